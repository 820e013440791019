"""Episode bookkeeping shared by every batched DROID backend: seeds, step counts, success and milestones.

A backend (embedded MuJoCo, Isaac Lab, the Isaac stand-in) owns physics and rendering; everything that
follows episodes lives here, once, so that all backends agree on names and semantics:

- **env ids** (:func:`resolve_env_ids`): which envs a ``reset`` touches: ``options={"env_ids": ids}``,
  ``options={"reset_mask": mask}`` or Isaac Lab's ``env_ids=`` keyword; integers (numpy, torch, list, a
  slice), distinct, in ``[0, N)``; an empty selection resets nothing.
- **seeds** (:meth:`Episodes.reset_seeds`, :meth:`Episodes.next_seeds`): a seed queued with
  ``set_episode_seeds`` wins; else ``reset(seed=s)`` gives env ``i`` the seed ``s + i``; else an env's
  next episode runs its previous seed ``+ N`` (so a batch started from ``s`` runs ``s, s+1, ...`` without
  repeats); the very first episode without any seed uses the backend's ``seed`` argument, else a random
  base drawn once.
- **counters**: ``episode_seed``, ``episode_step`` (steps taken in the episode), ``episode_count``
  (episodes started per env: a change marks a new episode).
- **success**: the placement check of :mod:`dz_gym.envs.droid` on a :class:`TaskState`, and its OR over
  the episode (``success_any_step``).
- **a backend's own checks**: a backend whose simulator judges the task itself (sim-evals' MILA tasks)
  names its milestones (``Episodes(..., milestone_names=...)``, in order, the last one being success) and
  hands their flags in with the state (``TaskState.milestone_flags``, ``(N, M)`` bool). They then replace
  the built-in checks below: ``success`` is the final flag, and ``info["milestones"]`` reports each one
  under its own name and, mapped in order, under the generic names.
- **milestones** (:data:`MILESTONES`): the first episode step at which each stage of the task was
  reached, checked in order as sim-evals' MILA tasks do (a stage counts only once the one before it has):

  ============= ====================================================================================
  ``reached``   the tool centre point is within ``reach_distance`` (3 cm) of the object's box
                (its centre when the backend gives no orientation or box)
  ``lifted``    the object's centre is ``lift_height`` (5 cm) above its height at the episode's start
  ``above_target`` the object's centre is within the scene's ``xy_radius`` of the container's centre
                horizontally and ``above_height`` (8 cm) above the container's origin
  ``placed``    the placement (success) check holds
  ============= ====================================================================================

- **info** (:meth:`Episodes.info`): one dict of ``(N, ...)`` numpy arrays per ``reset``/``step``,
  describing the state the step reached (before any autoreset); :data:`INFO_KEYS` lists its keys, each with
  Gymnasium's vector-info mask beside it (``_success``; ``milestones`` holds ``_<name>`` masks too; all True:
  :mod:`dz_gym.envs.vector_info`).

The flow a backend follows (``book`` is ``self.episodes`` of :class:`~dz_gym.envs.base.BatchedDroidEnv`)::

    # reset(seed, options)
    ids = book.resolve_reset_ids(options)          # validated, sorted
    seeds = book.reset_seeds(ids, seed)            # consumes queued seeds
    ... reset the simulator's envs ``ids`` with ``seeds`` ...
    info = book.record_reset(ids, seeds, state, images_fresh)

    # step(action)
    ending = book.ending_next_step(max_episode_length)   # (N,) bool, known before the physics
    seeds = book.next_seeds(np.flatnonzero(ending))      # seeds of the next episodes, if needed early
    ... step the simulator (and autoreset the envs that end) ...
    info = book.record_step(state, time_outs, images_fresh)
    book.start(done_ids, seeds, state_after_reset)       # the next episodes begin

Example (no simulator needed)::

    >>> import numpy as np
    >>> from dz_gym.envs import droid
    >>> book = Episodes(2, droid.scene_spec(1), seed=10)
    >>> ids = book.resolve_reset_ids(None)
    >>> seeds = book.reset_seeds(ids, None)
    >>> objects = np.array([[0.5, -0.1, 0.025], [0.5, 0.0, 0.025]])
    >>> state = TaskState.resting(objects, np.array([[0.55, 0.16, 0.0]] * 2))
    >>> info = book.record_reset(ids, seeds, state)
    >>> info["episode_seed"].tolist(), info["episode_step"].tolist()
    ([10, 11], [0, 0])
    >>> info = book.record_step(state, time_outs=np.array([False, True]))
    >>> info["episode_step"].tolist(), info["milestones"]["reached"].tolist()
    ([1, 1], [-1, -1])
    >>> book.start([1], book.next_seeds([1]))
    >>> book.episode_seed.tolist()
    [10, 13]
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from dz_gym.envs import droid
from dz_gym.envs.vector_info import with_masks
from dz_gym.preprocess import to_numpy

MILESTONES = ("reached", "lifted", "above_target", "placed")
NOT_REACHED = -1  # value of a milestone's first step while it has not been reached

INFO_KEYS = (
    "success",  # (N,) bool: the placement check on the state this step reached
    "success_any_step",  # (N,) bool: its OR over the episode so far
    "time_outs",  # (N,) bool: the episode ended by its step limit with this step
    "episode_seed",  # (N,) int64: seed of the episode this step belonged to
    "episode_step",  # (N,) int64: steps taken in that episode (0 on reset)
    "object_pos",  # (N,3) float64, env-local (robot base at the origin, table top z = 0)
    "object_quat",  # (N,4) float64 w-x-y-z; NaN where the backend does not report it
    "object_start_pos",  # (N,3) the object's position at the start of the episode (the lift reference)
    "container_pos",  # (N,3)
    "tcp_pos",  # (N,3) the gripper's tool centre point
    "milestones",  # dict name -> (N,) int64: first episode step of each milestone, -1 while not reached
    "images_fresh",  # (N,) bool: the returned observation's images were rendered for this state
)


@dataclass(frozen=True)
class TaskState:
    """What the success and milestone checks need of every env, env-local, host float64 arrays.

    ``object_quat`` (w-x-y-z) is optional: without it the reach check measures to the object's centre.
    """

    object_pos: np.ndarray  # (N,3)
    container_pos: np.ndarray  # (N,3)
    tcp_pos: np.ndarray  # (N,3)
    object_speed: np.ndarray  # (N,) linear speed, m/s
    object_quat: np.ndarray | None = None  # (N,4)
    # (N, M) bool: the backend's own milestone flags now (see ``Episodes(milestone_names=...)``); None for
    # the built-in checks
    milestone_flags: np.ndarray | None = None

    def success(self, criteria: droid.SuccessCriteria) -> np.ndarray:
        """The shared DROID placement check, ``(N,)`` bool."""
        return droid.placement_success(criteria, self.object_pos, self.container_pos, self.object_speed, self.tcp_pos)

    @classmethod
    def resting(cls, object_pos, container_pos, tcp_height: float = 0.3) -> TaskState:
        """Objects at rest with the tool centre point ``tcp_height`` above the object (tests, doubles)."""
        object_pos = np.asarray(object_pos, dtype=np.float64).reshape(-1, 3)
        tcp = object_pos + np.array([0.0, 0.0, tcp_height])
        return cls(
            object_pos, np.asarray(container_pos, dtype=np.float64).reshape(-1, 3), tcp, np.zeros(len(object_pos))
        )


@dataclass(frozen=True)
class ObjectBox:
    """The object's bounding box in its body frame (metres): centre offset and half extents."""

    center: tuple[float, float, float]
    half_extents: tuple[float, float, float]


