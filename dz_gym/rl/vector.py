"""``ResidualVectorEnv``: a :class:`~dz_gym.rl.residual.ResidualEnv` as a Gymnasium ``VectorEnv`` (numpy).

For RL code written against Gymnasium's vector API (CleanRL-style loops, libraries that take a
``gymnasium.vector.VectorEnv``): observations are one flat ``float32`` array per env, the chosen observation
groups concatenated (``groups=("policy",)`` by default: 17 values; add ``"privileged"`` for 42), actions are
``(N, 8)`` in ``[-1, 1]``, rewards ``(N,)`` float32, ``terminated``/``truncated`` ``(N,)`` bool.

``metadata["autoreset_mode"]`` is ``AutoresetMode.SAME_STEP``: an env whose episode ended in a step returns
its next episode's first observation; the ended episode's last one is ``info["final_obs"]`` (``(N, D)``,
rows valid where ``info["_final_obs"]``), its outcome ``info["final_info"]`` (``success``,
``success_any_step``, ``return``, ``length``; mask ``info["_final_info"]``). The other ``info`` keys are the
wrapper's (see :class:`~dz_gym.wrapper.DreamZeroPolicyWrapper`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

import gymnasium as gym
import numpy as np
from gymnasium.vector import AutoresetMode, VectorEnv
from gymnasium.vector.utils import batch_space

from dz_gym.envs import droid
from dz_gym.preprocess import to_numpy
from dz_gym.rl.residual import OBSERVATION_GROUPS, ResidualEnv

__all__ = ["ResidualVectorEnv"]


class ResidualVectorEnv(VectorEnv):
    """Gymnasium vector view of a :class:`ResidualEnv` (see the module docstring); owns it and closes it."""

    metadata: ClassVar[dict[str, Any]] = {"autoreset_mode": AutoresetMode.SAME_STEP, "render_modes": []}

    def __init__(self, env: ResidualEnv, groups: Sequence[str] = ("policy",)):
        if not isinstance(env, ResidualEnv):
            raise TypeError(f"env: expected a dz_gym.rl.ResidualEnv, got {type(env).__name__}")
        groups = tuple(groups)
        unknown = [g for g in groups if g not in OBSERVATION_GROUPS]
        if not groups or unknown or len(set(groups)) != len(groups):
            raise ValueError(f"groups: expected distinct names among {', '.join(OBSERVATION_GROUPS)}, got {groups!r}")
        self.env = env
        self.groups = groups
        self.num_envs = env.num_envs
        dim = sum(env.observation_dims[g] for g in groups)
        self.single_observation_space = gym.spaces.Box(-np.inf, np.inf, shape=(dim,), dtype=np.float32)
        self.single_action_space = gym.spaces.Box(-1.0, 1.0, shape=(droid.ACTION_DIM,), dtype=np.float32)
        self.observation_space = batch_space(self.single_observation_space, self.num_envs)
        self.action_space = batch_space(self.single_action_space, self.num_envs)
        self.metadata = dict(type(self).metadata)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        """Reset every env; ``seed`` gives env ``i`` the episode seed ``seed + i``."""
        super().reset(seed=seed)
        obs, info = self.env.reset(seed=seed, options=options)
        return self._flat(obs), dict(info)

    def step(self, actions):
        obs, reward, terminated, truncated, info = self.env.step(np.asarray(actions, dtype=np.float32))
        if "final_obs" in info:
            info["final_obs"] = self._flat(info["final_obs"])
        return (
            self._flat(obs),
            to_numpy(reward),
            to_numpy(terminated),
            to_numpy(truncated),
            info,
        )

    def close_extras(self, **kwargs: Any) -> None:
        env = getattr(self, "env", None)  # absent when the constructor refused its arguments
        if env is not None:
            env.close()

    def _flat(self, obs: dict[str, Any]) -> np.ndarray:
        parts = [to_numpy(obs[g]) for g in self.groups]
        return np.concatenate(parts, axis=1).astype(np.float32, copy=False)
