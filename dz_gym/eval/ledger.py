"""The rows of a run directory checked against its plan: ``episodes.jsonl`` as a ledger (pure, no I/O).

A resume trusts the rows it finds: an episode with a row is not run again, and the summary counts every row.
So every row read back must be one the run's own config can have written: :func:`check_ledger` refuses, with
``episodes.jsonl:LINE: why``,

- a row that fails the row schema (:func:`~dz_gym.eval.row.check_row`: a missing key, a wrong type);
- a row whose identity names no planned entry: a scene the run does not have, an episode beyond the planned
  ones, an arm the run does not have (or one missing in a run with arms), a seed other than ``seed + k``, a
  task other than the scene's (where the row names one);
- a row of another configuration: another ``max_steps``, another ``backend``, another ``policy`` than its
  arm's (the server URL is placement and may change on resume: not checked); a row of an older run without
  ``backend`` or ``policy`` is not checked on what it does not name;
- a second row of the same planned entry (scene, episode, arm).

``episodes`` may grow on resume, so a row only has to name an episode below the config's ``episodes``.

>>> spec = LedgerSpec(scenes=(1,), episodes=2, arms=(), seed=10, max_steps=30)
>>> row = {"scene": 1, "episode": 0, "seed": 10, "env": 0, "session_id": "s", "steps": 3, "server_calls": 1,
...        "success_at_end": True, "success_any_step": True, "error": None, "max_steps": 30}
>>> len(check_ledger([(1, row)], spec, "episodes.jsonl"))
1
>>> check_ledger([(1, row), (2, dict(row, steps=4))], spec, "episodes.jsonl")
Traceback (most recent call last):
...
ValueError: episodes.jsonl:2: a second row of scene 1 episode 0 (the first is on line 1)
>>> check_ledger([(1, dict(row, seed=0))], spec, "episodes.jsonl")
Traceback (most recent call last):
...
ValueError: episodes.jsonl:1: seed 0 is not this run's seed for scene 1 episode 0 (expected 10: --seed 10 + 0)
>>> spec = LedgerSpec(scenes=(1,), episodes=2, arms=(), seed=10, max_steps=30, backend="mujoco",
...                   policies={None: "reference"})
>>> check_ledger([(1, dict(row, backend="isaac"))], spec, "episodes.jsonl")
Traceback (most recent call last):
...
ValueError: episodes.jsonl:1: backend 'isaac', but this run's backend is 'mujoco'
>>> check_ledger([(1, dict(row, backend="mujoco", policy="hold"))], spec, "episodes.jsonl")
Traceback (most recent call last):
...
ValueError: episodes.jsonl:1: policy 'hold', but this run's policy is 'reference'
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from typing import Any

from dz_gym.eval.row import check_row

__all__ = ["LedgerSpec", "check_ledger", "spec_of"]


@dataclasses.dataclass(frozen=True)
class LedgerSpec:
    """What a row of the run may say: its scenes, episodes per scene, arms, base seed, step limit, per scene
    the task name its rows carry (a scene missing there is not checked), its backend (None: not checked) and
    per arm (None: the run without arms) its policy (an arm missing there is not checked)."""

    scenes: tuple[int, ...]
    episodes: int
    arms: tuple[str, ...]
    seed: int
    max_steps: int
    tasks: Mapping[int, str | None] = dataclasses.field(default_factory=dict)
    backend: str | None = None
    policies: Mapping[str | None, str] = dataclasses.field(default_factory=dict)


def spec_of(config: Any, tasks: Mapping[int, str | None] | None = None) -> LedgerSpec:
    """The :class:`LedgerSpec` of an :class:`~dz_gym.eval.config.EvalConfig`."""
    return LedgerSpec(scenes=tuple(int(s) for s in config.plan.scenes), episodes=int(config.plan.episodes),
                      arms=tuple(config.arms), seed=int(config.plan.seed), max_steps=int(config.plan.max_steps),
                      tasks=dict(tasks or {}), backend=str(config.plan.backend),
                      policies=config.arm_policies())  # fmt: skip


def _what(scene: int, episode: int, arm: str | None) -> str:
    return f"scene {scene} episode {episode}" + (f" arm {arm}" if arm is not None else "")


def _why(row: Mapping[str, Any], spec: LedgerSpec) -> str | None:
    """Why ``row`` (schema-checked) is not one of the run's planned entries, or None."""
    scene, episode, arm = row["scene"], row["episode"], row.get("arm")
    if scene not in spec.scenes:
        return f"scene {scene} is not one of this run's scenes {list(spec.scenes)}"
    if not 0 <= episode < spec.episodes:
        return f"episode {episode} of scene {scene} is not planned (this run has episodes 0-{spec.episodes - 1})"
    if spec.arms and arm not in spec.arms:
        return f"arm {arm!r} is not one of this run's arms {list(spec.arms)}"
    if not spec.arms and arm is not None:
        return f"arm {arm!r}, but this run has no arms"
    if row["seed"] != spec.seed + episode:
        return (f"seed {row['seed']} is not this run's seed for {_what(scene, episode, arm)} "
                f"(expected {spec.seed + episode}: --seed {spec.seed} + {episode})")  # fmt: skip
    if "max_steps" in row and row["max_steps"] != spec.max_steps:
        return f"max_steps {row['max_steps']!r}, but this run's episodes have max_steps {spec.max_steps}"
    if row.get("task") is not None and scene in spec.tasks and row["task"] != spec.tasks[scene]:
        return f"task {row.get('task')!r}, but scene {scene} of this run is {spec.tasks[scene]!r}"
    return _other_configuration(row, spec)


def _other_configuration(row: Mapping[str, Any], spec: LedgerSpec) -> str | None:
    """Why ``row`` was written under another backend or policy than the run's, or None (also when the row, of
    an older run, does not name them)."""
    backend, policy, arm = row.get("backend"), row.get("policy"), row.get("arm")
    if backend is not None and spec.backend is not None and backend != spec.backend:
        return f"backend {backend!r}, but this run's backend is {spec.backend!r}"
    if policy is not None and arm in spec.policies and policy != spec.policies[arm]:
        whose = "this run's policy" if arm is None else f"arm {arm}'s policy in this run"
        return f"policy {policy!r}, but {whose} is {spec.policies[arm]!r}"
    return None


def check_ledger(
    numbered: Iterable[tuple[int, Mapping[str, Any]]], spec: LedgerSpec, where: str
) -> list[Mapping[str, Any]]:
    """The rows of ``numbered`` (``(line, row)`` pairs of the file ``where``), each checked against ``spec``
    (see the module docstring); the first bad one is a one-line ``ValueError`` ``WHERE:LINE: why``."""
    seen: dict[tuple[int, int, str | None], int] = {}
    out: list[Mapping[str, Any]] = []
    for line, row in numbered:
        if not isinstance(row, Mapping):
            raise ValueError(f"{where}:{line}: expected a JSON object, got {type(row).__name__}")
        try:
            check_row(row)
        except ValueError as exc:
            raise ValueError(f"{where}:{line}: {str(exc).removeprefix('episode row: ')}") from None
        why = _why(row, spec)
        if why is not None:
            raise ValueError(f"{where}:{line}: {why}")
        key = (row["scene"], row["episode"], row.get("arm"))
        if key in seen:
            raise ValueError(f"{where}:{line}: a second row of {_what(*key)} (the first is on line {seen[key]})")
        seen[key] = line
        out.append(row)
    return out
