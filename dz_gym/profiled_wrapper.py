"""``ProfiledPolicyWrapper``: the policy wrapper with every stage of its hot path timed (``--profile``).

The same wrapper (:class:`~dz_gym.wrapper.DreamZeroPolicyWrapper`: same requests, same schedule, same
results), with its steps, resets and internal stages timed into a
:class:`~dz_gym.profiling.StageProfiler`; the policy client (a
:class:`~dz_gym.transport.SessionPool`) times its encoding, hand-offs, sends and reply parsing into the same
profiler, and an Isaac Lab env its physics and rendering (:mod:`dz_gym.profile_hooks`).

>>> from dz_gym.server.policies import HoldPolicy
>>> from dz_gym.testing.memory_client import MemoryPolicyClient
>>> from dz_gym.testing.toy_env import ToyDroidEnv
>>> profiler = StageProfiler()
>>> env = ToyDroidEnv(2, max_episode_length=16, image_shape=(18, 32))
>>> wrapper = ProfiledPolicyWrapper(env, client=MemoryPolicyClient(HoldPolicy(), num_envs=2), profiler=profiler)
>>> _ = wrapper.reset(seed=0)
>>> for _ in range(16):
...     _ = wrapper.step()
>>> wrapper.close()
>>> profiler.steps, profiler.rounds, profiler.requests
(16, 2, 4)
"""

from __future__ import annotations

import time
from typing import Any

import gymnasium as gym
import numpy as np

from dz_gym.profile_hooks import device_sync, encoded_size, instrument_env, server_ms, timed_requests
from dz_gym.profiling import CALLER_STAGES, StageProfiler
from dz_gym.wrapper import DreamZeroPolicyWrapper

__all__ = ["ProfiledPolicyWrapper"]

_INNER = tuple(s for s in CALLER_STAGES if s not in ("env_step", "physics", "render", "env_other", "wrapper_info",
                                                     "reset", "bookkeeping", "write_tail"))  # fmt: skip


class _TimedEnv(gym.Wrapper):
    """Times the env's ``step`` as ``env_step`` (waiting for its GPU work) and notes when it returned."""

    def __init__(self, env: gym.Env, profiler: StageProfiler):
        super().__init__(env)
        self._profiler = profiler
        self._sync = device_sync(env)
        self.returned_at = 0.0
        self.stepping = False  # inside step (the physics and render hooks count only then)

    def step(self, action):
        start = time.perf_counter()
        self.stepping = True
        try:
            out = self.env.step(action)
            if self._sync is not None:
                self._sync()
        finally:
            self.stepping = False
        self.returned_at = time.perf_counter()
        self._profiler.add("env_step", self.returned_at - start)
        return out


class ProfiledPolicyWrapper(DreamZeroPolicyWrapper):
    """:class:`~dz_gym.wrapper.DreamZeroPolicyWrapper` timed into ``profiler`` (see the module docstring)."""

    def __init__(self, env: gym.Env, *args: Any, profiler: StageProfiler, **kwargs: Any):
        if not isinstance(profiler, StageProfiler):
            raise TypeError(f"profiler: expected a dz_gym.profiling.StageProfiler, got {type(profiler).__name__}")
        self.profiler = profiler
        self._timed_env = _TimedEnv(env, profiler)
        self.env_hooks = instrument_env(env, profiler, active=lambda: self._timed_env.stepping)
        self._settled_s = 0.0  # settling replies, inside the current _take_replies
        self._sent_bytes = 0
        super().__init__(self._timed_env, *args, **kwargs)
        if hasattr(self.client, "set_profiler"):
            self.client.set_profiler(profiler)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        start = time.perf_counter()
        try:
            return super().reset(seed=seed, options=options)
        finally:
            elapsed = time.perf_counter() - start
            self.profiler.add_wrapper(elapsed)
            self.profiler.add("reset", elapsed)

    def step(self, action=None):
        start = time.perf_counter()
        self._sent_bytes = 0
        try:
            out = super().step(action)
        finally:
            end = time.perf_counter()
            self.profiler.add_wrapper(end - start)
        if self._timed_env.returned_at >= start:
            self.profiler.add("wrapper_info", end - self._timed_env.returned_at)
        called = np.asarray(out[4]["policy_called"], dtype=bool)
        self.profiler.step_done(int(np.count_nonzero(called)), self._sent_bytes)
        return out

    # -- the timed internals ---------------------------------------------------------------------------
    def _inner_total(self) -> float:
        return sum(self.profiler.total(stage) for stage in _INNER)

    def _propose(self, policy_obs):
        """Everything of the proposal that no inner stage claims (the schedule's bookkeeping, taking the
        step's rows from the caches) counts as ``scatter``."""
        start, inner = time.perf_counter(), self._inner_total()
        try:
            return super()._propose(policy_obs)
        finally:
            self.profiler.add("scatter", time.perf_counter() - start - (self._inner_total() - inner))

    def _requests(self, policy_obs, due: list[int]):
        requests = timed_requests(self.profiler, policy_obs, due, prompts=self.prompts,
                                  session_ids=self._schedule.session_ids, image_resolution=self.image_resolution,
                                  image_keys=getattr(self.env.unwrapped, "request_image_keys", None),
                                  host_memory=self._client.host_memory, profile=self.profile)  # fmt: skip
        self._sent_bytes += encoded_size(requests)
        return requests

    def _take_replies(self, env_ids: list[int], block: bool, record) -> None:
        """Blocked time is ``wait``; settling the replies is ``scatter``."""
        start, self._settled_s = time.perf_counter(), 0.0
        try:
            super()._take_replies(env_ids, block, record)
        finally:
            if block:
                self.profiler.add("wait", time.perf_counter() - start - self._settled_s)
            self.profiler.add("scatter", self._settled_s)

    def _settle(self, env_id: int, token: int, outcome, record) -> None:
        start = time.perf_counter()
        try:
            self.profiler.reply(outcome.latency_s, server_ms(outcome.reply))
            super()._settle(env_id, token, outcome, record)
        finally:
            self._settled_s += time.perf_counter() - start
