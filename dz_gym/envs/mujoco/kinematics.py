"""Kinematics of the droid robot alone (no task objects): forward kinematics of the ``tcp`` site, the
wrist camera's pose, joint limits, and damped-least-squares inverse kinematics.

It loads the robot model without any scene, so code that uses it (the scripted expert, a vision-only
reference policy) learns nothing about where the objects are. Poses are in the env-local world frame
(robot base at the origin, table top at z = 0), the same frame as the scenes.

IK solves for a TCP position and a "gripper pointing down" orientation with a yaw about the world z axis:
yaw 0 is the DROID home orientation, whose fingers close along the world y axis; yaw ``a`` rotates the
closing axis by ``a`` (so to grasp a long object across its long axis, pass the long axis's yaw). The error
is the position error plus half the sum of the cross products of the current and target TCP frame axes;
each iteration takes a damped-least-squares step on the 6x7 TCP Jacobian (lambda 1e-4), plus a small
step toward the home posture in the Jacobian's null space (so repeated warm-started solves do not drift
into joint limits), and clips to the joint limits; it stops at 0.1 mm / 1e-3 rad or after 60 iterations.
Warm-start it from the last command; a warm start that fails to converge is retried from home.

Not thread-safe: each instance owns one scratch ``MjData``; use one instance per thread.
"""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass

import mujoco
import numpy as np

from dz_gym.envs import droid
from dz_gym.envs.mujoco import robot
from dz_gym.envs.mujoco.poses import pose_from_mujoco


@dataclass(frozen=True)
class IKResult:
    """Joint positions found by :meth:`Kinematics.ik` and how well they reach the target."""

    q: np.ndarray  # (7,)
    position_error: float  # metres
    rotation_error: float  # radians (approximately)
    iterations: int

    @property
    def converged(self) -> bool:
        return self.position_error < 1e-3 and self.rotation_error < 1e-2


