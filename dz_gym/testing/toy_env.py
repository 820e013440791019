"""A tiny deterministic batched DROID env: the env contract without a simulator (no MuJoCo, no rendering).

:class:`ToyDroidEnv` follows the contract of :mod:`dz_gym.envs.base` (same-step autoreset, partial reset
through ``options={"env_ids": ...}``, ``set_episode_seeds``, the ``success``/``episode_seed``/... info keys)
with trivial dynamics: the joints move half way to the commanded targets each step; the images encode the
step and the first joint; the episode bookkeeping is the shared one of every backend. Success depends only on the episode's seed and step, so every episode's outcome is
known in advance (:func:`expected_success`):

- seed % 3 == 0: success from step 3 on (success at end and at any step);
- seed % 3 == 1: success only at steps 2..4 (at any step, not at end, for episodes longer than 4 steps);
- seed % 3 == 2: never.

It is for tests of what sits above an env (the wrapper, the evaluator's accounting, a user's training loop):
it has no physics and no cameras, and its object jumps into the container and out again without being
grasped (so the ordered milestones never fire), so it says nothing about a policy's behaviour.

>>> import numpy as np
>>> env = ToyDroidEnv(2, max_episode_length=4, image_shape=(18, 32))
>>> obs, _ = env.reset(seed=3)
>>> obs["policy"]["wrist_cam"].shape
(2, 18, 32, 3)
>>> for _ in range(4):
...     obs, reward, terminated, truncated, info = env.step(np.zeros((2, 8), dtype=np.float32))
>>> info["success"].tolist(), truncated.tolist(), expected_success(3, 4), expected_success(4, 4)
([True, True], [True, True], (True, True), (True, True))
>>> info["episode_seed"].tolist(), env.episode_seed.tolist()   # the step's episodes, the next ones
([3, 4], [5, 6])
"""

from __future__ import annotations

import numpy as np

from dz_gym.envs import droid
from dz_gym.envs.base import BatchedDroidEnv
from dz_gym.envs.episodes import TaskState

__all__ = ["STAGED_MODES", "GripperToyEnv", "StagedToyEnv", "ToyDroidEnv", "expected_success"]

OBJECT_START = (0.55, 0.12, 0.03)  # env-local, the robot base at the origin, table top z = 0
CONTAINER_POS = (0.55, -0.15, 0.0)


def expected_success(seed: int, steps: int) -> tuple[bool, bool]:
    """(success at end, success at any step) of an episode of ``steps`` steps with ``seed``."""
    if seed % 3 == 0:
        return steps >= 3, steps >= 3
    if seed % 3 == 1:
        return 2 <= steps <= 4, steps >= 2
    return False, False


