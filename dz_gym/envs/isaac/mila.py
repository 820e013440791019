"""sim-evals' MILA milestone checks from the poses, for a sim-evals without its milestone buffer.

sim-evals keeps ``env._mila_milestones_reached`` ``(N, M)``: each milestone of the task, reached in order
(a milestone counts once the one before it has), sticky until the episode's reset. The backend copies it
each step (:class:`~dz_gym.envs.isaac.build.MilestoneProbe`) and hands it to the shared episode
bookkeeping as ``TaskState.milestone_flags`` (:mod:`dz_gym.envs.episodes`), which turns it into the
``success``, ``success_any_step`` and ``milestones`` entries of ``info`` under the task's own names
(``reached_spoon``, ``completely_in_sink`` ...) and the generic ones.

A sim-evals without the buffer gets the same checks computed here from the poses
(:meth:`MilaFallback.flags`: centre distances, no object orientation or region box), marked by
``MilaFallback.used``. Like sim-evals' own buffer, it keeps its flags and the object's starting height
per episode.

Example (one env; the spoon lifted 10 cm from its start, then in the sink with the gripper open)::

    >>> import numpy as np
    >>> from dz_gym.envs.scenes import TASKS
    >>> fallback = MilaFallback(TASKS["place_spoon_in_sink"], 1)
    >>> sink = np.array([[0.5, 0.0, 0.0]])
    >>> fallback.flags([[0.4, 0.2, 0.02]], sink, [[0.4, 0.2, 0.03]], [1.0]).tolist()
    [[True, False, False, False]]
    >>> fallback.flags([[0.5, 0.0, 0.12]], sink, [[0.5, 0.0, 0.13]], [1.0]).tolist()
    [[True, True, True, False]]
    >>> fallback.flags([[0.5, 0.0, 0.02]], sink, [[0.5, 0.0, 0.03]], [0.0]).tolist()
    [[True, True, True, True]]
"""

from __future__ import annotations

import numpy as np

from dz_gym.envs.scenes import IsaacTask


class MilaFallback:
    """sim-evals' milestone checks of ``task`` for ``num_envs`` envs, sticky per episode."""

    def __init__(self, task: IsaacTask, num_envs: int):
        self.task = task
        self.num_envs = int(num_envs)
        self.reached = np.zeros((self.num_envs, len(task.milestones)), dtype=bool)
        self.start_z = np.full(self.num_envs, np.nan)
        self.used = False

    def start(self, ids) -> None:
        """Envs ``ids`` begin new episodes."""
        ids = np.asarray(ids, dtype=np.int64).reshape(-1)
        self.reached[ids] = False
        self.start_z[ids] = np.nan

    def flags(self, object_pos, target_pos, tcp_pos, gripper) -> np.ndarray:
        """The flags ``(N, M)`` from env-local poses and the gripper (0 open, 1 closed): in order, sticky."""
        self.used = True
        t = self.task.thresholds
        obj = np.asarray(object_pos, dtype=np.float64).reshape(self.num_envs, 3)
        target = np.asarray(target_pos, dtype=np.float64).reshape(self.num_envs, 3)
        tcp = np.asarray(tcp_pos, dtype=np.float64).reshape(self.num_envs, 3)
        gripper = np.asarray(gripper, dtype=np.float64).reshape(self.num_envs)
        unknown = np.isnan(self.start_z)
        self.start_z[unknown] = obj[unknown, 2]
        xy = np.hypot(obj[:, 0] - target[:, 0], obj[:, 1] - target[:, 1])
        checks = (
            np.linalg.norm(tcp - obj, axis=1) < t.reach_distance,
            obj[:, 2] > self.start_z + t.lift_height,
            (xy < t.target_xy_radius) & (obj[:, 2] > target[:, 2] + t.above_target_height),
            (xy < t.target_xy_radius)
            & (obj[:, 2] < target[:, 2] + t.in_target_height)
            & (gripper < t.release_gripper_threshold),
        )
        previous = np.ones(self.num_envs, dtype=bool)
        for index, now in enumerate(checks):
            self.reached[:, index] |= now & previous
            previous = self.reached[:, index]
        return self.reached.copy()