class Kinematics:
    """Forward and inverse kinematics of the robot model without task objects."""

    _shared: Kinematics | None = None
    _shared_lock = threading.Lock()

    def __init__(self):
        self.model = robot.load_robot_spec().compile()
        self.data = mujoco.MjData(self.model)
        self.index = robot.RobotIndex(self.model)
        self.lower = self.index.lower.copy()
        self.upper = self.index.upper.copy()
        self.home = robot.HOME.copy()
        self.wrist_fovy_deg = float(self.model.cam_fovy[self.index.wrist_camera])
        self._jacp = np.zeros((3, self.model.nv))
        self._jacr = np.zeros((3, self.model.nv))
        _, self.home_rotation = self.fk(self.home)

    @classmethod
    def shared(cls) -> Kinematics:
        """A process-wide instance (for light, single-threaded use such as calibration queries)."""
        with cls._shared_lock:
            if cls._shared is None:
                cls._shared = Kinematics()
            return cls._shared

    @property
    def joint_limits(self) -> tuple[np.ndarray, np.ndarray]:
        """Lower and upper arm joint limits, each ``(7,)`` (rad)."""
        return self.lower.copy(), self.upper.copy()

    def _set(self, q) -> None:
        q = np.asarray(q, dtype=np.float64).reshape(droid.ARM_DOF)
        self.data.qpos[self.index.arm_qpos] = q
        mujoco.mj_kinematics(self.model, self.data)

    def fk(self, q) -> tuple[np.ndarray, np.ndarray]:
        """TCP position ``(3,)`` and rotation ``(3, 3)`` (columns: TCP axes in world) at joints ``q``."""
        self._set(q)
        site = self.index.tcp_site
        return self.data.site_xpos[site].copy(), self.data.site_xmat[site].reshape(3, 3).copy()

    def tcp_pose(self, q) -> np.ndarray:
        """4x4 world-from-TCP at joints ``q``."""
        position, rotation = self.fk(q)
        pose = np.eye(4)
        pose[:3, :3], pose[:3, 3] = rotation, position
        return pose

    def camera_pose(self, q) -> np.ndarray:
        """World-from-camera (4x4, OpenCV axes) of the wrist camera at joints ``q``."""
        self._set(q)
        mujoco.mj_comPos(self.model, self.data)
        mujoco.mj_camlight(self.model, self.data)
        cam = self.index.wrist_camera
        return pose_from_mujoco(self.data.cam_xpos[cam].copy(), self.data.cam_xmat[cam])

    def target_rotation(self, yaw: float) -> np.ndarray:
        """TCP rotation pointing down with ``yaw`` about world z relative to the home orientation."""
        c, s = math.cos(yaw), math.sin(yaw)
        rz = np.array([[c, -s, 0.0], [s, c, 0.0], [0.0, 0.0, 1.0]])
        return rz @ self.home_rotation

    def ik(
        self,
        position,
        yaw: float = 0.0,
        q_init=None,
        *,
        rotation: np.ndarray | None = None,
        max_iterations: int = 60,
        damping: float = 1e-4,
        position_tolerance: float = 1e-4,
        rotation_tolerance: float = 1e-3,
        posture_gain: float = 0.1,
    ) -> IKResult:
        """Joint positions putting the TCP at ``position`` with the down-pointing ``yaw`` (or ``rotation``).

        ``q_init`` (default: home) warm-starts the solve; the result is clipped to the joint limits.
        """
        target = np.asarray(position, dtype=np.float64).reshape(3)
        target_rot = self.target_rotation(yaw) if rotation is None else np.asarray(rotation, dtype=np.float64)
        start = self.home if q_init is None else np.asarray(q_init, dtype=np.float64).reshape(droid.ARM_DOF)
        args = (target, target_rot, max_iterations, damping, position_tolerance, rotation_tolerance, posture_gain)
        result = self._solve(start, *args)
        if not result.converged and q_init is not None:
            retry = self._solve(self.home, *args)
            if retry.position_error + 0.1 * retry.rotation_error < result.position_error + 0.1 * result.rotation_error:
                return IKResult(
                    retry.q, retry.position_error, retry.rotation_error, result.iterations + retry.iterations
                )
        return result

    def _errors(self, target: np.ndarray, target_rot: np.ndarray, error: np.ndarray) -> tuple[float, float]:
        site = self.index.tcp_site
        current = self.data.site_xmat[site].reshape(3, 3)
        error[:3] = target - self.data.site_xpos[site]
        error[3:] = 0.5 * (
            np.cross(current[:, 0], target_rot[:, 0])
            + np.cross(current[:, 1], target_rot[:, 1])
            + np.cross(current[:, 2], target_rot[:, 2])
        )
        return float(np.linalg.norm(error[:3])), float(np.linalg.norm(error[3:]))

    def _solve(
        self, q, target, target_rot, max_iterations, damping, position_tolerance, rotation_tolerance, posture_gain
    ):
        model, data, site, dofs = self.model, self.data, self.index.tcp_site, self.index.arm_dof
        q = np.clip(np.array(q, dtype=np.float64), self.lower, self.upper)
        error = np.zeros(6)
        eye6, eye7 = damping * np.eye(6), np.eye(droid.ARM_DOF)
        iterations = 0
        for iterations in range(1, max_iterations + 1):
            data.qpos[self.index.arm_qpos] = q
            mujoco.mj_kinematics(model, data)
            pos_err, rot_err = self._errors(target, target_rot, error)
            if pos_err < position_tolerance and rot_err < rotation_tolerance:
                return IKResult(q, pos_err, rot_err, iterations)
            mujoco.mj_comPos(model, data)
            mujoco.mj_jacSite(model, data, self._jacp, self._jacr, site)
            jac = np.vstack((self._jacp[:, dofs], self._jacr[:, dofs]))
            pinv = jac.T @ np.linalg.inv(jac @ jac.T + eye6)
            dq = pinv @ error
            if posture_gain:
                dq += (eye7 - pinv @ jac) @ (posture_gain * (self.home - q))
            q = np.clip(q + dq, self.lower, self.upper)
        data.qpos[self.index.arm_qpos] = q
        mujoco.mj_kinematics(model, data)
        pos_err, rot_err = self._errors(target, target_rot, error)
        return IKResult(q, pos_err, rot_err, iterations)
