"""The batched DROID env interface every backend implements (Isaac Lab's contract, plus two hooks).

A backend is a ``gymnasium.Env`` that is internally batched, like Isaac Lab's ``ManagerBasedRLEnv``:

- ``reset(*, seed=None, options=None) -> (obs, info)`` resets every env, or only ``options["env_ids"]``
  (or ``options["reset_mask"]``, an ``(N,)`` bool mask), like Isaac Lab's ``reset(env_ids=...)``; the
  returned observation is the whole batch, unchanged for the other envs. Episode seeds: a seed queued
  with :meth:`~BatchedDroidEnv.set_episode_seeds` wins, else ``seed + env_id``, else the env's previous
  seed ``+ num_envs`` (see :mod:`dz_gym.envs.episodes`).
- ``step(action) -> (obs, reward, terminated, truncated, info)`` with ``action`` ``(N, 8)`` (numpy or
  torch), ``reward``/``terminated``/``truncated`` of shape ``(N,)``. Envs that finish are reset inside the
  step (same-step autoreset, ``metadata["autoreset_mode"] = AutoresetMode.SAME_STEP``), so their returned
  observation already belongs to the next episode; as Gymnasium 1.x's same-step vector envs do, ``info``
  then carries ``final_info`` (and ``final_obs``, the episode's last observation, where the backend has it:
  the embedded simulator does, Isaac Lab resets inside its own step and does not) with their ``_final_info``
  / ``_final_obs`` masks (:func:`dz_gym.envs.vector_info.with_final`). A backend that lists
  ``AutoresetMode.DISABLED`` in :attr:`~BatchedDroidEnv.autoreset_modes` (the embedded simulator) also runs
  without autoreset (``autoreset_mode=AutoresetMode.DISABLED``): finished envs keep their last
  observation and wait for ``reset(options={"reset_mask": ...})``; stepping before that is a one-line
  ``RuntimeError``.
- ``obs["policy"]`` holds ``external_cam``, ``external_cam_2``, ``wrist_cam`` ``(N,H,W,3)`` uint8 and
  ``arm_joint_pos`` ``(N,7)``, ``gripper_pos`` ``(N,1)`` float32 (numpy for the embedded simulator, torch
  tensors on the sim device for Isaac Lab). Image arrays may be views of the backend's frame buffers:
  they are valid until the next ``step``/``reset``; copy what you keep longer.
- ``info`` (dict of arrays with a leading ``N``) describes the state *reached by this step*, before any
  autoreset; its keys are :data:`dz_gym.envs.episodes.INFO_KEYS`: ``success`` (placement check now),
  ``success_any_step`` (OR over the episode so far), ``time_outs``, ``episode_seed`` (seed of the episode
  the step belonged to), ``episode_step`` (steps taken in it), ``object_pos`` / ``object_quat`` /
  ``object_start_pos`` / ``container_pos`` / ``tcp_pos`` env-local, ``milestones`` (name -> first step,
  -1 while not reached) and ``images_fresh`` (which envs' images were rendered for the returned
  observation).

Three hooks beyond Isaac Lab's API, all optional for callers:

- :meth:`set_render_mask` tells the backend which envs' images will be read from the next observation.
  Envs outside the mask may return their previous frame (the embedded simulator skips rendering them,
  the costliest part of a step); envs reset during the step are always rendered, unless
- :meth:`set_last_episodes` says their episode was their last: the caller starts no other in them, so the
  observation an autoreset returns for them (the next episode's first) is read by nobody and is neither
  rendered nor settled (:meth:`~BatchedDroidEnv.views_to_render`).
- :meth:`set_episode_seeds` queues the seeds of the next episode of some envs, applied when they reset
  (explicitly or by autoreset). The evaluator uses it for per-episode seeds that do not depend on
  ``num_envs``.

What a backend gets from :class:`BatchedDroidEnv`: the spaces, ``self.episodes`` (an
:class:`~dz_gym.envs.episodes.Episodes`: env-id validation, seeds, episode counters, success at any step,
milestones and the ``info`` dict), ``episode_seed``/``episode_step``/``episode_count`` (read-only views),
the closed check (:meth:`_check_open`, ``self._closed``), the started check (:meth:`_check_started`) and
action validation (:meth:`_numpy_action`, :meth:`_torch_action`). A backend keeps only its physics,
rendering and simulator calls; ``dz_gym.envs.episodes`` shows the reset and step flow.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.utils import seeding
from gymnasium.vector import AutoresetMode, VectorEnv

from dz_gym.envs import droid
from dz_gym.envs.episodes import MILESTONES, Episodes, ObjectBox, check_seed
from dz_gym.envs.limits import JOINT_OVERSHOOT, action_limits, joint_limits
from dz_gym.envs.vector_info import final_observations, with_final
from dz_gym.preprocess import to_numpy


def droid_spaces(image_shape: tuple[int, int], num_envs: int | None = None) -> tuple[gym.spaces.Dict, gym.spaces.Box]:
    """Observation and action spaces of the DROID contract at ``image_shape`` (H, W).

    The action space is bounded by the robot's joint ranges and the gripper command's ``[0, 1]``
    (:mod:`dz_gym.envs.limits`): actions are absolute joint targets, so all zeros lies outside it (the
    home pose, :data:`~dz_gym.envs.droid.HOME_JOINT_POSITIONS` with the gripper open, lies inside). The
    observed ``arm_joint_pos`` lies within the same ranges widened by
    :data:`~dz_gym.envs.limits.JOINT_OVERSHOOT` (a simulated joint's limit is a stiff spring, not a wall).
    With ``num_envs`` the spaces are batched (a leading ``num_envs`` dimension), equal to
    ``gymnasium.vector.utils.batch_space`` of the single spaces but built directly: ``batch_space`` takes
    about a second for 8 envs of 720x1280 views.

    >>> observation, action = droid_spaces((180, 320), num_envs=4)
    >>> observation["policy"]["wrist_cam"].shape, action.shape
    ((4, 180, 320, 3), (4, 8))
    >>> _, single = droid_spaces((180, 320))
    >>> single.contains(np.zeros(8, np.float32)), single.contains(np.array([*droid.HOME_JOINT_POSITIONS, 0], np.float32))
    (False, True)
    """
    height, width = image_shape
    lead = () if num_envs is None else (int(num_envs),)
    image = gym.spaces.Box(0, 255, shape=lead + (height, width, 3), dtype=np.uint8)
    joint_low, joint_high = (np.asarray(q, dtype=np.float32) for q in joint_limits())
    joint_low, joint_high = joint_low - np.float32(JOINT_OVERSHOOT), joint_high + np.float32(JOINT_OVERSHOOT)
    policy = gym.spaces.Dict(
        {
            "external_cam": image,
            "external_cam_2": image,
            "wrist_cam": image,
            droid.OBS_JOINT_KEY: gym.spaces.Box(
                np.broadcast_to(joint_low, lead + (droid.ARM_DOF,)),
                np.broadcast_to(joint_high, lead + (droid.ARM_DOF,)),
                dtype=np.float32,
            ),
            droid.OBS_GRIPPER_KEY: gym.spaces.Box(0.0, 1.0, shape=lead + (1,), dtype=np.float32),
        }
    )
    observation = gym.spaces.Dict({droid.POLICY_GROUP: policy})
    low, high = action_limits()
    shape = lead + (droid.ACTION_DIM,)
    action = gym.spaces.Box(np.broadcast_to(low, shape), np.broadcast_to(high, shape), dtype=np.float32)
    return observation, action


class BatchedDroidEnv(gym.Env, VectorEnv):
    """Base class of the batched DROID backends: spaces, metadata, episode bookkeeping and the hooks.

    It is a ``gymnasium.vector.VectorEnv`` (``num_envs``, batched and ``single_*`` spaces, same-step autoreset
    declared in ``metadata["autoreset_mode"]``, ``info`` in the vector form with ``_key`` masks), so
    Gymnasium's vector wrappers and ``gym.make_vec`` compose with it, and also a ``gymnasium.Env`` (with
    ``is_vector_env``, like Isaac Lab's ``ManagerBasedRLEnv``), so ``gymnasium.Wrapper`` subclasses such as
    :class:`~dz_gym.wrapper.DreamZeroPolicyWrapper` wrap it too.

    ``seed`` is the seed of the first ``reset()`` that passes none (random when None); ``object_box``
    refines the milestones' reach check and ``milestone_names`` names a backend's own milestones (see
    :class:`~dz_gym.envs.episodes.Episodes`); ``autoreset_mode`` one of :attr:`autoreset_modes`.
    ``reset(seed=s)`` also seeds :attr:`np_random` (``np_random_seed == s``), as Gymnasium's ``reset`` does.
    """

    autoreset_modes: tuple[AutoresetMode, ...] = (AutoresetMode.SAME_STEP,)  # what the backend can run

    metadata: dict[str, Any] = {
        "render_modes": [],
        "render_fps": droid.CONTROL_HZ,
        "autoreset_mode": AutoresetMode.SAME_STEP,
    }
    is_vector_env = True

    def __init__(
        self,
        num_envs: int,
        image_shape: tuple[int, int],
        scene: int,
        device: str = "cpu",
        *,
        seed: int | None = None,
        object_box: ObjectBox | None = None,
        milestone_names: Sequence[str] = MILESTONES,
        render_mode: str | None = None,
        autoreset_mode: AutoresetMode | str = AutoresetMode.SAME_STEP,
    ):
        try:
            autoreset_mode = AutoresetMode(autoreset_mode)
        except ValueError:
            autoreset_mode = None
        if autoreset_mode not in self.autoreset_modes:
            modes = ", ".join(mode.name for mode in self.autoreset_modes)
            raise ValueError(f"autoreset_mode: {type(self).__name__} runs {modes}; got {autoreset_mode!r}")
        if render_mode is not None and render_mode not in type(self).metadata["render_modes"]:
            modes = ", ".join(type(self).metadata["render_modes"]) or "none"
            raise ValueError(f"render_mode: expected None or one of: {modes}; got {render_mode!r}")
        self.render_mode = render_mode
        if isinstance(num_envs, bool) or not isinstance(num_envs, (int, np.integer)) or num_envs < 1:
            raise ValueError(f"num_envs: expected an integer >= 1, got {num_envs!r}")
        self.metadata = dict(type(self).metadata, autoreset_mode=autoreset_mode)
        self.autoreset = autoreset_mode == AutoresetMode.SAME_STEP  # finished envs reset inside step
        self.num_envs = int(num_envs)
        self.scene = droid.scene_spec(scene)
        self.device = device
        self.step_dt = droid.STEP_DT
        self.max_episode_length = droid.MAX_EPISODE_LENGTH
        self.single_observation_space, self.single_action_space = droid_spaces(image_shape)
        self.observation_space, self.action_space = droid_spaces(image_shape, self.num_envs)
        self.episodes = Episodes(self.num_envs, self.scene, check_seed(seed), object_box, milestone_names)
        self._render_mask: np.ndarray | None = None
        self._last_episodes: np.ndarray | None = None
        self._awaiting_reset = np.zeros(self.num_envs, dtype=bool)  # ended without autoreset, not reset yet
        self._closed = False

    # -- hooks ------------------------------------------------------------------------------------------
    def set_render_mask(self, mask: np.ndarray | None) -> None:
        """Envs whose images the caller will read from the next observation (``None``: all of them; always
        all under a ``render_mode``, whose frames a recorder reads every step)."""
        self._render_mask = None if self.render_mode is not None else self._env_mask(mask, "render mask")

    def set_last_episodes(self, mask) -> None:
        """``(N,)`` bool: envs whose current episode is their last, so that nobody reads the observation an
        autoreset returns for them (``None``, the default: any env may run another episode). The evaluator
        sets it from its queues: with N episodes on N envs every episode is its env's last."""
        self._last_episodes = self._env_mask(mask, "last episodes mask")

    def _env_mask(self, mask, what: str) -> np.ndarray | None:
        """A copy of ``mask`` as an ``(N,)`` bool array (None stays None); a one-line error naming ``what``."""
        if mask is None:
            return None
        mask = np.asarray(mask, dtype=bool).reshape(-1)
        if mask.shape != (self.num_envs,):
            raise ValueError(f"{what}: expected shape ({self.num_envs},), got {mask.shape}")
        return mask.copy()

    def views_to_render(self, ending: np.ndarray) -> np.ndarray:
        """``(N,)`` bool: envs whose views the observation of a step must render, given the envs ``ending``
        in that step: those of the render mask (every env without one) whose episode goes on or is followed by
        another, and every env that resets into a next episode (its first request reads that observation)."""
        ending = np.asarray(ending, dtype=bool).reshape(-1)
        if self._render_mask is None:
            return np.ones(self.num_envs, dtype=bool)
        last = self._last_episodes if self._last_episodes is not None else np.zeros(self.num_envs, dtype=bool)
        return (self._render_mask & ~(ending & last)) | (ending & ~last)

    def set_episode_seeds(self, env_ids, seeds) -> None:
        """Queue the seed of the next episode of each env in ``env_ids``."""
        self.episodes.queue_seeds(env_ids, seeds)

    # -- episode state (read-only views) ----------------------------------------------------------------
    @property
    def episode_seed(self) -> np.ndarray:
        """``(N,)`` seed of each env's current episode."""
        return _read_only(self.episodes.episode_seed)

    @property
    def episode_step(self) -> np.ndarray:
        """``(N,)`` steps taken in each env's current episode."""
        return _read_only(self.episodes.episode_step)

    @property
    def episode_count(self) -> np.ndarray:
        """``(N,)`` episodes started per env (a change marks a new episode)."""
        return _read_only(self.episodes.episode_count)

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` ran (every later call but ``close`` raises)."""
        return self._closed

    def render(self) -> tuple[np.ndarray, ...] | None:
        """Under ``render_mode="rgb_array"`` (where a backend offers it), each env's video strip of the latest
        observation, ``(H, 3W, 3)`` uint8 (right external | wrist | left external, as the evaluator's videos);
        None without a render mode."""
        if self.render_mode is None:
            return None
        views = self._render_views()
        strips = np.concatenate([to_numpy(views[key]) for key in droid.VIDEO_STRIP_KEYS], axis=2)
        return tuple(strips[i] for i in range(self.num_envs))

    def _render_views(self) -> dict:
        """Camera name -> ``(N, H, W, 3)`` frames of the latest observation, for :meth:`render`."""
        raise NotImplementedError(f"{type(self).__name__} offers no render mode")

    def __del__(self) -> None:
        # VectorEnv closes itself from its finalizer; a backend closes on close() or at exit (the embedded
        # simulator's atexit hook), never from garbage collection, which may run in any thread.
        return None

    # -- checks for the backends ------------------------------------------------------------------------
    def _check_open(self) -> None:
        """``RuntimeError`` once the env is closed."""
        if self._closed:
            raise RuntimeError(f"{type(self).__name__}: the env is closed")

    def _check_started(self, call: str = "step") -> None:
        """``RuntimeError`` before the first ``reset``, and (without autoreset) while an ended env waits for
        its reset."""
        self._check_open()
        if not self.episodes.started:
            raise RuntimeError(f"{call}: call reset() before the first {call}()")
        if self._awaiting_reset.any():
            ids = np.flatnonzero(self._awaiting_reset).tolist()
            raise RuntimeError(
                f"{call}: envs {ids} ended (autoreset_mode DISABLED); reset them first: "
                "reset(options={'reset_mask': mask})"
            )

    def _begin_reset(self, seed: int | None, options: Mapping[str, Any] | None, env_ids: Any = None):
        """``(ids, seeds)`` of a reset (see :mod:`dz_gym.envs.episodes`; queued seeds consumed); a ``seed``
        also seeds :attr:`np_random`, as Gymnasium's ``reset(seed=)`` does. For the backends' ``reset``."""
        self._check_open()
        ids = self.episodes.resolve_reset_ids(options, env_ids)
        seeds = self.episodes.reset_seeds(ids, seed)
        if seed is not None:
            self._np_random, self._np_random_seed = seeding.np_random(int(seed))
        self._awaiting_reset[ids] = False
        return ids, seeds

    def _resetting(self, ending: np.ndarray) -> np.ndarray:
        """``(N,)`` bool: of the envs ``ending`` in a step, those that reset inside it (none without autoreset,
        where they wait for ``reset`` instead). For the backends' ``step``."""
        ending = np.asarray(ending, dtype=bool).reshape(-1)
        if self.autoreset:
            return ending
        self._awaiting_reset |= ending
        return np.zeros_like(ending)

    def _step_info(self, info: Mapping[str, Any], ending, final_obs: Mapping[str, Any] | None = None) -> dict:
        """A step's ``info`` with Gymnasium's ``final_info`` / ``final_obs`` for the envs that reset inside it
        (``final_obs``: the batched observation before their reset, numpy, read now; None where the backend
        has none). For the backends' ``step``, before the ended envs reset."""
        ending = np.asarray(ending, dtype=bool).reshape(-1)
        if not self.autoreset:
            return dict(info)
        observations = None if final_obs is None or not ending.any() else final_observations(final_obs, ending)
        return with_final(info, ending, observations)

    def _numpy_action(self, action) -> np.ndarray:
        """``action`` (numpy, list or torch, ``(N, 8)``) as a finite float64 numpy array; one-line
        ``ValueError`` naming the problem otherwise. For the backends whose sim takes numpy arrays."""
        try:
            array = to_numpy(action).astype(np.float64)
        except (TypeError, ValueError):
            raise ValueError(
                f"action: expected a numeric array of shape ({self.num_envs}, {droid.ACTION_DIM}), got {type(action).__name__}"
            ) from None
        if array.shape != (self.num_envs, droid.ACTION_DIM):
            raise ValueError(f"action: expected shape ({self.num_envs}, {droid.ACTION_DIM}), got {array.shape}")
        if not np.isfinite(array).all():
            raise ValueError("action: expected finite values, got NaN or inf")
        return array

    def _torch_action(self, action):
        """``action`` (numpy or torch, ``(N, 8)``) as a finite float32 tensor on ``self.device``; one-line
        ``ValueError`` naming the problem otherwise. For the backends whose sim takes torch tensors."""
        import torch

        if isinstance(action, torch.Tensor):
            tensor = action.detach()
        else:
            array = np.asarray(action)
            if array.dtype == object:
                raise ValueError(
                    f"action: expected a numeric ({self.num_envs}, {droid.ACTION_DIM}) array, got dtype object"
                )
            tensor = torch.as_tensor(array)
        if tuple(tensor.shape) != (self.num_envs, droid.ACTION_DIM):
            raise ValueError(f"action: expected shape ({self.num_envs}, {droid.ACTION_DIM}), got {tuple(tensor.shape)}")
        tensor = tensor.to(device=self.device, dtype=torch.float32)
        if not bool(torch.isfinite(tensor).all()):
            raise ValueError("action: expected finite values, got NaN or inf")
        return tensor


def _read_only(array: np.ndarray) -> np.ndarray:
    view = array.view()
    view.flags.writeable = False
    return view
