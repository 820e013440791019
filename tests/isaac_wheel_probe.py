"""Runs the Isaac backend against the installed real isaaclab wheel in a fresh process; prints what it saw as JSON.

``python isaac_wheel_probe.py SCENARIO`` (test_isaac_wheels.py runs it and asserts on the JSON):

- ``wheel``: the wheel as installed, with Isaac Sim's own modules faked (:mod:`isaac_kit`): version
  detection, the package check, the launcher flags, the launch up to ``SimulationApp``, and after it the
  real config classes, ``parse_env_cfg``, the mdp terms, quaternion order and ``reset`` signature;
- ``nokit``: the wheel without Isaac Sim (an ``isaaclab`` wheel alone): ``--backend auto`` and the CLI;
- ``source``: the wheel's sources as a source install (``pip install -e source/isaaclab`` gives the
  extension's version as the package's): version detection and the package check.

Each scenario runs in its own process because Isaac Lab's launcher changes process state for good
(``sys.argv``, signal handlers, ``sys.stdout``) and Isaac Sim starts once per process.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import importlib.metadata
import inspect
import json
import re
import sys
import tempfile
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import isaac_kit  # noqa: E402

OUT: dict = {}


@contextlib.contextmanager
def step(name: str):
    """Record a step's outcome under ``name`` (``"error"``: the exception, in one line) and go on."""
    try:
        yield
    except BaseException as exc:  # noqa: BLE001 (a probe reports, the test decides)
        OUT.setdefault("errors", {})[name] = f"{type(exc).__name__}: {exc}".splitlines()[0][:500]
        OUT.setdefault("tracebacks", {})[name] = traceback.format_exc()[-3000:]


def version() -> str:
    return importlib.metadata.version("isaaclab")


def is_v3() -> bool:
    return version().startswith("3")


def flags_of(parser: argparse.ArgumentParser) -> list[str]:
    return sorted(option for action in parser._actions for option in action.option_strings)


def scenario_wheel() -> None:
    from dz_gym.envs.isaac import checks, compat, launch

    kit = isaac_kit.install("6.0.0" if is_v3() else "5.0.0")
    OUT["dist_version"] = version()
    with step("detect"):
        api = compat.detect()
        OUT["detect"] = [list(api.version), api.source, api.has_launch_simulation]
    with step("checkout"):
        # a checkout on PYTHONPATH has no package metadata: 3.0.0's isaaclab/__init__.py then says "0.0.0"
        folder = compat.isaaclab_folder()
        fallback = re.search(r'__version__ = "([^"]+)"', (folder / "__init__.py").read_text())
        OUT["checkout_fallback_version"] = fallback.group(1) if fallback else None
        install = compat.Install(None, OUT["checkout_fallback_version"], compat.has_launch_simulation(folder))
        try:
            OUT["checkout_release"] = list(compat.release_of(install)[0])
        except compat.BackendUnavailable as exc:
            OUT["checkout_release"] = str(exc)
    with step("packages"):
        OUT["tasks_found_before_launch"] = checks.isaaclab_tasks_installed()
        OUT["tasks_find_spec_before_launch"] = importlib.util.find_spec("isaaclab_tasks") is not None
        try:
            checks.check_packages()
            OUT["check_packages"] = "ok"
        except checks.BackendUnavailable as exc:
            OUT["check_packages"] = str(exc)
    with step("launcher_flags"):
        parser = argparse.ArgumentParser()
        launch.add_launcher_args(parser)
        OUT["launcher_flags"] = flags_of(parser)
    with step("launch"):
        app = launch.launch_app(headless=True, device="cpu")
        OUT["apps"] = [[dict(a.config), Path(a.experience).name] for a in kit.apps]
        OUT["launch_args"] = {k: v for k, v in vars(app.args).items() if isinstance(v, (bool, int, str, list))}
    after_launch(kit)
    with step("close"):
        launch.close_app()
        OUT["closed"] = [a.closed for a in kit.apps]


def after_launch(kit) -> None:
    from dz_gym.envs.isaac import compat

    api = compat.detect()
    for name in ("isaaclab.managers", "isaaclab.envs", "isaaclab.envs.mdp", "isaaclab.assets", "isaaclab.sensors"):
        with step(f"import {name}"):
            importlib.import_module(name)
    with step("quaternion_order"):
        OUT["quaternion_order"] = compat.quaternion_order()
    with step("image_term"):
        term = api.image_term()
        mdp = importlib.import_module("isaaclab.envs.mdp")
        OUT["image_term"] = [term.__name__, isinstance(term, type), hasattr(mdp, "image"), hasattr(mdp, "image_rgb")]
    with step("reset_signature"):
        envs = importlib.import_module("isaaclab.envs")
        OUT["reset_signature"] = str(inspect.signature(envs.ManagerBasedRLEnv.reset))
    with step("patch_env_cfg"):
        OUT["patch"] = patch_real_cfg(api)
    with step("parse_env_cfg"):
        task = "Isaac-Reach-Franka" if api.is_v3 else "Isaac-Reach-Franka-v0"  # 3.0 dropped the -v0 suffixes
        cfg = api.parse_env_cfg(task, device="cpu", num_envs=3)
        OUT["parse_env_cfg"] = [type(cfg).__name__, cfg.scene.num_envs, cfg.sim.device, cfg.sim.use_fabric]
    with step("prim_entities"):
        OUT["prim_entities"] = prim_entities(api)


