"""``MujocoDroidEnv``: the batched DROID contract (``dz_gym.envs.base``) on the embedded MuJoCo simulator.

The env is batched like Isaac Lab's: ``N`` envs step together with an ``(N, 8)`` action (7 absolute joint
targets + gripper, > 0.5 closes; numpy or CPU torch), at 15 Hz, with same-step autoreset when an episode
reaches ``max_episode_length`` (450 steps by default; ``truncated``, never ``terminated``).

Speed knobs:
- ``num_workers`` processes (default one per available core, at most ``N``; ``0`` steps everything in the
  calling process), each with its own renderer; images and states travel through shared memory.
- Lazy rendering: :meth:`set_render_mask` names the envs whose images will be read next (it stays in force
  until changed); the others skip rendering and keep their last frame, ``info["images_fresh"]`` says which
  were rendered. Envs reset during a step are always rendered.
- Shadows and reflections are off, anti-aliasing too (``multisamples=0``; 4 is MuJoCo's usual, about
  twice the rendering cost); the robot's visual meshes are decimated.

Seeds: ``reset(seed=s)`` gives env ``i`` the episode seed ``s + i`` (unless one was queued with
:meth:`set_episode_seeds`); an env's next episode, unless queued, uses its previous seed ``+ num_envs``, so
a batch started from ``s`` runs seeds ``s, s+1, ...`` without repeats. ``make_env(seed=...)`` sets the seed
of the first ``reset()`` that passes none; without any seed, a random base seed is drawn. The episode
seed alone decides the layout, so the same seed gives the same initial state and, under the same
actions, the same trajectory, whatever ``num_envs`` or ``num_workers``.

Beyond the contract: :meth:`privileged_state` (true object/container/TCP poses, for tests and the
scripted expert) and :meth:`perturb` (robustness tests).
"""

from __future__ import annotations

import atexit
import math
import os
import warnings
import weakref
from typing import Any

import numpy as np

from dz_gym.envs import droid
from dz_gym.envs.base import BatchedDroidEnv
from dz_gym.envs.mujoco import gl
from dz_gym.envs.mujoco import scene as scene_module
from dz_gym.envs.mujoco.cameras import CAMERA_NAMES, CameraCalibration, camera_calibration
from dz_gym.envs.mujoco.sim import RESET, SKIP, STEP, STEP_THEN_RESET, EnvGroup, GroupConfig, buffer_fields
from dz_gym.envs.mujoco.worker import Buffers, WorkerPool

MAX_IMAGE_SHAPE = (2160, 3840)
PERTURB_KINDS = ("nudge", "drop")

# Envs still open at interpreter exit are closed before module teardown (a renderer freed during teardown
# makes OSMesa print errors; workers get a clean "close" instead of a termination signal).
_OPEN_ENVS: "weakref.WeakSet[MujocoDroidEnv]" = weakref.WeakSet()


@atexit.register
def _close_open_envs() -> None:
    for env in list(_OPEN_ENVS):
        try:
            env.close()
        except Exception:  # noqa: BLE001 - best effort at exit
            pass


def _available_cores() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return max(1, os.cpu_count() or 1)


def _check_image_shape(image_shape) -> tuple[int, int]:
    try:
        height, width = (int(v) for v in image_shape)
        ok = all(float(v) == int(v) for v in image_shape)
    except (TypeError, ValueError):
        ok = False
    if not ok or not (16 <= height <= MAX_IMAGE_SHAPE[0] and 16 <= width <= MAX_IMAGE_SHAPE[1]):
        raise ValueError(
            f"image_shape: expected (height, width) integers within 16..{MAX_IMAGE_SHAPE[0]} x 16..{MAX_IMAGE_SHAPE[1]}, "
            f"got {image_shape!r}"
        )
    return height, width


def _as_numpy_action(action: Any, num_envs: int) -> np.ndarray:
    if hasattr(action, "detach") and hasattr(action, "cpu"):  # torch tensor (CPU or device)
        action = action.detach().cpu().numpy()
    try:
        array = np.asarray(action, dtype=np.float64)
    except (TypeError, ValueError):
        raise ValueError(f"action: expected a numeric array of shape ({num_envs}, {droid.ACTION_DIM}), got {type(action).__name__}") from None
    if array.shape != (num_envs, droid.ACTION_DIM):
        raise ValueError(f"action: expected shape ({num_envs}, {droid.ACTION_DIM}), got {array.shape}")
    if not np.isfinite(array).all():
        raise ValueError("action: expected finite values, got NaN or inf")
    return array


