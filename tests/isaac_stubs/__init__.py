"""The stand-in of what the Isaac backend's tests cannot have for real: Kit with the simulator, and sim-evals.

This is the one place that says what the stand-in models and from where. Test code only (``tests/``): it
is not in the package, and its import finder exists only in a test's process (:func:`install`, undone by
:func:`uninstall`). Where a real package can run on a CPU, the tests use it instead: the isaaclab 2.2.0 and
3.0.0 wheels' own code, with only Isaac Sim's modules faked, is tested by ``tests/test_isaac_wheels.py``
(``tests/isaac_kit.py`` is that fake). What is modelled here, and from which upstream source:

- **Kit and the simulator** (Isaac Sim 5.0 under Isaac Lab 2.2.0; Isaac Lab 3.0.0's Kit launcher): the app
  start and close (``AppLauncher``; 3.0's ``isaaclab.app.launch_simulation`` in ``isaaclab/app/sim_launcher.py``,
  which develop snapshots before extension 6.2.1 lack), and a ``ManagerBasedRLEnv`` that steps a tiny
  kinematic world with Isaac Lab's step/reset/manager semantics (:mod:`isaac_stubs.sim`, from the
  releases' ``envs/manager_based_rl_env.py``): reset signatures (2.2 ``reset(seed=None, env_ids=None,
  options=None)``, 3.0 ``reset(env_ids=slice(None), *, seed=None, options=None)``), in-place termination
  buffers, the env-origin grid, ``ProxyArray`` asset data on 3.0, ``find_bodies`` raising ``ValueError``,
  the stale first frame after a reset, lights and a stage with dome and distant lights;
- **the Isaac Lab API surface the backend reaches through the simulator** (``isaaclab``, ``isaaclab_tasks``
  as the backend imports them after launch): config classes shaped as the releases' (:mod:`isaac_stubs.cfgs`),
  ``parse_env_cfg`` with both releases' signatures, ``mdp.image`` (2.2) / ``mdp.image_rgb`` (3.0), the
  identity quaternion order of ``InitialStateCfg`` (w-x-y-z on 2.2, x-y-z-w on 3.0), and the package
  metadata of ``install`` "wheel" (2.2.0, 3.0.0) or "source" (the extension's: 0.44.9 for 2.2.0, 28.0.0 for
  3.0.0, 6.2.1 / 3.5.3 for ``release`` "develop" / "develop-old");
- **sim-evals** (not on PyPI), by ``layout`` (:data:`SIM_EVALS_LAYOUTS`, each the commit that has it):
  ``run_eval`` (3a6b0e8: gym id ``DROID``, ``set_scene(scene: int)`` registering the rigid bodies),
  ``per_scene`` (711ff04: one gym id per scene through a factory, objects as plain prims), ``de7ae486``
  (per-scene ids only), ``fea59e52`` (``DROID`` with ``set_scene(env_id: str)``, no objects registered),
  ``7ef6f1bc`` (both); ``mila=True`` adds the MILA tasks (``DROID-MILA``, ``set_task``, its task table,
  milestone reward term, reset events and ``policy_external_camera``), on either file
  layout (510b7dfb: MILA on ``droid_environment.py``). The checkout's ``environments/`` holds the
  registration source of its commit, which the backend reads before launch; the env-0 observation bug
  (``(7,)``/``(1,)`` at any N) of every version; ``pxr`` over the stand-in scene USDs (identity rotations).

What it cannot verify (only a machine with Isaac Sim and an RTX GPU can): that Isaac Sim starts and
renders, PhysX (contacts, grasps, batched vs single-env physics), the real names and contents of
sim-evals' USD assets and MILA scenes, the Fabric propagation of light edits, how stale the first frame
after a reset really is, memory and speed with N envs x 3 cameras at 720p.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.abc
import importlib.machinery
import importlib.metadata
import sys
import types
import warnings
from pathlib import Path

import gymnasium as gym

PREFIXES = ("isaaclab", "isaaclab_tasks", "sim_evals", "pxr", "isaacsim")
PACKAGES = (
    "isaacsim",
    "isaaclab",
    "isaaclab.envs",
    "isaaclab_tasks",
    "isaaclab_tasks.utils",
    "sim_evals",
    "sim_evals.environments",
    "sim_evals.environments.droid",
    "sim_evals.environments.mila",
    "pxr",
)


class World:
    """State shared by the stand-in modules of one test: version, call log, whether the app runs."""

    def __init__(
        self,
        version: str,
        sim_evals_root: Path,
        scene_dome_light: bool = True,
        *,
        release: str | None = None,
        install: str = "wheel",
        layout: str = "run_eval",
        mila: bool = False,
        scene_distant_light: bool = False,
    ):
        if install not in ("wheel", "source") or layout not in SIM_EVALS_LAYOUTS:
            raise ValueError(f"stand-in world: install {install!r} / layout {layout!r} not modelled")
        self.version = version
        self.is_v3 = version.startswith("3")
        self.release = release or ("3.0.0" if self.is_v3 else "2.2.0")
        if self.release not in ("2.2.0", "3.0.0", "develop", "develop-old"):
            raise ValueError(f"stand-in world: release {self.release!r} not modelled")
        self.is_develop = self.release.startswith("develop")
        # launch_simulation: the 3.0.0 release and develop from extension 6.2.1; older 3.x develop has none
        self.has_launch_simulation = self.is_v3 and self.release != "develop-old"
        self.install = install
        self.layout = layout
        self.mila = mila
        self.sim_evals_root = Path(sim_evals_root)
        self.scene_dome_light = scene_dome_light
        self.scene_distant_light = scene_distant_light
        self.tasks_root = self.sim_evals_root.parent / "isaaclab_tasks_pkg"
        (self.tasks_root / "utils").mkdir(parents=True, exist_ok=True)
        self.isaaclab_root = self.sim_evals_root.parent / "isaaclab_pkg"
        (self.isaaclab_root / "app").mkdir(parents=True, exist_ok=True)
        if self.has_launch_simulation:  # what the backend reads (not imports) before launch
            (self.isaaclab_root / "app" / "sim_launcher.py").write_text("def launch_simulation(cfg, args): ...\n")
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

    @property
    def version_string(self) -> str:
        """What the package metadata and ``isaaclab.__version__`` report for this install."""
        if self.install == "wheel":
            return "3.0.0" if self.is_v3 else "2.2.0"
        if self.is_v3:  # source installs: the extension's version (3.0.0's pyproject says 28.0.0)
            return {"3.0.0": "28.0.0", "develop": "6.2.1", "develop-old": "3.5.3"}[self.release]
        return "0.44.9"  # 2.2.0's config/extension.toml


class _Distribution(importlib.metadata.Distribution):
    def __init__(self, version: str):
        self._version = version

    def read_text(self, filename):
        if filename == "METADATA":
            return f"Metadata-Version: 2.1\nName: isaaclab\nVersion: {self._version}\n"
        return None

    def locate_file(self, path):
        return Path(str(path))


# sim-evals' layouts, by the commit that has each: what its environments package registers and how its
# set_scene reads (the source the backend reads before launch; the stand-in registers the same on import).
SIM_EVALS_LAYOUTS = {
    "run_eval": "3a6b0e8",  # droid_environment.py: DROID, set_scene(scene: int) registers the objects
    "per_scene": "711ff04",  # droid/: one gym id per scene through a factory, objects are plain prims
    "de7ae486": "de7ae486",  # droid_environment.py registering the per-scene ids only (no DROID)
    "fea59e52": "fea59e52",  # DROID only, set_scene(env_id: str), no objects registered
    "7ef6f1bc": "7ef6f1bc",  # DROID and the per-scene ids
}
_SCENE_IDS = '{"DROID-CubeInBowl": 1, "DROID-CanInMug": 2, "DROID-BananaInBin": 3}'
_SOURCES = {
    "run_eval": {
        "__init__.py": 'gym.register(id="DROID", entry_point="isaaclab.envs:ManagerBasedRLEnv")\n',
        "droid_environment.py": "class EnvCfg:\n    def set_scene(self, scene: int):\n        ...\n",
    },
    "per_scene": {
        "__init__.py": "from . import droid\n",
        "droid/__init__.py": "for env_id in DROID_SCENES:\n    gym.register(id=env_id, entry_point=make)\n",
        "droid/scenes.py": f"DROID_SCENES = {_SCENE_IDS}\n",
        "droid/env_cfg.py": "class DroidEnvCfg:\n    def set_scene(self, env_id: str):\n        ...\n",
    },
    "de7ae486": {
        "__init__.py": f"SCENES = {_SCENE_IDS}\nfor env_id in SCENES:\n    gym.register(id=env_id, entry_point=make)\n",
        "droid_environment.py": "class EnvCfg:\n    def set_scene(self, env_id: str):\n        ...\n",
    },
    "fea59e52": {  # droid_environment.py: the per-scene ids are DROID_SCENES' keys, read by set_scene only
        "__init__.py": 'gym.register(id="DROID", entry_point="isaaclab.envs:ManagerBasedRLEnv")\n',
        "droid_environment.py": f"DROID_SCENES = {_SCENE_IDS}\n\n\ndef get_scene_spec(env_id: str):\n"
        "    return DROID_SCENES[env_id]\n\n\nclass EnvCfg:\n    def set_scene(self, env_id: str):\n"
        "        spec = get_scene_spec(env_id)\n",
    },
    "7ef6f1bc": {
        "__init__.py": f'gym.register(id="DROID", entry_point=make)\nfor env_id in {_SCENE_IDS}:\n'
        "    gym.register(id=env_id, entry_point=make)\n",
        "droid_environment.py": "class EnvCfg:\n    def set_scene(self, env_id: str):\n        ...\n",
    },
}


def make_sim_evals_checkout(root: Path, scenes=(1, 2, 3), layout: str = "run_eval", mila: bool = False) -> Path:
    """A sim-evals checkout: ``src/sim_evals/environments/`` with the registration source of ``layout``
    (:data:`SIM_EVALS_LAYOUTS`), ``mila/`` with ``mila``, and ``assets/*.usd`` (empty files)."""
    environments = root / "src" / "sim_evals" / "environments"
    environments.mkdir(parents=True, exist_ok=True)
    for name, text in _SOURCES[layout].items():
        (environments / name).parent.mkdir(parents=True, exist_ok=True)
        (environments / name).write_text(text)
    if mila:
        (environments / "mila").mkdir(exist_ok=True)
        (environments / "mila" / "__init__.py").write_text('gym.register(id="DROID-MILA", entry_point=make)\n')
        for folder in ("Task1", "Task2"):
            (root / "assets" / "mila" / folder).mkdir(parents=True, exist_ok=True)
            (root / "assets" / "mila" / folder / "Scene.usd").write_text("#usda 1.0\n")
        (root / "assets" / "mila" / "place_spoon_in_utensil_holder.usd").write_text("#usda 1.0\n")
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
        if fullname not in self.builders or not self._present(fullname):
            return None
        is_package = fullname in PACKAGES
        origin = "stand-in"
        if fullname == "sim_evals":
            origin = str(self.world.sim_evals_root / "src" / "sim_evals" / "__init__.py")
        spec = importlib.machinery.ModuleSpec(fullname, self, origin=origin, is_package=is_package)
        if fullname == "sim_evals":
            spec.submodule_search_locations = [str(self.world.sim_evals_root / "src" / "sim_evals")]
        elif fullname == "isaaclab_tasks":
            spec.submodule_search_locations = [str(self.world.tasks_root)]
        elif fullname == "isaaclab":
            spec.submodule_search_locations = [str(self.world.isaaclab_root)]
        return spec

    def find_distributions(self, context=None):
        name = getattr(context, "name", None)
        if name not in (None, "isaaclab"):
            return iter(())
        return iter((_Distribution(self.world.version_string),))

    def _present(self, fullname: str) -> bool:
        world = self.world
        if fullname == "sim_evals.environments.droid":
            return world.layout == "per_scene"
        if fullname == "sim_evals.environments.mila":
            return world.mila
        return True

    def create_module(self, spec):
        return None

    def exec_module(self, module):
        self.world.log("import", module.__name__)
        self.builders[module.__name__](module)


def install(version: str, sim_evals_root: Path, **options) -> World:
    """Serve the stand-ins for Isaac Lab ``version`` ("2.2" or "3.0"); returns the call-recording world."""
    uninstall()
    world = World(version, sim_evals_root, **options)
    make_sim_evals_checkout(world.sim_evals_root, scenes=(), layout=world.layout, mila=world.mila)
    finder = _Finder(world)
    sys.meta_path.insert(0, finder)
    return world


def uninstall() -> None:
    """Remove the finder, the stand-in modules and the ``DROID`` gym registration."""
    sys.meta_path[:] = [f for f in sys.meta_path if not isinstance(f, _Finder)]
    for name in list(sys.modules):
        if name.split(".")[0] in PREFIXES:
            del sys.modules[name]
    for name in [name for name in gym.registry if name == "DROID" or name.startswith("DROID-")]:
        gym.registry.pop(name, None)


def _builders(world: World):
    from isaac_stubs import cfgs, mdp_functions, sim, sim_evals_layouts

    env_class = sim.StandInRLEnv30 if world.is_v3 else sim.StandInRLEnv22
    env_class.world = world

    def isaaclab(m):
        m.__version__ = world.version_string

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
                if not world.has_launch_simulation:  # 3.0's launcher has no --headless
                    parser.add_argument("--headless", action="store_true", default=False)
                parser.add_argument("--device", type=str, default=None if world.is_v3 else "cuda:0")
                parser.add_argument("--enable_cameras", action="store_true", default=False)
                parser.add_argument("--livestream", type=int, default=-1)
                parser.add_argument("--kit_args", type=str, default="")
                if world.is_v3:  # a comma list ("kit,newton") parsed to a list of names; None: no visualizer
                    parser.add_argument("--visualizer", "--viz", type=_visualizers, default=None)

        m.AppLauncher = AppLauncher
        if world.has_launch_simulation:  # 3.0: isaaclab/app/sim_launcher.py, exposed by isaaclab.app
            m.add_launcher_args = lambda parser: AppLauncher.add_app_launcher_args(parser)
            m.launch_simulation = _launch_simulation(world)

    def managers(m):
        m.TerminationTermCfg = cfgs.TerminationTermCfg
        m.ObservationTermCfg = cfgs.ObservationTermCfg
        m.ObservationGroupCfg = cfgs.ObservationGroupCfg
        m.SceneEntityCfg = cfgs.SceneEntityCfg
        m.EventTermCfg = cfgs.EventTermCfg
        m.RewardTermCfg = cfgs.RewardTermCfg

    def assets(m):
        # the identity quaternion of the installed version's order (2.2: w-x-y-z, 3.0: x-y-z-w)
        identity = (0.0, 0.0, 0.0, 1.0) if world.is_v3 else (1.0, 0.0, 0.0, 0.0)
        cfgs.AssetBaseCfg.InitialStateCfg = type("InitialStateCfg", (cfgs.InitialStateCfg,), {"rot": identity})
        m.RigidObjectCfg = cfgs.RigidObjectCfg
        m.AssetBaseCfg = cfgs.AssetBaseCfg

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
            m.image_rgb = mdp_functions.image  # 3.0 has the class term image_rgb and no mdp.image
        else:
            m.image = mdp_functions.image

    def tasks(m):
        pass

    def tasks_utils(m):
        def load(task_name):
            spec = gym.spec(task_name)
            return spec.kwargs["env_cfg_entry_point"]()

        if world.is_v3:

            def parse_env_cfg(task_name, device=None, num_envs=None, use_fabric=None, overrides=()):
                world.log(
                    "parse_env_cfg", task_name, {"device": device, "num_envs": num_envs, "use_fabric": use_fabric}
                )
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
                world.log(
                    "parse_env_cfg", task_name, {"device": device, "num_envs": num_envs, "use_fabric": use_fabric}
                )
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

    def make(**kwargs):
        return _make_env(env_class, world, **kwargs)

    def sim_evals_environments(m):
        if not world.launched:
            raise ImportError(
                "No module named 'pxr' (stand-in: sim_evals.environments imported before the app launched)"
            )
        m.arm_joint_pos = cfgs.upstream_arm_joint_pos
        m.gripper_pos = cfgs.upstream_gripper_pos
        if world.layout == "per_scene":
            import sim_evals.environments.droid  # noqa: F401  (registers the per-scene ids, as upstream)

            return
        if world.layout == "run_eval":
            env_cfg = cfgs.make_env_cfg_class(world)  # set_scene(k) registers the objects
        else:  # set_scene(env_id) with no objects registered
            env_cfg = cfgs.make_env_cfg_class(world, per_scene=True)
        m.EnvCfg = env_cfg
        if world.layout != "de7ae486":
            gym.register(
                id="DROID", entry_point=make, kwargs={"env_cfg_entry_point": env_cfg}, disable_env_checker=True
            )
        if world.layout in ("de7ae486", "7ef6f1bc"):
            register_per_scene_ids(env_cfg)

    def register_per_scene_ids(cfg_class):
        for env_id in sim_evals_layouts.PER_SCENE_IDS:

            def factory(env_id=env_id):
                return cfg_class().set_scene(env_id)

            gym.register(id=env_id, entry_point=make, kwargs={"env_cfg_entry_point": factory}, disable_env_checker=True)

    def sim_evals_droid(m):
        m.DroidEnvCfg = cfgs.make_env_cfg_class(world, per_scene=True)
        m.DROID_SCENES = dict(sim_evals_layouts.PER_SCENE_IDS)
        register_per_scene_ids(m.DroidEnvCfg)

    def sim_evals_mila(m):
        if world.layout == "per_scene":
            import sim_evals.environments.droid as droid_pkg

            base = droid_pkg.DroidEnvCfg
        else:  # MILA on the droid_environment.py layout (510b7dfb)
            base = cfgs.make_env_cfg_class(world, per_scene=True)
        m.MilaDroidEnvCfg = sim_evals_layouts.make_mila_cfg_class(world, base)
        m.MILA_TASKS = sim_evals_layouts.MILA_TASKS
        m.get_mila_task = sim_evals_layouts.get_mila_task
        gym.register(
            id="DROID-MILA",
            entry_point=make,
            kwargs={"env_cfg_entry_point": m.MilaDroidEnvCfg},
            disable_env_checker=True,
        )

    def pxr(m):
        sim_evals_layouts.build_pxr(m, world)

    return {
        "isaacsim": lambda m: None,  # Isaac Sim is installed (its app is the launchers' stand-in)
        "isaaclab": isaaclab,
        "isaaclab.app": app,
        "isaaclab.managers": managers,
        "isaaclab.sensors": sensors,
        "isaaclab.assets": assets,
        "isaaclab.envs": envs,
        "isaaclab.envs.mdp": mdp,
        "isaaclab_tasks": tasks,
        "isaaclab_tasks.utils": tasks_utils,
        "sim_evals": sim_evals_pkg,
        "sim_evals.environments": sim_evals_environments,
        "sim_evals.environments.droid": sim_evals_droid,
        "sim_evals.environments.mila": sim_evals_mila,
        "pxr": pxr,
    }


def _visualizers(text: str) -> list[str]:
    return [name.strip() for name in text.split(",") if name.strip()]


def _launch_simulation(world: World):
    """3.0's ``launch_simulation(env_cfg, launcher_args)`` context (with no config it starts Kit)."""

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

    return launch_simulation


def _make_env(env_class, world, cfg, **kwargs):
    world.log("gym.make", cfg)
    env = env_class(cfg, **kwargs)
    world.envs.append(env)
    return env
