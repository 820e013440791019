"""Patches to sim-evals' DROID env config that make it correct with ``num_envs > 1``, without forking it.

Applied after ``parse_env_cfg("DROID", ...)`` and ``cfg.set_scene(k)``, before ``gym.make``:

1. **Batched proprio terms.** Upstream ``arm_joint_pos``/``gripper_pos`` read ``joint_pos[0, ids]``: with
   N envs they return env 0's values, shape ``(7,)``/``(1,)``. They are replaced by functions that index
   ``joint_pos[:, ids]`` and return ``(N,7)``/``(N,1)``, with the same joint selection (articulation
   order, as upstream) and the same gripper scaling (``finger_joint / (pi/4)``; the term's clip to
   [0, 1] stays).
2. **Per-env positional lights.** Upstream's sphere light is one global prim (``/World/spehre``) at
   (0, -0.6, 0.7): only an env at the world origin is lit as in the single-env reference, and with N>1
   no env is there. Every positional light of the scene config (sphere, disk, rect, cylinder) outside
   ``{ENV_REGEX_NS}`` is moved to ``{ENV_REGEX_NS}/<name>``, so each env has its own light at the same
   env-local pose. Dome and distant lights are infinite and stay global.
3. **Rerender on reset** stays on (``rerender_on_reset`` / ``num_rerenders_on_reset``).
4. **State probe.** A termination term that never terminates captures the task state after the physics
   of each step, before the in-step reset (see :mod:`dz_gym.envs.isaac.state`).
5. Options: ``env_spacing`` (upstream 7 m), ``image_shape`` (camera resolution; upstream 720x1280),
   ``tiled_cameras`` (2.2's ``TiledCameraCfg`` instead of one render product per camera and env) and
   ``max_episode_length`` (env steps before the time-out; upstream 450, or a MILA task's ``max_timesteps``:
   Isaac Lab derives it from ``episode_length_s / (sim.dt * decimation)``, so that is what is set).

After ``gym.make``, :func:`keep_one_dome_light` fixes what the config cannot reach: a DomeLight or
DistantLight inside the scene USD is cloned into every env, and infinite lights add up, so all but env
0's are switched off.
"""

from __future__ import annotations

import importlib
import math
from collections.abc import Callable
from typing import Any

import numpy as np

from dz_gym.envs import droid
from dz_gym.envs.isaac.compat import IsaacLabApi

ENV_NS = "{ENV_REGEX_NS}"
ARM_JOINT_NAMES = tuple(f"panda_joint{i}" for i in range(1, 8))
GRIPPER_JOINT_NAMES = ("finger_joint",)
GRIPPER_CLOSED_RAD = math.pi / 4
PROBE_TERM = "dz_gym_state_probe"
_POSITIONAL_LIGHTS = ("SphereLightCfg", "DiskLightCfg", "RectLightCfg", "CylinderLightCfg")
_INFINITE_LIGHT_TYPES = ("DomeLight", "DistantLight")


def make_proprio_terms(api: IsaacLabApi) -> tuple[Callable, Callable]:
    """The batched replacements of sim-evals' ``arm_joint_pos`` and ``gripper_pos`` observation terms."""

    def arm_joint_pos(env):
        """Arm joint positions of every env, ``(N,7)`` rad (upstream returned env 0's ``(7,)``)."""
        robot = env.scene["robot"]
        return api.joint_pos(robot)[:, _joint_ids(api, robot, ARM_JOINT_NAMES)]

    def gripper_pos(env):
        """Gripper closure of every env, ``(N,1)``: ``finger_joint / (pi/4)``, 0 open, 1 closed."""
        robot = env.scene["robot"]
        return api.joint_pos(robot)[:, _joint_ids(api, robot, GRIPPER_JOINT_NAMES)] / GRIPPER_CLOSED_RAD

    return arm_joint_pos, gripper_pos