def quat_rotate_inverse(quat: np.ndarray, vectors: np.ndarray) -> np.ndarray:
    """Rotate ``vectors`` ``(N,3)`` by the inverse of unit quaternions ``quat`` ``(N,4)`` (w-x-y-z).

    Written out per component (``np.cross`` costs more than the arithmetic at these sizes).
    """
    w, ux, uy, uz = quat[:, 0], -quat[:, 1], -quat[:, 2], -quat[:, 3]  # the conjugate's vector part
    vx, vy, vz = vectors[:, 0], vectors[:, 1], vectors[:, 2]
    tx, ty, tz = 2.0 * (uy * vz - uz * vy), 2.0 * (uz * vx - ux * vz), 2.0 * (ux * vy - uy * vx)
    out = np.empty_like(vectors, dtype=np.float64)
    out[:, 0] = vx + w * tx + (uy * tz - uz * ty)
    out[:, 1] = vy + w * ty + (uz * tx - ux * tz)
    out[:, 2] = vz + w * tz + (ux * ty - uy * tx)
    return out


def reach_distance(state: TaskState, box: ObjectBox | None) -> np.ndarray:
    """Distance ``(N,)`` from the tool centre point to the object's box (0 inside), or to its centre."""
    offset = np.asarray(state.tcp_pos, dtype=np.float64) - np.asarray(state.object_pos, dtype=np.float64)
    quat = state.object_quat
    if box is None or quat is None or not np.isfinite(quat).all():
        return np.linalg.norm(offset, axis=1)
    local = quat_rotate_inverse(np.asarray(quat, dtype=np.float64), offset) - np.asarray(box.center)
    outside = np.maximum(np.abs(local) - np.asarray(box.half_extents), 0.0)
    return np.linalg.norm(outside, axis=1)


