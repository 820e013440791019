"""Per-episode success and milestones of sim-evals' MILA tasks, from sim-evals' own milestone flags.

sim-evals keeps ``env._mila_milestones_reached`` ``(N, M)``: each milestone of the task, reached in order
(a milestone counts once the one before it has), sticky until the episode's reset. The backend copies
it each step (:class:`~dz_gym.envs.isaac.build.MilestoneProbe`) and :class:`MilaEpisodes` turns it into
the ``info`` entries every backend reports:

- ``milestones``: ``{name: (N,) first episode step reached, -1 while not}`` under the generic names
  (``reached``, ``lifted``, ``above_target``, ``placed``, mapped in order) *and* the task's own names
  (``reached_spoon``, ``completely_in_sink`` ...), with the same values;
- ``success``: the task's final milestone (sim-evals' success), ``success_any_step`` its OR.

A sim-evals without the buffer gets the same checks computed here from the poses (:meth:`fallback_flags`:
centre distances, no object orientation or region box), marked by ``self.fallback_used``.
"""

from __future__ import annotations

import numpy as np

from dz_gym.envs.isaac.tasks import GENERIC_MILESTONES, IsaacTask

NOT_REACHED = -1


class MilaEpisodes:
    """First steps of each milestone per env, reset per episode."""

    def __init__(self, task: IsaacTask, num_envs: int):
        self.task = task
        self.num_envs = int(num_envs)
        self.first_step = np.full((len(task.milestones), self.num_envs), NOT_REACHED, dtype=np.int64)
        self.success_any = np.zeros(self.num_envs, dtype=bool)
        self.start_z = np.full(self.num_envs, np.nan)
        self.fallback_used = False

    def start(self, ids) -> None:
        """Envs ``ids`` begin new episodes."""
        ids = np.asarray(ids, dtype=np.int64).reshape(-1)
        self.first_step[:, ids] = NOT_REACHED
        self.success_any[ids] = False
        self.start_z[ids] = np.nan

    def fallback_flags(self, object_pos, target_pos, tcp_pos, gripper) -> np.ndarray:
        """sim-evals' checks from env-local poses (in order, sticky), when its buffer is absent."""
        self.fallback_used = True
        t = self.task.thresholds
        obj, target = np.asarray(object_pos, dtype=np.float64), np.asarray(target_pos, dtype=np.float64)
        unknown = np.isnan(self.start_z)
        self.start_z[unknown] = obj[unknown, 2]
        xy = np.hypot(obj[:, 0] - target[:, 0], obj[:, 1] - target[:, 1])
        checks = (
            np.linalg.norm(np.asarray(tcp_pos) - obj, axis=1) < t.reach_distance,
            obj[:, 2] > self.start_z + t.lift_height,
            (xy < t.target_xy_radius) & (obj[:, 2] > target[:, 2] + t.above_target_height),
            (xy < t.target_xy_radius) & (obj[:, 2] < target[:, 2] + t.in_target_height)
            & (np.asarray(gripper) < t.release_gripper_threshold),
        )
        flags = (self.first_step != NOT_REACHED).T.copy()
        previous = np.ones(self.num_envs, dtype=bool)
        for index, now in enumerate(checks):
            flags[:, index] |= now & previous
            previous = flags[:, index]
        return flags

    def record(self, flags: np.ndarray, episode_step: np.ndarray, update=None) -> dict:
        """The ``success``, ``success_any_step`` and ``milestones`` entries of ``info`` for the flags ``(N, M)``
        of this step; ``update`` (``(N,)`` bool) limits the bookkeeping to some envs (a partial reset)."""
        flags = np.asarray(flags, dtype=bool).reshape(self.num_envs, -1)
        update = np.ones(self.num_envs, dtype=bool) if update is None else np.asarray(update, dtype=bool)
        newly = flags.T & (self.first_step == NOT_REACHED) & update[None, :]
        steps = np.broadcast_to(np.asarray(episode_step, dtype=np.int64), self.first_step.shape)
        self.first_step[newly] = steps[newly]
        success = flags[:, -1].copy()
        self.success_any |= success & update
        milestones = {name: self.first_step[i].copy() for i, name in enumerate(GENERIC_MILESTONES)}
        milestones.update({name: self.first_step[i].copy() for i, name in enumerate(self.task.milestones)})
        return {"success": success, "success_any_step": self.success_any.copy(), "milestones": milestones}
