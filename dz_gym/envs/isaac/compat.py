"""Isaac Lab 2.2 vs 3.0: every difference the adapter touches, in one place.

sim-evals pins Isaac Lab 2.2 (Python 3.11, numpy < 2). Isaac Lab 3.0 changed several APIs the adapter
uses; the rest of ``dz_gym.envs.isaac`` calls only the methods of :class:`IsaacLabApi` for these. Facts
from the released wheels (isaaclab 2.2.0, 2.3.0, 3.0.0), which the tests import and call:

==================  ===========================================  ============================================
topic               2.2 (2.3 alike)                              3.0
==================  ===========================================  ============================================
launch              ``AppLauncher(args).app``; the wheel's       ``launch_simulation(cfg, args)`` context in
                    ``isaaclab.app`` module is empty and the     ``isaaclab/app/sim_launcher.py``, exposed as
                    class is reachable only through              ``isaaclab.app.launch_simulation``
                    ``from isaaclab.app import AppLauncher``     (``AppLauncher`` is a deprecated adapter on
                                                                 it); develop snapshots before extension
                                                                 6.2.1 have no ``launch_simulation``: they
                                                                 start with ``AppLauncher``
launcher args       ``AppLauncher.add_app_launcher_args``        ``isaaclab.app.add_launcher_args``
headless            ``--headless``                               no ``--headless``: headless unless a
                                                                 visualizer is selected (``--visualizer``/
                                                                 ``--viz``, a comma list, default None)
version             wheel: the release (``2.2.0``); source       wheel: ``3.0.0``; source install: the
                    install: the extension's (``0.44.9`` on      extension's (``28.0.0`` on 3.0.0); see
                    2.2.0, ``0.47.2`` on 2.3.0)                  :func:`release_of`
packages            wheel: ``isaaclab_tasks`` is under           wheel: ``isaaclab_tasks`` is a top-level
                    ``isaaclab/source/isaaclab_tasks/`` and      package, importable without Kit
                    importable only once Kit loaded it
reset               ``reset(seed=None, env_ids=None,             ``reset(env_ids=slice(None), *, seed=None,
                    options=None)``                              options=None)``; the adapter always passes
                                                                 keywords and an int64 tensor on the device
camera term         ``mdp.image`` (a function)                   ``mdp.image_rgb`` (a class term); no
                                                                 ``mdp.image``
quaternions         w-x-y-z                                      x-y-z-w (read from the installed
                                                                 ``AssetBaseCfg.InitialStateCfg.rot``)
asset data          torch tensors                                ``ProxyArray`` (``.torch``)
rerender on reset   ``rerender_on_reset: bool``                  ``num_rerenders_on_reset: int``
==================  ===========================================  ============================================

Differences the adapter does not need to bridge, and why:

- ``sim.physx`` vs ``sim.physics``: the adapter changes no physics setting;
- ``parse_env_cfg`` (3.0 adds ``overrides=()`` and defaults ``device`` to None): called with keywords only,
  the same call works on both;
- ``extras["final_obs"]`` (3.0, only with ``compute_final_obs``): not used; the state at the end of an
  episode is captured before the in-step reset by a termination-term probe on both versions.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import re
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dz_gym.errors import BackendUnavailable


def as_tensor(value: Any) -> Any:
    """The torch tensor behind an asset-data field: 3.0's ``ProxyArray`` via ``.torch``, 2.2's tensor as is."""
    inner = getattr(value, "torch", None)
    return value if inner is None or callable(inner) else inner


def parse_version(text: str) -> tuple[int, int]:
    """``"2.2.0"`` -> ``(2, 2)``; a clear error for anything that is not ``MAJOR.MINOR[...]``."""
    match = re.match(r"\s*(\d+)\.(\d+)", str(text))
    if match is None:
        raise ValueError(f"isaaclab version: expected 'MAJOR.MINOR[.PATCH]', got {text!r}")
    return int(match.group(1)), int(match.group(2))


@dataclass(frozen=True)
class IsaacLabApi:
    """The installed Isaac Lab's version and the calls that differ between 2.2 and 3.0."""

    version: tuple[int, int]
    source: str = ""  # how the version was read, e.g. "Isaac Lab extension 0.44.9 (a source install) -> 2.2"
    has_launch_simulation: bool = False  # isaaclab/app/sim_launcher.py defines launch_simulation (3.0.0 on)

    @property
    def major(self) -> int:
        return self.version[0]

    @property
    def is_v3(self) -> bool:
        return self.major >= 3

    # -- launching ---------------------------------------------------------------------------------
    @property
    def uses_launch_simulation(self) -> bool:
        """Whether the app starts with 3.0's ``launch_simulation`` (else with ``AppLauncher``)."""
        return self.is_v3 and self.has_launch_simulation

    def add_launcher_args(self, parser: argparse.ArgumentParser) -> None:
        """Add Isaac Lab's launcher arguments (``--device``, ``--headless``/``--viz`` ...) to ``parser``."""
        if self.uses_launch_simulation:
            _isaaclab_app("add_launcher_args")(parser)
        else:
            _isaaclab_app("AppLauncher").add_app_launcher_args(parser)

    def prepare_launch_args(self, args: argparse.Namespace, *, headless: bool) -> argparse.Namespace:
        """Set what the DROID env needs on the launcher arguments: cameras on, headless unless asked."""
        args.enable_cameras = True
        if self.uses_launch_simulation:
            # 3.0 runs headless unless a visualizer is selected; the camera sensors need Kit, which a
            # launch without a config cannot infer, so ask for it explicitly.
            args.require_kit = True
            if not headless and not getattr(args, "visualizer", None):
                args.visualizer = ["kit"]  # the parsed form of ``--visualizer kit``
        else:
            args.headless = bool(headless)
        return args

    def launch(self, args: argparse.Namespace) -> Callable[[], None]:
        """Start the simulator app; returns the function that closes it.

        2.2 (and 3.x develop snapshots without ``launch_simulation``) start Kit with ``AppLauncher``. 3.0
        enters ``launch_simulation`` with no config (the env config can only be built after launch, since
        sim-evals must be imported after Kit started) and ``require_kit``/``enable_cameras`` set, which
        starts Kit with cameras; the context stays open until the returned function exits it.
        """
        if self.uses_launch_simulation:
            context = _isaaclab_app("launch_simulation")(None, args)
            context.__enter__()
            return lambda: context.__exit__(None, None, None)
        launcher = _isaaclab_app("AppLauncher")(args)
        return launcher.app.close

    # -- env config -------------------------------------------------------------------------------
    def parse_env_cfg(self, task: str, *, device: str, num_envs: int, overrides: tuple[str, ...] = ()):
        """``parse_env_cfg(task, device=, num_envs=, use_fabric=True)``, as sim-evals' ``run_eval.py`` does;
        ``overrides`` (Hydra ``key=value`` strings) go to 3.0's ``overrides=`` and are refused on 2.2, which
        has none."""
        utils = importlib.import_module("isaaclab_tasks.utils")
        if not overrides:
            return utils.parse_env_cfg(task, device=device, num_envs=num_envs, use_fabric=True)
        if not self.is_v3:
            raise ValueError(f"cfg_overrides: need Isaac Lab 3.0's parse_env_cfg, found {self.source}")
        return utils.parse_env_cfg(task, device=device, num_envs=num_envs, use_fabric=True, overrides=list(overrides))

    def ensure_rerender_on_reset(self, cfg: Any) -> None:
        """Make sure cameras re-render after a reset (sim-evals sets it; keep it on whatever the version)."""
        if self.is_v3 or hasattr(cfg, "num_rerenders_on_reset"):
            cfg.num_rerenders_on_reset = max(1, int(getattr(cfg, "num_rerenders_on_reset", 0) or 0))
        if not self.is_v3:
            cfg.rerender_on_reset = True

    # -- stepping ---------------------------------------------------------------------------------
    def reset(self, env: Any, *, env_ids: Any = None, seed: int | None = None):
        """Reset all envs (``env_ids=None``) or the given ones, always as an int64 tensor on the env's device.

        2.2 has ``reset(seed=None, env_ids=None, options=None)``, 3.0 ``reset(env_ids=slice(None), *,
        seed=None, options=None)`` (``seed`` keyword-only, ``env_ids`` first): keywords fit both. A tensor
        is what both hand on to the event terms unchanged, and sim-evals' own reset terms (its initial
        conditions) index with it, so every env is passed as ``arange(num_envs)`` rather than None or a slice.
        """
        if env_ids is None:
            import torch

            env_ids = torch.arange(int(env.num_envs), dtype=torch.int64, device=env.device)
        return env.reset(env_ids=env_ids, seed=seed)

    def quat_from_wxyz(self, wxyz) -> tuple[float, float, float, float]:
        """A w-x-y-z quaternion in the order the installed Isaac Lab's configs take.

        Read from the installed code, not the version: the identity ``rot`` default of
        ``AssetBaseCfg.InitialStateCfg`` is ``(1, 0, 0, 0)`` where configs take w-x-y-z (2.x) and
        ``(0, 0, 0, 1)`` where they take x-y-z-w (3.0.0; develop from about extension 4.6.20).
        """
        w, x, y, z = (float(v) for v in wxyz)
        return (x, y, z, w) if quaternion_order() == "xyzw" else (w, x, y, z)

    def image_term(self) -> Any:
        """Isaac Lab's RGB camera observation term: 2.2's function ``mdp.image``, 3.0's class ``mdp.image_rgb``
        (3.0 has no ``mdp.image``)."""
        mdp = importlib.import_module("isaaclab.envs.mdp")
        name = "image_rgb" if self.is_v3 else "image"
        term = getattr(mdp, name, None)
        if term is None:
            raise BackendUnavailable(f"Isaac Lab {self.source}: isaaclab.envs.mdp has no {name}; see docs/isaac.md")
        return term

    # -- asset data -------------------------------------------------------------------------------
    def root_pos_w(self, asset: Any):
        return as_tensor(asset.data.root_pos_w)

    def root_lin_vel_w(self, asset: Any):
        data = asset.data
        for name in ("root_lin_vel_w", "root_com_lin_vel_w", "root_link_lin_vel_w"):
            if hasattr(data, name):
                return as_tensor(getattr(data, name))
        raise AttributeError("asset data: expected root_lin_vel_w (or root_com_lin_vel_w), found neither")

    def body_pos_w(self, asset: Any):
        data = asset.data
        for name in ("body_link_pos_w", "body_pos_w"):
            if hasattr(data, name):
                return as_tensor(getattr(data, name))
        raise AttributeError("asset data: expected body_link_pos_w (or body_pos_w), found neither")

    def joint_pos(self, asset: Any):
        return as_tensor(asset.data.joint_pos)

    def joint_names(self, asset: Any) -> list[str]:
        names = getattr(asset.data, "joint_names", None) or getattr(asset, "joint_names", None)
        if names is None:
            raise AttributeError("articulation: expected joint_names, found none")
        return list(names)

    def env_origins(self, env: Any):
        return as_tensor(env.scene.env_origins)

    def stage(self, env: Any):
        """The USD stage of the running simulation."""
        stage = getattr(getattr(env, "sim", None), "stage", None)
        if stage is not None:
            return stage
        omni_usd = importlib.import_module("omni.usd")
        return omni_usd.get_context().get_stage()