class ToyDroidEnv(BatchedDroidEnv):
    """``num_envs`` toy envs of ``scene``; episodes end after ``max_episode_length`` steps.

    Seeds, step counts, success (and its OR over the episode), milestones and the ``info`` dict come from the
    shared :class:`~dz_gym.envs.episodes.Episodes` bookkeeping, as for every backend: the toy only decides
    where the object is (in the container exactly when :func:`expected_success` says so, at its start
    position otherwise). ``partial_resets`` records the env ids of every partial reset, for tests of the
    callers.
    """

    def __init__(
        self,
        num_envs: int,
        scene: int = 1,
        max_episode_length: int = 450,
        image_shape=(180, 320),
        seed: int | None = None,
        terminate_on_success: bool = False,
    ):
        super().__init__(num_envs, tuple(image_shape), scene, seed=seed)
        self.max_episode_length = int(max_episode_length)
        self.terminate_on_success = bool(terminate_on_success)  # end an episode at its first successful step
        self._height, self._width = (int(v) for v in image_shape)
        n = self.num_envs
        self.joints = np.zeros((n, droid.ARM_DOF), dtype=np.float32)
        self.gripper = np.zeros((n, 1), dtype=np.float32)
        self.partial_resets: list[list[int]] = []
        criteria = self.scene.success
        self._container = np.array(CONTAINER_POS, dtype=np.float64)
        self._placed_offset = np.array([0.0, 0.0, 0.5 * (criteria.z_min + criteria.z_max)])
        self._tcp_offset = np.array([0.0, 0.0, criteria.release_distance + 0.1])

    def reset_one(self, i: int, seed: int) -> None:
        """Put env ``i``'s arm at the start pose of an episode with ``seed`` (near home, a function of it)."""
        rng = np.random.default_rng(seed)
        self.joints[i] = np.asarray(droid.HOME_JOINT_POSITIONS, dtype=np.float32) + rng.uniform(-0.05, 0.05, 7)
        self.gripper[i] = 0.0

    def _task_state(self, seeds: np.ndarray, steps: np.ndarray) -> TaskState:
        """The object in the container where the episodes' ``seeds`` and ``steps`` say it succeeds."""
        placed = np.array([expected_success(int(s), int(t))[0] for s, t in zip(seeds, steps)], dtype=bool)
        n = self.num_envs
        container = np.tile(self._container, (n, 1))
        start = np.tile(np.array(OBJECT_START, dtype=np.float64), (n, 1))
        obj = np.where(placed[:, None], container + self._placed_offset, start)
        return TaskState(obj, container, obj + self._tcp_offset, np.zeros(n))

    def _obs(self) -> dict:
        n = self.num_envs
        steps = self.episodes.episode_step
        policy: dict[str, np.ndarray] = {}
        for c, key in enumerate(droid.CAMERA_KEYS):
            img = np.zeros((n, self._height, self._width, 3), dtype=np.uint8)
            img[:, :, :, 0] = ((steps * 7) % 256).astype(np.uint8)[:, None, None]
            img[:, :, :, 1] = (np.abs(self.joints[:, 0]) * 1000 % 256).astype(np.uint8)[:, None, None]
            img[:, :, :, 2] = 40 * c
            policy[key] = img
        policy[droid.OBS_JOINT_KEY] = self.joints.copy()
        policy[droid.OBS_GRIPPER_KEY] = self.gripper.copy()
        return {droid.POLICY_GROUP: policy}

    def reset(self, *, seed=None, options=None):
        book = self.episodes
        ids, seeds = self._begin_reset(seed, options)
        if options and options.get("env_ids") is not None:
            self.partial_resets.append([int(i) for i in ids])
        for i, episode_seed in zip(ids, seeds):
            self.reset_one(int(i), int(episode_seed))
        now_seeds, now_steps = book.episode_seed.copy(), book.episode_step.copy()
        now_seeds[ids], now_steps[ids] = seeds, 0
        info = book.record_reset(ids, seeds, self._task_state(now_seeds, now_steps))
        return self._obs(), info

    def step(self, action):
        self._check_started()
        action = self._numpy_action(action).astype(np.float32)
        self.joints += 0.5 * (action[:, : droid.ARM_DOF] - self.joints)
        self.gripper[:, 0] = action[:, -1]
        book = self.episodes
        state = self._task_state(book.episode_seed, book.episode_step + 1)
        time_outs = book.ending_next_step(self.max_episode_length)
        terminated = self._terminated(state) & ~time_outs
        info = book.record_step(state, time_outs | terminated)
        ending = time_outs | terminated
        done = np.flatnonzero(ending)
        info = self._step_info(info, ending, self._obs() if done.size else None)
        if done.size:
            seeds = book.next_seeds(done)
            book.start(done, seeds)
            for i, episode_seed in zip(done, seeds):
                self.reset_one(int(i), int(episode_seed))
        reward = np.asarray(info["success"], dtype=np.float32)
        return self._obs(), reward, terminated, time_outs.copy(), info

    def _terminated(self, state: TaskState) -> np.ndarray:
        """``(N,)`` bool: the envs this step ends by the env's own rule (before the time limit)."""
        if self.terminate_on_success:
            return np.asarray(state.success(self.scene.success), dtype=bool)
        return np.zeros(self.num_envs, dtype=bool)

    def close(self):
        self._closed = True


