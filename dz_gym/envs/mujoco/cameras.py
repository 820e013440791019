"""The camera rig of the embedded simulator (the sim-evals DROID rig) and its calibration.

Two fixed external cameras sit on either side of the robot, 0.57 m to its left and right, 0.66 m above the
table, looking down ~37 degrees at the workspace in front of the robot; the third camera rides on the
gripper. The external poses and FOV are sim-evals' (Isaac Lab ``CameraCfg`` offsets, OpenGL convention,
focal 2.1 / vertical aperture 3.024 -> 71.5 degrees vertical FOV), so the external images have the Isaac
scenes' framing. The wrist camera is the droid model's own (EgoGym's calibration, centred on the
fingertips), whose 56.7 degree FOV matches sim-evals' wrist camera (~57 degrees). The horizontal FOV
follows from the image aspect ratio (104 degrees for the external cameras at 16:9, e.g. 180x320).

Calibration (:func:`camera_calibration`) uses the OpenCV convention: camera x right, y down, z forward
(the viewing direction); pixel (u, v) = (column, row) with (0, 0) the centre of the top-left pixel, so
``[u, v, 1]^T ~ K @ p_cam``. ``world_from_camera`` maps camera coordinates to env-local world coordinates
(robot base at the origin, table top at z = 0). It needs no simulator state: the external cameras are
fixed and the wrist camera's pose follows from the joint positions (:func:`wrist_camera_pose`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import mujoco
import numpy as np

from dz_gym.envs import droid
from dz_gym.envs.mujoco.kinematics import Kinematics
from dz_gym.envs.mujoco.poses import intrinsics, invert_pose, pose_from_mujoco

__all__ = [
    "CAMERA_NAMES", "EXTERNAL_CAMERAS", "EXTERNAL_FOVY_DEG", "WRIST_CAMERA", "CameraCalibration",
    "add_external_cameras", "camera_calibration", "intrinsics", "invert_pose", "pose_from_mujoco", "wrist_camera_pose",
]  # fmt: skip

EXTERNAL_FOVY_DEG = math.degrees(2 * math.atan(3.024 / 2 / 2.1))  # 71.5
# (name, position, quaternion w x y z in MuJoCo's camera convention: looks along -z, y up).
EXTERNAL_CAMERAS = (
    ("external_cam", (0.05, 0.57, 0.66), (-0.393, -0.195, 0.399, 0.805)),
    ("external_cam_2", (0.05, -0.57, 0.66), (0.805, 0.399, -0.195, -0.393)),
)
WRIST_CAMERA = "wrist_cam"
CAMERA_NAMES = droid.CAMERA_KEYS  # render order: external_cam, external_cam_2, wrist_cam


@dataclass(frozen=True)
class CameraCalibration:
    """Pinhole calibration of one camera at one image size (OpenCV convention, see the module docstring)."""

    name: str
    K: np.ndarray  # (3, 3) intrinsics in pixels
    world_from_camera: np.ndarray  # (4, 4); for the wrist camera: at the DROID home pose
    height: int
    width: int

    def project(self, points_world: np.ndarray, world_from_camera: np.ndarray | None = None) -> np.ndarray:
        """Pixel coordinates (..., 2) of world points (..., 3); points behind the camera give NaN."""
        pose = self.world_from_camera if world_from_camera is None else world_from_camera
        points = np.asarray(points_world, dtype=np.float64)
        rotation, translation = pose[:3, :3], pose[:3, 3]
        cam = (points - translation) @ rotation  # R^T (p - t)
        uvw = cam @ self.K.T
        with np.errstate(divide="ignore", invalid="ignore"):
            uv = uvw[..., :2] / uvw[..., 2:3]
        return np.where(cam[..., 2:3] > 0, uv, np.nan)


def add_external_cameras(spec: mujoco.MjSpec) -> None:
    """Add the two fixed external cameras of the rig to a scene spec's worldbody."""
    for name, pos, quat in EXTERNAL_CAMERAS:
        quat = np.asarray(quat, dtype=np.float64)
        spec.worldbody.add_camera(name=name, pos=pos, quat=quat / np.linalg.norm(quat), fovy=EXTERNAL_FOVY_DEG)


def _external_pose(position, quat) -> np.ndarray:
    quat = np.asarray(quat, dtype=np.float64)
    xmat = np.zeros(9)
    mujoco.mju_quat2Mat(xmat, quat / np.linalg.norm(quat))
    return pose_from_mujoco(np.asarray(position, dtype=np.float64), xmat)


def camera_calibration(
    image_shape: tuple[int, int] = droid.DEFAULT_EMBEDDED_IMAGE_SHAPE,
) -> dict[str, CameraCalibration]:
    """Calibration of every camera at ``image_shape`` (H, W), keyed by observation name.

    The external cameras are fixed. The wrist camera's entry holds its intrinsics and its pose at the
    DROID home pose; use :func:`wrist_camera_pose` for its pose at other joint positions.
    """
    height, width = int(image_shape[0]), int(image_shape[1])
    out = {
        name: CameraCalibration(
            name, intrinsics(EXTERNAL_FOVY_DEG, (height, width)), _external_pose(pos, quat), height, width
        )
        for name, pos, quat in EXTERNAL_CAMERAS
    }
    kin = Kinematics.shared()
    out[WRIST_CAMERA] = CameraCalibration(
        WRIST_CAMERA,
        intrinsics(kin.wrist_fovy_deg, (height, width)),
        kin.camera_pose(droid.HOME_JOINT_POSITIONS),
        height,
        width,
    )
    return out


def wrist_camera_pose(joint_positions: np.ndarray) -> np.ndarray:
    """World-from-camera (4x4, OpenCV axes) of the wrist camera at arm joint positions ``(7,)``."""
    return Kinematics.shared().camera_pose(joint_positions)
