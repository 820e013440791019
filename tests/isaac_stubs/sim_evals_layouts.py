"""Stand-ins of sim-evals' later layouts: per-scene gym ids (711ff04 and later) and the MILA tasks.

Modelled on sim-evals' ``environments/droid/{__init__,scenes,env_cfg}.py`` at 711ff04 and
``environments/mila/{__init__,tasks,rewards,mila_droid_environment}.py``:

- every DROID scene is its own gym id (:data:`PER_SCENE_IDS`), registered with a config *factory*
  (``DroidEnvCfg().set_scene(env_id)``); ``set_scene`` takes the id string, loads the scene USD and
  registers **no** entities: the objects are plain prims of the USD (``scene["rubiks_cube"]`` raises
  ``KeyError``), found by rigid-body prims in a USD read through the stand-in ``pxr``;
- ``sim_evals.environments.mila`` registers ``DROID-MILA`` (``MilaDroidEnvCfg().set_task(task_id)``);
  the task table (:data:`MILA_TASKS`) has each task's instruction, ``max_timesteps``, milestones and
  thresholds; ``set_task`` registers the object and the target as entities under their aliases, adds the
  ``milestones`` reward term (which keeps ``env._mila_milestones_reached`` ``(N, M)``, in order) and a
  ``reset_milestones`` reset event, and sets the episode length to ``max_timesteps`` steps.

``set_task`` also adds sim-evals' ``reset_initial_conditions`` class event term (pose sets of an
``initial_conditions.json`` dealt round-robin to the envs reset; the stand-in's file has five object
positions). Not modelled: the MILA scenes' contents, lights, hidden prims, camera poses, object
orientations (identity), the success hold steps of later versions.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch

from isaac_stubs.cfgs import (
    SCENE_BODIES,
    EventTermCfg,
    InitialStateCfg,
    RewardTermCfg,
    RigidObjectCfg,
)

ENV_NS = "{ENV_REGEX_NS}"

# gym id -> (scene number of the run_eval layout, instruction, USD under assets/)
PER_SCENE_IDS = {
    "DROID-CubeInBowl": (1, "put the cube in the bowl", "scene1.usd"),
    "DROID-CanInMug": (2, "put the can in the mug", "scene2.usd"),
    "DROID-BananaInBin": (3, "put banana in the bin", "scene3.usd"),
}


@dataclass(frozen=True)
class Milestone:
    name: str
    description: str = ""


@dataclass(frozen=True)
class MilaTask:
    """The fields of sim-evals' ``MilaTask`` the adapter and the milestone terms read."""

    task_id: str
    scene_asset: str
    language_instruction: str
    max_timesteps: int
    milestones: tuple[Milestone, ...]
    object_name: str
    target_name: str
    object_prim_path: str
    target_prim_path: str
    object_bbox_half_extents: tuple[float, float, float] | None = None
    object_bottom_center: tuple[float, float, float] | None = None
    object_mouth_center: tuple[float, float, float] | None = None
    target_region_extent_min: tuple[float, float, float] | None = None
    target_region_extent_max: tuple[float, float, float] | None = None
    target_region_tolerance: float = 0.01
    reach_distance: float = 0.03
    lift_height: float = 0.05
    target_xy_radius: float = 0.18
    above_target_height: float = 0.08
    in_target_height: float = 0.05
    release_gripper_threshold: float = 0.5
    bodies: dict = field(default_factory=dict)  # stand-in only: rigid-body prims of the scene USD -> env-local pos


def _milestones(*names):
    return tuple(Milestone(name) for name in names)


