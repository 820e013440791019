"""The trajectory file: the arrays of one episode's ``trajectories/*.npz``, declared once (pure, but :func:`read`).

:data:`ARRAYS` is the schema, like :class:`~dz_gym.eval.row.EpisodeRow` is the row's: per key its dtype, whether
it has one entry per step (``step``: leading axis T = the row's ``steps``), one per milestone (``milestone``:
M entries) or one value for the episode (``once``), its shape and its meaning. The runner builds the file with
:func:`pack`, the report reads it with :func:`read`, the tests check it with :func:`check`, and
``docs/eval.md``'s trajectory table is :func:`markdown_table` (a test keeps them equal).

>>> import numpy as np
>>> arrays = pack({"actions": [np.zeros(8)] * 3, "joint_pos": [np.zeros(7)] * 3, "gripper_pos": [np.zeros(1)] * 3,
...                "policy_called": [True, False, False], "chunk_latency_ms": [5.0, np.nan, np.nan],
...                "success": [False] * 3, "reward": [0.0] * 3, "seed": 7, "object_pos": []})
>>> sorted(arrays), arrays["actions"].dtype.name, arrays["seed"].shape
(['actions', 'chunk_latency_ms', 'gripper_pos', 'joint_pos', 'policy_called', 'reward', 'seed', 'success'], 'float32', ())
>>> check(arrays)
3
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

__all__ = ["ARRAYS", "Array", "check", "markdown_table", "pack", "read"]

PER = ("step", "milestone", "once")


@dataclasses.dataclass(frozen=True)
class Array:
    """One array of the trajectory file (see the module docstring)."""

    key: str
    dtype: str  # numpy dtype name; "str" for unicode strings
    per: str  # step | milestone | once
    shape: tuple[int, ...]  # the shape after the leading axis (steps or milestones); () for a scalar
    meaning: str
    required: bool = False


ARRAYS: tuple[Array, ...] = (
    Array("actions", "float32", "step", (8,), "actions executed (7 joint targets, gripper 0/1)", True),
    Array("joint_pos", "float32", "step", (7,), "arm joint positions each action was chosen from", True),
    Array("gripper_pos", "float32", "step", (1,), "gripper position each action was chosen from", True),
    Array("policy_called", "bool", "step", (), "steps that sent a request", True),
    Array(
        "chunk_latency_ms", "float32", "step", (), "latency of the chunk received at that step (NaN otherwise)", True
    ),  # fmt: skip
    Array("success", "bool", "step", (), "placement check after the step", True),
    Array("reward", "float32", "step", (), "the env's reward after the step", True),
    Array("object_pos", "float32", "step", (3,), "env-local object position after the step"),
    Array("container_pos", "float32", "step", (3,), "env-local container position after the step"),
    Array(
        "tcp_pos",
        "float32",
        "step",
        (3,),
        "the gripper's tool centre point after the step (with the positions "
        "above, what the reach/lift/above-target checks use)",
    ),  # fmt: skip
    Array(
        "object_quat",
        "float32",
        "step",
        (4,),
        "the object's orientation (w, x, y, z) after the step, for the "
        "reach check's box; NaN where the backend does not report it",
    ),  # fmt: skip
    Array(
        "object_start_pos",
        "float32",
        "once",
        (3,),
        "the object's position at the episode's start (the lift check's reference)",
    ),  # fmt: skip
    Array("milestone_names", "str", "milestone", (), "the row's `milestones`, in order"),
    Array(
        "milestone_first_step", "int64", "milestone", (), "first step of each milestone (1-based), -1 for never reached"
    ),  # fmt: skip
    Array("seed", "int64", "once", (), "the episode's seed", True),
)
BY_KEY = {a.key: a for a in ARRAYS}


def _as(spec: Array, value: Any) -> np.ndarray:
    if spec.dtype == "str":
        return np.asarray(value, dtype=np.str_)
    if spec.per == "step" and isinstance(value, (list, tuple)) and value and np.ndim(value[0]) > 0:
        return np.stack(value).astype(spec.dtype)
    return np.asarray(value, dtype=spec.dtype)


def pack(values: Mapping[str, Any]) -> dict[str, np.ndarray]:
    """The arrays of the file from ``values`` (per key a list of per-step values, or the array): cast to the
    schema's dtypes; an optional key given as None or an empty list is left out. One-line ``ValueError`` for an
    unknown key, a missing required one or a wrong shape (:func:`check`)."""
    unknown = sorted(set(values) - set(BY_KEY))
    if unknown:
        raise ValueError(f"trajectory: unknown key(s) {unknown} (expected {', '.join(BY_KEY)})")
    out: dict[str, np.ndarray] = {}
    for spec in ARRAYS:
        value = values.get(spec.key)
        if value is None or (not spec.required and isinstance(value, (list, tuple)) and not value):
            continue
        out[spec.key] = _as(spec, value)
    check(out)
    return out


def check(arrays: Mapping[str, Any], *, complete: bool = True) -> int:
    """The number of steps T of a trajectory's ``arrays``; a one-line ``ValueError`` naming the key when one is
    missing (only with ``complete``), unknown, of another dtype kind or shape, or when per-step arrays disagree
    on T."""
    for spec in ARRAYS:
        if complete and spec.required and spec.key not in arrays:
            raise ValueError(f"trajectory: missing key {spec.key!r} ({spec.meaning})")
    steps: int | None = None
    milestones: int | None = None
    for key, value in arrays.items():
        spec = BY_KEY.get(key)
        if spec is None:
            raise ValueError(f"trajectory: unknown key {key!r} (expected {', '.join(BY_KEY)})")
        array = np.asarray(value)
        kind = "U" if spec.dtype == "str" else np.dtype(spec.dtype).kind
        if array.dtype.kind != kind:
            raise ValueError(f"trajectory: {key!r} expected dtype {spec.dtype}, got {array.dtype}")
        lead = () if spec.per == "once" else array.shape[:1]
        if array.shape[len(lead) :] != spec.shape or (spec.per != "once" and array.ndim < 1):
            want = ("T, " if spec.per == "step" else "M, " if spec.per == "milestone" else "") + ", ".join(
                map(str, spec.shape)
            )
            raise ValueError(f"trajectory: {key!r} expected shape ({want.rstrip(', ')}), got {array.shape}")
        if spec.per == "step":
            if steps is not None and lead[0] != steps:
                raise ValueError(f"trajectory: {key!r} has {lead[0]} steps, expected {steps} like the other arrays")
            steps = int(lead[0])
        elif spec.per == "milestone":
            if milestones is not None and lead[0] != milestones:
                raise ValueError(
                    f"trajectory: {key!r} has {lead[0]} entries, expected {milestones} (one per milestone)"
                )
            milestones = int(lead[0])
    return int(steps or 0)


def read(path: str | os.PathLike, keys: Iterable[str] | None = None) -> dict[str, np.ndarray]:
    """The checked arrays of one trajectory file. With ``keys`` (each in the schema) only those that the file
    has, checked among themselves: what a reader of older or partial files (the report) needs. Raises
    ``OSError`` or a one-line ``ValueError``."""
    wanted = None if keys is None else list(keys)
    for key in wanted or ():
        if key not in BY_KEY:
            raise ValueError(f"trajectory: unknown key {key!r} (expected {', '.join(BY_KEY)})")
    with np.load(path, allow_pickle=False) as data:
        names = data.files if wanted is None else [k for k in wanted if k in data.files]
        arrays = {key: np.asarray(data[key]) for key in names}
    check(arrays, complete=wanted is None)
    return arrays


def _shape(spec: Array) -> str:
    lead = {"step": ["T"], "milestone": ["M"], "once": []}[spec.per]
    dims = lead + [str(d) for d in spec.shape]
    return f"({', '.join(dims)}{',' if len(dims) == 1 else ''})" if dims else "scalar"


def markdown_table() -> str:
    """The trajectory table of ``docs/eval.md``: one line per array (key, shape and dtype, per, meaning)."""
    lines = ["| array | shape, dtype | per | meaning |", "|---|---|---|---|"]
    for spec in ARRAYS:
        need = "" if spec.required else " (where the env reports it)"
        lines.append(f"| `{spec.key}` | {_shape(spec)} {spec.dtype} | {spec.per} | {spec.meaning}{need} |")
    return "\n".join(lines)
