"""The task's own Isaac Lab terms: proprio observations, the gripper action, and the per-seed layout reset.

- :func:`arm_joint_pos` / :func:`gripper_pos`: the DROID proprio, ``(N,7)`` rad and ``(N,1)`` in [0, 1]
  (the driver joint over its closed angle, as the MuJoCo backend reports it);
- :class:`LazyImageRGB`: Isaac Lab's ``image_rgb`` that reads (renders) its camera only when the env's views
  are due (:mod:`dz_gym.envs.isaac.views`), and otherwise repeats its last frames;
- :class:`GripperAction`: the DROID gripper command (> 0.5 closes), sent to the Robotiq tendon actuator as
  its 0 or 255 control, as the MuJoCo backend does;
- :class:`ResetLayout`: places the object and the container of every env being reset from its episode
  seed with the MuJoCo backend's own sampler (:func:`dz_gym.envs.mujoco.scene.sample_layout`), so one seed
  gives one layout on both backends. It exposes ``initial_conditions`` / ``current_index`` as the isaac
  backend's seed dealer expects (:class:`dz_gym.envs.isaac.build.InitialConditions`): the list it deals
  holds the episode seeds themselves. Without the dealer (a plain ``gym.make``) an env's k-th reset uses
  seed ``env_id + k * N``.
"""

from __future__ import annotations

import isaaclab.envs.mdp as base_mdp
import numpy as np
import torch
from isaaclab.envs.mdp.actions.actions_cfg import FixedTendonPositionActionCfg
from isaaclab.envs.mdp.actions.tendon_actions import FixedTendonPositionAction
from isaaclab.managers import ManagerTermBase, SceneEntityCfg
from isaaclab.utils import configclass

from dz_gym.envs import droid
from dz_gym.envs.isaac import views
from dz_gym.envs.mujoco import robot, scene

ARM_JOINTS = robot.ARM_JOINTS
GRIPPER_JOINT = robot.GRIPPER_JOINT
GRIPPER_CLOSED_ANGLE = robot.GRIPPER_CLOSED_ANGLE
# The pads' centres of mass: their midpoint is within 5 mm of the MJCF's ``tcp`` site (the MuJoCo backend's TCP).
TCP_BODIES = ("left_pad", "right_pad")
DEFAULT_CAMERA = SceneEntityCfg("tiled_camera")  # Isaac Lab's image_rgb default; the task names its cameras
# Every seed is its own "initial condition": the dealer indexes this with ``seed % len``.
SEED_SPACE = range(2**62)


def _joint_ids(asset, names) -> list[int]:
    ids, _ = asset.find_joints(list(names), preserve_order=True)
    return list(ids)


def _joint_pos(asset):
    data = asset.data.joint_pos
    return getattr(data, "torch", data)


def arm_joint_pos(env, asset_name: str = "robot") -> torch.Tensor:
    """Arm joint positions ``(N,7)`` rad, panda joint order."""
    robot_asset = env.scene[asset_name]
    return _joint_pos(robot_asset)[:, _cached_ids(env, robot_asset, ARM_JOINTS)].to(torch.float32)


def gripper_pos(env, asset_name: str = "robot") -> torch.Tensor:
    """Gripper closure ``(N,1)``: the right driver joint over its closed angle, clipped to [0, 1]."""
    robot_asset = env.scene[asset_name]
    angle = _joint_pos(robot_asset)[:, _cached_ids(env, robot_asset, (GRIPPER_JOINT,))]
    return (angle / GRIPPER_CLOSED_ANGLE).clamp(0.0, 1.0).to(torch.float32)


def _cached_ids(env, asset, names: tuple[str, ...]) -> list[int]:
    cache = env.__dict__.setdefault("_dz_gym_joint_ids", {})
    if names not in cache:
        cache[names] = _joint_ids(asset, names)
    return cache[names]