@dataclass(frozen=True)
class Install:
    """What is installed: the package metadata's version, ``isaaclab.__version__``, the 3.0 launcher."""

    dist_version: str | None
    module_version: str | None
    has_launch_simulation: bool


def release_of(install: Install) -> tuple[tuple[int, int], str]:
    """The Isaac Lab release line ``(major, minor)`` whose APIs an install has, and how it was read.

    The pip wheel's metadata is the release (``2.2.0``, ``2.3.0``, ``3.0.0``). A source install
    (``pip install -e source/isaaclab``) reports the extension's version in both the metadata and
    ``isaaclab.__version__``: ``0.44.9`` on 2.2.0, ``0.47.2`` on 2.3.0, ``28.0.0`` on 3.0.0 (develop
    snapshots between them: ``3.x`` .. ``27.x``). Mapping: ``0.x`` with x >= 41 -> 2.2 (below: older than
    2.2), ``1.x`` -> older than 2.2, ``2.x`` -> 2.x, major >= 3 -> the 3.0 APIs. A ``launch_simulation`` in
    ``isaaclab/app/sim_launcher.py`` means the 3.0 APIs whatever the numbers say.
    """
    text = install.dist_version or install.module_version
    if not text:
        if install.has_launch_simulation:
            return (3, 0), "Isaac Lab 3.x (isaaclab.app.launch_simulation found; no version metadata)"
        raise BackendUnavailable(
            "Isaac Lab: no version in the package metadata nor in isaaclab.__version__; see docs/isaac.md"
        )
    major, minor = parse_version(text)
    if major == 0:
        release = (2, 2) if minor >= 41 else (2, 1)
        how = f"Isaac Lab extension {text} (a source install) -> {'2.2' if minor >= 41 else 'older than 2.2'}"
    elif major == 1:
        release, how = (1, minor), f"Isaac Lab {text}"
    elif major == 2:
        release, how = (2, minor), f"Isaac Lab {text}"
    else:
        release = (3, 0)
        how = f"Isaac Lab {text}" if (major, minor) == (3, 0) else f"Isaac Lab {text} (3.x APIs)"
    if install.has_launch_simulation and release < (3, 0):
        release, how = (3, 0), how + "; isaaclab.app.launch_simulation found -> 3.x APIs"
    return release, how


