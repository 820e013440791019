"""Turn the planner's Cartesian rows into safe joint-position rows (the action chunk).

Each row's TCP target is solved by the embedded simulator's damped-least-squares IK
(:class:`dz_gym.envs.mujoco.kinematics.Kinematics`, the robot model without task objects), warm-started
from the previous row, so consecutive rows stay on one IK branch. Every emitted row is made safe:

- joints inside the limits, less a margin;
- no joint moves more than ``max_joint_step`` rad from the previous row (the first row from the anchor);
- the TCP of the emitted joints never goes below ``min_tcp_z`` (table top + margin): a row that would is
  replaced by the previous one.

Joint-target rows (HOME) step straight toward their target under the same bounds.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from dz_gym.envs import droid
from dz_gym.policies.reference.planner import Row


class MotionSolver:
    """IK + safety for one chunk; ``kinematics`` is a per-thread ``Kinematics`` instance."""

    def __init__(
        self,
        *,
        min_tcp_z: float = 0.015,
        max_joint_step: float = 0.12,
        limit_margin: float = 0.01,
        position_tolerance: float = 5e-4,
        rotation_tolerance: float = 5e-3,
        max_iterations: int = 30,
    ):
        self.min_tcp_z = float(min_tcp_z)
        self.max_joint_step = float(max_joint_step)
        self.limit_margin = float(limit_margin)
        self.position_tolerance = position_tolerance
        self.rotation_tolerance = rotation_tolerance
        self.max_iterations = max_iterations

    @staticmethod
    def yaw_of(kinematics, rotation: np.ndarray) -> float:
        """Yaw (rad) of a TCP rotation relative to the home orientation, about world z."""
        relative = rotation @ kinematics.home_rotation.T
        return math.atan2(relative[1, 0], relative[0, 0])

    def solve(
        self, kinematics, rows: Sequence[Row], q_start: np.ndarray, exact_rows: int | None = None, stride: int = 4
    ) -> tuple[np.ndarray, list[np.ndarray]]:
        """``(len(rows), 8)`` float32 actions and the joint rows, starting from joints ``q_start``.

        The first ``exact_rows`` rows (default: all) are solved one by one; beyond them only every
        ``stride``-th row and the last are, the rows between interpolated in joint space (rows the client
        will not execute before the next call need less precision than the ones it will).
        """
        lower = kinematics.lower + self.limit_margin
        upper = kinematics.upper - self.limit_margin
        q0 = np.clip(np.asarray(q_start, dtype=np.float64), lower, upper)
        n = len(rows)
        exact = n if exact_rows is None else max(0, min(int(exact_rows), n))
        raw: list[np.ndarray | None] = [None] * n
        q_knot, last_key, last_knot = q0, None, -1
        for i, row in enumerate(rows):
            is_knot = i < exact or (i - exact + 1) % stride == 0 or i == n - 1 or row.joints is not None
            if not is_knot:
                continue
            if row.joints is not None:
                q = np.asarray(row.joints, dtype=np.float64)
                last_key = None
            else:
                key = (*np.round(row.position, 6), round(row.yaw, 6))
                if key == last_key:
                    q = q_knot
                else:
                    target = np.array(row.position, dtype=np.float64)
                    target[2] = max(target[2], self.min_tcp_z)
                    q = kinematics.ik(
                        target,
                        yaw=row.yaw,
                        q_init=q_knot,
                        max_iterations=self.max_iterations,
                        position_tolerance=self.position_tolerance,
                        rotation_tolerance=self.rotation_tolerance,
                    ).q
                last_key = key
            start = q_knot if last_knot < 0 else raw[last_knot]
            for j in range(last_knot + 1, i):  # rows between two knots: linear in joint space
                raw[j] = start + (q - start) * ((j - last_knot) / (i - last_knot))
            raw[i], q_knot, last_knot = q, q, i
        out = np.empty((n, droid.ACTION_DIM), dtype=np.float32)
        joints: list[np.ndarray] = []
        q_prev = q0
        for i, row in enumerate(rows):
            q = self._safe(kinematics, raw[i], q_prev, lower, upper)
            out[i, : droid.ARM_DOF] = q
            out[i, droid.ARM_DOF] = row.gripper
            joints.append(q)
            q_prev = q
        return out, joints

    def _safe(self, kinematics, q: np.ndarray, q_prev: np.ndarray, lower: np.ndarray, upper: np.ndarray) -> np.ndarray:
        q = np.clip(q, lower, upper)
        q = q_prev + np.clip(q - q_prev, -self.max_joint_step, self.max_joint_step)
        if not np.array_equal(q, q_prev):
            position, _ = kinematics.fk(q)
            if position[2] < self.min_tcp_z - 1e-3:
                return q_prev.copy()
        return q
