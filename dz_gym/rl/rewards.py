"""Rewards of the residual-RL env from the env's success and milestones (numpy only, no torch, no I/O).

Every DROID backend reports, per step, the placement check (``info["success"]``, ``info["success_any_step"]``)
and the first episode step of each task milestone (``info["milestones"][name]``, -1 while not reached; see
:mod:`dz_gym.envs.episodes`): ``reached`` (the tool centre point within 3 cm of the object), ``lifted`` (the
object 5 cm above its start), ``above_target`` (the object above the container) and ``placed`` (the
placement check, in order after the others). The reward is built from those only, so it means the same on
every backend and matches what the evaluator counts as success.

Two modes (:class:`RewardConfig`):

- ``"dense"`` (default): in the step in which a milestone is first reached, its weight
  (``reached`` 0.1, ``lifted`` 0.2, ``above_target`` 0.2 by default); in the step in which the episode
  first succeeds (placement check true for the first time), ``success`` (1.0). Each term is paid at most
  once per episode, so an episode's return is at most ``sum(weights) + success`` (1.5 by default) and a
  policy cannot farm a milestone by hovering around it.
- ``"sparse"``: only the success term (1.0 in the step of the first success, else 0).

In both modes ``residual_cost`` (default 0) subtracts ``residual_cost * mean(a**2)`` of the normalized
residual action ``a`` in [-1, 1] per step: it keeps the correction small where it does not help.

>>> import numpy as np
>>> config = RewardConfig()
>>> info = {"success": np.array([False, True]), "episode_step": np.array([5, 9]),
...         "milestones": {"reached": np.array([5, 2]), "lifted": np.array([-1, 4]),
...                        "above_target": np.array([-1, 7]), "placed": np.array([-1, 9])}}
>>> reward, first_success = step_reward(config, info, np.array([False, False]))
>>> [round(float(r), 3) for r in reward], first_success.tolist()
([0.1, 1.0], [False, True])
>>> step_reward(RewardConfig(mode="sparse"), info, np.array([False, False]))[0].tolist()
[0.0, 1.0]
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from dz_gym.envs.episodes import MILESTONES

__all__ = ["DEFAULT_MILESTONE_WEIGHTS", "REWARD_MODES", "RewardConfig", "step_reward"]

REWARD_MODES = ("dense", "sparse")
DEFAULT_MILESTONE_WEIGHTS: dict[str, float] = {"reached": 0.1, "lifted": 0.2, "above_target": 0.2, "placed": 0.0}


@dataclass(frozen=True)
class RewardConfig:
    """How the residual env turns success and milestones into a reward (see the module docstring)."""

    mode: str = "dense"
    milestone_weights: Mapping[str, float] = field(default_factory=lambda: dict(DEFAULT_MILESTONE_WEIGHTS))
    success: float = 1.0
    residual_cost: float = 0.0

    def __post_init__(self) -> None:
        if self.mode not in REWARD_MODES:
            raise ValueError(f"reward mode: expected one of {', '.join(REWARD_MODES)}, got {self.mode!r}")
        unknown = sorted(set(self.milestone_weights) - set(MILESTONES))
        if unknown:
            raise ValueError(
                f"milestone_weights: expected names among {', '.join(MILESTONES)}, got {', '.join(unknown)}"
            )
        for name, value in [
            *self.milestone_weights.items(),
            ("success", self.success),
            ("residual_cost", self.residual_cost),
        ]:
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                raise ValueError(f"reward {name}: expected a finite number, got {value!r}")
        if self.residual_cost < 0:
            raise ValueError(f"residual_cost: expected a number >= 0, got {self.residual_cost!r}")

    @property
    def max_return(self) -> float:
        """The largest return of one episode (every term paid once, no residual cost)."""
        dense = sum(max(0.0, float(w)) for w in self.milestone_weights.values()) if self.mode == "dense" else 0.0
        return dense + max(0.0, float(self.success))


def step_reward(
    config: RewardConfig, info: Mapping[str, Any], succeeded_before: np.ndarray, residual: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """The ``(N,)`` float32 reward of one step and the ``(N,)`` bool mask of envs that first succeeded in it.

    ``info`` is the env's step info (the state the step reached, before any reset); ``succeeded_before``
    says which envs' episodes had already succeeded before this step (the caller keeps it per episode);
    ``residual`` is the ``(N, D)`` normalized residual action (for ``residual_cost``).
    """
    success = np.asarray(info["success"], dtype=bool).reshape(-1)
    first_success = success & ~np.asarray(succeeded_before, dtype=bool).reshape(-1)
    reward = config.success * first_success.astype(np.float64)
    if config.mode == "dense":
        step = np.asarray(info["episode_step"]).reshape(-1)
        milestones = info["milestones"]
        for name, weight in config.milestone_weights.items():
            if weight:
                first = np.asarray(milestones[name]).reshape(-1)
                reward += weight * ((first == step) & (first >= 0))
    if config.residual_cost and residual is not None:
        reward -= config.residual_cost * np.mean(np.square(np.asarray(residual, dtype=np.float64)), axis=1)
    return reward.astype(np.float32), first_success
