"""Stand-in ``isaaclab`` / ``isaaclab_tasks`` / ``sim_evals`` modules for testing the Isaac backend on a CPU.

:func:`install` puts an import finder in ``sys.meta_path`` that serves these modules (so
``importlib.util.find_spec`` sees them without importing them, and importing them is recorded), for an
Isaac Lab ``"2.2"`` or ``"3.0"``; :class:`World` records every call in order (``world.calls``).

Reproduced: the launchers (2.2 ``AppLauncher`` with ``add_app_launcher_args``; 3.0 ``launch_simulation``
context and ``add_launcher_args``, ``AppLauncher`` deprecated), ``parse_env_cfg`` (both signatures),
sim-evals' registration of the ``DROID`` gym id on import of ``sim_evals.environments`` (which fails
unless the app runs, as importing ``pxr``/``omni`` does), its ``EnvCfg`` with ``set_scene`` and the
env-0 observation bug, and an env with Isaac Lab's step/reset order (see :mod:`dz_gym.testing.isaac_stubs.sim`).

What it cannot verify (only a machine with Isaac Sim and an RTX GPU can):

- that Isaac Sim starts, renders, and what the images look like; whether the RTX-less GPU heuristic is
  right for a given GPU;
- PhysX: contacts, grasps, object dynamics, numerical equality of batched vs single-env physics;
- the real names and layout in sim-evals' USD assets (body names of the gripper, entity names, whether
  the scene USDs contain DomeLights), the real Isaac Lab 3.0 argument names of ``launch_simulation``;
- that Fabric propagates the dome-light edits to the renderer, and how stale the first frame after a
  reset really is on a given Isaac Lab version;
- memory and speed with N envs x 3 cameras at 720p.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.abc
import importlib.machinery
import sys
import types
import warnings
from pathlib import Path

import gymnasium as gym

PREFIXES = ("isaaclab", "isaaclab_tasks", "sim_evals")


class World:
    """State shared by the stand-in modules of one test: version, call log, whether the app runs."""

    def __init__(self, version: str, sim_evals_root: Path, scene_dome_light: bool = True):
        self.version = version
        self.is_v3 = version.startswith("3")
        self.sim_evals_root = Path(sim_evals_root)
        self.scene_dome_light = scene_dome_light
        self.calls: list[tuple] = []
        self.launched = False
        self.envs: list = []

    def log(self, name, *args):
        self.calls.append((name, *args))

    def names(self) -> list[str]:
        return [call[0] for call in self.calls]

    def index(self, name: str) -> int:
        return self.names().index(name)

    @property
    def env(self):
        return self.envs[-1]


def make_sim_evals_checkout(root: Path, scenes=(1, 2, 3)) -> Path:
    """A sim-evals checkout layout: ``src/sim_evals/environments/`` and ``assets/*.usd`` (empty files)."""
    (root / "src" / "sim_evals" / "environments").mkdir(parents=True, exist_ok=True)
    (root / "assets").mkdir(exist_ok=True)
    for scene in scenes:
        (root / "assets" / f"scene{scene}.usd").write_text("#usda 1.0\n")
    (root / "assets" / "franka_robotiq_2f_85_flattened.usd").write_text("#usda 1.0\n")
    return root


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def __init__(self, world: World):
        self.world = world
        self.builders = _builders(world)

    def find_spec(self, fullname, path=None, target=None):
        if fullname not in self.builders:
            return None
        is_package = fullname in ("isaaclab", "isaaclab.envs", "isaaclab_tasks", "sim_evals")
        origin = "stand-in"
        if fullname == "sim_evals":
            origin = str(self.world.sim_evals_root / "src" / "sim_evals" / "__init__.py")
        spec = importlib.machinery.ModuleSpec(fullname, self, origin=origin, is_package=is_package)
        if fullname == "sim_evals":
            spec.submodule_search_locations = [str(self.world.sim_evals_root / "src" / "sim_evals")]
        return spec

    def create_module(self, spec):
        return None

    def exec_module(self, module):
        self.world.log("import", module.__name__)
        self.builders[module.__name__](module)


def install(version: str, sim_evals_root: Path, **options) -> World:
    """Serve the stand-ins for Isaac Lab ``version`` ("2.2" or "3.0"); returns the call-recording world."""
    uninstall()
    world = World(version, sim_evals_root, **options)
    finder = _Finder(world)
    sys.meta_path.insert(0, finder)
    return world


def uninstall() -> None:
    """Remove the finder, the stand-in modules and the ``DROID`` gym registration."""
    sys.meta_path[:] = [f for f in sys.meta_path if not isinstance(f, _Finder)]
    for name in list(sys.modules):
        if name.split(".")[0] in PREFIXES:
            del sys.modules[name]
    gym.registry.pop("DROID", None)


def _builders(world: World):
    from dz_gym.testing.isaac_stubs import cfgs, mdp_functions, sim

    env_class = sim.StandInRLEnv30 if world.is_v3 else sim.StandInRLEnv22
    env_class.world = world

    def isaaclab(m):
        m.__version__ = "3.0.0" if world.is_v3 else "2.2.0"

    def app(m):
        class SimulationApp:
            def close(self):
                world.log("app.close")
                world.launched = False

        class AppLauncher:
            def __init__(self, args=None, **kwargs):
                if world.is_v3:
                    warnings.warn("AppLauncher is deprecated; use launch_simulation", DeprecationWarning, stacklevel=2)
                args = vars(args) if isinstance(args, argparse.Namespace) else dict(args or {}, **kwargs)
                world.log("app.launch", dict(args))
                world.launched = True
                self.app = SimulationApp()

            @staticmethod
            def add_app_launcher_args(parser):
                world.log("app.add_args")
                parser.add_argument("--headless", action="store_true", default=False)
                parser.add_argument("--device", type=str, default="cuda:0")
                parser.add_argument("--enable_cameras", action="store_true", default=False)
                parser.add_argument("--livestream", type=int, default=-1)
                parser.add_argument("--kit_args", type=str, default="")

        m.AppLauncher = AppLauncher
        if world.is_v3:

            def add_launcher_args(parser):
                world.log("app.add_args")
                parser.add_argument("--device", type=str, default=None)
                parser.add_argument("--visualizer", "--viz", type=str, nargs="*", default=[])
                parser.add_argument("--enable_cameras", action="store_true", default=False)
                parser.add_argument("--physics", type=str, default=None)

            @contextlib.contextmanager
            def launch_simulation(cfg, launcher_args=None):
                args = vars(launcher_args) if isinstance(launcher_args, argparse.Namespace) else dict(launcher_args or {})
                world.log("app.launch", dict(args), cfg)
                world.launched = True
                try:
                    yield None
                finally:
                    world.log("app.close")
                    world.launched = False

            m.add_launcher_args = add_launcher_args
            m.launch_simulation = launch_simulation

    def managers(m):
        m.TerminationTermCfg = cfgs.TerminationTermCfg
        m.ObservationTermCfg = cfgs.ObservationTermCfg
        m.ObservationGroupCfg = cfgs.ObservationGroupCfg
        m.SceneEntityCfg = cfgs.SceneEntityCfg
        m.EventTermCfg = cfgs.EventTermCfg

    def sensors(m):
        m.CameraCfg = cfgs.CameraCfg
        m.TiledCameraCfg = cfgs.TiledCameraCfg

    def envs(m):
        m.ManagerBasedRLEnv = env_class

    def mdp(m):
        m.observations = types.SimpleNamespace(image=mdp_functions.image)
        m.time_out = mdp_functions.time_out
        m.reset_scene_to_default = mdp_functions.reset_scene_to_default
        if world.is_v3:
            m.image_rgb = mdp_functions.image_rgb

    def tasks(m):
        pass

    def tasks_utils(m):
        def load(task_name):
            spec = gym.spec(task_name)
            return spec.kwargs["env_cfg_entry_point"]()

        if world.is_v3:

            def parse_env_cfg(task_name, device=None, num_envs=None, use_fabric=None, overrides=()):
                world.log("parse_env_cfg", task_name, {"device": device, "num_envs": num_envs, "use_fabric": use_fabric})
                cfg = load(task_name)
                if device is not None:
                    cfg.sim.device = device
                if use_fabric is not None:
                    cfg.sim.use_fabric = use_fabric
                if num_envs is not None:
                    cfg.scene.num_envs = num_envs
                return cfg

        else:

            def parse_env_cfg(task_name, device="cuda:0", num_envs=None, use_fabric=None):
                world.log("parse_env_cfg", task_name, {"device": device, "num_envs": num_envs, "use_fabric": use_fabric})
                cfg = load(task_name)
                cfg.sim.device = device
                if use_fabric is not None:
                    cfg.sim.use_fabric = use_fabric
                if num_envs is not None:
                    cfg.scene.num_envs = num_envs
                return cfg

        m.parse_env_cfg = parse_env_cfg

    def sim_evals_pkg(m):
        pass

    def sim_evals_environments(m):
        if not world.launched:
            raise ImportError("No module named 'pxr' (stand-in: sim_evals.environments imported before the app launched)")
        env_cfg = cfgs.make_env_cfg_class(world)
        m.EnvCfg = env_cfg
        m.arm_joint_pos = cfgs.upstream_arm_joint_pos
        m.gripper_pos = cfgs.upstream_gripper_pos
        gym.register(
            id="DROID",
            entry_point=lambda **kwargs: _make_env(env_class, world, **kwargs),
            kwargs={"env_cfg_entry_point": env_cfg},
            disable_env_checker=True,
        )

    return {
        "isaaclab": isaaclab,
        "isaaclab.app": app,
        "isaaclab.managers": managers,
        "isaaclab.sensors": sensors,
        "isaaclab.envs": envs,
        "isaaclab.envs.mdp": mdp,
        "isaaclab_tasks": tasks,
        "isaaclab_tasks.utils": tasks_utils,
        "sim_evals": sim_evals_pkg,
        "sim_evals.environments": sim_evals_environments,
    }


def _make_env(env_class, world, cfg, **kwargs):
    world.log("gym.make", cfg)
    env = env_class(cfg, **kwargs)
    world.envs.append(env)
    return env