def milestone_checks(
    scene: droid.SceneSpec, state: TaskState, start_z: np.ndarray, success: np.ndarray, box: ObjectBox | None = None
) -> dict[str, np.ndarray]:
    """Each milestone's condition on ``state`` now, ``(N,)`` bool, before the in-order rule."""
    criteria = scene.milestones
    obj = np.asarray(state.object_pos, dtype=np.float64)
    container = np.asarray(state.container_pos, dtype=np.float64)
    xy = np.hypot(obj[:, 0] - container[:, 0], obj[:, 1] - container[:, 1])
    return {
        "reached": reach_distance(state, box) < criteria.reach_distance,
        "lifted": obj[:, 2] > start_z + criteria.lift_height,
        "above_target": (xy <= scene.success.xy_radius) & (obj[:, 2] - container[:, 2] > criteria.above_height),
        "placed": np.asarray(success, dtype=bool),
    }


def resolve_env_ids(num_envs: int, env_ids: Any = None, options: Mapping[str, Any] | None = None) -> np.ndarray:
    """The envs a reset touches, as a sorted int64 array; a one-line ``ValueError`` for bad ids.

    ``env_ids`` (Isaac Lab's keyword) wins over ``options["env_ids"]``, which wins over
    ``options["reset_mask"]`` (Gymnasium's ``(N,)`` bool mask); none of them means every env.
    """
    if env_ids is None and options:
        if options.get("env_ids") is not None:
            env_ids = options["env_ids"]
        elif options.get("reset_mask") is not None:
            mask = to_numpy(options["reset_mask"])
            if mask.dtype != bool or mask.reshape(-1).shape != (num_envs,):
                raise ValueError(
                    f"options['reset_mask']: expected a ({num_envs},) bool array, got {mask.dtype} {mask.shape}"
                )
            return np.flatnonzero(mask.reshape(-1)).astype(np.int64)
    if env_ids is None:
        return np.arange(num_envs, dtype=np.int64)
    if isinstance(env_ids, slice):
        return np.arange(num_envs, dtype=np.int64)[env_ids]
    ids = np.atleast_1d(to_numpy(env_ids))
    if ids.size and ids.dtype.kind not in "iu":
        raise ValueError(f"env_ids: expected integer env ids, got dtype {ids.dtype}")
    ids = ids.astype(np.int64).reshape(-1)
    if ids.size and (ids.min() < 0 or ids.max() >= num_envs or np.unique(ids).size != ids.size):
        raise ValueError(f"env_ids: expected distinct ids in [0, {num_envs}), got {ids.tolist()}")
    return np.sort(ids)


def check_seed(seed: Any, name: str = "seed") -> int | None:
    """``seed`` as an int (or None); a one-line ``ValueError`` for anything else."""
    if seed is None:
        return None
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
        raise ValueError(f"{name}: expected an integer or None, got {seed!r}")
    return int(seed)