def patch_env_cfg(
    cfg: Any,
    api: IsaacLabApi,
    *,
    probe_term: Callable | None = None,
    env_spacing: float | None = None,
    image_shape: tuple[int, int] | None = None,
    tiled_cameras: bool = False,
    max_episode_length: int | None = None,
) -> list[str]:
    """Apply the multi-env patches to a parsed sim-evals DROID config; returns what was changed, in words."""
    changes: list[str] = []
    policy = cfg.observations.policy
    for term in (droid.OBS_JOINT_KEY, droid.OBS_GRIPPER_KEY, *droid.CAMERA_KEYS):
        if getattr(policy, term, None) is None:
            raise ValueError(
                f"sim-evals config: observation term {term!r} missing (needs sim-evals 423e87c or later, see docs/isaac.md)"
            )
    arm, gripper = make_proprio_terms(api)
    policy.arm_joint_pos.func = arm
    policy.gripper_pos.func = gripper
    changes.append("observations.policy.arm_joint_pos/gripper_pos: batched (N,7)/(N,1) instead of env 0's")

    for name, light in _scene_entities(cfg.scene):
        spawn = getattr(light, "spawn", None)
        if type(spawn).__name__ in _POSITIONAL_LIGHTS and not str(light.prim_path).startswith(ENV_NS):
            old = light.prim_path
            light.prim_path = f"{ENV_NS}/{name}"
            changes.append(f"scene.{name}: global light {old} -> per-env {light.prim_path}")

    api.ensure_rerender_on_reset(cfg)

    if probe_term is not None:
        managers = importlib.import_module("isaaclab.managers")
        setattr(cfg.terminations, PROBE_TERM, managers.TerminationTermCfg(func=probe_term, time_out=False))
        changes.append(f"terminations.{PROBE_TERM}: task-state probe (never terminates)")

    changes.extend(set_episode_shape(cfg, env_spacing=env_spacing, max_episode_length=max_episode_length))

    cameras = [getattr(cfg.scene, key) for key in droid.CAMERA_KEYS]
    if image_shape is not None:
        height, width = (int(v) for v in image_shape)
        if height < 1 or width < 1:
            raise ValueError(f"image_shape: expected (height, width) >= 1, got {image_shape!r}")
        for camera in cameras:
            camera.height, camera.width = height, width
        changes.append(
            f"cameras: {height}x{width} instead of {droid.ISAAC_IMAGE_SHAPE[0]}x{droid.ISAAC_IMAGE_SHAPE[1]}"
        )
    if tiled_cameras and not api.is_v3:
        sensors = importlib.import_module("isaaclab.sensors")
        for key, camera in zip(droid.CAMERA_KEYS, cameras, strict=True):
            fields = {name: value for name, value in vars(camera).items() if not name.startswith("_")}
            fields.pop("class_type", None)
            setattr(cfg.scene, key, sensors.TiledCameraCfg(**fields))
        changes.append("cameras: TiledCameraCfg (batched render products; image parity unverified, IsaacLab#493)")
    return changes


def set_episode_shape(cfg: Any, *, env_spacing: float | None, max_episode_length: int | None) -> list[str]:
    """Apply the options every Isaac task takes, sim-evals' and dz-gym's own: the distance between env
    origins and the time-out in env steps (each ``None``: left as the task has it); returns the changes."""
    changes = []
    if env_spacing is not None:
        if not float(env_spacing) > 0:
            raise ValueError(f"env_spacing: expected a positive distance in metres, got {env_spacing!r}")
        cfg.scene.env_spacing = float(env_spacing)
        changes.append(f"scene.env_spacing: {cfg.scene.env_spacing} m")
    if max_episode_length is not None:
        changes.append(set_max_episode_length(cfg, max_episode_length))
    return changes


def set_seed(cfg: Any, seed: int) -> str:
    """Isaac Lab's ``cfg.seed`` from the run's seed (it seeds torch, numpy and Warp when the env is created;
    unset, Isaac Lab warns "Seed not set"); returns what was changed, in words."""
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ValueError(f"seed: expected an integer >= 0, got {seed!r}")
    cfg.seed = int(seed)
    return f"seed: {cfg.seed}"


def set_max_episode_length(cfg: Any, steps: int) -> str:
    """Make Isaac Lab time out after ``steps`` env steps; returns what was changed, in words.

    Isaac Lab derives ``max_episode_length = ceil(episode_length_s / (sim.dt * decimation))``, so that is
    what is set, half a step below the target so that the ceiling lands on it despite rounding.
    """
    if isinstance(steps, bool) or not isinstance(steps, (int, np.integer)) or steps < 1:
        raise ValueError(f"max_episode_length: expected an integer >= 1 (env steps), got {steps!r}")
    step_dt = float(cfg.sim.dt) * int(cfg.decimation)
    cfg.episode_length_s = (int(steps) - 0.5) * step_dt
    return f"episode_length_s: {cfg.episode_length_s:.4g} s ({int(steps)} steps)"


def keep_one_dome_light(stage: Any, num_envs: int) -> list[str]:
    """Switch off the dome and distant lights of envs 1..N-1 (env 0's light every env, as in the
    single-env run: infinite lights cloned per env add up N times).

    Returns the prim paths switched off. Lights outside ``/World/envs`` are left alone.
    """
    switched_off = []
    for prim in stage.Traverse():
        if prim.GetTypeName() not in _INFINITE_LIGHT_TYPES:
            continue
        path = str(prim.GetPath())
        env_index = _env_index(path)
        if env_index is None or env_index == 0:
            continue
        for attr_name in ("inputs:intensity", "intensity"):
            attr = prim.GetAttribute(attr_name)
            if attr and attr.IsValid():
                attr.Set(0.0)
        switched_off.append(path)
    return switched_off


def _env_index(path: str) -> int | None:
    prefix = "/World/envs/env_"
    if not path.startswith(prefix):
        return None
    digits = path[len(prefix) :].split("/", 1)[0]
    return int(digits) if digits.isdigit() else None


def _joint_ids(api: IsaacLabApi, robot: Any, names: tuple[str, ...]) -> list[int]:
    """Indices of ``names`` in articulation order, exactly as sim-evals' terms select them."""
    ids = [i for i, name in enumerate(api.joint_names(robot)) if name in names]
    if len(ids) != len(names):
        raise KeyError(f"robot joints {list(names)}: expected all in the articulation, found {len(ids)}")
    return ids


def _scene_entities(scene_cfg: Any):
    for name, value in vars(scene_cfg).items():
        if not name.startswith("_") and hasattr(value, "prim_path"):
            yield name, value
