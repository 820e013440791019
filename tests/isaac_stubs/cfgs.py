"""Stand-in config objects of Isaac Lab and sim-evals' DROID env config (the shapes the adapter edits).

Mirrors what sim_evals.md documents (and the pinned sim-evals source shows): ``EnvCfg`` with
``scene`` (a global sphere light at ``/World/spehre``, the robot, three 720x1280 cameras), the policy
observation terms with upstream's env-0 indexing, a ``time_out`` termination, 120 Hz physics with
decimation 8, 30 s episodes, and ``set_scene(k)`` registering the scene's rigid bodies as entities.
The 3.0 variant differs where Isaac Lab 3.0 does: ``sim.physics`` instead of ``sim.physx``,
``num_rerenders_on_reset`` instead of ``rerender_on_reset``, xyzw camera quaternions, ``mdp.image_rgb``.
"""

from __future__ import annotations

import copy
import math
from pathlib import Path

import numpy as np

ENV_NS = "{ENV_REGEX_NS}"


class Cfg:
    """Like Isaac Lab's ``configclass``: class-level defaults deep-copied per instance (callables shared)."""

    def __init__(self, **kwargs):
        for klass in reversed(type(self).__mro__):
            for key, value in vars(klass).items():
                if key.startswith("__") or callable(value) or isinstance(value, (property, staticmethod, classmethod)):
                    continue
                setattr(self, key, copy.deepcopy(value))
        for key, value in kwargs.items():
            setattr(self, key, value)
        post = getattr(self, "post_init", None)
        if post is not None:
            post()


# -- isaaclab.sim ----------------------------------------------------------------------------------
class SphereLightCfg(Cfg):
    intensity = 1000.0
    radius = 0.5


class DomeLightCfg(Cfg):
    intensity = 1000.0


class PinholeCameraCfg(Cfg):
    focal_length = 24.0
    horizontal_aperture = 20.955
    vertical_aperture = 15.2908


class UsdFileCfg(Cfg):
    usd_path = ""


class PhysxCfg(Cfg):
    enable_ccd = False
    gpu_temp_buffer_capacity = 2**24


class SimulationCfg(Cfg):
    dt = 1.0 / 60.0
    render_interval = 1
    device = "cuda:0"
    use_fabric = True


# -- isaaclab.assets / sensors / managers -----------------------------------------------------------
class InitialStateCfg(Cfg):
    pos = (0.0, 0.0, 0.0)
    rot = (1.0, 0.0, 0.0, 0.0)


class AssetBaseCfg(Cfg):
    prim_path = ""
    spawn = None
    init_state = InitialStateCfg()


class ArticulationCfg(AssetBaseCfg):
    pass


class RigidObjectCfg(AssetBaseCfg):
    pass


class OffsetCfg(Cfg):
    pos = (0.0, 0.0, 0.0)
    rot = (1.0, 0.0, 0.0, 0.0)
    convention = "opengl"


class CameraCfg(Cfg):
    prim_path = ""
    height = 720
    width = 1280
    data_types = ["rgb"]
    spawn = None
    offset = OffsetCfg()


class TiledCameraCfg(CameraCfg):
    pass


class SceneEntityCfg(Cfg):
    def __init__(self, name: str = "", **kwargs):
        super().__init__(name=name, **kwargs)


class ObservationTermCfg(Cfg):
    func = None
    params = {}
    noise = None
    clip = None


class TerminationTermCfg(Cfg):
    func = None
    params = {}
    time_out = False


class EventTermCfg(Cfg):
    func = None
    mode = "reset"
    params = {}


class RewardTermCfg(Cfg):
    func = None
    weight = 1.0
    params = {}


class ObservationGroupCfg(Cfg):
    enable_corruption = True
    concatenate_terms = True


# -- sim-evals' DROID config --------------------------------------------------------------------------
ARM_JOINTS = [f"panda_joint{i}" for i in range(1, 8)]
HOME = (0.0, -math.pi / 5, 0.0, -4 * math.pi / 5, 0.0, 3 * math.pi / 5, 0.0)

# Rigid bodies of each scene USD (name -> env-local position), as sim-evals' set_scene finds them.
SCENE_BODIES = {
    1: {"rubiks_cube": (0.55, 0.12, 0.03), "_24_bowl": (0.50, -0.18, 0.02)},
    2: {"_10_potted_meat_can": (0.52, 0.15, 0.05), "_25_mug": (0.55, -0.15, 0.04), "_11_banana": (0.35, 0.3, 0.02)},
    3: {"_11_banana": (0.50, 0.15, 0.02), "Magenta_Box": (0.55, -0.20, 0.05)},
}


def upstream_arm_joint_pos(env, asset_cfg=None):
    """sim-evals' term: ``joint_pos[0, ids]`` -- env 0 only, no batch dimension (the bug)."""
    robot = env.scene["robot" if asset_cfg is None else asset_cfg.name]
    names = ARM_JOINTS
    ids = [i for i, name in enumerate(robot.data.joint_names) if name in names]
    return _raw(robot.data.joint_pos)[0, ids]


def upstream_gripper_pos(env, asset_cfg=None):
    """sim-evals' term: ``joint_pos[0, finger] / (pi/4)`` -- env 0 only (the bug)."""
    robot = env.scene["robot" if asset_cfg is None else asset_cfg.name]
    ids = [i for i, name in enumerate(robot.data.joint_names) if name in ["finger_joint"]]
    return _raw(robot.data.joint_pos)[0, ids] / (np.pi / 4)


def _raw(value):
    # upstream indexes the data field directly; a 3.0 ProxyArray allows that through its bridge
    return value.torch if hasattr(value, "torch") and not callable(value.torch) else value