class MujocoDroidEnv(BatchedDroidEnv):
    """N embedded DROID envs of one scene (see the module docstring for semantics and knobs)."""

    def __init__(
        self,
        scene: int = 1,
        num_envs: int = 1,
        seed: int | None = None,
        image_shape: tuple[int, int] = droid.DEFAULT_EMBEDDED_IMAGE_SHAPE,
        num_workers: int | None = None,
        *,
        max_episode_length: int | None = None,
        randomization: scene_module.Randomization | None = None,
        start_method: str | None = None,
        multisamples: int = 0,
        device: str = "cpu",
    ):
        image_shape = _check_image_shape(image_shape)
        if device != "cpu":
            raise ValueError(f"device: the embedded simulator returns numpy arrays; expected 'cpu', got {device!r}")
        super().__init__(num_envs, image_shape, scene, device="cpu")
        if max_episode_length is not None:
            if not isinstance(max_episode_length, (int, np.integer)) or max_episode_length < 1:
                raise ValueError(f"max_episode_length: expected an integer >= 1, got {max_episode_length!r}")
            self.max_episode_length = int(max_episode_length)
        if randomization is None:
            randomization = scene_module.Randomization()
        elif not isinstance(randomization, scene_module.Randomization):
            raise ValueError(f"randomization: expected a Randomization, got {type(randomization).__name__}")
        if seed is not None and not isinstance(seed, (int, np.integer)):
            raise ValueError(f"seed: expected an integer or None, got {seed!r}")
        if num_workers is None:
            num_workers = min(_available_cores(), self.num_envs)
        if not isinstance(num_workers, (int, np.integer)) or num_workers < 0:
            raise ValueError(f"num_workers: expected an integer >= 0 or None, got {num_workers!r}")
        self.num_workers = min(int(num_workers), self.num_envs)
        if not isinstance(multisamples, (int, np.integer)) or not 0 <= multisamples <= 16:
            raise ValueError(f"multisamples: expected an integer in [0, 16], got {multisamples!r}")
        self.multisamples = int(multisamples)
        self.image_shape = image_shape
        self.randomization = randomization
        self.layout_spec = scene_module.LAYOUTS[self.scene.scene_id]
        self._initial_seed = None if seed is None else int(seed)
        self._closed = False
        self._pool: WorkerPool | None = None
        self._group: EnvGroup | None = None
        self._buffers: Buffers | None = None
        self._worker_slices: list[tuple[int, int]] = []

        n = self.num_envs
        self.episode_step = np.zeros(n, dtype=np.int64)
        self.episode_seed = np.zeros(n, dtype=np.int64)
        self.episode_count = np.zeros(n, dtype=np.int64)
        self._success_any = np.zeros(n, dtype=bool)
        self._has_reset = False

        fields = buffer_fields(n, image_shape)
        _OPEN_ENVS.add(self)
        try:
            if self.num_workers == 0:
                self._buffers = Buffers(fields, shared=False)
                config = GroupConfig(self.scene.scene_id, 0, n, image_shape, randomization, multisamples=self.multisamples)
                self._group = EnvGroup(config, self._buffers.arrays)
            else:
                self._buffers = Buffers(fields, shared=True)
                self._pool = self._start_pool(start_method)
        except BaseException:
            self.close()
            raise

    # ------------------------------------------------------------------------------------ start-up
    def _start_pool(self, start_method: str | None) -> WorkerPool:
        n, p = self.num_envs, self.num_workers
        bounds = [round(k * n / p) for k in range(p + 1)]
        self._worker_slices = list(zip(bounds[:-1], bounds[1:]))
        configs = [
            GroupConfig(self.scene.scene_id, a, b, self.image_shape, self.randomization, multisamples=self.multisamples)
            for a, b in self._worker_slices
        ]
        # spawn: a fresh interpreter that inherits MUJOCO_GL & co. as set below (a forkserver would keep
        # the environment, and possibly a mujoco import, from the time it started).
        method = start_method or "spawn"
        worker_env = {}
        if p > 1 and "LP_NUM_THREADS" not in os.environ:
            worker_env["LP_NUM_THREADS"] = "1"  # one llvmpipe thread per worker: the workers fill the cores
        backends = [gl.configure()]
        if not gl.user_chose_backend() and backends[0] != gl.FALLBACK_BACKEND:
            backends.append(gl.FALLBACK_BACKEND)
        failures: list[str] = []
        for backend in backends:
            env = dict(worker_env, MUJOCO_GL=backend)
            if backend in ("egl", "osmesa"):  # PyOpenGL must load the same platform as MuJoCo's context
                env["PYOPENGL_PLATFORM"] = backend
            try:
                pool = WorkerPool(configs, self._buffers, method, env)
            except gl.RenderingUnavailable as exc:
                failures.append(f"{backend}: {exc.detail}")
                continue
            if failures:
                warnings.warn(f"rendering with MUJOCO_GL={backend} ({'; '.join(failures)})", RuntimeWarning, stacklevel=3)
            return pool
        raise gl.unavailable("; ".join(failures), tried=backends)

    # ----------------------------------------------------------------------------------- contract
    def reset(self, *, seed: int | None = None, options: dict | None = None):
        """Reset all envs (or ``options["env_ids"]`` / ``options["reset_mask"]``); returns ``(obs, info)``."""
        self._check_open()
        n = self.num_envs
        ids = np.arange(n)
        if options:
            if "env_ids" in options:
                ids = np.unique(np.atleast_1d(np.asarray(options["env_ids"], dtype=np.int64)))
                if ids.size and (ids.min() < 0 or ids.max() >= n):
                    raise ValueError(f"options['env_ids']: expected ids in [0, {n}), got {ids.tolist()}")
            elif "reset_mask" in options:
                mask = np.asarray(options["reset_mask"], dtype=bool).reshape(-1)
                if mask.shape != (n,):
                    raise ValueError(f"options['reset_mask']: expected shape ({n},), got {mask.shape}")
                ids = np.flatnonzero(mask)
        if seed is None and not self._has_reset:
            seed = self._initial_seed if self._initial_seed is not None else int(np.random.SeedSequence().entropy % 2**31)
        if seed is not None and not isinstance(seed, (int, np.integer)):
            raise ValueError(f"seed: expected an integer or None, got {seed!r}")
        a = self._buffers.arrays
        a["op"][:] = SKIP
        for env in ids.tolist():
            fallback = int(seed) + env if seed is not None else self._next_seed(env)
            a["seed"][env] = self._take_seed(env, fallback)
            a["op"][env] = RESET
        self._run()
        self.episode_step[ids] = 0
        self.episode_seed[ids] = a["seed"][ids]
        self.episode_count[ids] += 1
        self._success_any[ids] = False
        self._has_reset = True
        success = self._success_now()
        self._success_any[ids] |= success[ids]
        info = self._info(success, np.zeros(n, dtype=bool), self.episode_seed.copy(), self.episode_step.copy())
        return self._observation(), info

    def step(self, action):
        """Step every env by one control period; done envs reset in the same step (see base.py)."""
        self._check_open()
        if not self._has_reset:
            raise RuntimeError("step: call reset() before the first step()")
        actions = _as_numpy_action(action, self.num_envs)
        a = self._buffers.arrays
        self.episode_step += 1
        truncated = self.episode_step >= self.max_episode_length
        finished_seed = self.episode_seed.copy()
        finished_step = self.episode_step.copy()
        a["action"][:] = actions
        a["op"][:] = np.where(truncated, STEP_THEN_RESET, STEP)
        for env in np.flatnonzero(truncated).tolist():
            a["seed"][env] = self._take_seed(env, self._next_seed(env))
        mask = np.ones(self.num_envs, dtype=bool) if self._render_mask is None else self._render_mask
        a["render"][:] = mask | truncated
        self._run()
        success = self._success_now()
        self._success_any |= success
        info = self._info(success, truncated, finished_seed, finished_step)
        if truncated.any():
            self.episode_step[truncated] = 0
            self.episode_seed[truncated] = a["seed"][truncated]
            self.episode_count[truncated] += 1
            self._success_any[truncated] = False
        reward = np.zeros(self.num_envs, dtype=np.float32)
        terminated = np.zeros(self.num_envs, dtype=bool)
        return self._observation(), reward, terminated, truncated.copy(), info

    def close(self) -> None:
        """Stop the workers, close the renderers and free the shared memory (idempotent)."""
        if getattr(self, "_closed", True):
            return
        self._closed = True
        if self._pool is not None:
            self._pool.close()
            self._pool = None
        if self._group is not None:
            self._group.close()
            self._group = None
        if self._buffers is not None:
            self._buffers.close()
            self._buffers = None

    def __del__(self):
        try:
            self.close()
        except Exception:  # noqa: BLE001 - never raise from a finalizer
            pass

    # ------------------------------------------------------------------------------------- extras
    def privileged_state(self) -> dict[str, np.ndarray]:
        """True state of every env now (after any autoreset), for tests and the scripted expert.

        Keys: ``object_pos``/``container_pos``/``tcp_pos`` (N,3) env-local, ``object_quat``/``container_quat``
        (N,4) w-x-y-z, ``object_linvel`` (N,3), ``tcp_rot`` (N,3,3), ``joint_pos`` (N,7), ``gripper_pos``
        (N,), ``episode_seed``/``episode_step``/``episode_count`` (N,) (the last counts resets, so a change
        marks a new episode).
        """
        self._check_open()
        a = self._buffers.arrays
        keys = ("object_pos", "object_quat", "object_linvel", "container_pos", "container_quat", "tcp_pos", "tcp_rot", "joint_pos", "gripper_pos")
        state = {key: a[key].copy() for key in keys}
        state["episode_seed"] = self.episode_seed.copy()
        state["episode_step"] = self.episode_step.copy()
        state["episode_count"] = self.episode_count.copy()
        return state

    def perturb(self, env_id: int, kind: str, distance: float | None = None) -> bool:
        """Perturb one env now; returns whether it applied. Takes effect from the next step's observation.

        - ``"nudge"``: slide the object ``distance`` (default 4 cm) across the table in a direction drawn
          from the episode's seed, keeping clear of the container and the table's edge. Refused (False)
          while the object is held or not resting on the table.
        - ``"drop"``: take the object out of a closed gripper: it is moved ``distance`` (default 10 cm)
          sideways, away from the container, at the same height, and falls. Refused (False) when the
          gripper holds nothing.
        """
        self._check_open()
        if kind not in PERTURB_KINDS:
            raise ValueError(f"kind: expected one of {PERTURB_KINDS}, got {kind!r}")
        if not isinstance(env_id, (int, np.integer)) or not 0 <= env_id < self.num_envs:
            raise ValueError(f"env_id: expected an integer in [0, {self.num_envs}), got {env_id!r}")
        if distance is not None and not (math.isfinite(distance) and distance > 0):
            raise ValueError(f"distance: expected a positive number of metres, got {distance!r}")
        if not self._has_reset:
            raise RuntimeError("perturb: call reset() first")
        if self._group is not None:
            return self._group.perturb(int(env_id), kind, distance)
        worker = next(k for k, (lo, hi) in enumerate(self._worker_slices) if lo <= env_id < hi)
        return self._pool.perturb(worker, int(env_id), kind, distance)

    def camera_calibration(self) -> dict[str, CameraCalibration]:
        """Calibration of the cameras at this env's image size (see ``cameras.camera_calibration``)."""
        return camera_calibration(self.image_shape)

    # ------------------------------------------------------------------------------------ helpers
    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("env: closed")

    def _run(self) -> None:
        if self._group is not None:
            self._group.run()
        else:
            self._pool.run()

    def _next_seed(self, env: int) -> int:
        if self.episode_count[env] == 0:
            return int(np.random.SeedSequence().entropy % 2**31) + env
        return int(self.episode_seed[env]) + self.num_envs

    def _success_now(self) -> np.ndarray:
        a = self._buffers.arrays
        return droid.placement_success(
            self.scene.success, a["info_object_pos"], a["info_container_pos"], a["info_object_speed"], a["info_tcp_pos"]
        )

    def _info(self, success, time_outs, episode_seed, episode_step) -> dict[str, np.ndarray]:
        a = self._buffers.arrays
        return {
            "success": success.astype(bool),
            "success_any_step": self._success_any.copy(),
            "time_outs": np.asarray(time_outs, dtype=bool).copy(),
            "episode_seed": episode_seed,
            "episode_step": episode_step,
            "object_pos": a["info_object_pos"].copy(),
            "container_pos": a["info_container_pos"].copy(),
            "images_fresh": a["fresh"].astype(bool),
        }

    def _observation(self) -> dict[str, dict[str, np.ndarray]]:
        a = self._buffers.arrays
        policy = {name: a[name].copy() for name in CAMERA_NAMES}
        policy[droid.JOINT_KEY] = a["joint_pos"].astype(np.float32)
        policy[droid.GRIPPER_KEY] = a["gripper_pos"].astype(np.float32).reshape(-1, 1)
        return {droid.POLICY_GROUP: policy}



def make_env(
    scene: int = 1,
    num_envs: int = 1,
    seed: int | None = None,
    image_shape: tuple[int, int] = droid.DEFAULT_EMBEDDED_IMAGE_SHAPE,
    num_workers: int | None = None,
    **kwargs: Any,
) -> MujocoDroidEnv:
    """Create a :class:`MujocoDroidEnv` (keyword options: ``max_episode_length``, ``randomization``,
    ``start_method``, ``multisamples``, ``device``)."""
    return MujocoDroidEnv(scene, num_envs, seed, image_shape, num_workers, **kwargs)
