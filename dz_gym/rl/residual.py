"""``ResidualEnv``: residual RL over a served policy, as a batched torch env on top of the wrapper.

The served policy (DreamZero, or any OpenPI server) proposes the next action of every env; a learned policy
adds a bounded correction. :class:`ResidualEnv` turns a :class:`~dz_gym.wrapper.DreamZeroPolicyWrapper` into
that problem:

- **action** ``(N, 8)`` in ``[-1, 1]`` (clipped): the executed action is ``proposal + scale * action``, with
  ``scale`` per dimension (default 0.05 rad for the 7 joint targets, 0.5 for the gripper command, which is
  then clipped to ``[0, 1]``). A zero action executes exactly the served policy.
- **observation**: a dict of ``(N, D)`` float32 tensors on ``device``, one per group:

  - ``"policy"`` (:data:`POLICY_TERMS`, 17 values): arm joints (7), gripper (1), the served policy's proposal
    for this step (8) and the episode's progress (step / ``episode_length``);
  - ``"privileged"`` (:data:`PRIVILEGED_TERMS`, 25 values, for an asymmetric critic): the object's position
    and orientation, the container's and the tool centre point's positions, the object relative to the
    tool and to the container, the object's lift above its start, the milestones reached so far and
    whether the episode has succeeded. All from the env's ``info`` (the same keys on every backend).

- **reward**: from success and the milestones, dense or sparse (:mod:`dz_gym.rl.rewards`).
- **episodes**: the residual env ends them itself, after ``episode_length`` steps (``truncated``) or, with
  ``terminate_on_success`` (default), in the step in which the placement check first holds (``terminated``).
  It needs the env's own ``max_episode_length`` to be longer, so that the env never resets an episode on
  its own and every final state is observed (:func:`make_residual_env` builds the env so).

Resets follow Gymnasium's ``SAME_STEP`` convention, like the wrapper: in the step in which an episode ends,
the env is reset at once; the returned observation of that env is the first one of its next episode, the
last one of the ended episode is in ``info["final_obs"]`` (a dict of ``(N, D)`` numpy arrays, rows valid
where ``info["_final_obs"]``), and ``info["final_info"]`` holds the ended episodes' ``success``,
``success_any_step``, ``return`` and ``length`` (mask ``info["_final_info"]``). The final observation's
proposal entries repeat the proposal executed in the final step: an episode that is over asks the server
for nothing more. The rest of ``info`` is the wrapper's and describes the state each step reached, before
any reset (``info["chunk_stats"]`` holds the ended episodes' chunk statistics, as the wrapper gives them).

**Server calls.** The served policy is asked exactly when the wrapper's chunk schedule says so (every
``open_loop_horizon`` steps of an episode); the residual env reads each step's proposal with
:meth:`~dz_gym.wrapper.DreamZeroPolicyWrapper.propose`, which the following ``step`` executes (plus the
residual): no request beyond the schedule, none for an episode that has ended.

``ResidualEnv`` is the batched env itself; :class:`~dz_gym.rl.rsl_rl_env.RslRlVecEnv` adapts it to rsl_rl
and :class:`~dz_gym.rl.vector.ResidualVectorEnv` to Gymnasium's vector API. Needs torch (``dz-gym[rl]``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from dz_gym.envs import droid
from dz_gym.envs.episodes import MILESTONES, NOT_REACHED
from dz_gym.records import EpisodeStats
from dz_gym.requests import to_numpy
from dz_gym.rl.rewards import RewardConfig, step_reward
from dz_gym.wrapper import DreamZeroPolicyWrapper

__all__ = [
    "DEFAULT_RESIDUAL_SCALE",
    "OBSERVATION_GROUPS",
    "POLICY_TERMS",
    "PRIVILEGED_TERMS",
    "ResidualEnv",
    "make_residual_env",
]

DEFAULT_RESIDUAL_SCALE = (0.05,) * droid.ARM_DOF + (0.5,)
POLICY_TERMS = (("joint_pos", droid.ARM_DOF), ("gripper_pos", 1), ("proposal", droid.ACTION_DIM), ("progress", 1))
PRIVILEGED_TERMS = (
    ("object_pos", 3),
    ("object_quat", 4),
    ("container_pos", 3),
    ("tcp_pos", 3),
    ("object_from_tcp", 3),
    ("object_from_container", 3),
    ("object_lift", 1),
    ("milestones_reached", len(MILESTONES)),
    ("succeeded", 1),
)
OBSERVATION_GROUPS = {"policy": POLICY_TERMS, "privileged": PRIVILEGED_TERMS}


def _group_dim(terms) -> int:
    return sum(size for _, size in terms)


class ResidualEnv:
    """Residual RL over ``wrapper``'s served policy, batched, torch tensors on ``device`` (module docstring).

    ``episode_length``: steps per episode (default: the env's ``max_episode_length`` - 1; it must be
    shorter than the env's); ``residual_scale``: one number or 8, the correction at action 1;
    ``reward``: a :class:`~dz_gym.rl.rewards.RewardConfig`; ``terminate_on_success``: end an episode in
    the step in which it first succeeds. The residual env owns ``wrapper`` and closes it.
    """

    def __init__(
        self,
        wrapper: DreamZeroPolicyWrapper,
        *,
        episode_length: int | None = None,
        residual_scale: float | Sequence[float] = DEFAULT_RESIDUAL_SCALE,
        reward: RewardConfig | None = None,
        terminate_on_success: bool = True,
        device: Any = "cpu",
    ):
        import torch

        if not isinstance(wrapper, DreamZeroPolicyWrapper):
            raise TypeError(f"wrapper: expected a DreamZeroPolicyWrapper, got {type(wrapper).__name__}")
        env_length = int(wrapper.max_episode_length)
        if episode_length is None:
            episode_length = env_length - 1
        if (
            isinstance(episode_length, bool)
            or not isinstance(episode_length, (int, np.integer))
            or not (1 <= episode_length < env_length)
        ):
            raise ValueError(
                f"episode_length: expected an integer in [1, {env_length - 1}] (shorter than the env's "
                f"max_episode_length {env_length}, so that every final state is observed), got {episode_length!r}"
            )
        scale = np.asarray(residual_scale, dtype=np.float32)
        if (
            scale.ndim > 1
            or scale.size not in (1, droid.ACTION_DIM)
            or not np.all(np.isfinite(scale))
            or np.any(scale < 0)
        ):
            raise ValueError(
                f"residual_scale: expected one number >= 0 or {droid.ACTION_DIM} of them, got {residual_scale!r}"
            )
        if reward is not None and not isinstance(reward, RewardConfig):
            raise TypeError(f"reward: expected a RewardConfig, got {type(reward).__name__}")
        self.wrapper = wrapper
        self.num_envs = int(wrapper.num_envs)
        self.num_actions = droid.ACTION_DIM
        self.episode_length = int(episode_length)
        self.residual_scale = np.broadcast_to(scale, (droid.ACTION_DIM,)).copy()
        self.reward_config = reward or RewardConfig()
        self.terminate_on_success = bool(terminate_on_success)
        self.device = torch.device(device)
        self.observation_dims = {name: _group_dim(terms) for name, terms in OBSERVATION_GROUPS.items()}
        n = self.num_envs
        self.episode_steps = np.zeros(n, dtype=np.int64)  # steps taken in each env's current episode
        self._succeeded = np.zeros(n, dtype=bool)
        self._returns = np.zeros(n, dtype=np.float64)
        self._proposal: np.ndarray | None = None
        self._arrays: dict[str, np.ndarray] | None = None  # the current observation, numpy
        self._obs: dict[str, Any] | None = None  # the same as tensors on self.device
        self._closed = False

    # -- API ------------------------------------------------------------------------------------------
    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        """Reset every env (new episodes, new sessions); returns ``(obs, info)``.

        Only whole-batch resets: single episodes end inside :meth:`step` (a partial reset here would drop the
        proposal already read for the other envs). ``options`` go to the env otherwise.
        """
        self._check_open()
        if options and (options.get("env_ids") is not None or options.get("reset_mask") is not None):
            raise ValueError("options: ResidualEnv.reset resets every env; episodes end inside step()")
        obs, info = self.wrapper.reset(seed=seed, options=options)
        self.episode_steps[:] = 0
        self._succeeded[:] = False
        self._returns[:] = 0.0
        self._proposal = self.wrapper.propose()
        self._arrays = self._observe(obs, info)
        self._obs = self._to_tensors(self._arrays)
        return self._obs, info

    def step(self, action):
        """Execute ``proposal + scale * clip(action, -1, 1)``; returns ``(obs, reward, terminated, truncated,
        info)`` with ``(N,)`` tensors on ``device`` and ``info`` as in the module docstring."""
        self._check_open()
        if self._proposal is None:
            raise RuntimeError("step: call reset() first")
        residual = self._residual(action)
        proposal = self._proposal
        executed = proposal + residual * self.residual_scale
        executed[:, droid.ARM_DOF] = np.clip(executed[:, droid.ARM_DOF], 0.0, 1.0)
        obs, _, env_terminated, env_truncated, info = self.wrapper.step(executed)
        ended_by_env = np.asarray(to_numpy(env_terminated), bool).reshape(-1) | np.asarray(
            to_numpy(env_truncated), bool
        ).reshape(-1)
        if ended_by_env.any():
            raise RuntimeError(
                f"envs {np.flatnonzero(ended_by_env).tolist()} ended their episodes on their own: the env's "
                f"max_episode_length must exceed episode_length ({self.episode_length})"
            )
        self.episode_steps += 1
        reward, first_success = step_reward(self.reward_config, info, self._succeeded, residual)
        self._succeeded |= first_success
        self._returns += reward
        success = np.asarray(info["success"], dtype=bool)
        terminated = first_success if self.terminate_on_success else np.zeros(self.num_envs, dtype=bool)
        truncated = (self.episode_steps >= self.episode_length) & ~terminated
        done = terminated | truncated
        info = dict(info)
        if done.any():
            ids = np.flatnonzero(done)
            final_arrays = self._observe(obs, info)  # the ended episodes' last observation (all rows)
            info.update(self._final_entries(final_arrays, done, success, info))
            obs, reset_info = self.wrapper.reset(options={"env_ids": ids})
            self.episode_steps[ids] = 0
            self._succeeded[ids] = False
            self._returns[ids] = 0.0
            info_now = _merge_rows(info, reset_info, ids)
        else:
            info_now = info
        self._proposal = self.wrapper.propose()
        self._arrays = self._observe(obs, info_now)
        self._obs = self._to_tensors(self._arrays)
        import torch

        flags = torch.as_tensor(np.stack([terminated, truncated]), device=self.device)
        return self._obs, torch.as_tensor(reward, device=self.device), flags[0], flags[1], info

    @property
    def observations(self) -> dict[str, Any]:
        """The current observation (tensors), as the last ``reset``/``step`` returned it."""
        if self._obs is None:
            raise RuntimeError("observations: call reset() first")
        return self._obs

    @property
    def proposal(self) -> np.ndarray:
        """The served policy's ``(N, 8)`` proposal for the next step (a copy)."""
        if self._proposal is None:
            raise RuntimeError("proposal: call reset() first")
        return self._proposal.copy()

    def close(self) -> None:
        """Close the wrapper (its connections and the env); idempotent."""
        if not self._closed:
            self._closed = True
            self.wrapper.close()

    # -- internals ------------------------------------------------------------------------------------
    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("ResidualEnv: closed")

    def _residual(self, action) -> np.ndarray:
        try:
            array = np.asarray(to_numpy(action), dtype=np.float32)
        except (TypeError, ValueError):
            raise ValueError(f"action: expected a numeric ({self.num_envs}, {self.num_actions}) array") from None
        if array.shape != (self.num_envs, self.num_actions):
            raise ValueError(f"action: expected shape ({self.num_envs}, {self.num_actions}), got {array.shape}")
        if not np.isfinite(array).all():
            raise ValueError("action: expected finite values, got NaN or inf")
        return np.clip(array, -1.0, 1.0)

    def _observe(self, obs, info) -> dict[str, np.ndarray]:
        """The observation groups (numpy) from the wrapper's observation and an ``info`` of the same state.

        Fresh arrays every call (the tensors made from them share their memory), filled column by column.
        """
        n, arm = self.num_envs, droid.ARM_DOF
        policy_obs = obs[droid.POLICY_GROUP]
        policy = np.empty((n, self.observation_dims["policy"]), dtype=np.float32)
        policy[:, :arm] = to_numpy(policy_obs[droid.OBS_JOINT_KEY]).reshape(n, arm)
        policy[:, arm] = to_numpy(policy_obs[droid.OBS_GRIPPER_KEY]).reshape(n)
        policy[:, arm + 1 : arm + 1 + droid.ACTION_DIM] = self._proposal
        policy[:, -1] = self.episode_steps / self.episode_length
        return {"policy": policy, "privileged": self._privileged(info)}

    def _privileged(self, info) -> np.ndarray:
        n = self.num_envs
        out = np.empty((n, self.observation_dims["privileged"]), dtype=np.float32)
        obj = np.asarray(info["object_pos"]).reshape(n, 3)
        tcp = np.asarray(info["tcp_pos"]).reshape(n, 3)
        container = np.asarray(info["container_pos"]).reshape(n, 3)
        out[:, 0:3] = obj
        out[:, 3:7] = np.asarray(info["object_quat"]).reshape(n, 4)
        out[:, 7:10] = container
        out[:, 10:13] = tcp
        out[:, 13:16] = obj - tcp
        out[:, 16:19] = obj - container
        out[:, 19] = obj[:, 2] - np.asarray(info["object_start_pos"]).reshape(n, 3)[:, 2]
        for k, name in enumerate(MILESTONES):
            out[:, 20 + k] = np.asarray(info["milestones"][name]) != NOT_REACHED
        out[:, 20 + len(MILESTONES)] = self._succeeded
        return np.nan_to_num(out, copy=False)  # backends without an orientation report NaN

    def _to_tensors(self, arrays: dict[str, np.ndarray]) -> dict[str, Any]:
        import torch

        return {name: torch.as_tensor(array, device=self.device) for name, array in arrays.items()}

    def _final_entries(self, arrays, done, success, info) -> dict[str, Any]:
        """``final_obs``/``final_info`` (Gymnasium's SAME_STEP keys) and the wrapper's ``chunk_stats``."""
        final_obs = {name: np.where(done[:, None], array, 0.0).astype(np.float32) for name, array in arrays.items()}
        final_info = {
            "success": success & done,
            "success_any_step": self._succeeded & done,
            "return": np.where(done, self._returns, 0.0),
            "length": np.where(done, self.episode_steps, 0),
        }
        ended = {int(i): self.wrapper.episode_stats(int(i)) for i in np.flatnonzero(done)}
        return {
            "final_obs": final_obs,
            "_final_obs": done.copy(),
            "final_info": final_info,
            "_final_info": done.copy(),
            "chunk_stats": EpisodeStats.to_info(ended, self.num_envs),
            "_chunk_stats": done.copy(),
        }


def _merge_rows(step_info: dict, reset_info: dict, ids: np.ndarray) -> dict:
    """``step_info`` with the rows ``ids`` of the state keys taken from ``reset_info`` (the new episodes)."""
    merged: dict[str, Any] = {}
    for key in ("object_pos", "object_quat", "object_start_pos", "container_pos", "tcp_pos"):
        values = np.array(step_info[key], copy=True)
        values[ids] = np.asarray(reset_info[key])[ids]
        merged[key] = values
    milestones = {}
    for name in MILESTONES:
        values = np.array(step_info["milestones"][name], copy=True)
        values[ids] = np.asarray(reset_info["milestones"][name])[ids]
        milestones[name] = values
    merged["milestones"] = milestones
    return merged


def make_residual_env(
    scene: int = 1,
    num_envs: int = 1,
    *,
    server: str | Sequence[str] | None = None,
    client=None,
    episode_length: int = droid.MAX_EPISODE_LENGTH,
    seed: int | None = None,
    backend: str = "mujoco",
    env_kwargs: dict[str, Any] | None = None,
    wrapper_kwargs: dict[str, Any] | None = None,
    **residual_kwargs: Any,
) -> ResidualEnv:
    """A :class:`ResidualEnv` of ``num_envs`` envs of ``scene`` over the policy at ``server`` (or ``client``).

    The env is built with ``max_episode_length = episode_length + 1`` so that the residual env ends every
    episode itself; ``env_kwargs`` go to :func:`dz_gym.make_droid_env`, ``wrapper_kwargs`` to the wrapper,
    the other keyword arguments to :class:`ResidualEnv`.
    """
    from dz_gym.envs import make_droid_env

    if isinstance(episode_length, bool) or not isinstance(episode_length, (int, np.integer)) or episode_length < 1:
        raise ValueError(f"episode_length: expected an integer >= 1, got {episode_length!r}")
    env = make_droid_env(
        backend=backend, scene=scene, num_envs=num_envs, seed=seed, max_episode_length=int(episode_length) + 1,
        **dict(env_kwargs or {}),
    )  # fmt: skip
    try:
        wrapper = DreamZeroPolicyWrapper(env, server=server, client=client, **dict(wrapper_kwargs or {}))
    except BaseException:
        env.close()
        raise
    try:
        return ResidualEnv(wrapper, episode_length=int(episode_length), **residual_kwargs)
    except BaseException:
        wrapper.close()
        raise
