"""A tiny deterministic batched DROID env for the evaluator's fast tests (no MuJoCo, no rendering).

It follows the contract of ``dz_gym.envs.base`` (same-step autoreset, partial reset through
``options={"env_ids": ...}``, ``set_episode_seeds``, the info keys) with trivial dynamics: joints move half way
to the commanded targets each step; the images encode the joints and the step. Success depends only on the
episode's seed and step, so every episode's outcome is known in advance:

- seed % 3 == 0: success from step 3 on (success at end and at any step);
- seed % 3 == 1: success only at steps 2..4 (at any step, not at end, for episodes longer than 4 steps);
- seed % 3 == 2: never.
"""

from __future__ import annotations

import numpy as np

from dz_gym.envs import droid
from dz_gym.envs.base import BatchedDroidEnv


def expected_success(seed: int, steps: int) -> tuple[bool, bool]:
    """(success at end, success at any step) of an episode of ``steps`` steps with ``seed``."""
    if seed % 3 == 0:
        return steps >= 3, steps >= 3
    if seed % 3 == 1:
        return 2 <= steps <= 4, steps >= 2
    return False, False


class FakeDroidEnv(BatchedDroidEnv):
    def __init__(self, num_envs: int, scene: int = 1, max_episode_length: int = 450, image_shape=(180, 320)):
        super().__init__(num_envs, image_shape, scene)
        self.max_episode_length = int(max_episode_length)
        self._height, self._width = image_shape
        n = self.num_envs
        self.joints = np.zeros((n, droid.ARM_DOF), dtype=np.float32)
        self.gripper = np.zeros((n, 1), dtype=np.float32)
        self.seeds = np.zeros(n, dtype=np.int64)
        self.steps = np.zeros(n, dtype=np.int64)
        self.success_any = np.zeros(n, dtype=bool)
        self._fallback = 1_000_000
        self.partial_resets: list[list[int]] = []
        self.closed = False

    def _reset_one(self, i: int, seed: int) -> None:
        rng = np.random.default_rng(seed)
        self.seeds[i] = seed
        self.steps[i] = 0
        self.success_any[i] = False
        self.joints[i] = np.asarray(droid.HOME_JOINT_POSITIONS, dtype=np.float32) + rng.uniform(-0.05, 0.05, 7)
        self.gripper[i] = 0.0

    def _obs(self) -> dict:
        n = self.num_envs
        images = {}
        for c, key in enumerate(droid.CAMERA_KEYS):
            img = np.zeros((n, self._height, self._width, 3), dtype=np.uint8)
            for i in range(n):
                img[i, :, :, 0] = int(self.steps[i] * 7) % 256
                img[i, :, :, 1] = int(abs(self.joints[i, 0]) * 1000) % 256
                img[i, :, :, 2] = 40 * c
            images[key] = img
        policy = dict(images)
        policy[droid.JOINT_KEY] = self.joints.copy()
        policy[droid.GRIPPER_KEY] = self.gripper.copy()
        return {droid.POLICY_GROUP: policy}

    def reset(self, *, seed=None, options=None):
        ids = None if not options else options.get("env_ids")
        ids = list(range(self.num_envs)) if ids is None else [int(i) for i in np.atleast_1d(ids)]
        if options and options.get("env_ids") is not None:
            self.partial_resets.append(ids)
        for i in ids:
            fallback = (seed + i) if seed is not None else self._next_fallback()
            self._reset_one(i, self._take_seed(i, fallback))
        return self._obs(), {}

    def _next_fallback(self) -> int:
        self._fallback += 1
        return self._fallback

    def step(self, action):
        action = np.asarray(action, dtype=np.float32)
        if action.shape != (self.num_envs, droid.ACTION_DIM):
            raise ValueError(f"action: expected ({self.num_envs}, 8), got {action.shape}")
        self.joints += 0.5 * (action[:, : droid.ARM_DOF] - self.joints)
        self.gripper[:, 0] = action[:, -1]
        self.steps += 1
        success = np.array([expected_success(int(s), int(t))[0] for s, t in zip(self.seeds, self.steps)])
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
            self._reset_one(int(i), self._take_seed(int(i), self._next_fallback()))
        reward = np.zeros(self.num_envs, dtype=np.float32)
        terminated = np.zeros(self.num_envs, dtype=bool)
        return self._obs(), reward, terminated, truncated, info

    def close(self):
        self.closed = True
