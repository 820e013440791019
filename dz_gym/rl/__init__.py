"""Residual RL over a served policy: a batched torch env, rsl_rl's ``VecEnv`` and a Gymnasium vector view.

Optional (``pip install dz-gym[rl]``: torch, rsl-rl-lib); nothing else in dz_gym imports this package, and
its names are imported on first use:

- :class:`ResidualEnv` / :func:`make_residual_env` (:mod:`dz_gym.rl.residual`): the served policy's
  proposal plus a bounded learned correction, with rewards from success and milestones
  (:class:`RewardConfig`, :mod:`dz_gym.rl.rewards`);
- :class:`RslRlVecEnv` (:mod:`dz_gym.rl.rsl_rl_env`): rsl_rl's ``VecEnv`` (rsl-rl-lib 5.x) for its
  ``OnPolicyRunner``;
- :class:`ResidualVectorEnv` (:mod:`dz_gym.rl.vector`): Gymnasium's ``VectorEnv`` (numpy, SAME_STEP autoreset).

``docs/rl.md`` describes the observation, action, reward and episode conventions and what training reached.
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = ["ResidualEnv", "ResidualVectorEnv", "RewardConfig", "RslRlVecEnv", "make_residual_env"]

_WHERE = {
    "ResidualEnv": "dz_gym.rl.residual",
    "make_residual_env": "dz_gym.rl.residual",
    "RewardConfig": "dz_gym.rl.rewards",
    "RslRlVecEnv": "dz_gym.rl.rsl_rl_env",
    "ResidualVectorEnv": "dz_gym.rl.vector",
}


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'dz_gym.rl' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)


def __dir__() -> list[str]:
    return sorted(__all__)