class GripperToyEnv(ToyDroidEnv):
    """The toy env where the outcome depends on the policy: the object is placed while the gripper is closed
    (as seed 0 is at step 3), and otherwise stays where a never-placed seed (``seed % 3 == 2``) keeps it. A policy
    that closes the gripper solves episodes, one that holds it open none: what the A/B, K-arm and report tests
    need to tell arms apart."""

    def _task_state(self, seeds, steps):
        state = super()._task_state(np.zeros_like(seeds), np.full_like(steps, 3))
        start = super()._task_state(np.full_like(seeds, 2), steps)
        closed = self.gripper[:, 0] > 0.5
        obj = np.where(closed[:, None], state.object_pos, start.object_pos)
        return type(state)(obj, state.container_pos, obj + self._tcp_offset, state.object_speed)


# The scripts of StagedToyEnv, by seed % 8: the failure mode each one ends in, by the shared milestone checks.
STAGED_MODES = ("success", "undone", "never_reached", "grasp_failed", "dropped", "timeout_near", "misplaced",
                "terminated")  # fmt: skip
STAGED_LENGTH = 12  # steps of a staged episode (each script's stages are laid out over these)


class StagedToyEnv(ToyDroidEnv):
    """The toy env whose episodes follow a pick-and-place script chosen by the seed (``seed % 8`` indexes
    :data:`STAGED_MODES`), through the real milestone and success checks of every backend: the gripper reaches
    the object at step 2, lifts it at 4, carries it over the container at 6 and puts it down, released, at 8;
    each script stops or goes wrong at one stage (``undone``: knocked out again at 10; ``dropped``: falls back
    to the table at 6; ``timeout_near``: still held over the container at the time limit; ``misplaced``: put
    down beside the container; ``terminated``: like ``misplaced``, but the env ends the episode at step 9).
    Episodes last :data:`STAGED_LENGTH` steps; the policy's actions change nothing."""

    def __init__(self, num_envs: int, scene: int = 1, **kwargs):
        kwargs.setdefault("max_episode_length", STAGED_LENGTH)
        super().__init__(num_envs, scene, **kwargs)

    def _staged(self, mode: str, t: int, start: np.ndarray, above: np.ndarray, placed: np.ndarray):
        """(object, tool centre point) of script ``mode`` after step ``t``."""
        high = np.array([0.0, 0.0, 0.3])
        stage = 0 if mode == "never_reached" else 1 if mode == "grasp_failed" else 4
        stage = min(stage, int(t >= 2) + int(t >= 4) + int(t >= 6) + int(t >= 8))
        if mode == "dropped" and t >= 6:
            return start, start + high
        if mode == "timeout_near":
            stage = min(stage, 3)
        if mode in ("misplaced", "terminated") and t >= 8:
            beside = placed + np.array([0.0, 0.25, 0.0])
            return beside, beside + high
        if mode == "undone" and t >= 10:
            return start, start + high
        lifted = start + np.array([0.0, 0.0, 0.1])
        obj = (start, start, lifted, above, placed)[stage]
        return obj, (obj + high if stage in (0, 4) else obj)

    def _task_state(self, seeds: np.ndarray, steps: np.ndarray) -> TaskState:
        n = self.num_envs
        container = np.tile(self._container, (n, 1))
        start = np.array(OBJECT_START, dtype=np.float64)
        above = self._container + np.array([0.0, 0.0, 0.15])
        placed = self._container + self._placed_offset
        obj, tcp = np.zeros((n, 3)), np.zeros((n, 3))
        for i, (seed, t) in enumerate(zip(seeds, steps)):
            obj[i], tcp[i] = self._staged(STAGED_MODES[int(seed) % 8], int(t), start, above, placed)
        return TaskState(obj, container, tcp, np.zeros(n))

    def _terminated(self, state: TaskState) -> np.ndarray:
        book = self.episodes
        ends = [STAGED_MODES[int(s) % 8] == "terminated" and int(t) + 1 == 9
                for s, t in zip(book.episode_seed, book.episode_step)]  # fmt: skip
        return super()._terminated(state) | np.array(ends, dtype=bool)