def patch_real_cfg(api) -> dict:
    """A config shaped as sim-evals' DROID one (its term and entity names), made of the real Isaac Lab classes,
    through the backend's patches."""
    import isaaclab.envs.mdp as mdp
    import isaaclab.sim as sim_utils
    from isaaclab.assets import AssetBaseCfg
    from isaaclab.envs import ManagerBasedRLEnvCfg
    from isaaclab.managers import (
        ObservationGroupCfg,
        ObservationTermCfg,
        RewardTermCfg,
        SceneEntityCfg,
        TerminationTermCfg,
    )
    from isaaclab.scene import InteractiveSceneCfg
    from isaaclab.sensors import CameraCfg
    from isaaclab.utils import configclass

    from dz_gym.envs import droid
    from dz_gym.envs.isaac.build import MilestoneProbe
    from dz_gym.envs.isaac.config import patch_env_cfg
    from dz_gym.envs.isaac.state import StateProbe

    image = api.image_term()

    def camera(path):
        return CameraCfg(prim_path=path, height=720, width=1280, data_types=["rgb"], spawn=sim_utils.PinholeCameraCfg())

    def image_obs(name):
        return ObservationTermCfg(
            func=image, params={"sensor_cfg": SceneEntityCfg(name), "data_type": "rgb", "normalize": False}
        )

    @configclass
    class SceneCfg(InteractiveSceneCfg):
        sphere_light = AssetBaseCfg(
            prim_path="/World/spehre",
            spawn=sim_utils.SphereLightCfg(intensity=5000.0, radius=0.1),
            init_state=AssetBaseCfg.InitialStateCfg(pos=(0.0, -0.6, 0.7)),
        )
        dome_light = AssetBaseCfg(prim_path="/World/DomeLight", spawn=sim_utils.DomeLightCfg(intensity=300.0))
        external_cam = camera("{ENV_REGEX_NS}/external_cam")
        external_cam_2 = camera("{ENV_REGEX_NS}/external_cam_2")
        wrist_cam = camera("{ENV_REGEX_NS}/robot/wrist_cam")

    @configclass
    class PolicyCfg(ObservationGroupCfg):
        arm_joint_pos = ObservationTermCfg(func=mdp.joint_pos)
        gripper_pos = ObservationTermCfg(func=mdp.joint_pos, clip=(0.0, 1.0))
        external_cam = image_obs("external_cam")
        external_cam_2 = image_obs("external_cam_2")
        wrist_cam = image_obs("wrist_cam")

        def __post_init__(self):
            self.concatenate_terms = False

    @configclass
    class ObservationsCfg:
        policy = PolicyCfg()

    @configclass
    class TerminationsCfg:
        time_out = TerminationTermCfg(func=mdp.time_out, time_out=True)

    @configclass
    class RewardsCfg:
        milestones = RewardTermCfg(func=mdp.is_alive, weight=0.0)

    @configclass
    class EnvCfg(ManagerBasedRLEnvCfg):
        scene = SceneCfg(num_envs=4, env_spacing=7.0)
        observations = ObservationsCfg()
        terminations = TerminationsCfg()
        rewards = RewardsCfg()

    cfg = EnvCfg()
    scene = droid.scene_spec(1)
    probe = StateProbe(api, scene)
    changes = patch_env_cfg(
        cfg, api, probe_term=probe.term, env_spacing=30.0, image_shape=(4, 6), tiled_cameras=not api.is_v3
    )
    changes.append(MilestoneProbe(("reached",)).install(cfg))
    policy = cfg.observations.policy
    probe_term = cfg.terminations.dz_gym_state_probe
    return {
        "changes": len(changes),
        "arm_func": policy.arm_joint_pos.func.__name__,
        "gripper_func": policy.gripper_pos.func.__name__,
        "gripper_clip": list(policy.gripper_pos.clip),
        "sphere_light": cfg.scene.sphere_light.prim_path,
        "dome_light": cfg.scene.dome_light.prim_path,
        "rerender": [getattr(cfg, "rerender_on_reset", None), getattr(cfg, "num_rerenders_on_reset", None)],
        "probe_term": [type(probe_term).__name__, probe_term.time_out, probe_term.func is probe.term],
        "reward_probe": type(cfg.rewards.dz_gym_milestone_probe).__name__,
        "env_spacing": cfg.scene.env_spacing,
        "cameras": [
            [type(getattr(cfg.scene, k)).__name__, getattr(cfg.scene, k).height, getattr(cfg.scene, k).width]
            for k in droid.CAMERA_KEYS
        ],
        "to_dict": sorted(cfg.to_dict()["observations"]["policy"])[:3],
    }


