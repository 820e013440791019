"""Isaac Lab 2.2 vs 3.0: every difference the adapter touches, in one place.

sim-evals pins Isaac Lab 2.2 (Python 3.11, numpy < 2). Isaac Lab 3.0 changed several APIs the adapter
uses; the rest of ``dz_gym.envs.isaac`` calls only the methods of :class:`IsaacLabApi` for these:

==================  ===========================================  ============================================
topic               2.2                                          3.0
==================  ===========================================  ============================================
launch              ``AppLauncher(args).app``                    ``launch_simulation(cfg, args)`` context
                                                                 (``AppLauncher`` deprecated)
launcher args       ``AppLauncher.add_app_launcher_args``        ``isaaclab.app.add_launcher_args``
headless            ``--headless``                               no visualizer selected (``--viz`` opts in)
reset               ``reset(seed=None, env_ids=None,             ``reset(env_ids=slice(None), *, seed=None,
                    options=None)``                              options=None)``; ``env_ids`` an int tensor
                                                                 on the device or a slice
asset data          torch tensors                                ``ProxyArray`` (``.torch``)
rerender on reset   ``rerender_on_reset: bool``                  ``num_rerenders_on_reset: int``
==================  ===========================================  ============================================

Differences the adapter does not need to bridge, and why:

- quaternions (wxyz in 2.2, xyzw in 3.0): the adapter reads positions and speeds only, never orientations;
- ``sim.physx`` vs ``sim.physics``: the adapter changes no physics setting;
- ``mdp.observations.image`` vs ``mdp.image_rgb``: the camera terms come from sim-evals unchanged;
- ``parse_env_cfg`` (3.0 adds ``overrides=()`` and defaults ``device`` to None): called with keywords only,
  the same call works on both;
- ``extras["final_obs"]`` (3.0, only with ``compute_final_obs``): not used; the state at the end of an
  episode is captured before the in-step reset by a termination-term probe on both versions.
"""

from __future__ import annotations

import argparse
import importlib
import re
import warnings
from dataclasses import dataclass
from typing import Any, Callable

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

    @property
    def major(self) -> int:
        return self.version[0]

    @property
    def is_v3(self) -> bool:
        return self.major >= 3

    # -- launching ---------------------------------------------------------------------------------
    def add_launcher_args(self, parser: argparse.ArgumentParser) -> None:
        """Add Isaac Lab's launcher arguments (``--device``, ``--headless``/``--viz`` ...) to ``parser``."""
        app = importlib.import_module("isaaclab.app")
        if self.is_v3 and hasattr(app, "add_launcher_args"):
            app.add_launcher_args(parser)
        else:
            app.AppLauncher.add_app_launcher_args(parser)

    def prepare_launch_args(self, args: argparse.Namespace, *, headless: bool) -> argparse.Namespace:
        """Set what the DROID env needs on the launcher arguments: cameras on, headless unless asked."""
        args.enable_cameras = True
        if self.is_v3:
            # 3.0 runs headless unless a visualizer is selected; the camera sensors need Kit, which a
            # launch without a config cannot infer, so ask for it explicitly.
            args.require_kit = True
            if not headless and not getattr(args, "visualizer", None):
                args.visualizer = ["kit"]
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
            launch_simulation = getattr(app, "launch_simulation", None)
            if launch_simulation is None:
                launch_simulation = importlib.import_module("isaaclab_tasks.utils").launch_simulation
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
        """Reset all envs (``env_ids=None``) or the given ones (an int64 tensor on the env's device).

        Always keywords: 3.0 made ``seed`` keyword-only and moved ``env_ids`` first.
        """
        if env_ids is None:
            env_ids = slice(None) if self.is_v3 else None
        return env.reset(env_ids=env_ids, seed=seed)

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


def detect(version: str | None = None) -> IsaacLabApi:
    """The API of the installed Isaac Lab (``version`` overrides what is detected, e.g. ``"3.0"``).

    Reads ``isaaclab.__version__`` (set from the extension metadata in both versions), then the package
    metadata, then falls back on a feature test (3.0 has ``isaaclab.app.launch_simulation``). Importing
    ``isaaclab`` and ``isaaclab.app`` is safe before the app launches; nothing else is imported here.
    """
    if version is None:
        try:
            isaaclab = importlib.import_module("isaaclab")
        except ImportError as exc:
            raise BackendUnavailable(
                "Isaac Lab is not importable (isaaclab): install Isaac Lab 2.2 with sim-evals, see docs/isaac.md"
            ) from exc
        version = getattr(isaaclab, "__version__", None)
        if not version:
            try:
                from importlib.metadata import version as dist_version

                version = dist_version("isaaclab")
            except Exception:
                version = None
        if not version:
            app = importlib.import_module("isaaclab.app")
            version = "3.0" if hasattr(app, "launch_simulation") else "2.2"
    parsed = parse_version(version)
    if parsed < (2, 2):
        raise BackendUnavailable(
            f"Isaac Lab {version}: sim-evals needs Isaac Lab 2.2 (or 3.0 with a ported sim-evals), see docs/isaac.md"
        )
    if parsed[0] > 3:
        warnings.warn(f"Isaac Lab {version} is newer than 3.x; using the 3.0 code paths", stacklevel=2)
    return IsaacLabApi(parsed)
