"""An episode in progress on one env slot: its plan entry, its identity and what its row is made from (pure).

:class:`~dz_gym.eval.runner.SceneRunner` keeps one per running episode; its per-step values are in the
runner's :class:`~dz_gym.eval.steplog.StepLog` (the whole batch's steps). When the episode ends, the log's
columns of its steps (:func:`step_columns`: keyed as the trajectory file's per-step arrays, plus
``success_any_step``; and its first reported ``object_start_pos`` and ``episode_seed``) become the
trajectory's arrays (:meth:`EpisodeInProgress.arrays`) and the row's measured fields (:func:`measures`), and
the episode's identity and measures its row (:meth:`EpisodeInProgress.row`).
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import time
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from dz_gym.eval import trajectory
from dz_gym.eval.plan import PlanEntry
from dz_gym.eval.results import latency_stats
from dz_gym.eval.row import EpisodeRow
from dz_gym.records import EpisodeStats
from dz_gym.requests import to_numpy

__all__ = ["STEP_KEYS", "EpisodeInProgress", "iso_time", "measures", "step_columns"]

STEP_KEYS = tuple(a.key for a in trajectory.ARRAYS if a.per == "step")  # the trajectory's per-step arrays


def iso_time(timestamp: float) -> str:
    """A wall-clock time as the rows write it: ISO 8601, UTC, milliseconds."""
    return _dt.datetime.fromtimestamp(timestamp, _dt.timezone.utc).isoformat(timespec="milliseconds")


@dataclasses.dataclass
class EpisodeInProgress:
    """An episode in progress on one slot: its plan entry, its identity and its per-episode values."""

    entry: PlanEntry
    slot: int  # the wrapper's env slot (a shard's local slot)
    scene: int
    episode: int
    seed: int
    prompt: str
    session_id: str
    started_at: float
    t0: float
    video_key: str | None
    arm: str | None = None
    task: str | None = None
    milestones: dict[str, int] | None = None  # info["milestones"] of the episode's last step
    server_errors: int = 0

    def arrays(self, columns: Mapping[str, np.ndarray | None]) -> dict[str, np.ndarray]:
        """The trajectory file's arrays (what :class:`~dz_gym.eval.writer.EpisodeWriter` saves) from the
        episode's ``columns``, through the file's schema (:mod:`dz_gym.eval.trajectory`: keys, dtypes, shapes)."""
        names = None if self.milestones is None else list(self.milestones)
        return trajectory.pack(
            {
                **{key: columns.get(key) for key in STEP_KEYS},
                "seed": self.seed,
                "object_start_pos": columns.get("object_start_pos"),  # the lift milestone's reference height
                "milestone_names": names,
                "milestone_first_step": None if names is None else list(self.milestones.values()),
            }
        )

    def row(self, *, steps: int, seen: Mapping[str, Any], error: str | None, event: str | None, ended_by: str,
            trajectory_path: str, video: str | None, stats: EpisodeStats | None, retried: Sequence[str],
            max_steps: int, backend: str | None, server: str, placement: Mapping[str, Any]) -> dict[str, Any]:  # fmt: skip
        """The finished episode's :class:`~dz_gym.eval.row.EpisodeRow` as the dict written to ``episodes.jsonl``
        (``seen``: :func:`measures` of its steps; ``stats``: the wrapper's record of its requests; ``retried``:
        the events of its earlier attempts; ``server``: where its requests went)."""
        latencies = seen["latencies"]
        milestones = None
        if self.milestones is not None:
            milestones = {name: (step if step >= 0 else None) for name, step in self.milestones.items()}
        measured: dict[str, Any] = dict(seen.get("success", {}))
        if stats is not None:
            measured.update(chunk_delays=list(stats.delays), request_delays=list(stats.drawn_delays),
                            wait_steps=int(stats.wait_steps),
                            stale_steps=int(stats.stale_steps), reconnects=int(stats.reconnects),
                            retries=int(stats.retries))  # fmt: skip
        row = EpisodeRow.of(
            self.entry,
            attempts=1 + len(retried),
            retried_events=list(retried),
            prompt=self.prompt,
            task=self.task,
            max_steps=max_steps,
            backend=backend,
            server=server,
            session_id=self.session_id,
            steps=steps,
            ended_by=ended_by,
            milestones=milestones,
            server_calls=seen["server_calls"],
            server_errors=self.server_errors,
            latency_ms=latency_stats(latencies),
            latencies_ms=latencies,
            error=error,
            error_event=event,
            env_seed=seen["env_seed"],
            final_object_pos=seen["final_object_pos"],
            final_container_pos=seen["final_container_pos"],
            started_at=iso_time(self.started_at),
            wall_s=round(time.perf_counter() - self.t0, 4),
            trajectory=trajectory_path,
            video=video,
            **placement,
            **measured,
        )
        return row.to_dict()


def step_columns(info: Mapping[str, Any], joints, gripper, reward, latency_ms, success, success_any) -> dict:
    """One batch step's whole-batch columns for the step log, keyed as the trajectory's per-step arrays (float32
    actions, proprio and poses; None for a pose the env does not report; ``success_any_step`` besides), made once
    per step from the step's ``info`` and the runner's converted ``(N,)`` arrays."""
    poses = {key: info.get(key) for key in ("object_pos", "container_pos", "tcp_pos", "object_quat")}
    return {
        "actions": np.asarray(info["policy_action"], dtype=np.float32),
        "joint_pos": joints.astype(np.float32),
        "gripper_pos": gripper.astype(np.float32),
        "policy_called": np.asarray(info["policy_called"], dtype=bool),
        "chunk_latency_ms": latency_ms,
        "success": success,
        "success_any_step": success_any,
        "reward": reward,
        **{key: None if a is None else to_numpy(a).astype(np.float32) for key, a in poses.items()},
    }


def measures(columns: Mapping[str, np.ndarray | None], errored: bool) -> dict[str, Any]:
    """The row's fields measured on the episode's ``columns``: latencies (ms, rounded, the steps that got a
    reply or an error), server calls, final poses and, unless it ``errored``, its success."""
    latency = columns["chunk_latency_ms"]
    latencies = [round(float(v), 3) for v in latency[np.isfinite(latency)]]
    object_pos, container_pos = columns.get("object_pos"), columns.get("container_pos")
    out: dict[str, Any] = {
        "latencies": latencies,
        "server_calls": int(np.count_nonzero(columns["policy_called"])),
        "final_object_pos": None if object_pos is None else object_pos[-1].tolist(),
        "final_container_pos": None if container_pos is None else container_pos[-1].tolist(),
        "env_seed": None if columns.get("episode_seed") is None else int(columns["episode_seed"]),
    }
    if not errored:
        success = columns["success"]
        reached = np.flatnonzero(success)
        out["success"] = {
            "success_at_end": bool(success[-1]),
            "success_any_step": bool(reached.size or np.any(columns["success_any_step"])),
            "first_success_step": int(reached[0]) + 1 if reached.size else None,
        }
    return out