class LazyImageRGB(base_mdp.image_rgb):
    """Observation term: a camera's RGB frames, rendered only when the env's views are due.

    The same parameters and output as Isaac Lab's ``image_rgb``; when :func:`dz_gym.envs.isaac.views.demand_of`
    says the views are not due, the camera is not read (so not rendered) and the term returns its last frames
    again. The first call, and every call with ``frame_stack`` > 1 (a stack must advance), always renders.
    """

    def __init__(self, cfg, env):
        super().__init__(cfg, env)
        self._last: torch.Tensor | None = None

    def __call__(
        self,
        env,
        sensor_cfg: SceneEntityCfg = DEFAULT_CAMERA,
        data_type: str = "rgb",
        normalize: bool = True,
        mean: float | None = None,
        channel_first: bool = False,
        frame_stack: int = 1,
        *,
        out: torch.Tensor | None = None,
    ) -> torch.Tensor:
        demand = views.demand_of(env)
        render = demand.due or self._last is None or frame_stack != 1
        demand.note(render)
        if render:
            self._last = super().__call__(
                env, sensor_cfg, data_type, normalize, mean, channel_first, frame_stack, out=out
            )
            return self._last
        if out is None:
            return self._last
        out.copy_(self._last)
        self._last = out
        return out


class GripperAction(FixedTendonPositionAction):
    """The DROID gripper command on the tendon actuator: ``> 0.5`` closes (control 255), else opens (0)."""

    def process_actions(self, actions: torch.Tensor):
        closed = (actions > droid.GRIPPER_CLOSE_THRESHOLD).to(actions.dtype)
        super().process_actions(closed)


@configclass
class GripperActionCfg(FixedTendonPositionActionCfg):
    """The gripper term: one action column, scaled to the actuator's 0..255 control."""

    class_type: type = GripperAction
    tendon_names: list[str] = ["split"]
    scale: float = robot.GRIPPER_CTRL_CLOSED


class ResetLayout(ManagerTermBase):
    """Event term (mode ``reset``): object and container poses of the envs being reset, from their seeds."""

    def __init__(self, cfg, env):
        super().__init__(cfg, env)
        self.scene_id = int(cfg.params["scene_id"])
        self.randomization = scene.Randomization()
        self.rest_z = scene.LAYOUTS[self.scene_id].object_rest_z
        self.initial_conditions = SEED_SPACE
        self.current_index = 0
        self._resets = np.zeros(env.num_envs, dtype=np.int64)

    def __call__(self, env, env_ids, scene_id: int = 1):
        ids = _as_index_list(env_ids, env.num_envs)
        if not ids:
            return
        seeds = self._seeds(ids, env.num_envs)
        layouts = [
            scene.sample_layout(self.scene_id, np.random.default_rng(_u64(s)), self.randomization) for s in seeds
        ]
        origins = _as_torch(env.scene.env_origins)[ids]
        device = origins.device
        obj = torch.tensor(
            [[*lay.object_xy, self.rest_z, *_yaw_xyzw(lay.object_yaw)] for lay in layouts], device=device
        )
        con = torch.tensor([[*lay.container_xy, 0.0, *_yaw_xyzw(lay.container_yaw)] for lay in layouts], device=device)
        obj[:, :3] += origins
        con[:, :3] += origins
        index = torch.as_tensor(ids, dtype=torch.int32, device=device)
        zeros = torch.zeros((len(ids), 6), device=device)
        for name, pose in (("object", obj), ("container", con)):
            asset = env.scene[name]
            asset.write_root_pose_to_sim_index(root_pose=pose, env_ids=index)
            asset.write_root_velocity_to_sim_index(root_velocity=zeros, env_ids=index)

    def _seeds(self, ids: list[int], num_envs: int) -> list[int]:
        """The dealt seeds (one per env being reset, in ascending id order), or ``env_id + k N``."""
        if self.initial_conditions is not SEED_SPACE:
            dealt = [
                int(self.initial_conditions[(self.current_index + i) % len(self.initial_conditions)])
                for i in range(len(ids))
            ]
            self.current_index += len(ids)
            return dealt
        seeds = [int(i + self._resets[i] * num_envs) for i in ids]
        self._resets[ids] += 1
        return seeds


def _as_index_list(env_ids, num_envs: int) -> list[int]:
    if env_ids is None or isinstance(env_ids, slice):
        return list(range(num_envs))[env_ids or slice(None)]
    inner = getattr(env_ids, "torch", env_ids)
    return sorted(int(i) for i in torch.as_tensor(inner).reshape(-1).tolist())


def _as_torch(value):
    inner = getattr(value, "torch", None)
    return value if inner is None or callable(inner) else inner


def _u64(seed: int) -> int:
    return int(np.int64(seed).view(np.uint64))


def _yaw_xyzw(yaw: float) -> tuple[float, float, float, float]:
    return (0.0, 0.0, float(np.sin(yaw / 2)), float(np.cos(yaw / 2)))
