"""An episode in progress on one env slot: its plan entry, its identity and what each step recorded (pure).

:class:`~dz_gym.eval.runner.SceneRunner` fills one per running episode and, when it ends, turns it into the
trajectory's arrays (:meth:`EpisodeInProgress.arrays`) and the row.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from dz_gym.eval.plan import PlanEntry

__all__ = ["EpisodeInProgress"]


@dataclasses.dataclass
class EpisodeInProgress:
    """An episode in progress on one slot: its plan entry, its identity and the per-step record."""

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
    tcp_pos: list = dataclasses.field(default_factory=list)
    object_quat: list = dataclasses.field(default_factory=list)
    object_start_pos: np.ndarray | None = None  # the lift milestone's reference height
    actions: list = dataclasses.field(default_factory=list)
    joints: list = dataclasses.field(default_factory=list)
    gripper: list = dataclasses.field(default_factory=list)
    called: list = dataclasses.field(default_factory=list)
    latency_ms: list = dataclasses.field(default_factory=list)
    success: list = dataclasses.field(default_factory=list)
    reward: list = dataclasses.field(default_factory=list)
    object_pos: list = dataclasses.field(default_factory=list)
    container_pos: list = dataclasses.field(default_factory=list)
    env_seed: int | None = None
    success_any: bool = False
    server_errors: int = 0

    @property
    def steps(self) -> int:
        return len(self.actions)

    def arrays(self) -> dict[str, np.ndarray]:
        """The trajectory file's arrays (what :class:`~dz_gym.eval.writer.EpisodeWriter` saves)."""
        ep = self
        arrays = {
            "actions": np.stack(ep.actions).astype(np.float32),
            "joint_pos": np.stack(ep.joints).astype(np.float32),
            "gripper_pos": np.stack(ep.gripper).astype(np.float32),
            "policy_called": np.asarray(ep.called, dtype=bool),
            "chunk_latency_ms": np.asarray(ep.latency_ms, dtype=np.float32),
            "success": np.asarray(ep.success, dtype=bool),
            "reward": np.asarray(ep.reward, dtype=np.float32),
            "seed": np.int64(ep.seed),
        }
        if ep.object_pos:
            arrays["object_pos"] = np.stack(ep.object_pos).astype(np.float32)
        if ep.container_pos:
            arrays["container_pos"] = np.stack(ep.container_pos).astype(np.float32)
        if ep.tcp_pos:
            arrays["tcp_pos"] = np.stack(ep.tcp_pos).astype(np.float32)
        if ep.object_quat:
            arrays["object_quat"] = np.stack(ep.object_quat).astype(np.float32)
        if ep.object_start_pos is not None:
            arrays["object_start_pos"] = ep.object_start_pos
        if ep.milestones is not None:  # first step per milestone, -1 where never reached
            arrays["milestone_names"] = np.asarray(list(ep.milestones), dtype=np.str_)
            arrays["milestone_first_step"] = np.asarray(list(ep.milestones.values()), dtype=np.int64)
        return arrays
