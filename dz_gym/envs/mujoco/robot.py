"""The Franka + Robotiq 2F-85 "droid" robot of the embedded simulator: asset path, names and constants.

The MJCF under ``assets/droid/`` is tabletask 0.2.3's bundled droid model with decimated visual meshes
(``scripts/decimate_robot_meshes.py`` rebuilds it; licences and NOTICE sit next to it). The arm uses the
DROID position gains (kp 400, kv 80) and gravity compensation; the gripper is a tendon-driven 2F-85 whose
actuator takes 0..255. Everything here is shared by the scene builder, the kinematics and the env.
"""

from __future__ import annotations

from pathlib import Path

import mujoco
import numpy as np

from dz_gym.envs import droid

ASSET_DIR = Path(__file__).resolve().parent / "assets" / "droid"
MODEL_XML = ASSET_DIR / "model.xml"

ARM_JOINTS = tuple(f"joint{i}" for i in range(1, 8))
ARM_ACTUATORS = ARM_JOINTS
GRIPPER_ACTUATOR = "fingers_actuator"
GRIPPER_JOINT = "right_driver_joint"
GRIPPER_CTRL_CLOSED = 255.0
# Driver angle (rad) that reads as a fully closed gripper; gripper_pos = angle / this, clipped to [0, 1].
GRIPPER_CLOSED_ANGLE = 0.824033
TCP_SITE = "tcp"
WRIST_CAMERA = "wrist_cam"  # the model's "wrist" camera, renamed to the DROID observation key
GRIPPER_BODIES = (
    "base", "left_driver", "left_coupler", "left_spring_link", "left_follower", "left_pad",
    "right_driver", "right_coupler", "right_spring_link", "right_follower", "right_pad",
)  # fmt: skip
HOME = np.asarray(droid.HOME_JOINT_POSITIONS, dtype=np.float64)

# Saturated accent colours of the vendor materials are greyed out so that colour thresholding in the
# camera images finds only the task objects (the Franka's blue and green status lights).
_NEUTRAL_MATERIALS = {"light_blue": (0.45, 0.45, 0.47, 1.0), "green": (0.5, 0.5, 0.5, 1.0)}


def load_robot_spec() -> mujoco.MjSpec:
    """The robot as an ``MjSpec``: base at the origin, neutral colours, no reflections, wrist camera renamed.

    The vendor's fixed "external" camera is removed (the scene adds the DROID rig instead).
    """
    spec = mujoco.MjSpec.from_file(str(MODEL_XML))
    for material in spec.materials:
        if material.name in _NEUTRAL_MATERIALS:
            material.rgba = _NEUTRAL_MATERIALS[material.name]
        material.reflectance = 0.0
    for camera in list(spec.cameras):
        if camera.name == "external":
            spec.delete(camera)
        elif camera.name == "wrist":
            camera.name = WRIST_CAMERA
    return spec


class RobotIndex:
    """Addresses of the robot's joints, actuators and sites in a compiled model (any scene or robot-only)."""

    def __init__(self, model: mujoco.MjModel):
        self.arm_qpos = np.array([model.joint(name).qposadr[0] for name in ARM_JOINTS], dtype=np.int64)
        self.arm_dof = np.array([model.joint(name).dofadr[0] for name in ARM_JOINTS], dtype=np.int64)
        self.arm_ctrl = np.array([model.actuator(name).id for name in ARM_ACTUATORS], dtype=np.int64)
        self.gripper_ctrl = model.actuator(GRIPPER_ACTUATOR).id
        self.gripper_qpos = model.joint(GRIPPER_JOINT).qposadr[0]
        self.tcp_site = model.site(TCP_SITE).id
        self.wrist_camera = model.camera(WRIST_CAMERA).id
        self.lower = model.jnt_range[[model.joint(n).id for n in ARM_JOINTS], 0].copy()
        self.upper = model.jnt_range[[model.joint(n).id for n in ARM_JOINTS], 1].copy()
        self.ctrl_lower = model.actuator_ctrlrange[self.arm_ctrl, 0].copy()
        self.ctrl_upper = model.actuator_ctrlrange[self.arm_ctrl, 1].copy()
        self.gripper_bodies = np.array([model.body(n).id for n in GRIPPER_BODIES], dtype=np.int64)
        # All robot qpos entries (arm and gripper linkage): a reset zeroes the gripper ones.
        robot_joints = [j for j in range(model.njnt) if model.jnt_type[j] != mujoco.mjtJoint.mjJNT_FREE]
        self.robot_qpos = np.array([model.jnt_qposadr[j] for j in robot_joints], dtype=np.int64)

    def gripper_position(self, qpos: np.ndarray) -> float:
        """Gripper opening in [0, 1] (0 open, 1 closed) from the driver joint angle."""
        return float(np.clip(qpos[self.gripper_qpos] / GRIPPER_CLOSED_ANGLE, 0.0, 1.0))