MILA_TASKS = {
    "place_spoon_in_sink": MilaTask(
        "place_spoon_in_sink",
        "Task2/Scene.usd",
        "Pick up the spoon and place it in the sink.",
        300,
        _milestones("reached_spoon", "lifted_up_spoon", "above_sink", "completely_in_sink"),
        "spoon",
        "sink",
        "Spoon054/Spoon054",
        "Sink081/Sink081",
        object_bbox_half_extents=(0.039, 0.181, 0.034),
        bodies={"Spoon054/Spoon054": (0.55, 0.10, 0.02), "Sink081/Sink081": (0.50, -0.30, -0.10)},
    ),
    "place_spoon_in_utensil_holder": MilaTask(
        "place_spoon_in_utensil_holder",
        "place_spoon_in_utensil_holder.usd",
        "Pick up the spoon and place it in the utensil holder.",
        400,
        _milestones("reached_spoon", "lifted_up_spoon", "above_utensil_holder", "released_in_utensil_holder"),
        "spoon",
        "utensil_holder",
        "Spoon054/Spoon054",
        "Cup082/Cup082",
        object_bbox_half_extents=(0.039, 0.181, 0.034),
        target_xy_radius=0.16,
        above_target_height=0.10,
        in_target_height=0.12,
        bodies={"Spoon054/Spoon054": (0.55, 0.10, 0.02), "Cup082/Cup082": (0.45, -0.25, 0.05)},
    ),
    "stack_red_bowl_into_grey_bowl": MilaTask(
        "stack_red_bowl_into_grey_bowl",
        "Task1/Scene.usd",
        "Pick up the red bowl and place it in the grey bowl.",
        600,
        _milestones("reached_red_bowl", "lifted_up_red_bowl", "above_grey_bowl", "placed_in_grey_bowl"),
        "red_bowl",
        "grey_bowl",
        "Bowl061/Bowl061",
        "Bowl062/Bowl062",
        object_bbox_half_extents=(0.079, 0.079, 0.030),
        object_bottom_center=(0.0, 0.0, -0.030),
        object_mouth_center=(0.0, 0.0, 0.030),
        target_region_extent_min=(-0.089, -0.089, -0.034),
        target_region_extent_max=(0.089, 0.089, 0.034),
        bodies={"Bowl061/Bowl061": (0.55, 0.15, 0.03), "Bowl062/Bowl062": (0.50, -0.20, 0.03)},
    ),
}


def get_mila_task(task_id: str) -> MilaTask:
    try:
        return MILA_TASKS[task_id]
    except KeyError:
        raise ValueError(
            f"Unsupported MILA task '{task_id}'. Supported tasks: {', '.join(sorted(MILA_TASKS))}"
        ) from None


def scene_asset_path(world, env_id: str) -> Path:
    path = Path(world.sim_evals_root) / "assets" / PER_SCENE_IDS[env_id][2]
    if not path.is_file():
        raise FileNotFoundError(f"Could not find asset for {env_id}. Checked:\n  - {path}")
    return path


def usd_bodies(usd_path: str) -> dict[str, tuple[float, float, float]]:
    """Rigid-body prims (path under ``/World`` -> position) of a stand-in scene USD, by its file name."""
    path = Path(str(usd_path))
    for task in MILA_TASKS.values():
        if str(path).endswith(task.scene_asset):
            return dict(task.bodies)
    digits = path.stem.removeprefix("scene")
    return dict(SCENE_BODIES.get(int(digits), {})) if digits.isdigit() else {}


def scene_rigid_bodies(cfg) -> dict[str, tuple[float, float, float]]:
    """The rigid-body prims under ``{ENV_REGEX_NS}/scene`` of an env config's scene USD."""
    scene = getattr(cfg.scene, "scene", None)
    usd = getattr(getattr(scene, "spawn", None), "usd_path", None)
    return usd_bodies(usd) if usd else {}


# -- pxr (only what sim-evals and the adapter call to read a scene USD) ----------------------------
class _Vec(tuple):
    pass


class _Quat:
    def __init__(self, wxyz):
        self._wxyz = tuple(float(v) for v in wxyz)

    def GetReal(self):
        return self._wxyz[0]

    def GetImaginary(self):
        return _Vec(self._wxyz[1:])


class _Matrix:
    def __init__(self, pos):
        self._pos = _Vec(float(v) for v in pos)

    def ExtractTranslation(self):
        return self._pos

    def RemoveScaleShear(self):
        return self  # no scale here (the real pxr's scaled transforms: test_isaac_wheels.py)

    def ExtractRotationQuat(self):
        return _Quat((1.0, 0.0, 0.0, 0.0))


class _UsdPrim:
    def __init__(self, path, pos=None):
        self.path, self.pos = path, pos

    def __bool__(self):
        return self.pos is not None

    def GetPath(self):
        return self.path


class _UsdStage:
    def __init__(self, bodies):
        self.bodies = bodies

    def GetPrimAtPath(self, path):
        leaf = str(path).removeprefix("/World/")
        return _UsdPrim(path, self.bodies.get(leaf))


