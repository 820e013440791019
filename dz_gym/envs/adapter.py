"""The env a ``gymnasium.Wrapper`` can wrap, from any batched env: a VectorEnv, a BatchedDroidEnv, Isaac Lab's.

:class:`~dz_gym.wrapper.DreamZeroPolicyWrapper` is a ``gymnasium.Wrapper``, which wraps ``gymnasium.Env``
objects. A :class:`~dz_gym.envs.base.BatchedDroidEnv` is one (and a ``VectorEnv`` too), and so is Isaac Lab's
``ManagerBasedRLEnv`` (``is_vector_env``); a ``gymnasium.vector.VectorEnv`` that is not, such as one under
Gymnasium's vector wrappers (``RecordEpisodeStatistics(gym.make_vec(...))``) or a ``SyncVectorEnv``, is seen
through :class:`VectorEnvAdapter`: its ``reset``/``step``/spaces, and the DROID hooks (``set_render_mask``,
``set_episode_seeds``, ``scene``, ``max_episode_length``, ...) of the env at its bottom where it has them.

The wrapper resets finished envs' sessions in the step that ended them, so a VectorEnv must reset in that
step too: :func:`as_wrappable` refuses, in one line, one whose ``metadata["autoreset_mode"]`` is not
``SAME_STEP`` (Gymnasium's default is ``NEXT_STEP``; ``SyncVectorEnv(..., autoreset_mode=SAME_STEP)`` fits).

A single env (``gym.make(id)``: not batched, its observation ``{"policy": {...}}``) becomes a batch of one,
Gymnasium's own ``SyncVectorEnv([env], autoreset_mode=SAME_STEP)``, seen through :class:`VectorEnvAdapter`
(the DROID facts, ``scene`` and ``max_episode_length``, then come from that one env). Anything else is a
one-line ``TypeError`` saying what the wrapper needs.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
from gymnasium.vector import AutoresetMode, SyncVectorEnv, VectorEnv

from dz_gym.envs import droid

__all__ = ["VectorEnvAdapter", "as_wrappable"]


class VectorEnvAdapter(gym.Env):
    """A ``gymnasium.Env`` view of ``vector_env`` (see the module docstring); ``close`` closes it."""

    is_vector_env = True

    def __init__(self, vector_env: VectorEnv):
        self.vector_env = vector_env
        self.num_envs = int(vector_env.num_envs)
        self.observation_space = vector_env.observation_space
        self.action_space = vector_env.action_space
        self.single_observation_space = vector_env.single_observation_space
        self.single_action_space = vector_env.single_action_space
        self.metadata = dict(vector_env.metadata)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        return self.vector_env.reset(seed=seed, options=options)

    def step(self, action):
        return self.vector_env.step(action)

    def close(self) -> None:
        self.vector_env.close()

    def __getattr__(self, name: str):
        # Only reached for names this view lacks: the DROID hooks and facts of the env at the bottom, or where
        # that is Gymnasium's SyncVectorEnv, the facts its envs agree on (``scene``, ``max_episode_length``).
        if name.startswith("_") or name == "vector_env":
            raise AttributeError(name)
        bottom = self.vector_env.unwrapped
        envs = getattr(bottom, "envs", None)
        if hasattr(bottom, name) or not envs:
            return getattr(bottom, name)
        values = [getattr(env.unwrapped, name) for env in envs]
        if all(_same(value, values[0]) for value in values[1:]):
            return values[0]
        raise AttributeError(f"{name}: the envs of {type(bottom).__name__} differ")


def as_wrappable(env: Any) -> gym.Env:
    """``env`` itself when it is a batched ``gymnasium.Env``, a :class:`VectorEnvAdapter` over a same-step
    ``VectorEnv`` or over a batch of one single env; a one-line error otherwise."""
    if isinstance(env, gym.Env) and not _batched(env):
        space = env.observation_space
        if not (isinstance(space, gym.spaces.Dict) and droid.POLICY_GROUP in space.spaces):
            raise TypeError(
                f"env: expected a batched DROID env (gym.make_vec), a same-step VectorEnv or one env whose "
                f"observations are {{'{droid.POLICY_GROUP}': ...}} (gym.make), got {type(env.unwrapped).__name__} "
                f"with observation space {type(space).__name__}"
            )
        env = SyncVectorEnv([lambda: env], autoreset_mode=AutoresetMode.SAME_STEP)
    if isinstance(env, gym.Env):
        return env
    if not isinstance(env, VectorEnv):
        raise TypeError(f"env: expected a gymnasium.Env or gymnasium.vector.VectorEnv, got {type(env).__name__}")
    mode = env.metadata.get("autoreset_mode", AutoresetMode.NEXT_STEP)
    if mode != AutoresetMode.SAME_STEP:
        raise ValueError(
            f"env: expected a VectorEnv with metadata['autoreset_mode'] = AutoresetMode.SAME_STEP "
            f"(finished envs reset inside step), got {getattr(mode, 'name', mode)}"
        )
    return VectorEnvAdapter(env)


def _same(a: Any, b: Any) -> bool:
    """Whether two plain values are equal (False for values without a plain ``==``, e.g. bound methods)."""
    try:
        return a is b or bool(a == b) and not callable(a)
    except (TypeError, ValueError):
        return False


def _batched(env: gym.Env) -> bool:
    """Whether a ``gymnasium.Env`` steps a batch (a BatchedDroidEnv, Isaac Lab's env: ``is_vector_env``)."""
    return bool(getattr(env.unwrapped, "is_vector_env", False)) or isinstance(env.unwrapped, VectorEnv)
