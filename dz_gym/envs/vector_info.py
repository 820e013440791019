"""Gymnasium's vector ``info`` form for a batched env's info: a ``_key`` mask beside every key (pure, no I/O).

A ``gymnasium.vector.VectorEnv`` returns one ``info`` dict whose values have a leading ``num_envs``; beside
each key ``k`` a bool ``(N,)`` array ``info["_k"]`` says which envs report it, and a nested dict carries its
own masks (``info["milestones"]["_reached"]``). Gymnasium's ``DictInfoToList`` (1.1, 1.2) needs the masks at
every level; consumers that iterate a nested dict skip the names that start with ``_`` (:func:`entries`).

Every DROID info key is reported by every env at every step, so the masks the batched env adds are all
True (read-only, one array per call); the wrapper's ``chunk_stats`` (only the envs whose episode ended) keep their own masks.

>>> import numpy as np
>>> info = with_masks({"success": np.array([True, False]), "milestones": {"reached": np.array([3, -1])}}, 2)
>>> sorted(info), sorted(info["milestones"])
(['_milestones', '_success', 'milestones', 'success'], ['_reached', 'reached'])
>>> info["_success"].tolist(), sorted(entries(info["milestones"]))
([True, True], ['reached'])
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np


def with_masks(info: Mapping[str, Any], num_envs: int) -> dict[str, Any]:
    """A copy of ``info`` with an all-True ``_key`` mask for each key (and inside each nested dict) that has
    none; keys starting with ``_`` are masks already and are kept as they are. The added masks are one
    read-only array per call, shared by its keys (a step's info stays cheap: no array per key; never shared
    with another call's info, which Gymnasium's checker and users keeping infos rely on).

    >>> with_masks({"success": np.zeros(2)}, 2)["_success"].flags.writeable
    False
    """
    mask = np.ones(int(num_envs), dtype=bool)
    mask.flags.writeable = False
    return _with_mask(info, mask)


def _with_mask(info: Mapping[str, Any], mask: np.ndarray) -> dict[str, Any]:
    out = dict(info)
    for key, value in info.items():
        if key.startswith("_"):
            continue
        if isinstance(value, Mapping):
            out[key] = _with_mask(value, mask)
        out.setdefault(f"_{key}", mask)
    return out


def entries(mapping: Mapping[str, Any]) -> dict[str, Any]:
    """The items of a vector-info dict without its masks (the names that start with ``_``)."""
    return {key: value for key, value in mapping.items() if not str(key).startswith("_")}