def prim_entities(api) -> dict:
    """``register_prim_entities`` on a real USD stage (usd-core's ``pxr``): a rigid body under a scaled,
    rotated transform, as sim-evals' scene USDs have."""
    from pxr import Gf, Usd, UsdGeom, UsdPhysics

    from dz_gym.envs.isaac.build import register_prim_entities

    path = Path(tempfile.mkdtemp()) / "scene1.usd"
    stage = Usd.Stage.CreateNew(str(path))
    UsdGeom.Xform.Define(stage, "/World")
    body = UsdGeom.Xform.Define(stage, "/World/Spoon054/Spoon054")
    UsdPhysics.RigidBodyAPI.Apply(body.GetPrim())
    half = 0.5**0.5
    body.AddTranslateOp().Set(Gf.Vec3d(0.5, 0.1, 0.02))
    body.AddOrientOp().Set(Gf.Quatf(half, 0.0, 0.0, half))  # 90 degrees about z
    body.AddScaleOp().Set(Gf.Vec3f(2.0, 2.0, 2.0))
    stage.GetRootLayer().Save()

    class Scene:
        pass

    class Cfg:
        scene_asset_path = str(path)
        scene = Scene()

    cfg = Cfg()
    register_prim_entities(cfg, api, {"spoon": "Spoon054/Spoon054"})
    entity = cfg.scene.spoon
    return {
        "type": type(entity).__name__,
        "prim_path": entity.prim_path,
        "pos": [round(v, 6) for v in entity.init_state.pos],
        "rot": [round(v, 6) for v in entity.init_state.rot],
    }


def scenario_nokit() -> None:
    from dz_gym.envs import backends
    from dz_gym.envs.isaac import checks, compat, launch
    from dz_gym.eval import flags

    OUT["dist_version"] = version()
    OUT["isaacsim_found"] = importlib.util.find_spec("isaacsim") is not None
    OUT["kitless_found"] = all(importlib.util.find_spec(name) is not None for name in checks.KITLESS_STACK)
    OUT["auto"] = backends.resolve("auto")
    OUT["flags_wanted_auto"] = launch.isaac_flags_wanted([])
    with step("detect"):
        OUT["detect"] = list(compat.detect().version)
    with step("add_launcher_args"):
        parser = argparse.ArgumentParser()
        launch.add_launcher_args(parser)
        OUT["launcher_flags"] = flags_of(parser)
    with step("build_parser"):
        parser = flags.build_parser(isaac_args=True)  # as when --backend isaac is given
        OUT["cli_flags_with_isaac"] = flags_of(parser)


def scenario_source() -> None:
    """The wheel's own sources laid out as a source install: the framework packages on ``sys.path``, and the
    package metadata a ``pip install -e source/isaaclab`` writes (the extension's version)."""
    from dz_gym.envs.isaac import checks, compat

    root = isaac_kit.wheel_root()
    source = root / "source"
    if (source / "isaaclab" / "isaaclab").is_dir():  # 2.x: the framework lives under source/
        extension = (source / "isaaclab" / "config" / "extension.toml").read_text()
        folders = [source / name for name in ("isaaclab", "isaaclab_tasks")]
    else:  # 3.0: the wheel's top-level packages are the framework; source/ keeps the projects' metadata
        extension = (source / "isaaclab" / "pyproject.toml").read_text()
        folders = []
    ext_version = re.search(r'^version\s*=\s*"([^"]+)"', extension, re.M).group(1)
    meta = Path(tempfile.mkdtemp()) / "site"
    dist = meta / f"isaaclab-{ext_version}.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: isaaclab\nVersion: {ext_version}\n")
    for folder in [meta, *folders][::-1]:
        sys.path.insert(0, str(folder))
    importlib.invalidate_caches()
    OUT["extension_version"] = ext_version
    with step("detect"):
        api = compat.detect()
        OUT["detect"] = [list(api.version), api.source, api.has_launch_simulation]
    with step("packages"):
        OUT["tasks_found"] = checks.isaaclab_tasks_installed()
        try:
            checks.check_packages()
            OUT["check_packages"] = "ok"
        except checks.BackendUnavailable as exc:
            OUT["check_packages"] = str(exc)


if __name__ == "__main__":
    globals()[f"scenario_{sys.argv[1]}"]()
    sys.stdout.flush()
    sys.__stdout__.write("\nPROBE " + json.dumps(OUT, default=str) + "\n")
