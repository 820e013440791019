"""``MujocoDroidEnv``: the batched DROID contract (``dz_gym.envs.base``) on the embedded MuJoCo simulator.

The env is batched like Isaac Lab's: ``N`` envs step together with an ``(N, 8)`` action (7 absolute joint
targets + gripper, > 0.5 closes; numpy or CPU torch), at 15 Hz, with same-step autoreset when an episode
reaches ``max_episode_length`` (450 steps by default; ``truncated``, never ``terminated``).

Speed knobs:
- ``num_workers`` processes (default one per available core, at most ``N``; ``0`` steps everything in the
  calling process), each with its own renderer; images and states travel through shared memory.
- Lazy rendering: :meth:`set_render_mask` names the envs whose images will be read next (it stays in force
  until changed); the others skip rendering and keep their last frame, ``info["images_fresh"]`` says which
  were rendered. Envs reset during a step are rendered, unless their episode was their last
  (:meth:`~dz_gym.envs.base.BatchedDroidEnv.set_last_episodes`).
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
from gymnasium.vector import AutoresetMode

from dz_gym.envs import droid
from dz_gym.envs.base import BatchedDroidEnv
from dz_gym.envs.episodes import TaskState
from dz_gym.envs.mujoco import gl
from dz_gym.envs.mujoco import scene as scene_module
from dz_gym.envs.mujoco.cameras import (
    CAMERA_NAMES,
    CameraCalibration,
    camera_calibration,
)
from dz_gym.envs.mujoco.sim import (
    RESET,
    SKIP,
    STEP,
    STEP_THEN_RESET,
    EnvGroup,
    GroupConfig,
    buffer_fields,
)
from dz_gym.envs.mujoco.worker import Buffers, WorkerPool
from dz_gym.envs.render_shape import MAX_RENDER_SHAPE, check_render_shape
from dz_gym.spawning import usable_cores

MAX_IMAGE_SHAPE = MAX_RENDER_SHAPE
PERTURB_KINDS = ("nudge", "drop")

# Envs still open at interpreter exit are closed before module teardown (a renderer freed during teardown
# makes OSMesa print errors; workers get a clean "close" instead of a termination signal).
_OPEN_ENVS: weakref.WeakSet[MujocoDroidEnv] = weakref.WeakSet()


@atexit.register
def _close_open_envs() -> None:
    for env in list(_OPEN_ENVS):
        try:
            env.close()
        except Exception:  # noqa: BLE001 - best effort at exit
            pass


class MujocoDroidEnv(BatchedDroidEnv):
    """N embedded DROID envs of one scene (see the module docstring for semantics and knobs).

    ``render_mode="rgb_array"``: :meth:`render` gives each env's video strip (Gymnasium's ``RecordVideo``)."""

    metadata: dict[str, Any] = {**BatchedDroidEnv.metadata, "render_modes": ["rgb_array"]}
    autoreset_modes = (AutoresetMode.SAME_STEP, AutoresetMode.DISABLED)

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
        frame_views: bool = True,
        render_mode: str | None = None,
        autoreset_mode: AutoresetMode | str = AutoresetMode.SAME_STEP,
    ):
        image_shape = check_render_shape(image_shape)
        if device != "cpu":
            raise ValueError(f"device: the embedded simulator returns numpy arrays; expected 'cpu', got {device!r}")
        layout_spec = scene_module.LAYOUTS[droid.scene_spec(scene).scene_id]
        super().__init__(
            num_envs,
            image_shape,
            scene,
            device="cpu",
            seed=seed,
            object_box=scene_module.object_box(scene),
            render_mode=render_mode,
            autoreset_mode=autoreset_mode,
        )
        if max_episode_length is not None:
            if not isinstance(max_episode_length, (int, np.integer)) or max_episode_length < 1:
                raise ValueError(f"max_episode_length: expected an integer >= 1, got {max_episode_length!r}")
            self.max_episode_length = int(max_episode_length)
        if randomization is None:
            randomization = scene_module.Randomization()
        elif not isinstance(randomization, scene_module.Randomization):
            raise ValueError(f"randomization: expected a Randomization, got {type(randomization).__name__}")
        if num_workers is None:
            num_workers = min(usable_cores(), self.num_envs)
        if not isinstance(num_workers, (int, np.integer)) or num_workers < 0:
            raise ValueError(f"num_workers: expected an integer >= 0 or None, got {num_workers!r}")
        self.num_workers = min(int(num_workers), self.num_envs)
        if not isinstance(multisamples, (int, np.integer)) or not 0 <= multisamples <= 16:
            raise ValueError(f"multisamples: expected an integer in [0, 16], got {multisamples!r}")
        self.multisamples = int(multisamples)
        self.frame_views = bool(frame_views)
        self.image_shape = image_shape
        self.randomization = randomization
        self.layout_spec = layout_spec
        self._closed = True  # until the buffers exist
        self._pool: WorkerPool | None = None
        self._group: EnvGroup | None = None
        self._buffers: Buffers | None = None
        self._frames: dict[str, np.ndarray] = {}
        self._frame_store: dict[str, np.ndarray] = {}
        self._worker_slices: list[tuple[int, int]] = []

        n = self.num_envs
        fields = buffer_fields(n, image_shape)
        _OPEN_ENVS.add(self)
        try:
            if self.num_workers == 0:
                self._buffers = Buffers(fields, shared=False)
                config = GroupConfig(
                    self.scene.scene_id, 0, n, image_shape, randomization, multisamples=self.multisamples
                )
                self._group = EnvGroup(config, self._buffers.arrays)
            else:
                self._buffers = Buffers(fields, shared=True)
                self._pool = self._start_pool(start_method)
            self._closed = False
            # Frames handed out live in private memory: the workers' shared block is unmapped on close(),
            # and a caller may still hold an observation then. In-process buffers are private already.
            arrays = self._buffers.arrays
            self._frame_store = {
                name: arrays[name] if self._pool is None else np.zeros_like(arrays[name]) for name in CAMERA_NAMES
            }
            self._frames = {name: _read_only(store) for name, store in self._frame_store.items()}
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
                warnings.warn(
                    f"rendering with MUJOCO_GL={backend} ({'; '.join(failures)})", RuntimeWarning, stacklevel=3
                )
            return pool
        raise gl.unavailable("; ".join(failures), tried=backends)

    # ----------------------------------------------------------------------------------- contract
    def reset(self, *, seed: int | None = None, options: dict | None = None):
        """Reset all envs (or ``options["env_ids"]`` / ``options["reset_mask"]``); returns ``(obs, info)``."""
        book = self.episodes
        ids, seeds = self._begin_reset(seed, options)
        a = self._buffers.arrays
        a["op"][:] = SKIP
        a["seed"][ids] = seeds
        a["op"][ids] = RESET
        self._run()
        info = book.record_reset(ids, seeds, self._task_state(info=True), a["fresh"])
        return self._observation(), info

    def step(self, action):
        """Step every env by one control period; done envs reset in the same step (see base.py), or wait for
        ``reset`` under ``autoreset_mode=DISABLED``.

        Without a render mask (Gymnasium's use: every view is read) an autoreset runs in two passes, the step
        and then the reset of the envs that ended, so that ``info["final_obs"]`` shows their last state; under
        a render mask (the wrapper's: it reads only the next episode's first frames) the step and the reset
        run in one pass and ``info`` carries ``final_info`` only."""
        self._check_started()
        actions = self._numpy_action(action)
        book = self.episodes
        a = self._buffers.arrays
        truncated = book.ending_next_step(self.max_episode_length)
        resetting = self._resetting(truncated)
        done = np.flatnonzero(resetting)
        seeds = book.next_seeds(done)
        two_pass = bool(done.size) and self._render_mask is None
        a["action"][:] = actions
        a["op"][:] = np.where(resetting & ~two_pass, STEP_THEN_RESET, STEP)
        a["seed"][done] = seeds
        a["render"][:] = self.views_to_render(resetting & ~two_pass)
        self._run()
        state = self._task_state(info=True)
        if two_pass:
            info = book.record_step(state, truncated, a["fresh"])
            info = self._step_info(info, resetting, self._observation())  # the final frames, before the reset
            fresh = a["fresh"].copy()
            a["op"][:] = SKIP
            a["op"][done] = RESET
            self._run()
            a["fresh"][:] |= fresh
            info["images_fresh"] = a["fresh"].astype(bool)  # of the returned observation
        else:
            info = self._step_info(book.record_step(state, truncated, a["fresh"]), resetting)
        if done.size:
            book.start(done, seeds, self._task_state(info=False))
        reward = np.zeros(self.num_envs, dtype=np.float32)
        terminated = np.zeros(self.num_envs, dtype=bool)
        return self._observation(), reward, terminated, truncated, info

    def close(self) -> None:
        """Stop the workers, close the renderers and free the shared memory (idempotent)."""
        if self._buffers is None:
            return
        self._closed = True
        self._frames, self._frame_store = {}, {}
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
    @property
    def worker_pids(self) -> list[int]:
        """Process ids of the simulation workers (empty when the envs step in this process or after
        ``close``): what a benchmark needs to account the CPU time spent outside the caller."""
        return [proc.pid for proc in self._pool.procs] if self._pool is not None else []

    @property
    def render_devices(self) -> list[dict[str, str | None]]:
        """Per rendering process (each worker, or this process), the GL backend and the EGL device it renders
        with (:func:`dz_gym.envs.mujoco.gl.rendering_device`): where a sharded run's views were drawn."""
        if self._pool is not None:
            return list(self._pool.render_devices)
        return [gl.rendering_device()] if self._group is not None else []

    def privileged_state(self) -> dict[str, np.ndarray]:
        """True state of every env now (after any autoreset), for tests and the scripted expert.

        Keys: ``object_pos``/``container_pos``/``tcp_pos`` (N,3) env-local, ``object_quat``/``container_quat``
        (N,4) w-x-y-z, ``object_linvel`` (N,3), ``tcp_rot`` (N,3,3), ``joint_pos`` (N,7), ``gripper_pos``
        (N,), ``episode_seed``/``episode_step``/``episode_count`` (N,) (the last counts resets, so a change
        marks a new episode).
        """
        self._check_open()
        a = self._buffers.arrays
        keys = (
            "object_pos",
            "object_quat",
            "object_linvel",
            "container_pos",
            "container_quat",
            "tcp_pos",
            "tcp_rot",
            "joint_pos",
            "gripper_pos",
        )
        state = {key: a[key].copy() for key in keys}
        for key in ("episode_seed", "episode_step", "episode_count"):
            state[key] = getattr(self.episodes, key).copy()
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
        self._check_started("perturb")
        if self._group is not None:
            return self._group.perturb(int(env_id), kind, distance)
        worker = next(k for k, (lo, hi) in enumerate(self._worker_slices) if lo <= env_id < hi)
        return self._pool.perturb(worker, int(env_id), kind, distance)

    def camera_calibration(self) -> dict[str, CameraCalibration]:
        """Calibration of the cameras at this env's image size (see ``cameras.camera_calibration``)."""
        return camera_calibration(self.image_shape)

    # ------------------------------------------------------------------------------------ helpers
    def _run(self) -> None:
        if self._group is not None:
            self._group.run()
        else:
            self._pool.run()

    def _task_state(self, info: bool) -> TaskState:
        """The state the last step reached (``info``: before any autoreset) or the current one (after it)."""
        a = self._buffers.arrays
        if info:
            return TaskState(
                a["info_object_pos"].copy(), a["info_container_pos"].copy(), a["info_tcp_pos"].copy(),
                a["info_object_speed"].copy(), a["info_object_quat"].copy(),
            )  # fmt: skip
        speed = np.linalg.norm(a["object_linvel"], axis=1)
        return TaskState(
            a["object_pos"].copy(), a["container_pos"].copy(), a["tcp_pos"].copy(), speed, a["object_quat"].copy()
        )

    def _render_views(self) -> dict[str, np.ndarray]:
        return self._frame_store  # the latest frames of every env (all rendered under a render mode)

    def _observation(self) -> dict[str, dict[str, np.ndarray]]:
        """The batch's observation. Images are read-only views of the frame buffers (valid until the next
        ``step``/``reset``), or copies with ``frame_views=False``."""
        a = self._buffers.arrays
        if self._pool is not None:  # bring in the frames rendered by this step only
            for start, stop in _runs(np.flatnonzero(a["fresh"])):
                for name in CAMERA_NAMES:
                    self._frame_store[name][start:stop] = a[name][start:stop]
        if self.frame_views:
            policy = dict(self._frames)
        else:
            policy = {name: frames.copy() for name, frames in self._frame_store.items()}
        policy[droid.OBS_JOINT_KEY] = a["joint_pos"].astype(np.float32)
        policy[droid.OBS_GRIPPER_KEY] = a["gripper_pos"].astype(np.float32).reshape(-1, 1)
        return {droid.POLICY_GROUP: policy}


def _runs(ids: np.ndarray) -> list[tuple[int, int]]:
    """Sorted ``ids`` as half-open ``(start, stop)`` runs of consecutive values."""
    if not ids.size:
        return []
    breaks = np.flatnonzero(np.diff(ids) != 1) + 1
    starts = np.concatenate(([ids[0]], ids[breaks]))
    stops = np.concatenate((ids[breaks - 1] + 1, [ids[-1] + 1]))
    return list(zip(starts.tolist(), stops.tolist()))


def _read_only(array: np.ndarray) -> np.ndarray:
    view = array.view()
    view.flags.writeable = False
    return view


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