def build_pxr(module, world) -> None:
    """``pxr.Usd``, ``pxr.UsdGeom``, ``pxr.UsdPhysics`` over the stand-in scene USDs (identity rotations)."""
    if not world.launched:
        raise ImportError("stand-in: pxr is importable only once the app runs")

    class Stage:
        @staticmethod
        def Open(path):
            world.log("usd.open", str(path))
            return _UsdStage(usd_bodies(path)) if Path(str(path)).is_file() else None

    class TimeCode:
        @staticmethod
        def Default():
            return None

    class Xformable:
        def __init__(self, prim):
            self.prim = prim

        def ComputeLocalToWorldTransform(self, time):
            return _Matrix(self.prim.pos)

    class RigidBodyAPI:
        def __init__(self, prim):
            self.prim = prim

        def __bool__(self):
            return bool(self.prim)

    module.Usd = type("Usd", (), {"Stage": Stage, "TimeCode": TimeCode})
    module.UsdGeom = type("UsdGeom", (), {"Xformable": Xformable})
    module.UsdPhysics = type("UsdPhysics", (), {"RigidBodyAPI": RigidBodyAPI})


# -- MILA milestone terms (sim-evals' rewards.py, for axis-aligned objects) -------------------------
def _raw(value):
    return value.torch if hasattr(value, "torch") and not callable(value.torch) else value


def reset_milestones(env, env_ids):
    task = get_mila_task(env.cfg.task_id)
    if getattr(env, "_mila_milestones_reached", None) is None:
        env._mila_milestones_reached = torch.zeros(env.num_envs, len(task.milestones), dtype=torch.bool)
        env._mila_initial_object_z = torch.zeros(env.num_envs)
    env._mila_milestones_reached[env_ids] = False
    env._mila_initial_object_z[env_ids] = _raw(env.scene[task.object_name].data.root_pos_w)[env_ids, 2]


def milestone_checks(env, task: MilaTask) -> dict[str, torch.Tensor]:
    obj = _raw(env.scene[task.object_name].data.root_pos_w)
    target = _raw(env.scene[task.target_name].data.root_pos_w)
    robot = env.scene["robot"]
    names = list(robot.data.body_names)
    fingers = _raw(robot.data.body_link_pos_w)[:, [names.index("left_inner_finger"), names.index("right_inner_finger")]]
    half = torch.tensor(task.object_bbox_half_extents)
    outside = torch.clamp((fingers - obj[:, None, :]).abs() - half, min=0.0)
    reached = torch.linalg.norm(outside, dim=-1).min(dim=1).values < task.reach_distance
    joint = list(robot.data.joint_names).index("finger_joint")
    gripper_open = _raw(robot.data.joint_pos)[:, joint] / (torch.pi / 4) < task.release_gripper_threshold
    xy = torch.linalg.norm(obj[:, :2] - target[:, :2], dim=1)
    lifted = obj[:, 2] > env._mila_initial_object_z + task.lift_height
    above = (xy < task.target_xy_radius) & (obj[:, 2] > target[:, 2] + task.above_target_height)
    above_anywhere = obj[:, 2] > target[:, 2] + task.above_target_height
    in_target = (xy < task.target_xy_radius) & (obj[:, 2] < target[:, 2] + task.in_target_height) & gripper_open
    inside = torch.zeros(env.num_envs, dtype=torch.bool)
    if task.target_region_extent_min is not None:
        points = obj[:, None, :] + torch.tensor((task.object_bottom_center, task.object_mouth_center))[None]
        local = points - target[:, None, :]
        low = torch.tensor(task.target_region_extent_min) - task.target_region_tolerance
        high = torch.tensor(task.target_region_extent_max) + task.target_region_tolerance
        inside = ((local >= low) & (local <= high)).all(dim=-1).all(dim=-1) & (points[:, 1, 2] > points[:, 0, 2])
    return {
        "reached_spoon": reached,
        "lifted_up_spoon": lifted,
        "above_sink": above,
        "completely_in_sink": in_target,
        "above_utensil_holder": above,
        "released_in_utensil_holder": in_target,
        "reached_red_bowl": reached,
        "lifted_up_red_bowl": lifted,
        "above_grey_bowl": above_anywhere,
        "placed_in_grey_bowl": inside & gripper_open,
    }