def read_install() -> Install:
    """Read the installed Isaac Lab's versions without launching or importing anything.

    The package metadata serves wheel and source installs alike; ``isaaclab.__version__`` is read only
    where there is no metadata (a checkout on ``PYTHONPATH``), since importing a 2.x wheel's ``isaaclab``
    imports Isaac Sim.
    """
    folder = isaaclab_folder()
    if folder is None:
        raise BackendUnavailable(
            "Isaac Lab is not importable (isaaclab): install Isaac Lab 2.2 with sim-evals, see docs/isaac.md"
        )
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as dist_version

    try:
        dist = dist_version("isaaclab")
    except PackageNotFoundError:
        dist = None
    module_version = None
    if not dist:
        try:
            module_version = getattr(importlib.import_module("isaaclab"), "__version__", None) or None
        except ImportError as exc:
            raise BackendUnavailable(f"Isaac Lab: importing isaaclab failed ({exc}); see docs/isaac.md") from exc
    return Install(dist or None, str(module_version) if module_version else None, has_launch_simulation(folder))


def isaaclab_folder() -> Path | None:
    """The installed ``isaaclab`` package folder, located without importing it; None when absent."""
    try:
        spec = importlib.util.find_spec("isaaclab")
    except (ImportError, ValueError):
        return None
    if spec is None:
        return None
    for folder in spec.submodule_search_locations or []:
        return Path(folder)
    return Path(spec.origin).parent if spec.origin else None