def make_env_cfg_class(world, per_scene: bool = False):
    """sim-evals' ``EnvCfg`` (``run_eval.py`` layout) or, with ``per_scene``, its scene-agnostic
    ``DroidEnvCfg`` of 711ff04 (``set_scene(env_id: str)`` loads the USD only: objects stay plain prims)."""
    from isaac_stubs import mdp_functions

    v3 = world.is_v3

    def camera(prim, pos, rot_wxyz, focal):
        rot = rot_wxyz if not v3 else (rot_wxyz[1], rot_wxyz[2], rot_wxyz[3], rot_wxyz[0])
        return CameraCfg(
            prim_path=prim,
            height=720,
            width=1280,
            data_types=["rgb"],
            spawn=PinholeCameraCfg(focal_length=focal, horizontal_aperture=5.376, vertical_aperture=3.024),
            offset=OffsetCfg(pos=pos, rot=rot, convention="opengl"),
        )

    def image_term(name):  # mdp.observations.image on both (3.0.0 has no mdp.image_rgb)
        params = {"sensor_cfg": SceneEntityCfg(name), "data_type": "rgb", "normalize": False}
        return ObservationTermCfg(func=mdp_functions.image, params=params)

    class SceneCfg(Cfg):
        num_envs = 1
        env_spacing = 7.0
        sphere_light = AssetBaseCfg(
            prim_path="/World/spehre",
            spawn=SphereLightCfg(intensity=5000.0),
            init_state=InitialStateCfg(pos=(0.0, -0.6, 0.7)),
        )
        robot = ArticulationCfg(prim_path=f"{ENV_NS}/robot", init_state=InitialStateCfg())
        external_cam = camera(f"{ENV_NS}/external_cam", (0.05, 0.57, 0.66), (-0.393, -0.195, 0.399, 0.805), 2.1)
        external_cam_2 = camera(f"{ENV_NS}/external_cam_2", (0.05, -0.57, 0.66), (0.805, 0.399, -0.195, -0.393), 2.1)
        wrist_cam = camera(
            f"{ENV_NS}/robot/Gripper/Robotiq_2F_85/base_link/wrist_cam",
            (0.011, -0.031, -0.074),
            (-0.420, 0.570, 0.576, -0.409),
            2.8,
        )

        def dynamic_scene(self, scene_name):
            if per_scene:
                from isaac_stubs import sim_evals_layouts

                path = sim_evals_layouts.scene_asset_path(world, scene_name)
                self.scene = AssetBaseCfg(prim_path=f"{ENV_NS}/scene", spawn=UsdFileCfg(usd_path=str(path)))
                return {"scene_env_id": scene_name, "scene_asset_path": str(path)}
            path = Path(world.sim_evals_root) / "assets" / f"scene{scene_name}.usd"
            if not path.is_file():
                raise FileNotFoundError(f"stand-in USD open failed: {path}")
            self.scene = AssetBaseCfg(prim_path=f"{ENV_NS}/scene", spawn=UsdFileCfg(usd_path=str(path)))
            for name, pos in SCENE_BODIES[int(scene_name)].items():
                setattr(
                    self,
                    name,
                    RigidObjectCfg(prim_path=f"{ENV_NS}/scene/{name}", spawn=None, init_state=InitialStateCfg(pos=pos)),
                )

    class PolicyCfg(ObservationGroupCfg):
        arm_joint_pos = ObservationTermCfg(func=upstream_arm_joint_pos)
        gripper_pos = ObservationTermCfg(func=upstream_gripper_pos, noise={"std": 0.05}, clip=(0, 1))
        external_cam = image_term("external_cam")
        external_cam_2 = image_term("external_cam_2")
        wrist_cam = image_term("wrist_cam")

        def post_init(self):
            self.enable_corruption = False
            self.concatenate_terms = False

    class ObservationCfg(Cfg):
        policy = PolicyCfg()

    class TerminationsCfg(Cfg):
        time_out = TerminationTermCfg(func=mdp_functions.time_out, time_out=True)

    class EventCfg(Cfg):
        reset_all = EventTermCfg(func=mdp_functions.reset_scene_to_default, mode="reset")

    class Empty(Cfg):
        pass

    class EnvCfg(Cfg):
        scene = SceneCfg(num_envs=1, env_spacing=7.0)
        observations = ObservationCfg()
        terminations = TerminationsCfg()
        events = EventCfg()
        rewards = Empty()
        commands = Empty()
        curriculum = Empty()
        sim = SimulationCfg()

        def post_init(self):
            self.episode_length_s = 30
            self.decimation = 8
            self.sim.dt = 1 / (15 * 8)
            self.sim.render_interval = self.decimation
            physx = PhysxCfg(enable_ccd=True, gpu_temp_buffer_capacity=2**30)
            if v3:
                self.sim.physics = physx
                self.num_rerenders_on_reset = 1
            else:
                self.sim.physx = physx
                self.rerender_on_reset = True

        def set_scene(self, scene_name):
            world.log("cfg.set_scene", scene_name)
            if per_scene:
                from isaac_stubs import sim_evals_layouts

                if not isinstance(scene_name, str):
                    raise ValueError(
                        f"Unknown DROID environment {scene_name!r}. Valid env ids: {', '.join(sim_evals_layouts.PER_SCENE_IDS)}"
                    )
                spec = sim_evals_layouts.PER_SCENE_IDS.get(scene_name)
                if spec is None:
                    raise ValueError(
                        f"Unknown DROID environment {scene_name!r}. Valid env ids: {', '.join(sim_evals_layouts.PER_SCENE_IDS)}"
                    )
                self.scene_env_id = scene_name
                self.language_instruction = spec[1]
                self.scene_asset_path = self.scene.dynamic_scene(scene_name)["scene_asset_path"]
                return self
            self.scene.dynamic_scene(scene_name)

    return EnvCfg
