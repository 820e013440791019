"""Rigid poses and pinhole intrinsics shared by the camera rig and the kinematics (pure numpy).

Conventions: a pose is a 4x4 world-from-frame transform; camera poses use OpenCV axes (x right, y down,
z forward), while MuJoCo/OpenGL cameras look along their -z axis with y up. This module sits below both
``cameras`` and ``kinematics`` so that neither imports the other for these helpers.

>>> import numpy as np
>>> pose = np.eye(4); pose[:3, 3] = (1.0, 2.0, 3.0)
>>> invert_pose(pose)[:3, 3].tolist()
[-1.0, -2.0, -3.0]
>>> round(float(intrinsics(90.0, (100, 200))[0, 0]), 6)
50.0
"""

from __future__ import annotations

import math

import numpy as np

# MuJoCo/OpenGL camera axes (x right, y up, z backward) -> OpenCV axes (x right, y down, z forward).
GL_TO_CV = np.diag([1.0, -1.0, -1.0])


def invert_pose(pose: np.ndarray) -> np.ndarray:
    """Inverse of a 4x4 rigid transform."""
    out = np.eye(4)
    out[:3, :3] = pose[:3, :3].T
    out[:3, 3] = -pose[:3, :3].T @ pose[:3, 3]
    return out


def intrinsics(fovy_deg: float, image_shape: tuple[int, int]) -> np.ndarray:
    """K of a MuJoCo camera with vertical FOV ``fovy_deg`` rendered at ``image_shape`` (square pixels)."""
    height, width = image_shape
    focal = (height / 2) / math.tan(math.radians(fovy_deg) / 2)
    return np.array([[focal, 0.0, (width - 1) / 2], [0.0, focal, (height - 1) / 2], [0.0, 0.0, 1.0]])


def pose_from_mujoco(position: np.ndarray, xmat: np.ndarray) -> np.ndarray:
    """4x4 world-from-camera (OpenCV axes) from a MuJoCo camera's world position and 3x3 orientation."""
    pose = np.eye(4)
    pose[:3, :3] = np.asarray(xmat, dtype=np.float64).reshape(3, 3) @ GL_TO_CV
    pose[:3, 3] = position
    return pose