class Episodes:
    """Per-env episode state of a batch of ``num_envs`` envs of ``scene`` (see the module docstring).

    The arrays ``episode_seed``, ``episode_step``, ``episode_count``, ``success_any`` and ``start_pos`` are
    owned here; read them, never write them. ``box`` (the object's box in its body frame) refines the
    reach check when the backend's :class:`TaskState` carries ``object_quat``. ``milestone_names`` other
    than :data:`MILESTONES` are a backend's own milestones: every state it records then carries their
    ``milestone_flags``.
    """

    def __init__(
        self,
        num_envs: int,
        scene: droid.SceneSpec,
        seed: int | None = None,
        box: ObjectBox | None = None,
        milestone_names: Sequence[str] = MILESTONES,
    ):
        n = int(num_envs)
        self.num_envs = n
        self.scene = scene
        self.box = box
        self.milestone_names = tuple(milestone_names)
        if not self.milestone_names or len(set(self.milestone_names)) != len(self.milestone_names):
            raise ValueError(f"milestone_names: expected distinct names, got {list(self.milestone_names)}")
        self.initial_seed = check_seed(seed)
        self.episode_seed = np.zeros(n, dtype=np.int64)
        self.episode_step = np.zeros(n, dtype=np.int64)
        self.episode_count = np.zeros(n, dtype=np.int64)
        self.success_any = np.zeros(n, dtype=bool)
        self.start_pos = np.full((n, 3), np.nan)
        self.milestone_steps = {name: np.full(n, NOT_REACHED, dtype=np.int64) for name in self.milestone_names}
        self._queued: dict[int, int] = {}

    # -- seeds ------------------------------------------------------------------------------------------
    @property
    def started(self) -> bool:
        """Whether any env has started an episode (``reset`` ran)."""
        return bool(self.episode_count.any())

    def queue_seeds(self, env_ids, seeds) -> None:
        """Queue the seed of the next episode of each env in ``env_ids`` (applied when it resets)."""
        env_ids = np.atleast_1d(to_numpy(env_ids)).reshape(-1)
        seeds = np.atleast_1d(to_numpy(seeds)).reshape(-1)
        if env_ids.shape != seeds.shape:
            raise ValueError(f"seeds: expected one seed per env id, got {seeds.shape} for {env_ids.shape}")
        if env_ids.size and env_ids.dtype.kind not in "iu":
            raise ValueError(f"env_ids: expected integer env ids, got dtype {env_ids.dtype}")
        if seeds.size and seeds.dtype.kind not in "iu":
            raise ValueError(f"seeds: expected integers, got dtype {seeds.dtype}")
        for env_id, seed in zip(env_ids.tolist(), seeds.tolist()):
            if not 0 <= env_id < self.num_envs:
                raise ValueError(f"env_ids: expected ids in [0, {self.num_envs}), got {env_id}")
            self._queued[int(env_id)] = int(seed)

    def reset_seeds(self, ids, seed: int | None) -> np.ndarray:
        """Seeds of the episodes that ``reset(seed=seed)`` starts in envs ``ids`` (queued seeds consumed)."""
        seed = check_seed(seed)
        ids = np.asarray(ids, dtype=np.int64).reshape(-1)
        fresh = self.episode_count[ids] == 0
        if seed is None and fresh.any() and self.initial_seed is None:
            # drawn once, so that the envs of a batch still run consecutive seeds
            self.initial_seed = int(np.random.SeedSequence().entropy % 2**31)
        if seed is None and not self.started:
            seed = self.initial_seed
        if seed is not None:
            fallback = seed + ids
        else:
            fallback = np.where(fresh, ids + (self.initial_seed or 0), self.episode_seed[ids] + self.num_envs)
        return np.array([self._queued.pop(int(i), int(f)) for i, f in zip(ids, fallback)], dtype=np.int64)

    def next_seeds(self, ids) -> np.ndarray:
        """Seeds of the next episodes of envs ``ids`` after their current ones end (queued seeds consumed)."""
        return self.reset_seeds(ids, None)

    # -- episodes ---------------------------------------------------------------------------------------
    def resolve_reset_ids(self, options: Mapping[str, Any] | None, env_ids: Any = None) -> np.ndarray:
        """:func:`resolve_env_ids` for this batch."""
        return resolve_env_ids(self.num_envs, env_ids, options)

    def ending_next_step(self, max_episode_length) -> np.ndarray:
        """``(N,)`` bool: envs whose next step reaches ``max_episode_length`` (a scalar or per env)."""
        return self.episode_step + 1 >= np.asarray(max_episode_length)

    def start(self, ids, seeds, state: TaskState | None = None) -> None:
        """Envs ``ids`` begin new episodes with ``seeds``; ``state`` (after their reset) gives the lift
        reference, else the first state recorded in the episode does."""
        ids = np.asarray(ids, dtype=np.int64).reshape(-1)
        if not ids.size:
            return
        self.episode_seed[ids] = np.asarray(seeds, dtype=np.int64).reshape(-1)
        self.episode_step[ids] = 0
        self.episode_count[ids] += 1
        self.success_any[ids] = False
        for steps in self.milestone_steps.values():
            steps[ids] = NOT_REACHED
        self.start_pos[ids] = np.nan if state is None else np.asarray(state.object_pos, dtype=np.float64)[ids]

    def record_reset(self, ids, seeds, state: TaskState, images_fresh=None) -> dict[str, Any]:
        """Start episodes ``ids`` and return the ``info`` of the reset (every env's current state)."""
        ids = np.asarray(ids, dtype=np.int64).reshape(-1)
        self.start(ids, seeds, state)
        selected = np.zeros(self.num_envs, dtype=bool)
        selected[ids] = True
        return self._record(state, np.zeros(self.num_envs, dtype=bool), images_fresh, selected)

    def record_step(self, state: TaskState, time_outs, images_fresh=None) -> dict[str, Any]:
        """Count one step of every env and return its ``info`` (the state the step reached); the envs that
        ended are not restarted here: call :meth:`start` for them with :meth:`next_seeds`."""
        self.episode_step += 1
        return self._record(state, to_numpy(time_outs).astype(bool).reshape(-1), images_fresh, None)

    def _checks(self, state: TaskState) -> tuple[np.ndarray, list[np.ndarray]]:
        """Success ``(N,)`` and each milestone's condition now, in the order of ``milestone_names``."""
        names = self.milestone_names
        if state.milestone_flags is not None:
            flags = np.asarray(state.milestone_flags, dtype=bool).reshape(self.num_envs, -1)
            if flags.shape[1] != len(names):
                raise ValueError(
                    f"milestone_flags: expected ({self.num_envs}, {len(names)}) for {list(names)}, got {flags.shape}"
                )
            return flags[:, -1].copy(), [flags[:, i] for i in range(len(names))]
        if names != MILESTONES:
            raise ValueError(
                f"milestone_flags: the backend's milestones {list(names)} need their flags in every TaskState"
            )
        success = state.success(self.scene.success)
        checks = milestone_checks(self.scene, state, self.start_pos[:, 2], success, self.box)
        return success, [checks[name] for name in MILESTONES]

    def _record(self, state: TaskState, time_outs, images_fresh, selected) -> dict[str, Any]:
        n = self.num_envs
        update = np.ones(n, dtype=bool) if selected is None else selected
        unknown = update & np.isnan(self.start_pos[:, 0])
        self.start_pos[unknown] = np.asarray(state.object_pos, dtype=np.float64)[unknown]
        success, conditions = self._checks(state)
        self.success_any |= success & update
        previous = update
        for name, condition in zip(self.milestone_names, conditions):
            steps = self.milestone_steps[name]
            now = condition & previous & (steps == NOT_REACHED)
            steps[now] = self.episode_step[now]
            previous = update & (steps != NOT_REACHED)
        milestones = {
            generic: self.milestone_steps[own].copy() for generic, own in zip(MILESTONES, self.milestone_names)
        }
        milestones.update({name: steps.copy() for name, steps in self.milestone_steps.items()})
        quat = state.object_quat
        info = {
            "success": success,
            "success_any_step": self.success_any.copy(),
            "time_outs": time_outs,
            "episode_seed": self.episode_seed.copy(),
            "episode_step": self.episode_step.copy(),
            "object_pos": np.array(state.object_pos, dtype=np.float64),
            "object_quat": np.full((n, 4), np.nan) if quat is None else np.array(quat, dtype=np.float64),
            "object_start_pos": self.start_pos.copy(),
            "container_pos": np.array(state.container_pos, dtype=np.float64),
            "tcp_pos": np.array(state.tcp_pos, dtype=np.float64),
            "milestones": milestones,
            "images_fresh": np.ones(n, dtype=bool) if images_fresh is None else np.array(images_fresh, dtype=bool),
        }
        return with_masks(info, n)  # Gymnasium's vector form: every env reports every key
