"""Manager-based Isaac Lab 3.0 env configs of the DROID scenes 1-3: Newton physics, Newton Warp cameras.

One config class per scene (:class:`DroidScene1EnvCfg` ...), all from :class:`DroidNewtonEnvCfg`:

- **scene**: the MuJoCo backend's robot, table, floor, object and container, as USD converted from its
  MJCF (:mod:`dz_gym.envs.isaac_droid3.assets`), the robot's base at each env origin; two fixed external
  cameras and the wrist camera, with the embedded simulator's poses and fields of view
  (:mod:`dz_gym.envs.mujoco.cameras`), rendered by ``NewtonWarpRendererCfg`` (Warp ray casting on CUDA:
  no Isaac Sim, no RT cores); the renderer lights them with its own directional light and ambient term (the
  scene's distant light prim is for other renderers: the Newton Warp renderer does not read USD lights);
- **physics**: ``NewtonCfg`` with the MuJoCo-Warp solver, ``dt`` 1/120 s with 4 substeps and decimation 8
  (15 Hz control, 2.08 ms physics steps; the MuJoCo backend takes 2.02 ms), CUDA graph capture on;
- **actions**: 7 absolute joint-position targets (implicit PD, kp 400, kd 80, the MJCF's gains and force
  limits) and the gripper command on the Robotiq tendon actuator (:class:`~.mdp.GripperAction`);
- **observations**: ``obs["policy"]`` with the three ``(N, H, W, 3)`` uint8 views, ``arm_joint_pos (N, 7)``
  and ``gripper_pos (N, 1)``, not concatenated (the DROID contract of :mod:`dz_gym.envs.droid`); the views
  render only at the steps whose views are due (:class:`~.mdp.LazyImageRGB`, every step unless the isaac
  backend's ``set_render_mask`` says otherwise);
- **events**: at reset, the robot to the DROID home pose and the object and container to the layout of the
  episode's seed (:class:`~.mdp.ResetLayout`, the MuJoCo backend's sampler);
- **terminations**: the 30 s time-out (450 steps). Success is judged outside, by the shared check
  (:mod:`dz_gym.envs.episodes`) on the state the isaac backend reads.

Importing this module imports Isaac Lab (no simulator starts); the USD assets are converted on first use.
"""

from __future__ import annotations

import math

import isaaclab.envs.mdp as base_mdp
import isaaclab.sim as sim_utils
from isaaclab.actuators import ImplicitActuatorCfg
from isaaclab.assets import ArticulationCfg, AssetBaseCfg, RigidObjectCfg
from isaaclab.envs import ManagerBasedRLEnvCfg
from isaaclab.managers import EventTermCfg, ObservationGroupCfg, ObservationTermCfg, SceneEntityCfg, TerminationTermCfg
from isaaclab.scene import InteractiveSceneCfg
from isaaclab.sensors import CameraCfg
from isaaclab.utils import configclass
from isaaclab_newton.physics import MJWarpSolverCfg, NewtonCfg
from isaaclab_newton.renderers import NewtonWarpRendererCfg

from dz_gym.envs import droid
from dz_gym.envs.isaac_droid3 import assets, mdp
from dz_gym.envs.mujoco import cameras, robot

CONTROL_DECIMATION = 8
PHYSICS_DT = 1.0 / 120.0
PHYSICS_SUBSTEPS = 4
ENV_SPACING = 3.0
ROBOT_PRIM = "{ENV_REGEX_NS}/Robot"
# The converter nests the bodies as in the MJCF; the wrist camera rides on the gripper's base body.
GRIPPER_BASE_PRIM = ROBOT_PRIM + "/Geometry/link0/link1/link2/link3/link4/link5/link6/link7/base"
EXTERNAL_FOCAL = 2.1
EXTERNAL_VERTICAL_APERTURE = 3.024  # sim-evals' rig: 71.5 degrees vertical
WRIST_FOVY_DEG = 56.74  # the MJCF's wrist camera
WRIST_POS = (0.031, 0.074, 0.022)  # in the gripper base frame (the MJCF's wrist camera)
WRIST_QUAT_WXYZ = (-5.63403367e-03, -9.66281899e-04, 9.85593110e-01, 1.69037112e-01)
ARM_EFFORT = {"joint[1-4]": 87.0, "joint[5-7]": 12.0}


def _xyzw(wxyz) -> tuple[float, float, float, float]:
    w, x, y, z = (float(v) for v in wxyz)
    norm = math.sqrt(w * w + x * x + y * y + z * z)
    return (x / norm, y / norm, z / norm, w / norm)


def _pinhole(fovy_deg: float, shape: tuple[int, int]) -> sim_utils.PinholeCameraCfg:
    height, width = shape
    vertical = 2.0 * EXTERNAL_FOCAL * math.tan(math.radians(fovy_deg) / 2.0)
    return sim_utils.PinholeCameraCfg(
        focal_length=EXTERNAL_FOCAL,
        horizontal_aperture=vertical * width / height,
        vertical_aperture=vertical,
        clipping_range=(0.01, 20.0),
    )


