"""A tiny deterministic batched DROID env: the env contract without a simulator (no MuJoCo, no rendering).

:class:`ToyDroidEnv` follows the contract of :mod:`dz_gym.envs.base` (same-step autoreset, partial reset
through ``options={"env_ids": ...}``, ``set_episode_seeds``, the ``success``/``episode_seed``/... info keys)
with trivial dynamics: the joints move half way to the commanded targets each step; the images encode the
step and the first joint. Success depends only on the episode's seed and step, so every episode's outcome is
known in advance (:func:`expected_success`):

- seed % 3 == 0: success from step 3 on (success at end and at any step);
- seed % 3 == 1: success only at steps 2..4 (at any step, not at end, for episodes longer than 4 steps);
- seed % 3 == 2: never.

It is for tests of what sits above an env (the wrapper, the evaluator's accounting, a user's training loop):
it has no physics, no cameras and no object, so it says nothing about a policy's behaviour.

>>> import numpy as np
>>> env = ToyDroidEnv(2, max_episode_length=4, image_shape=(18, 32))
>>> obs, _ = env.reset(seed=3)
>>> obs["policy"]["wrist_cam"].shape
(2, 18, 32, 3)
>>> for _ in range(4):
...     obs, reward, terminated, truncated, info = env.step(np.zeros((2, 8), dtype=np.float32))
>>> info["success"].tolist(), truncated.tolist(), expected_success(3, 4), expected_success(4, 4)
([True, True], [True, True], (True, True), (True, True))
"""

from __future__ import annotations

import numpy as np

from dz_gym.envs import droid
from dz_gym.envs.base import BatchedDroidEnv

__all__ = ["ToyDroidEnv", "expected_success"]


def expected_success(seed: int, steps: int) -> tuple[bool, bool]:
    """(success at end, success at any step) of an episode of ``steps`` steps with ``seed``."""
    if seed % 3 == 0:
        return steps >= 3, steps >= 3
    if seed % 3 == 1:
        return 2 <= steps <= 4, steps >= 2
    return False, False


class ToyDroidEnv(BatchedDroidEnv):
    """``num_envs`` toy envs of ``scene`` (its prompt only); episodes end after ``max_episode_length`` steps.

    ``partial_resets`` records the env ids of every partial reset, for tests of the callers.
    """

    def __init__(self, num_envs: int, scene: int = 1, max_episode_length: int = 450, image_shape=(180, 320)):
        super().__init__(num_envs, tuple(image_shape), scene)
        self.max_episode_length = int(max_episode_length)
        self._height, self._width = (int(v) for v in image_shape)
        n = self.num_envs
        self.joints = np.zeros((n, droid.ARM_DOF), dtype=np.float32)
        self.gripper = np.zeros((n, 1), dtype=np.float32)
        self.seeds = np.zeros(n, dtype=np.int64)
        self.steps = np.zeros(n, dtype=np.int64)
        self.success_any = np.zeros(n, dtype=bool)
        self._fallback = 1_000_000
        self.partial_resets: list[list[int]] = []
        self._toy_closed = False

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` ran."""
        return self._toy_closed

    def reset_one(self, i: int, seed: int) -> None:
        """Start env ``i``'s episode with ``seed`` (joints near home, a function of the seed)."""
        rng = np.random.default_rng(seed)
        self.seeds[i] = seed
        self.steps[i] = 0
        self.success_any[i] = False
        self.joints[i] = np.asarray(droid.HOME_JOINT_POSITIONS, dtype=np.float32) + rng.uniform(-0.05, 0.05, 7)
        self.gripper[i] = 0.0

    def _obs(self) -> dict:
        n = self.num_envs
        policy: dict[str, np.ndarray] = {}
        for c, key in enumerate(droid.CAMERA_KEYS):
            img = np.zeros((n, self._height, self._width, 3), dtype=np.uint8)
            img[:, :, :, 0] = ((self.steps * 7) % 256).astype(np.uint8)[:, None, None]
            img[:, :, :, 1] = (np.abs(self.joints[:, 0]) * 1000 % 256).astype(np.uint8)[:, None, None]
            img[:, :, :, 2] = 40 * c
            policy[key] = img
        policy[droid.JOINT_KEY] = self.joints.copy()
        policy[droid.GRIPPER_KEY] = self.gripper.copy()
        return {droid.POLICY_GROUP: policy}

    def reset(self, *, seed=None, options=None):
        if self._toy_closed:
            raise RuntimeError("ToyDroidEnv: the env is closed")
        ids = None if not options else options.get("env_ids")
        ids = list(range(self.num_envs)) if ids is None else [int(i) for i in np.atleast_1d(ids)]
        if options and options.get("env_ids") is not None:
            self.partial_resets.append(ids)
        for i in ids:
            fallback = (seed + i) if seed is not None else self._next_fallback()
            self.reset_one(i, self._take_seed(i, fallback))
        return self._obs(), {}

    def _next_fallback(self) -> int:
        self._fallback += 1
        return self._fallback

    def step(self, action):
        if self._toy_closed:
            raise RuntimeError("ToyDroidEnv: the env is closed")
        action = np.asarray(action, dtype=np.float32)
        if action.shape != (self.num_envs, droid.ACTION_DIM):
            raise ValueError(f"action: expected shape ({self.num_envs}, {droid.ACTION_DIM}), got {action.shape}")
        self.joints += 0.5 * (action[:, : droid.ARM_DOF] - self.joints)
        self.gripper[:, 0] = action[:, -1]
        self.steps += 1
        success = np.array([expected_success(int(s), int(t))[0] for s, t in zip(self.seeds, self.steps)], dtype=bool)
        self.success_any |= success
        truncated = self.steps >= self.max_episode_length
        info = {
            "success": success.copy(),
            "success_any_step": self.success_any.copy(),
            "time_outs": truncated.copy(),
            "episode_seed": self.seeds.copy(),
            "episode_step": self.steps.copy(),
            "object_pos": np.tile(np.array([0.5, 0.0, 0.03]), (self.num_envs, 1)),
            "container_pos": np.tile(np.array([0.5, 0.2, 0.0]), (self.num_envs, 1)),
            "images_fresh": np.ones(self.num_envs, dtype=bool),
        }
        for i in np.flatnonzero(truncated):
            self.reset_one(int(i), self._take_seed(int(i), self._next_fallback()))
        reward = np.zeros(self.num_envs, dtype=np.float32)
        terminated = np.zeros(self.num_envs, dtype=bool)
        return self._obs(), reward, terminated, truncated, info

    def close(self):
        self._toy_closed = True