def has_launch_simulation(folder: Path | None) -> bool:
    """Whether the ``isaaclab`` package at ``folder`` has 3.0's ``launch_simulation`` (read, not imported:
    ``isaaclab/app/sim_launcher.py`` defines it from the 3.0.0 release and develop extension 6.2.1 on)."""
    path = None if folder is None else Path(folder) / "app" / "sim_launcher.py"
    try:
        return path is not None and "def launch_simulation(" in path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return False


def quaternion_order() -> str:
    """``"wxyz"`` or ``"xyzw"``: the order the installed Isaac Lab's configs take (after launch on 2.x)."""
    assets = importlib.import_module("isaaclab.assets")
    rot = tuple(float(v) for v in assets.AssetBaseCfg.InitialStateCfg().rot)
    if rot == (1.0, 0.0, 0.0, 0.0):
        return "wxyz"
    if rot == (0.0, 0.0, 0.0, 1.0):
        return "xyzw"
    raise BackendUnavailable(f"Isaac Lab: AssetBaseCfg.InitialStateCfg.rot default {rot} is no identity quaternion")


def _isaaclab_app(name: str) -> Any:
    """``from isaaclab.app import <name>``: the one form that works on every install. A 2.x wheel's
    ``isaaclab.app`` module is empty and registers ``AppLauncher`` apart (``sys.modules``), so
    ``import_module("isaaclab.app").AppLauncher`` fails there; a 2.x wheel also imports Isaac Sim on import."""
    try:
        module = importlib.import_module("isaaclab.app")
        found = getattr(module, name, None)
        if found is None:
            import sys

            found = sys.modules.get(f"isaaclab.app.{name}")  # where a 2.x wheel's expose_api puts AppLauncher
    except ImportError as exc:
        raise BackendUnavailable(
            f"Isaac Lab: 'from isaaclab.app import {name}' failed ({exc}); Isaac Sim must be installed, "
            "see docs/isaac.md"
        ) from exc
    if found is None:
        raise BackendUnavailable(f"Isaac Lab: isaaclab.app has no {name}; see docs/isaac.md")
    return found


def detect(version: str | None = None) -> IsaacLabApi:
    """The API of the installed Isaac Lab (``version`` overrides the release detected, e.g. ``"3.0"``).

    Reads the package metadata (else ``isaaclab.__version__``) and maps it to a release with
    :func:`release_of` (wheel and source installs of 2.2.x, 2.3.x and 3.0.x); nothing is launched.
    """
    install = read_install() if version is None or isaaclab_folder() is not None else Install(None, None, False)
    if version is not None:
        parsed, how = parse_version(version), f"Isaac Lab {version} (given)"
    else:
        parsed, how = release_of(install)
    if parsed < (2, 2):
        raise BackendUnavailable(f"{how}: sim-evals needs Isaac Lab 2.2 (or 3.0), see docs/isaac.md")
    if parsed[0] > 3:
        warnings.warn(f"{how} is newer than 3.x; using the 3.0 code paths", stacklevel=2)
        parsed = (3, 0)
    return IsaacLabApi(parsed, how, has_launch_simulation=install.has_launch_simulation)