def _camera(prim_path: str, pos, wxyz, fovy_deg: float, shape, moving: bool) -> CameraCfg:
    return CameraCfg(
        prim_path=prim_path,
        offset=CameraCfg.OffsetCfg(pos=tuple(pos), rot=_xyzw(wxyz), convention="opengl"),
        data_types=["rgb"],
        spawn=_pinhole(fovy_deg, shape),
        height=int(shape[0]),
        width=int(shape[1]),
        update_latest_camera_pose=moving,
        renderer_cfg=NewtonWarpRendererCfg(),
    )


def _scene_cfg(scene_id: int, shape: tuple[int, int]) -> InteractiveSceneCfg:
    files = assets.scene_assets(scene_id)
    (ext_name, ext_pos, ext_quat), (ext2_name, ext2_pos, ext2_quat) = cameras.EXTERNAL_CAMERAS
    home = dict(zip(robot.ARM_JOINTS, droid.HOME_JOINT_POSITIONS, strict=True))
    cfg = InteractiveSceneCfg(num_envs=1, env_spacing=ENV_SPACING, replicate_physics=True)
    cfg.robot = ArticulationCfg(
        prim_path=ROBOT_PRIM,
        spawn=sim_utils.UsdFileCfg(usd_path=str(files.robot)),
        init_state=ArticulationCfg.InitialStateCfg(pos=(0.0, 0.0, 0.0), joint_pos={**home, ".*driver.*": 0.0}),
        actuators={
            "arm": ImplicitActuatorCfg(
                joint_names_expr=["joint[1-7]"], stiffness=400.0, damping=80.0, effort_limit_sim=ARM_EFFORT
            )
        },
    )
    cfg.table = AssetBaseCfg(prim_path="{ENV_REGEX_NS}/Table", spawn=sim_utils.UsdFileCfg(usd_path=str(files.table)))
    cfg.object = RigidObjectCfg(
        prim_path="{ENV_REGEX_NS}/Object", spawn=sim_utils.UsdFileCfg(usd_path=str(files.object))
    )
    cfg.container = RigidObjectCfg(
        prim_path="{ENV_REGEX_NS}/Container", spawn=sim_utils.UsdFileCfg(usd_path=str(files.container))
    )
    cfg.light = AssetBaseCfg(
        prim_path="/World/Light", spawn=sim_utils.DistantLightCfg(intensity=3000.0, color=(1.0, 1.0, 1.0))
    )
    fovy = cameras.EXTERNAL_FOVY_DEG
    setattr(cfg, ext_name, _camera("{ENV_REGEX_NS}/" + ext_name, ext_pos, ext_quat, fovy, shape, False))
    setattr(cfg, ext2_name, _camera("{ENV_REGEX_NS}/" + ext2_name, ext2_pos, ext2_quat, fovy, shape, False))
    cfg.wrist_cam = _camera(GRIPPER_BASE_PRIM + "/wrist_cam", WRIST_POS, WRIST_QUAT_WXYZ, WRIST_FOVY_DEG, shape, True)
    return cfg


@configclass
class ActionsCfg:
    """The 8-D DROID action: 7 joint-position targets (rad, absolute) + the gripper command."""

    arm = base_mdp.JointPositionActionCfg(
        asset_name="robot", joint_names=list(robot.ARM_JOINTS), preserve_order=True, scale=1.0, use_default_offset=False
    )
    gripper = mdp.GripperActionCfg(asset_name="robot")


def _image_term(key: str) -> ObservationTermCfg:
    return ObservationTermCfg(
        func=mdp.LazyImageRGB, params={"sensor_cfg": SceneEntityCfg(key), "data_type": "rgb", "normalize": False}
    )


@configclass
class PolicyCfg(ObservationGroupCfg):
    """``obs["policy"]``: three uint8 views and the proprio, as separate terms."""

    external_cam = _image_term("external_cam")
    external_cam_2 = _image_term("external_cam_2")
    wrist_cam = _image_term("wrist_cam")
    arm_joint_pos = ObservationTermCfg(func=mdp.arm_joint_pos)
    gripper_pos = ObservationTermCfg(func=mdp.gripper_pos)

    def __post_init__(self):
        self.enable_corruption = False
        self.concatenate_terms = False


@configclass
class ObservationsCfg:
    policy: PolicyCfg = PolicyCfg()


@configclass
class EventsCfg:
    """Reset: the robot to its home pose, then the object and container to the episode seed's layout."""

    reset_robot = EventTermCfg(func=base_mdp.reset_scene_to_default, mode="reset", params={"reset_joint_targets": True})
    reset_initial_conditions = EventTermCfg(func=mdp.ResetLayout, mode="reset", params={"scene_id": 1})


@configclass
class TerminationsCfg:
    time_out = TerminationTermCfg(func=base_mdp.time_out, time_out=True)


@configclass
class RewardsCfg:
    """No shaped reward: the evaluation's success check runs on the state (see the module docstring)."""


