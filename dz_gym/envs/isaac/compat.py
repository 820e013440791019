"""Isaac Lab 2.2 vs 3.0: every difference the adapter touches, in one place.

sim-evals pins Isaac Lab 2.2 (Python 3.11, numpy < 2). Isaac Lab 3.0 changed several APIs the adapter
uses; the rest of ``dz_gym.envs.isaac`` calls only the methods of :class:`IsaacLabApi` for these:

==================  ===========================================  ============================================
topic               2.2                                          3.0
==================  ===========================================  ============================================
launch              ``AppLauncher(args).app``                    ``launch_simulation(cfg, args)`` context
                                                                 (``AppLauncher`` deprecated), in
                                                                 ``isaaclab_tasks.utils.sim_launcher``
launcher args       ``AppLauncher.add_app_launcher_args``        ``add_launcher_args`` next to it
headless            ``--headless``                               no visualizer selected (``--visualizer``
                                                                 /``--viz``: a comma list, default None)
version             wheel: the release (``2.2.0``); source       wheel: ``3.0.0``; source install: the
                    install: the extension's (``0.41.x`` on      extension's (``6.1.x``); see
                    2.2.0, ``0.45.x`` on 2.2.1)                  :func:`release_of`
reset               ``reset(seed=None, env_ids=None,             the 3.0.0 release keeps 2.2's signature and
                    options=None)``                              needs ``None`` (a slice reaches the event
                                                                 manager's ``len``); develop has
                                                                 ``reset(env_ids=slice(None), *, seed=None,
                                                                 options=None)``, which hands slices on to
                                                                 the event terms. Always an int64 tensor on
                                                                 the device (every version accepts it)
asset data          torch tensors                                ``ProxyArray`` (``.torch``)
rerender on reset   ``rerender_on_reset: bool``                  ``num_rerenders_on_reset: int``
==================  ===========================================  ============================================

Differences the adapter does not need to bridge, and why:

- quaternions (wxyz in 2.2, xyzw in 3.0): the adapter reads positions and speeds only, never orientations;
- ``sim.physx`` vs ``sim.physics``: the adapter changes no physics setting;
- ``mdp.observations.image`` (3.0.0 has only ``mdp.image``): the camera terms come from sim-evals unchanged;
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
    source: str = ""  # how the version was read, e.g. "source install, extension 0.45.3 -> Isaac Lab 2.2"

    @property
    def major(self) -> int:
        return self.version[0]

    @property
    def is_v3(self) -> bool:
        return self.major >= 3

    # -- launching ---------------------------------------------------------------------------------
    def _launcher(self, name: str):
        """3.0's launcher function ``name``: ``isaaclab_tasks.utils.sim_launcher`` (the release), else
        ``isaaclab.app`` or ``isaaclab_tasks.utils`` (develop snapshots); None if none has it."""
        for module in ("isaaclab_tasks.utils.sim_launcher", "isaaclab.app", "isaaclab_tasks.utils"):
            try:
                found = getattr(importlib.import_module(module), name, None)
            except ImportError:
                continue
            if found is not None:
                return found
        return None

    def add_launcher_args(self, parser: argparse.ArgumentParser) -> None:
        """Add Isaac Lab's launcher arguments (``--device``, ``--headless``/``--viz`` ...) to ``parser``."""
        add = self._launcher("add_launcher_args") if self.is_v3 else None
        if add is not None:
            add(parser)
        else:
            importlib.import_module("isaaclab.app").AppLauncher.add_app_launcher_args(parser)

    def prepare_launch_args(self, args: argparse.Namespace, *, headless: bool) -> argparse.Namespace:
        """Set what the DROID env needs on the launcher arguments: cameras on, headless unless asked."""
        args.enable_cameras = True
        if self.is_v3:
            # 3.0 runs headless unless a visualizer is selected; the camera sensors need Kit, which a
            # launch without a config cannot infer, so ask for it explicitly.
            args.require_kit = True
            if not headless and not getattr(args, "visualizer", None):
                args.visualizer = "kit"  # the parsed form of ``--visualizer kit`` (a comma list)
        else:
            args.headless = bool(headless)
        return args

    def launch(self, args: argparse.Namespace) -> Callable[[], None]:
        """Start the simulator app; returns the function that closes it.

        2.2 starts Kit with ``AppLauncher``. 3.0 enters ``launch_simulation`` with no config (the env
        config can only be built after launch, since sim-evals must be imported after Kit started) and
        ``require_kit``/``enable_cameras`` set, which starts Kit with cameras; the context stays open until
        the returned function exits it.
        """
        app = importlib.import_module("isaaclab.app")
        if self.is_v3:
            launch_simulation = self._launcher("launch_simulation")
            if launch_simulation is None:
                raise BackendUnavailable(
                    "Isaac Lab 3.x without launch_simulation (looked in isaaclab_tasks.utils.sim_launcher, "
                    "isaaclab.app, isaaclab_tasks.utils); see docs/isaac.md"
                )
            context = launch_simulation(None, args)
            context.__enter__()
            return lambda: context.__exit__(None, None, None)
        launcher = app.AppLauncher(args)
        return launcher.app.close

    # -- env config -------------------------------------------------------------------------------
    def parse_env_cfg(self, task: str, *, device: str, num_envs: int):
        """``parse_env_cfg(task, device=, num_envs=, use_fabric=True)``, as sim-evals' ``run_eval.py`` does."""
        utils = importlib.import_module("isaaclab_tasks.utils")
        return utils.parse_env_cfg(task, device=device, num_envs=num_envs, use_fabric=True)

    def ensure_rerender_on_reset(self, cfg: Any) -> None:
        """Make sure cameras re-render after a reset (sim-evals sets it; keep it on whatever the version)."""
        if self.is_v3 or hasattr(cfg, "num_rerenders_on_reset"):
            cfg.num_rerenders_on_reset = max(1, int(getattr(cfg, "num_rerenders_on_reset", 0) or 0))
        if not self.is_v3:
            cfg.rerender_on_reset = True

    # -- stepping ---------------------------------------------------------------------------------
    def reset(self, env: Any, *, env_ids: Any = None, seed: int | None = None):
        """Reset all envs (``env_ids=None``) or the given ones, always as an int64 tensor on the env's device.

        That is the one form every version accepts: 2.2 and the 3.0.0 release take ``None`` or a tensor (the
        release passes a slice on to the event manager, whose ``len(env_ids)`` fails), develop takes a slice
        or a tensor but hands a slice on to the event terms, and sim-evals' own reset terms (its initial
        conditions) expect a tensor. Always keywords: develop made ``seed`` keyword-only and moved
        ``env_ids`` first.
        """
        if env_ids is None:
            import torch

            env_ids = torch.arange(int(env.num_envs), dtype=torch.int64, device=env.device)
        return env.reset(env_ids=env_ids, seed=seed)

    def quat_from_wxyz(self, wxyz) -> tuple[float, float, float, float]:
        """A w-x-y-z quaternion in the order this version's configs take (3.0: x-y-z-w)."""
        w, x, y, z = (float(v) for v in wxyz)
        return (x, y, z, w) if self.is_v3 else (w, x, y, z)

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
    """What is installed: the package metadata's version, ``isaaclab.__version__``, the 3.x launcher."""

    dist_version: str | None
    module_version: str | None
    has_sim_launcher: bool


