"""Building a dz-gym task on Isaac Lab 3.0 kit-less (Newton physics, Newton Warp cameras) for the isaac backend.

A task with ``IsaacTask.package`` (:mod:`dz_gym.envs.scenes`; today :mod:`dz_gym.envs.isaac_droid3`) needs
neither Isaac Sim nor sim-evals: its config is parsed *before* launch (nothing of Kit is imported), and
``launch_simulation(cfg, args)`` then starts only what the config names (Newton and the Warp renderer need
no Kit, so no app starts at all); the context stays open until the env closes. What the sim-evals path
patches (proprio terms, lights, the robot's joint names) is the task's own here; the backend adds only
its task-state probe, the camera size and the env spacing.
"""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from dz_gym.envs.isaac import launch
from dz_gym.envs.isaac.compat import IsaacLabApi, detect
from dz_gym.envs.isaac.config import PROBE_TERM, set_episode_shape, set_seed
from dz_gym.envs.isaac.state import StateProbe
from dz_gym.envs.scenes import IsaacTask
from dz_gym.errors import BackendUnavailable

REQUIRED = ("isaaclab", "isaaclab_newton", "isaaclab_tasks", "newton", "warp", "mujoco_warp", "mujoco_usd_converter")
SETUP_HINT = "run scripts/setup_isaac3.sh (Python 3.12, a CUDA GPU); see docs/isaac.md"


@dataclass
class KitlessBuild:
    """What :func:`build` made: the API, the parsed config, the gym env, the probe and the patches (words)."""

    api: IsaacLabApi
    cfg: Any
    gym_env: Any
    probe: StateProbe
    patches: list[str]


def check_packages() -> None:
    """Isaac Lab 3.0's kit-less stack is installed (nothing is imported)."""
    missing = [name for name in REQUIRED if _find(name) is None]
    if missing:
        raise BackendUnavailable(
            f"Isaac Lab 3.0 kit-less is not installed (missing modules: {', '.join(missing)}); {SETUP_HINT}"
        )


def build(
    task: IsaacTask,
    num_envs: int,
    *,
    device: str,
    app_args: Any = None,
    version: str | None = None,
    image_shape: tuple[int, int] | None = None,
    env_spacing: float | None = None,
    max_episode_length: int | None = None,
    seed: int | None = None,
    overrides: Sequence[str] = (),
) -> KitlessBuild:
    """Parse the task's config, add the backend's probe, launch kit-less and ``gym.make`` the env.

    ``max_episode_length``: the time-out in env steps (the task's 450 unless given; longer is honoured);
    ``seed``: Isaac Lab's ``cfg.seed`` (torch, numpy and Warp seeded at creation; None leaves it unset);
    ``overrides``: Hydra-style ``key=value`` overrides of the task's config, applied by Isaac Lab 3.0's
    ``parse_env_cfg`` before anything is derived or built (e.g. ``env.scene_id=2`` or
    ``env.scene.wrist_cam.renderer_cfg.tile_rendering_width=16``; a key the config lacks is refused there)."""
    import gymnasium as gym

    check_packages()
    api = detect(version)
    if not api.is_v3:
        raise BackendUnavailable(f"task {task.name}: needs Isaac Lab 3.0 (kit-less), found {api.source}; {SETUP_HINT}")
    importlib.import_module(task.package)  # registers the gym ids
    overrides = check_overrides(overrides)
    cfg = api.parse_env_cfg(task.gym_id, device=device, num_envs=num_envs, overrides=overrides)
    if overrides:  # Isaac Lab's Hydra path sets a key the config lacks as a new attribute, silently
        check_override_keys(type(cfg)(), overrides)
    sync = getattr(cfg, "sync_derived", None)
    derived = sync() if callable(sync) else []
    spec = task.scene_spec()
    robot = importlib.import_module(f"{task.package}.mdp")
    probe = StateProbe(
        api,
        spec,
        tcp_bodies=robot.TCP_BODIES,
        gripper_joint=robot.GRIPPER_JOINT,
        gripper_closed=robot.GRIPPER_CLOSED_ANGLE,
        tcp_from_com=True,
    )
    managers = importlib.import_module("isaaclab.managers")
    setattr(cfg.terminations, PROBE_TERM, managers.TerminationTermCfg(func=probe.term, time_out=False))
    patches = [f"dz-gym task {task.gym_id} ({task.package})", f"terminations.{PROBE_TERM}: task-state probe"]
    patches.extend(f"override {item}" for item in overrides)
    patches.extend(derived)
    if seed is not None:
        patches.append(set_seed(cfg, seed))
    if image_shape is not None:
        cfg.resize_cameras(tuple(int(v) for v in image_shape))
        patches.append(f"cameras: {image_shape[0]}x{image_shape[1]}")
    patches.extend(set_episode_shape(cfg, env_spacing=env_spacing, max_episode_length=max_episode_length))
    api.ensure_rerender_on_reset(cfg)
    launch.launch_kitless(cfg, app_args, device=device, api=api)
    gym_env = gym.make(task.gym_id, cfg=cfg)
    probe.validate(gym_env.unwrapped)
    return KitlessBuild(api, cfg, gym_env, probe, patches)


def check_overrides(overrides: Any) -> tuple[str, ...]:
    """``overrides`` as a tuple of ``key=value`` strings; ``ValueError`` naming the field otherwise."""
    if isinstance(overrides, (str, bytes)) or not isinstance(overrides, Sequence):
        raise ValueError(f"cfg_overrides: expected a list of 'key=value' strings, got {overrides!r}")
    for item in overrides:
        if not isinstance(item, str) or "=" not in item or not item.split("=", 1)[0].strip():
            raise ValueError(f"cfg_overrides: expected 'key=value' strings, got {item!r}")
    return tuple(overrides)


def check_override_keys(default_cfg: Any, overrides: Sequence[str]) -> None:
    """Refuse, in one line, an override whose key is not a field of the env's config (``default_cfg``, as
    the task defines it): keys are ``env.``-dotted paths; below a dict (a term's ``params``) any key goes."""
    for item in overrides:
        key = item.split("=", 1)[0].strip()
        parts = key.split(".")
        if parts[0] != "env" or len(parts) < 2:
            raise ValueError(f"cfg_overrides: expected a key under 'env.' (the env's config), got {key!r}")
        node = default_cfg
        for depth, name in enumerate(parts[1:], start=1):
            if isinstance(node, dict):
                break
            if not hasattr(node, name):
                where = ".".join(parts[:depth])
                raise ValueError(f"cfg_overrides: {key}: {where} ({type(node).__name__}) has no field {name!r}")
            node = getattr(node, name)


def _find(name: str):
    try:
        return importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return None
