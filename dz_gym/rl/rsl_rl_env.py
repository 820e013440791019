"""``RslRlVecEnv``: a :class:`~dz_gym.rl.residual.ResidualEnv` as rsl_rl's ``VecEnv`` (``rsl-rl-lib`` >= 5).

Follows ``rsl_rl.env.VecEnv`` of rsl-rl-lib 5.x as its source defines it (checked on 5.5.1; 2.x returned
``(obs, extras)`` from ``get_observations()`` with the critic's observations in ``extras``; 5.x returns one
``TensorDict`` of observation groups):

- attributes ``num_envs``, ``num_actions``, ``max_episode_length``, ``episode_length_buf`` (writable: the
  runner's ``init_at_random_ep_len`` writes random lengths into it, which shortens the first episodes),
  ``device`` and ``cfg``;
- ``get_observations() -> TensorDict`` with the groups ``"policy"`` and ``"privileged"`` (batch size N);
- ``step(actions) -> (obs, rewards, dones, extras)``: ``dones`` is ``terminated | truncated`` (a long
  tensor, as Isaac Lab's wrapper gives it), ``extras["time_outs"]`` the truncations (PPO bootstraps those
  with the critic's value), ``extras["log"]`` the ended episodes' success, return and length (rsl_rl's
  logger averages them over each iteration and prints keys that start with ``/``).

Observation groups for rsl_rl's runner config: ``{"actor": ["policy"], "critic": ["policy", "privileged"]}``
(:data:`OBS_GROUPS`, an asymmetric critic); ``{"actor": ["policy"], "critic": ["policy"]}`` without
privileged information.
"""

from __future__ import annotations

from typing import Any

import torch
from rsl_rl.env import VecEnv
from tensordict import TensorDict

from dz_gym.rl.residual import ResidualEnv

__all__ = ["OBS_GROUPS", "RslRlVecEnv"]

OBS_GROUPS = {"actor": ["policy"], "critic": ["policy", "privileged"]}


class RslRlVecEnv(VecEnv):
    """rsl_rl's ``VecEnv`` over a :class:`ResidualEnv` (see the module docstring); ``seed`` is the seed of the
    first reset (made by the first ``get_observations``)."""

    def __init__(self, env: ResidualEnv, *, seed: int | None = None, cfg: dict | None = None):
        if not isinstance(env, ResidualEnv):
            raise TypeError(f"env: expected a dz_gym.rl.ResidualEnv, got {type(env).__name__}")
        self.env = env
        self.num_envs = env.num_envs
        self.num_actions = env.num_actions
        self.max_episode_length = env.episode_length
        self.device = env.device
        self.cfg = dict(cfg) if cfg is not None else self._default_cfg()
        self._seed = seed
        self._obs: TensorDict | None = None
        self.last_info: dict[str, Any] = {}  # the residual env's info of the last reset or step

    def _default_cfg(self) -> dict[str, Any]:
        env = self.env
        reward = env.reward_config
        return {
            "episode_length": env.episode_length,
            "residual_scale": env.residual_scale.tolist(),
            "terminate_on_success": env.terminate_on_success,
            "reward": {"mode": reward.mode, "milestone_weights": dict(reward.milestone_weights),
                       "success": reward.success, "residual_cost": reward.residual_cost},
            "open_loop_horizon": env.wrapper.open_loop_horizon,
            "prompts": sorted(set(env.wrapper.prompts)),
        }  # fmt: skip

    # -- VecEnv ---------------------------------------------------------------------------------------
    @property
    def episode_length_buf(self) -> torch.Tensor:
        """``(N,)`` steps taken in each env's current episode (a copy; assign to change them)."""
        return torch.as_tensor(self.env.episode_steps, dtype=torch.long, device=self.device).clone()

    @episode_length_buf.setter
    def episode_length_buf(self, value) -> None:
        steps = torch.as_tensor(value).detach().to("cpu", torch.long).reshape(-1).numpy()
        if steps.shape != (self.num_envs,):
            raise ValueError(f"episode_length_buf: expected shape ({self.num_envs},), got {tuple(steps.shape)}")
        self.env.episode_steps[:] = steps.clip(0, self.max_episode_length - 1)

    def get_observations(self) -> TensorDict:
        if self._obs is None:
            self.reset()
        return self._obs

    def reset(self, seed: int | None = None) -> tuple[TensorDict, dict]:
        """Reset every env, with ``seed`` (default: the constructor's, for the first reset). The runner never
        calls it (the env resets finished episodes inside ``step``); evaluation loops do."""
        obs, info = self.env.reset(seed=self._seed if seed is None else seed)
        self._seed = None
        self.last_info = info
        self._obs = self._tensordict(obs)
        return self._obs, {}

    def step(self, actions: torch.Tensor) -> tuple[TensorDict, torch.Tensor, torch.Tensor, dict]:
        if self._obs is None:
            self.reset()
        obs, reward, terminated, truncated, info = self.env.step(actions)
        self.last_info = info
        self._obs = self._tensordict(obs)
        dones = terminated | truncated
        extras: dict[str, Any] = {"time_outs": truncated}
        if "_final_info" in info:
            ended = info["_final_info"]
            final = info["final_info"]
            extras["log"] = {
                f"/episode/{key}": torch.as_tensor(final[key][ended], dtype=torch.float32, device=self.device)
                for key in ("success", "return", "length")
            }
        return self._obs, reward, dones.to(torch.long), extras

    def close(self) -> None:
        self.env.close()

    def _tensordict(self, obs: dict[str, torch.Tensor]) -> TensorDict:
        return TensorDict(dict(obs), batch_size=[self.num_envs], device=self.device)
