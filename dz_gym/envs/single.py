"""``DroidEnv``: one DROID env as a plain ``gymnasium.Env``, what ``gym.make(id)`` returns for a dz-gym id.

It is a backend's batched env with ``num_envs=1`` underneath, with the batch dimension squeezed away: the
observation is ``{"policy": {"external_cam": (H, W, 3) uint8, ..., "arm_joint_pos": (7,), "gripper_pos":
(1,)}}``, the action ``(8,)`` (7 absolute joint targets in rad, then the gripper command in ``[0, 1]``),
``reward`` a float, ``terminated``/``truncated`` bools and ``info`` the batched env's info for its one env
(``success``, ``success_any_step``, ``milestones`` name -> first step or -1, ... without the vector masks).
The observation's arrays are copies, not views of the simulator's frame buffers.

Episodes end like the batched env's (``truncated`` at ``max_episode_length``, 450 steps by default; the
registered ids' ``spec.max_episode_steps`` is the same 450, Gymnasium's ``TimeLimit``) and then wait for
``reset()``, as Gymnasium's single envs do: the observation returned with ``truncated`` is the episode's last
one, stepping again before ``reset()`` is a one-line ``RuntimeError``, and ``reset()`` without a seed runs the
next seed (the previous one + 1). The batched env underneath runs with ``autoreset_mode=DISABLED``; on Isaac
Lab, which resets inside its own step, the observation returned with ``truncated`` shows the next episode
already, and ``reset()`` without a seed starts that episode's seed again.

``gym.make(id, max_episode_steps=K)`` sets Gymnasium's ``TimeLimit`` (its default, the spec's 450, also ends
an episode given a longer ``max_episode_length``: pass both, or ``max_episode_steps=-1``).

``reset(seed=s)`` seeds :attr:`np_random` (``np_random_seed == s``) and runs episode seed ``s``. For many envs
use ``gym.make_vec(id, num_envs=N)``: one batched env (a ``gymnasium.vector.VectorEnv``) instead of N of these
(``gym.make(id, num_envs=N)`` is a one-line error saying so); ``gym.make_vec(id, num_envs=N,
vectorization_mode="sync")`` runs N of these in Gymnasium's ``SyncVectorEnv``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.vector import AutoresetMode

from dz_gym.envs import droid
from dz_gym.envs.vector_info import entries
from dz_gym.preprocess import to_numpy


def squeeze_first(value: Any) -> Any:
    """The first env's part of a batched value (arrays, tensors, dicts of them); masks are dropped.

    >>> squeeze_first({"success": np.array([True]), "_success": np.array([True]), "pos": np.zeros((1, 3))})
    {'success': True, 'pos': array([0., 0., 0.])}
    """
    if isinstance(value, Mapping):
        return {key: squeeze_first(item) for key, item in entries(value).items()}
    array = np.asarray(to_numpy(value))
    if array.ndim == 0:
        return array.item()
    first = array[0]
    return first.item() if first.ndim == 0 else np.array(first, copy=True)


def _single_info(info: Mapping[str, Any]) -> dict[str, Any]:
    """The one env's info, without the vector masks and a same-step autoreset's ``final_*`` entries."""
    return squeeze_first({key: value for key, value in info.items() if not key.startswith(("final_", "_final_"))})


class DroidEnv(gym.Env):
    """One env of ``backend``'s ``scene`` (see the module docstring); keyword arguments go to the backend's
    env (``seed``, ``image_shape``, ``max_episode_length``, ...). The embedded simulator steps in this process
    (``num_workers=0``) unless told otherwise: one env gains nothing from a worker process."""

    metadata: dict[str, Any] = {"render_modes": ["rgb_array"], "render_fps": droid.CONTROL_HZ}

    def __init__(self, backend: str = "mujoco", scene: int | str = 1, render_mode: str | None = None, **kwargs: Any):
        from dz_gym.envs import make_droid_env, resolve_backend

        if "num_envs" in kwargs:
            raise ValueError(
                f"num_envs: gym.make builds one env; for {kwargs['num_envs']!r} envs use "
                "gym.make_vec(id, num_envs=...) (one batched VectorEnv)"
            )
        if resolve_backend(backend) == "mujoco":
            kwargs.setdefault("num_workers", 0)
            kwargs.setdefault("autoreset_mode", AutoresetMode.DISABLED)
        if render_mode is not None:
            kwargs["render_mode"] = render_mode
        self.batched = make_droid_env(backend=backend, scene=scene, num_envs=1, **kwargs)
        self._ended = False  # the episode ended and waits for reset()
        self._next_seed: int | None = None  # the seed an autoreset underneath started (Isaac Lab)
        self.render_mode = render_mode
        self.observation_space = self.batched.single_observation_space
        self.action_space = self.batched.single_action_space
        self.max_episode_length = self.batched.max_episode_length
        self.scene = self.batched.scene

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        """Start a new episode (``seed``: its seed; None: the env's next one)."""
        super().reset(seed=seed)
        episode_seed = seed if seed is not None else self._next_seed
        obs, info = self.batched.reset(seed=episode_seed, options=options)
        self._ended, self._next_seed = False, None
        return squeeze_first(obs), _single_info(info)

    def step(self, action):
        """One 15 Hz step with an ``(8,)`` action (a one-line ``ValueError`` for another shape); a one-line
        ``RuntimeError`` once the episode ended, until ``reset()``."""
        if self._ended:
            raise RuntimeError("step: the episode ended (terminated or truncated); call reset() first")
        array = np.asarray(to_numpy(action))
        if array.shape != (droid.ACTION_DIM,):
            raise ValueError(f"action: expected shape ({droid.ACTION_DIM},), got {array.shape}")
        obs, reward, terminated, truncated, info = self.batched.step(array.reshape(1, droid.ACTION_DIM))
        terminated, truncated = bool(squeeze_first(terminated)), bool(squeeze_first(truncated))
        self._ended = terminated or truncated
        if self._ended and self.batched.metadata.get("autoreset_mode") == AutoresetMode.SAME_STEP:
            self._next_seed = int(self.batched.episode_seed[0])  # started underneath; reset() runs it again
        return squeeze_first(obs), float(squeeze_first(reward)), terminated, truncated, _single_info(info)

    def render(self):
        """Under ``render_mode="rgb_array"``: the env's video strip ``(H, 3W, 3)`` uint8 (None otherwise)."""
        frames = self.batched.render()
        return None if frames is None else frames[0]

    def close(self) -> None:
        """Close the env underneath (idempotent)."""
        self.batched.close()