def release_of(install: Install) -> tuple[tuple[int, int], str]:
    """The Isaac Lab release line ``(major, minor)`` whose APIs an install has, and how it was read.

    The pip wheel's metadata is the release (``2.2.0``, ``3.0.0``). A source install
    (``pip install -e source/isaaclab``) reports the extension's version from ``config/extension.toml``
    in both the metadata and ``isaaclab.__version__``: ``0.41.x`` on 2.2.0, ``0.45.x`` on 2.2.1,
    ``6.1.x`` on 3.0.0 (``3.5.x`` on some develop snapshots). Mapping: ``0.x`` with x >= 41 -> 2.2
    (below: older than 2.2), ``1.x`` -> older than 2.2, ``2.x`` -> 2.x, major >= 3 -> the 3.0 APIs.
    ``isaaclab_tasks/utils/sim_launcher.py`` present means the 3.x APIs whatever the numbers say.
    """
    text = install.dist_version or install.module_version
    if not text:
        if install.has_sim_launcher:
            return (3, 0), "Isaac Lab 3.x (isaaclab_tasks.utils.sim_launcher found; no version metadata)"
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
    if install.has_sim_launcher and release < (3, 0):
        release, how = (3, 0), how + "; isaaclab_tasks.utils.sim_launcher found -> 3.x APIs"
    return release, how


def read_install() -> Install:
    """Read the installed Isaac Lab's versions without launching anything (``isaaclab`` is light to import)."""
    try:
        isaaclab = importlib.import_module("isaaclab")
    except ImportError as exc:
        raise BackendUnavailable(
            "Isaac Lab is not importable (isaaclab): install Isaac Lab 2.2 with sim-evals, see docs/isaac.md"
        ) from exc
    module_version = getattr(isaaclab, "__version__", None) or None
    try:
        from importlib.metadata import PackageNotFoundError
        from importlib.metadata import version as dist_version

        dist = dist_version("isaaclab")
    except PackageNotFoundError:
        dist = None
    return Install(dist or None, str(module_version) if module_version else None, _has_sim_launcher())


def _has_sim_launcher() -> bool:
    try:
        spec = importlib.util.find_spec("isaaclab_tasks")  # a top-level name: located, not imported
    except (ImportError, ValueError):
        return False
    for folder in (spec.submodule_search_locations or []) if spec is not None else []:
        if (Path(folder) / "utils" / "sim_launcher.py").is_file():
            return True
    return False


def detect(version: str | None = None) -> IsaacLabApi:
    """The API of the installed Isaac Lab (``version`` overrides what is detected, e.g. ``"3.0"``).

    Reads the package metadata and ``isaaclab.__version__`` and maps them to a release with
    :func:`release_of` (wheel and source installs of 2.2.x and 3.0.x). Importing ``isaaclab`` is safe
    before the app launches; nothing else is imported here.
    """
    if version is not None:
        parsed, how = parse_version(version), f"Isaac Lab {version} (given)"
    else:
        parsed, how = release_of(read_install())
    if parsed < (2, 2):
        raise BackendUnavailable(f"{how}: sim-evals needs Isaac Lab 2.2 (or 3.0), see docs/isaac.md")
    if parsed[0] > 3:
        warnings.warn(f"{how} is newer than 3.x; using the 3.0 code paths", stacklevel=2)
        parsed = (3, 0)
    return IsaacLabApi(parsed, how)
