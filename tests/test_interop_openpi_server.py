"""Our transport against the PyPI ``openpi-server`` package (openpi's own WebsocketPolicyServer), on loopback.

openpi-server replies with dicts (``actions`` plus ``server_timing``), sends the policy metadata at
handshake, and answers any policy exception with a text traceback followed by close 1011.
"""

from __future__ import annotations

import asyncio
import threading
import time

import numpy as np
import pytest

from dz_gym.errors import ConnectionLost, ServerError
from dz_gym.protocol import build_infer_request
from dz_gym.testing.servers import DZ_METADATA, free_port, gather
from dz_gym.transport import SessionPool, TransportConfig

openpi_server = pytest.importorskip("openpi_server")

pytestmark = pytest.mark.timeout(60)

CFG = TransportConfig(open_timeout=3, request_timeout=10, close_timeout=1, connect_retries=10, retry_backoff=0.05)


class EchoPolicy:
    """Answers with a chunk built from the request, so the test can check what the server decoded."""

    def __init__(self, sleep_s: float = 0.0, fail_on: str | None = None):
        self.sleep_s = sleep_s
        self.fail_on = fail_on
        self.calls = 0

    def infer(self, obs: dict) -> dict:
        self.calls += 1
        if self.fail_on is not None and obs.get("prompt") == self.fail_on:
            raise ValueError(f"policy refused prompt {obs['prompt']!r}")
        if self.sleep_s:
            time.sleep(self.sleep_s)  # openpi runs the policy inside its event loop: this blocks every client
        joints = np.asarray(obs["observation/joint_position"])
        image = np.asarray(obs["observation/exterior_image_0_left"])
        actions = np.zeros((24, 8), dtype=np.float32)
        actions[:, :7] = joints
        return {
            "actions": actions,
            "prompt": obs["prompt"],
            "session_id": obs.get("session_id"),
            "image_sum": int(image.astype(np.int64).sum()),
            "image_shape": list(image.shape),
        }

    def reset(self) -> None:
        pass


class OpenpiServerThread:
    """openpi_server.WebsocketPolicyServer.run() on its own loop in a daemon thread."""

    def __init__(self, policy, metadata: dict | None = None):
        self.port = free_port()
        self.url = f"ws://127.0.0.1:{self.port}"
        server = openpi_server.WebsocketPolicyServer(policy, host="127.0.0.1", port=self.port, metadata=metadata)
        self.loop = asyncio.new_event_loop()
        self.task = self.loop.create_task(server.run())
        self.thread = threading.Thread(target=self.loop.run_forever, name="openpi-server", daemon=True)
        self.thread.start()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        async def cancel():
            self.task.cancel()
            await asyncio.wait([self.task], timeout=5)

        asyncio.run_coroutine_threadsafe(cancel(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)


def infer(pool: SessionPool, i: int, payload) -> object:
    """One request on session ``i``; the reply, or the typed error raised."""
    outcome = gather(pool, {i: payload})[i]
    if outcome.error is not None:
        raise outcome.error
    return outcome.reply


def dz_request(k: int, prompt: str = "put the marker in the mug") -> dict:
    image = np.full((180, 320, 3), k, dtype=np.uint8)
    return build_infer_request(
        images={
            "observation/exterior_image_0_left": image,
            "observation/exterior_image_1_left": image,
            "observation/wrist_image_left": image,
        },
        joint_position=np.full(7, 0.1 * k),
        gripper_position=[0.0],
        prompt=prompt,
        session_id=f"session-{k}",
    )


def test_handshake_and_infer_against_openpi_server():
    policy = EchoPolicy()
    with OpenpiServerThread(policy, metadata=DZ_METADATA) as server, SessionPool(server.url, 3, CFG) as pool:
        metas = pool.connect()
        assert all(m.image_resolution == (180, 320) and m.n_external_cameras == 2 for m in metas)
        outcomes = gather(pool, {k: dz_request(k) for k in range(3)})
    for k, outcome in outcomes.items():
        assert outcome.ok, outcome.error
        reply = outcome.reply
        assert reply.actions.shape == (24, 8) and reply.actions.dtype == np.float32
        np.testing.assert_allclose(reply.actions[:, :7], 0.1 * k, rtol=1e-6)
        assert "infer_ms" in reply.server_timing
        assert reply.extra["prompt"] == "put the marker in the mug"
        assert reply.extra["session_id"] == f"session-{k}"
        assert reply.extra["image_sum"] == 180 * 320 * 3 * k and reply.extra["image_shape"] == [180, 320, 3]
    assert policy.calls == 3


def test_empty_metadata_from_openpi_server():
    with OpenpiServerThread(EchoPolicy()) as server, SessionPool(server.url, 1, CFG) as pool:
        (meta,) = pool.connect()
        assert meta.raw == {} and meta.image_resolution is None
        reply = infer(pool, 0, dz_request(2))
        # openpi reports the previous round trip from the second request on
        assert "prev_total_ms" not in reply.server_timing
        assert "prev_total_ms" in infer(pool, 0, dz_request(2)).server_timing


def test_policy_exception_is_a_fatal_server_error_then_connection_lost():
    policy = EchoPolicy(fail_on="fail")
    with OpenpiServerThread(policy) as server, SessionPool(server.url, 2, CFG) as pool:
        pool.connect()
        outcomes = gather(pool, {0: dz_request(0, prompt="fail"), 1: dz_request(1)})
        error = outcomes[0].error
        assert isinstance(error, ServerError) and error.fatal
        assert "ValueError: policy refused prompt 'fail'" in str(error)
        assert "Traceback" in error.message
        assert outcomes[1].ok  # the other session is untouched
        assert not pool.is_connected(0) and pool.is_connected(1)
        with pytest.raises(ConnectionLost):
            infer(pool, 0, dz_request(0))
        pool.reconnect(0)
        assert infer(pool, 0, dz_request(3)).actions.shape == (24, 8)


class OverlapProbe(EchoPolicy):
    """Counts how many ``infer`` calls run at the same moment (server side, no clock)."""

    def __init__(self):
        super().__init__()
        self.lock = threading.Lock()
        self.running = 0
        self.max_running = 0
        self.order: list[str] = []

    def infer(self, obs: dict) -> dict:
        with self.lock:
            self.running += 1
            self.max_running = max(self.max_running, self.running)
            self.order.append(obs["session_id"])
        try:
            return super().infer(obs)
        finally:
            with self.lock:
                self.running -= 1


def test_blocking_openpi_server_serves_sessions_one_after_another():
    """openpi runs inference inside its event loop, so concurrent sessions queue (openpi#717): with 4
    requests in flight at once, the policy never runs two at a time, and every session gets its own reply."""
    policy = OverlapProbe()
    with OpenpiServerThread(policy) as server, SessionPool(server.url, 4, CFG) as pool:
        pool.connect()
        outcomes = gather(pool, {k: dz_request(k) for k in range(4)})
    assert all(o.ok for o in outcomes.values())
    assert [outcomes[k].reply.extra["session_id"] for k in range(4)] == [f"session-{k}" for k in range(4)]
    assert policy.calls == 4 and policy.max_running == 1 and sorted(policy.order) == [f"session-{k}" for k in range(4)]