@configclass
class DroidNewtonEnvCfg(ManagerBasedRLEnvCfg):
    """Scene 1 by default; ``scene_id`` and ``image_shape`` pick the scene and the views' (H, W).

    Both may also be set after construction, as Isaac Lab's Hydra overrides do (``env.scene_id=2``,
    ``env.image_shape=[90,160]``: ``parse_env_cfg(..., overrides=[...])`` or a training script's command
    line write them after ``__post_init__``): :meth:`validate_config`, which Isaac Lab calls when the env is
    created (before anything is built), rebuilds what derives from them (:meth:`sync_derived`).
    """

    scene_id: int = 1
    image_shape: tuple[int, int] = droid.DEFAULT_EMBEDDED_IMAGE_SHAPE
    prompt: str = droid.scene_spec(1).prompt
    actions: ActionsCfg = ActionsCfg()
    observations: ObservationsCfg = ObservationsCfg()
    events: EventsCfg = EventsCfg()
    terminations: TerminationsCfg = TerminationsCfg()
    rewards: RewardsCfg = RewardsCfg()

    def __post_init__(self):
        self.decimation = CONTROL_DECIMATION
        self.episode_length_s = droid.MAX_EPISODE_LENGTH * CONTROL_DECIMATION * PHYSICS_DT
        self.sim.dt = PHYSICS_DT
        self.sim.render_interval = CONTROL_DECIMATION
        self.sim.physics = NewtonCfg(
            solver_cfg=MJWarpSolverCfg(
                solver="newton", integrator="implicitfast", cone="elliptic", njmax=600, nconmax=200, impratio=10.0
            ),
            num_substeps=PHYSICS_SUBSTEPS,
            use_cuda_graph=True,
        )
        self.scene = _scene_cfg(self.scene_id, tuple(self.image_shape))
        self.events.reset_initial_conditions.params = {"scene_id": self.scene_id}
        self.prompt = droid.scene_spec(self.scene_id).prompt
        self.num_rerenders_on_reset = 1

    def validate_config(self):
        """Isaac Lab's hook at env creation: bring the scene in line with ``scene_id`` and ``image_shape``."""
        self.sync_derived()

    def sync_derived(self) -> list[str]:
        """Rebuild what ``__post_init__`` derived from ``scene_id`` and ``image_shape`` if either was set since
        (a Hydra override); returns what changed, in words. A scene change rebuilds the scene (keeping
        ``num_envs``, ``env_spacing`` and ``replicate_physics``; other ``scene.*`` overrides are the old scene's
        and are dropped), the layout event and the prompt; ``image_shape`` is the three views' size."""
        scene_id = self.scene_id
        if isinstance(scene_id, bool) or not isinstance(scene_id, int) or scene_id not in (1, 2, 3):
            raise ValueError(f"scene_id: expected 1, 2 or 3, got {scene_id!r}")
        shape = tuple(self.image_shape) if isinstance(self.image_shape, (list, tuple)) else ()
        if len(shape) != 2 or not all(isinstance(v, int) and not isinstance(v, bool) and v >= 1 for v in shape):
            raise ValueError(f"image_shape: expected [height, width], integers >= 1, got {self.image_shape!r}")
        changes = []
        built = self.events.reset_initial_conditions.params.get("scene_id")
        if built != scene_id:
            old = self.scene
            self.scene = _scene_cfg(scene_id, shape)
            self.scene.num_envs, self.scene.env_spacing = old.num_envs, old.env_spacing
            self.scene.replicate_physics = old.replicate_physics
            self.events.reset_initial_conditions.params = {"scene_id": scene_id}
            if built in (1, 2, 3) and self.prompt == droid.scene_spec(built).prompt:
                self.prompt = droid.scene_spec(scene_id).prompt
            changes.append(f"scene_id: scene {built} -> {scene_id} (scene, layout event, prompt rebuilt)")
        if any((getattr(self.scene, key).height, getattr(self.scene, key).width) != shape for key in droid.CAMERA_KEYS):
            self.resize_cameras(shape)
            changes.append(f"image_shape: views {shape[0]}x{shape[1]}")
        return changes

    def resize_cameras(self, shape: tuple[int, int]) -> None:
        """Render the three views at ``shape`` (H, W), with the same fields of view."""
        height, width = (int(v) for v in shape)
        if height < 1 or width < 1:
            raise ValueError(f"image_shape: expected (height, width) >= 1, got {shape!r}")
        self.image_shape = (height, width)
        for key in droid.CAMERA_KEYS:
            camera = getattr(self.scene, key)
            fovy = WRIST_FOVY_DEG if key == "wrist_cam" else cameras.EXTERNAL_FOVY_DEG
            camera.height, camera.width, camera.spawn = height, width, _pinhole(fovy, (height, width))


@configclass
class DroidScene1EnvCfg(DroidNewtonEnvCfg):
    """Scene 1: put the cube in the bowl."""

    scene_id: int = 1


@configclass
class DroidScene2EnvCfg(DroidNewtonEnvCfg):
    """Scene 2: pick up the can and put it in the mug."""

    scene_id: int = 2


@configclass
class DroidScene3EnvCfg(DroidNewtonEnvCfg):
    """Scene 3: put the banana in the bin."""

    scene_id: int = 3
