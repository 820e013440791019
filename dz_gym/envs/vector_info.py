"""Gymnasium's vector ``info`` form for a batched env's info: a ``_key`` mask beside every key (pure, no I/O).

A ``gymnasium.vector.VectorEnv`` returns one ``info`` dict whose values have a leading ``num_envs``; beside
each key ``k`` a bool ``(N,)`` array ``info["_k"]`` says which envs report it, and a nested dict carries its
own masks (``info["milestones"]["_reached"]``). Gymnasium's ``DictInfoToList`` (1.1, 1.2) needs the masks at
every level; consumers that iterate a nested dict skip the names that start with ``_`` (:func:`entries`).

Every DROID info key is reported by every env at every step, so the masks the batched env adds are all
True (read-only, one array per call); the wrapper's ``chunk_stats`` (only the envs whose episode ended) keep their own masks.

Where envs reset inside ``step`` (``AutoresetMode.SAME_STEP``), Gymnasium 1.x's vector envs report the episodes
that ended there under ``info["final_obs"]`` (an ``(N,)`` object array: the ended env's last observation, None
elsewhere) and ``info["final_info"]`` (that step's info, its masks True only for the ended envs), each with its
``_final_obs`` / ``_final_info`` mask: :func:`with_final` adds them.

>>> import numpy as np
>>> info = with_masks({"success": np.array([True, False]), "milestones": {"reached": np.array([3, -1])}}, 2)
>>> sorted(info), sorted(info["milestones"])
(['_milestones', '_success', 'milestones', 'success'], ['_reached', 'reached'])
>>> info["_success"].tolist(), sorted(entries(info["milestones"]))
([True, True], ['reached'])
>>> obs = {"policy": {"arm_joint_pos": np.arange(4.0).reshape(2, 2)}}
>>> final = with_final(info, np.array([False, True]), final_observations(obs, [False, True]))
>>> final["_final_obs"].tolist(), final["final_obs"][0], final["final_obs"][1]
([False, True], None, {'policy': {'arm_joint_pos': array([2., 3.])}})
>>> final["final_info"]["_success"].tolist(), final["final_info"]["milestones"]["_reached"].tolist()
([False, True], [False, True])
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

FINAL_KEYS = ("final_obs", "final_info")


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


def _with_mask(info: Mapping[str, Any], mask: np.ndarray, replace: bool = False) -> dict[str, Any]:
    """``info`` with ``mask`` beside each key (and in each nested dict): where none is there, or everywhere
    when ``replace``."""
    out = dict(info)
    for key, value in info.items():
        if key.startswith("_"):
            continue
        if isinstance(value, Mapping):
            out[key] = _with_mask(value, mask, replace)
        if replace:
            out[f"_{key}"] = mask
        else:
            out.setdefault(f"_{key}", mask)
    return out


def final_observations(obs: Mapping[str, Any], ended) -> np.ndarray:
    """Gymnasium's ``final_obs``: an ``(N,)`` object array holding a copy of each ended env's part of the
    batched observation ``obs`` (numpy arrays, nested dicts), None for the others. Made before the ended
    envs reset: the backend's frame buffers may be overwritten then."""
    ended = np.asarray(ended, dtype=bool).reshape(-1)
    observations = np.full(ended.size, None, dtype=object)
    for i in np.flatnonzero(ended):
        observations[i] = _part(obs, int(i))
    return observations


def with_final(info: Mapping[str, Any], ended, final_obs: np.ndarray | None = None) -> dict[str, Any]:
    """A copy of ``info`` (in the vector form) with Gymnasium's same-step ``final_info`` and, given
    :func:`final_observations`, ``final_obs`` (see the module docstring); ``info`` as it is when no env ended.

    ``final_info`` holds ``info``'s arrays (not copies) under masks that are True for the ended envs only. Where
    ``info`` has a ``final_info`` already (from the env underneath), its entries stay and the step's keys it
    lacks are added; its ``final_obs`` stays.
    """
    ended = np.asarray(ended, dtype=bool).reshape(-1)
    if not ended.any():
        return dict(info)
    mask = ended.copy()
    mask.flags.writeable = False
    out = dict(info)
    given = info.get("final_info")  # an env's own: the wrapper adds the step's keys it lacks
    step = {key: value for key, value in info.items() if not key.startswith("_") and key not in FINAL_KEYS}
    if given is not None:
        step = {key: value for key, value in step.items() if key not in given}
    out["final_info"] = {**(given or {}), **_with_mask(step, mask, True)}
    out["_final_info"] = mask
    if final_obs is not None and "final_obs" not in info:
        out["final_obs"], out["_final_obs"] = final_obs, mask
    return out


def _part(value: Any, i: int) -> Any:
    """A copy of env ``i``'s part of a batched value (numpy arrays, nested dicts of them)."""
    if isinstance(value, Mapping):
        return {key: _part(item, i) for key, item in value.items()}
    return np.array(np.asarray(value)[i], copy=True)


def entries(mapping: Mapping[str, Any]) -> dict[str, Any]:
    """The items of a vector-info dict without its masks (the names that start with ``_``)."""
    return {key: value for key, value in mapping.items() if not str(key).startswith("_")}