def milestone_reward(env, task_id: str):
    """Milestones reached in order (a milestone counts once the one before it has); newly reached / dt."""
    task = get_mila_task(task_id)
    if getattr(env, "_mila_milestones_reached", None) is None:
        reset_milestones(env, torch.arange(env.num_envs))
    reached = env._mila_milestones_reached
    checks = milestone_checks(env, task)
    newly = torch.zeros(env.num_envs)
    for index, milestone in enumerate(task.milestones):
        previous = torch.ones(env.num_envs, dtype=torch.bool) if index == 0 else reached[:, index - 1]
        now = checks[milestone.name] & previous
        newly += (now & ~reached[:, index]).float()
        reached[:, index] |= now
    return newly / env.step_dt


class reset_initial_conditions:
    """sim-evals' class event term: deals the next pose sets of a JSON file round-robin to the envs reset
    (``(current_index + j) % len`` to the j-th id), offset by each env's origin; ``current_index`` advances."""

    def __init__(self, cfg, env):
        import json

        with open(cfg.params.get("initial_conditions_file", ""), encoding="utf-8") as f:
            self.initial_conditions = json.load(f)["poses"]
        self.current_index = 0

    def __call__(self, env, env_ids, initial_conditions_file):
        if not isinstance(env_ids, torch.Tensor):  # as upstream: torch.tensor(env_ids) (a slice fails)
            env_ids = torch.tensor(env_ids)
        ids = env_ids.reshape(-1)
        if not self.initial_conditions or not ids.numel():
            return
        count = len(self.initial_conditions)
        for j, env_id in enumerate(ids.tolist()):
            for name, pose in self.initial_conditions[(self.current_index + j) % count].items():
                entity = env.scene[name]
                entity.pos[env_id] = torch.tensor(pose[:3], dtype=torch.float32) + env.origins[env_id]
                entity.vel[env_id] = 0.0
        self.current_index += ids.numel()


def initial_conditions_file(world, task: MilaTask) -> Path:
    """A stand-in ``initial_conditions.json``: five object positions (env-local), y in 5 cm steps."""
    import json

    path = Path(world.sim_evals_root) / "configs" / "mila" / task.task_id / "initial_conditions.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    x, y, z = task.bodies[task.object_prim_path]
    poses = [{task.object_name: [x, y + 0.05 * k, z, 1.0, 0.0, 0.0, 0.0]} for k in range(5)]
    path.write_text(json.dumps({"instruction": task.language_instruction, "poses": poses}))
    return path


def make_mila_cfg_class(world, droid_env_cfg):
    """``MilaDroidEnvCfg``: the per-scene ``DroidEnvCfg`` plus ``set_task(task_id)``."""
    from isaac_stubs.cfgs import AssetBaseCfg, UsdFileCfg

    class MilaDroidEnvCfg(droid_env_cfg):
        task_id = "place_spoon_in_sink"

        def set_task(self, task_id):
            world.log("cfg.set_task", task_id)
            task = get_mila_task(task_id)
            path = Path(world.sim_evals_root) / "assets" / "mila" / task.scene_asset
            if not path.is_file():
                raise FileNotFoundError(f"Could not open MILA scene asset: {path}")
            self.task_id = task.task_id
            self.scene.scene = AssetBaseCfg(prim_path=f"{ENV_NS}/scene", spawn=UsdFileCfg(usd_path=str(path)))
            for alias, prim in ((task.object_name, task.object_prim_path), (task.target_name, task.target_prim_path)):
                pos = task.bodies[prim]
                setattr(
                    self.scene,
                    alias,
                    RigidObjectCfg(prim_path=f"{ENV_NS}/scene/{prim}", init_state=InitialStateCfg(pos=pos)),
                )
            self.rewards.milestones = RewardTermCfg(func=milestone_reward, weight=1.0, params={"task_id": task.task_id})
            self.events.reset_initial_conditions = EventTermCfg(
                func=reset_initial_conditions,
                mode="reset",
                params={"initial_conditions_file": str(initial_conditions_file(world, task))},
            )
            self.events.reset_milestones = EventTermCfg(func=reset_milestones, mode="reset")
            self.episode_length_s = task.max_timesteps * self.sim.dt * self.decimation
            self.language_instruction = task.language_instruction
            # set_task repositions external_cam for the task and makes external_cam_2 the camera the
            # client sends as the first exterior view
            self.policy_external_camera = "external_cam_2"
            return self

    return MilaDroidEnvCfg
