"""Idle-closed connections lose no episode: the wrapper over the reference server with an idle timeout
shorter than the gap between an env's requests.

One FIFO worker at 60 ms and 3 envs: an env that got its chunk waits for the others' requests before it
asks again, longer than the server's 0.1 s idle timeout, so the server closes its connection cleanly in
between. The transport re-sends those requests on fresh connections: no env sees an error, no episode is
flagged, and the server processed exactly the requests the wrapper sent (server-side count).
"""

from __future__ import annotations

import threading

import numpy as np
import pytest

from dz_gym.server.launch import start_server_thread
from dz_gym.testing.isaac_standin import IsaacDroidStandIn
from dz_gym.transport import TransportConfig
from dz_gym.wrapper import DreamZeroPolicyWrapper

pytestmark = pytest.mark.timeout(120)


class CountingPolicy:
    """Counts the inferences the server runs; answers a chunk that holds the received joints."""

    def __init__(self):
        self.lock = threading.Lock()
        self.processed = 0
        self.new_sessions = 0

    def infer(self, request, *, session_id, new_session):
        with self.lock:
            self.processed += 1
            self.new_sessions += bool(new_session)
        chunk = np.zeros((24, 8), dtype=np.float32)
        chunk[:, :7] = np.asarray(request["observation/joint_position"], dtype=np.float32).reshape(-1)[:7]
        return chunk


def test_idle_closes_between_requests_lose_no_episode():
    policy = CountingPolicy()
    envs = 3
    config = TransportConfig(open_timeout=5, request_timeout=20, close_timeout=1, connect_retries=1)
    with start_server_thread(policy, flavor="vllm-omni", workers=1, latency_ms=60, idle_timeout_s=0.1) as server:
        env = DreamZeroPolicyWrapper(
            IsaacDroidStandIn(scene=1, num_envs=envs, max_episode_length=20),
            server=server.url + "/v1/realtime/robot/openpi",
            transport=config,
        )
        try:
            env.reset(seed=0)
            sent = 0
            done = np.zeros(envs, dtype=bool)
            for _ in range(32):
                _, _, terminated, truncated, info = env.step()
                sent += int(np.sum(info["policy_called"]))
                assert all(error is None for error in info["policy_error"]), info["policy_error"]
                assert not np.any(info["episode_flagged"])
                done |= np.asarray(terminated, dtype=bool).reshape(-1) | np.asarray(truncated, dtype=bool).reshape(-1)
                if done.all():
                    break
        finally:
            env.close()
        connections = server.server.connections
    assert done.all()  # every episode ran to its end
    assert sent > envs and policy.processed == sent  # nothing lost, nothing processed twice
    assert connections > envs  # the server closed idle connections and the requests went out on new ones
