"""What one batch step reports, read once for the whole batch (pure): :class:`StepOutcome`.

The wrapper's ``step()`` gives the batch's reward, ``terminated`` and ``truncated`` (host arrays or tensors)
and its ``info`` (:class:`~dz_gym.records.StepRecord`'s columns: ``policy_error``, ``integrity_event``,
``chunk_received``, ``chunk_latency_s``, the env's ``success`` flags and ``milestones``). The scene runner
(:class:`~dz_gym.eval.runner.SceneRunner`) reads them here as ``(N,)`` host arrays, and asks which running
episodes ended at this step and how: a failed server call first, else the env's own end, else the run's step
limit (the env's limit is longer).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import numpy as np

from dz_gym.envs.vector_info import entries
from dz_gym.requests import to_numpy

__all__ = ["StepOutcome", "info_column", "milestone_columns"]


def info_column(info: Mapping[str, Any], key: str) -> np.ndarray | None:
    """``info[key]`` as a host array, None where the env does not report it."""
    value = info.get(key)
    return None if value is None else to_numpy(value)


def _flags(info: Mapping[str, Any], key: str, num_envs: int) -> np.ndarray:
    """``info[key]`` as ``(N,)`` bools, all False where the env does not report it."""
    value = info_column(info, key)
    return np.zeros(num_envs, dtype=bool) if value is None else np.asarray(value).astype(bool).reshape(-1)


def milestone_columns(info: Mapping[str, Any]) -> dict[str, np.ndarray] | None:
    """``info["milestones"]`` as name -> ``(N,)`` int64 host arrays (None when the env reports none)."""
    value = info.get("milestones")
    if not isinstance(value, Mapping):
        return None
    return {
        str(name): np.asarray(to_numpy(steps), dtype=np.int64).reshape(-1) for name, steps in entries(value).items()
    }


@dataclasses.dataclass(frozen=True)
class StepOutcome:
    """One batch step, per slot: ``(N,)`` host arrays (``errors`` and ``events`` as the info gives them).

    >>> info = {"policy_error": [None, "lost"], "integrity_event": [None, "connection_lost"],
    ...         "policy_called": [True, True], "chunk_latency_s": [0.02, 0.5], "success": [True, False]}
    >>> out = StepOutcome.read([1.0, 0.0], [True, False], [False, False], info, 2)
    >>> out.done.tolist(), out.failed.tolist(), out.latency_ms.tolist()
    ([True, False], [False, True], [20.0, 500.0])
    >>> out.ends(np.arange(2), np.array([3, 3]), max_steps=10).tolist(), out.end_of(0), out.end_of(1)
    ([0, 1], (None, None, 'terminated'), ('lost', 'connection_lost', 'error'))
    """

    reward: np.ndarray
    terminated: np.ndarray
    done: np.ndarray  # terminated or truncated: the env has reset itself (same-step autoreset)
    failed: np.ndarray  # the slot's server call failed at this step
    errors: Any
    events: Any
    latency_ms: np.ndarray  # the round trip of a chunk received (or a call failed) at this step, else NaN
    success: np.ndarray
    success_any: np.ndarray

    @classmethod
    def read(cls, reward, terminated, truncated, info: Mapping[str, Any], num_envs: int) -> StepOutcome:
        terminated = np.asarray(to_numpy(terminated), dtype=bool).reshape(-1)
        errors = info["policy_error"]
        failed = np.not_equal(np.asarray(errors, dtype=object), None)
        received = np.asarray(info.get("chunk_received", info["policy_called"]), dtype=bool)
        latency_ms = np.where(received | failed, np.asarray(info["chunk_latency_s"], dtype=np.float64) * 1e3, np.nan)
        return cls(
            reward=np.asarray(to_numpy(reward), dtype=np.float64).reshape(-1),
            terminated=terminated,
            done=terminated | np.asarray(to_numpy(truncated), dtype=bool).reshape(-1),
            failed=failed,
            errors=errors,
            events=info["integrity_event"],
            latency_ms=latency_ms,
            success=_flags(info, "success", num_envs),
            success_any=_flags(info, "success_any_step", num_envs),
        )

    def ends(self, active: np.ndarray, steps: np.ndarray, max_steps: int) -> np.ndarray:
        """The ``active`` slots whose episode ended at this step (``steps``: each one's steps so far)."""
        return active[self.failed[active] | self.done[active] | (steps >= max_steps)]

    def end_of(self, slot: int) -> tuple[str | None, str | None, str]:
        """How the slot's episode ended: ``(error, integrity event, ended_by)``; an error first, else the env's
        end, else the step limit."""
        if self.failed[slot]:
            event = self.events[slot]
            return str(self.errors[slot]), None if event is None else str(event), "error"
        return None, None, "terminated" if self.terminated[slot] else "time_limit"
