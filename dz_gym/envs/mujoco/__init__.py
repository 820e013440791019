"""The embedded DROID-like simulator on MuJoCo: three scenes, three cameras, batched worker processes.

Public names:
    make_env(scene, num_envs, seed=None, image_shape=(180, 320), num_workers=None, ...) -> MujocoDroidEnv
    MujocoDroidEnv                       the batched env (``dz_gym.envs.base.BatchedDroidEnv``)
    Randomization                        per-episode placement ranges
    camera_calibration(image_shape)      intrinsics and poses of the cameras (OpenCV convention)
    wrist_camera_pose(joint_positions)   the wrist camera's pose at given arm joints
    Kinematics                           FK / IK of the robot without task objects

``MUJOCO_GL`` is set to ``egl`` (unless already set) before MuJoCo is imported: see ``gl.py``.
"""

from __future__ import annotations

from dz_gym.envs.mujoco import gl as _gl

_gl.configure()

from dz_gym.envs.mujoco.cameras import (
    CameraCalibration,
    camera_calibration,
    wrist_camera_pose,
)
from dz_gym.envs.mujoco.env import MujocoDroidEnv, make_env
from dz_gym.envs.mujoco.gl import RenderingUnavailable
from dz_gym.envs.mujoco.kinematics import IKResult, Kinematics
from dz_gym.envs.mujoco.scene import Randomization

__all__ = [
    "CameraCalibration",
    "IKResult",
    "Kinematics",
    "MujocoDroidEnv",
    "Randomization",
    "RenderingUnavailable",
    "camera_calibration",
    "make_env",
    "wrist_camera_pose",
]
