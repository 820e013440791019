"""Starting Isaac Sim once per process, the way the installed Isaac Lab wants it.

Isaac Sim (Kit) must run before any module that touches ``omni``/``pxr`` is imported, sim-evals'
``sim_evals.environments`` included, and it can run only once per process. This module owns that
process-wide state: :func:`launch_app` starts the app (or returns the one already running) and
:func:`add_launcher_args` lets a command line accept Isaac Lab's own launcher flags.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from dz_gym.envs.isaac.compat import IsaacLabApi, detect


@dataclass
class RunningApp:
    """The running simulator app of this process and the launcher arguments it was started with."""

    api: IsaacLabApi
    args: argparse.Namespace
    _close: Callable[[], None] = field(repr=False)
    closed: bool = False

    def close(self) -> None:
        """Close the app (once). Isaac Sim cannot be started again in the same process afterwards."""
        if not self.closed:
            self.closed = True
            self._close()


_app: RunningApp | None = None
_closed_once = False


def add_launcher_args(parser: argparse.ArgumentParser, version: str | None = None) -> argparse.ArgumentParser:
    """Add the installed Isaac Lab's launcher arguments to ``parser`` (returns it).

    Safe before launch: only ``isaaclab.app`` is imported. The parsed namespace is what
    ``make_droid_env(backend="isaac", app_args=...)`` takes.
    """
    detect(version).add_launcher_args(parser)
    return parser


def isaac_flags_wanted(argv: list[str]) -> bool:
    """Whether a ``dz-gym-eval`` command line will run on Isaac Lab, so its launcher flags belong on the
    parser: ``--backend isaac``, or ``auto`` (or none) with Isaac Lab importable, or a resumed run that
    used Isaac Lab. Nothing of Isaac Lab is imported here (``find_spec`` of top-level names only)."""
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--backend", default=None)
    pre.add_argument("--resume", default=None)
    known, _ = pre.parse_known_args(argv)
    backend = known.backend
    if backend is None and known.resume is not None:
        try:
            import json
            from pathlib import Path

            saved = json.loads((Path(known.resume) / "config.json").read_text())
            backend = saved.get("plan", saved).get("backend")  # nested, or flat (saved before the sections)
        except (OSError, ValueError, AttributeError):
            backend = None
    if backend == "isaac":
        return True
    if backend in (None, "auto"):
        from dz_gym.envs.isaac.checks import isaac_can_start

        return isaac_can_start()  # the rule ``--backend auto`` resolves by (dz_gym.envs.backends)
    return False


def launch_app(
    app_args: argparse.Namespace | None = None,
    *,
    headless: bool = True,
    device: str | None = None,
    version: str | None = None,
) -> RunningApp:
    """Start Isaac Sim with cameras enabled (headless by default), or return the app already running.

    ``app_args`` is the caller's parsed namespace (with the launcher arguments); when None the launcher's
    defaults are used. ``device`` overrides ``app_args.device``.
    """
    global _app
    if _app is not None and not _app.closed:
        return _app
    if _closed_once:
        raise RuntimeError("isaac: the simulator app was closed in this process; start a new process")
    api = detect(version)
    args = argparse.Namespace(**vars(app_args)) if app_args is not None else _default_args(api)
    if device is not None:
        args.device = device
    api.prepare_launch_args(args, headless=headless)
    close = api.launch(args)
    _app = RunningApp(api=api, args=args, _close=close)
    return _app


def launch_kitless(cfg: Any, app_args: argparse.Namespace | None = None, *, device: str | None = None,
                   api: IsaacLabApi | None = None) -> RunningApp:  # fmt: skip
    """Enter Isaac Lab 3.0's ``launch_simulation(cfg, args)`` for a kit-less config (Newton physics, Warp
    cameras: it starts no Kit app), or return the app already running; the context closes with the app."""
    global _app
    if _app is not None and not _app.closed:
        return _app
    if _closed_once:
        raise RuntimeError("isaac: the simulation was closed in this process; start a new process")
    api = api or detect()
    args = dict(vars(app_args)) if app_args is not None else {}
    if device is not None:
        args["device"] = device
    from isaaclab.app.sim_launcher import launch_simulation

    context = launch_simulation(cfg, args)
    context.__enter__()
    _app = RunningApp(api=api, args=argparse.Namespace(**args), _close=lambda: context.__exit__(None, None, None))
    return _app


def close_app() -> None:
    """Close the app of this process, if one runs."""
    global _closed_once
    if _app is not None and not _app.closed:
        _app.close()
        _closed_once = True


def _default_args(api: IsaacLabApi) -> argparse.Namespace:
    parser = argparse.ArgumentParser(add_help=False)
    api.add_launcher_args(parser)
    args, _ = parser.parse_known_args([])
    return args


_scene_in_use: int | None = None
_env_open = False


def claim_scene(scene: int) -> None:
    """Register a new env of ``scene`` in this process: one open env at a time, one scene per process.

    Rebuilding the stage for another scene in the same process can render wrong poses (IsaacLab-Arena
    #1168), so a second scene needs a new process.
    """
    global _scene_in_use, _env_open
    if _env_open:
        raise RuntimeError("isaac: an Isaac env is already open in this process; close it first (one env per process)")
    if _scene_in_use is not None and _scene_in_use != scene:
        raise RuntimeError(
            f"isaac: scene {_scene_in_use} was already built in this process; scene {scene} needs a new process "
            "(rebuilding the stage can render wrong poses)"
        )
    _scene_in_use, _env_open = scene, True


def release_scene() -> None:
    """The env of this process was closed."""
    global _env_open
    _env_open = False


def _forget_app_for_tests() -> None:
    """Drop the process-wide state (the test suite starts a stand-in app per test)."""
    global _app, _closed_once, _scene_in_use, _env_open
    _app = None
    _closed_once = False
    _scene_in_use = None
    _env_open = False
