"""An episode in progress on one env slot: its plan entry, its identity and what each step recorded (pure).

:class:`~dz_gym.eval.runner.SceneRunner` fills one per running episode and, when it ends, turns it into the
trajectory's arrays (:meth:`EpisodeInProgress.arrays`) and the row.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from dz_gym.eval import trajectory
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
        """The trajectory file's arrays (what :class:`~dz_gym.eval.writer.EpisodeWriter` saves), through the
        file's schema (:mod:`dz_gym.eval.trajectory`: keys, dtypes, shapes)."""
        names = None if self.milestones is None else list(self.milestones)
        return trajectory.pack(
            {
                "actions": self.actions,
                "joint_pos": self.joints,
                "gripper_pos": self.gripper,
                "policy_called": self.called,
                "chunk_latency_ms": self.latency_ms,
                "success": self.success,
                "reward": self.reward,
                "seed": self.seed,
                "object_pos": self.object_pos,
                "container_pos": self.container_pos,
                "tcp_pos": self.tcp_pos,
                "object_quat": self.object_quat,
                "object_start_pos": self.object_start_pos,
                "milestone_names": names,
                "milestone_first_step": None if names is None else list(self.milestones.values()),
            }  # fmt: skip
        )
