"""Re-sending and retrying, so that idle-closed connections and transient server errors lose no episode.

A request the server cannot have processed is re-sent on a fresh connection and counted in
``Outcome.reconnects``; a request that got a server error is retried only up to ``retry_server_errors`` and
counted in ``Outcome.retries``; nothing the server may have processed is sent twice. The server-side truth
comes from :class:`~dz_gym.testing.servers.StampPolicy`, which counts every request that reached the model.
"""

from __future__ import annotations

import numpy as np
import pytest
from websockets.asyncio.server import ServerConnection

from dz_gym.errors import ConnectionLost, ServerError
from dz_gym.protocol import JOINT_KEY, packb
from dz_gym.server.launch import start_server_thread
from dz_gym.testing.servers import DZ_METADATA, STAMP_KEY, ServerThread, StampPolicy, gather
from dz_gym.transport import SessionPool, TransportConfig

pytestmark = pytest.mark.timeout(60)

CFG = TransportConfig(open_timeout=3, request_timeout=5, close_timeout=1, connect_retries=1, retry_backoff=0.05)


def stamped(stamp: str) -> dict:
    return {
        JOINT_KEY: np.zeros(7),
        "prompt": "p",
        "session_id": stamp.split("-")[0],
        "endpoint": "infer",
        STAMP_KEY: stamp,
    }


@pytest.mark.parametrize("sessions", [4, 6])
def test_idle_timeout_shorter_than_the_gap_loses_no_episode(sessions):
    """One FIFO worker at 50 ms and N sessions sent in lockstep: the first-served session waits at least
    (N-1) x 50 ms for its next request, longer than the server's 0.1 s idle timeout, so the server closes
    it in between. Every request still completes, the client counts the reconnects, and the server
    processed each request exactly once."""
    policy = StampPolicy()
    steps = 4
    with start_server_thread(policy, flavor="vllm-omni", workers=1, latency_ms=50, idle_timeout_s=0.1) as server:
        with SessionPool(server.url, sessions, CFG) as pool:
            pool.connect()
            outcomes = []
            for step in range(steps):
                batch = gather(pool, {i: stamped(f"e{i}-s{step}") for i in range(sessions)})
                outcomes += batch.values()
    assert all(o.ok for o in outcomes), [str(o.error) for o in outcomes if not o.ok]
    assert sum(o.reconnects for o in outcomes) > 0
    assert policy.duplicates() == {}
    assert sorted(policy.processed) == sorted(f"e{i}-s{k}" for i in range(sessions) for k in range(steps))
    assert all(float(o.reply.actions[0, 7]) == 1.0 for o in outcomes)  # the server's own count, echoed
    assert all(o.retries == 0 for o in outcomes)


def test_server_errors_are_retried_up_to_the_limit():
    """vLLM-Omni answers an injected failure with a binary error and keeps the connection."""
    policy = StampPolicy()
    with start_server_thread(policy, flavor="vllm-omni", fail_every=2) as server:
        retrying = TransportConfig(open_timeout=3, request_timeout=5, close_timeout=1, retry_server_errors=1)
        with SessionPool(server.url, 1, retrying) as pool:
            pool.connect()
            outcomes = [gather(pool, {0: stamped(f"a-{k}")})[0] for k in range(4)]
        # inferences 1, 3, 5, 7 succeed; 2, 4, 6 fail and are retried once
        assert [o.ok for o in outcomes] == [True] * 4
        assert [o.retries for o in outcomes] == [0, 1, 1, 1]
        assert [o.reconnects for o in outcomes] == [0, 0, 0, 0]
    with start_server_thread(StampPolicy(), flavor="vllm-omni", fail_every=2) as server:
        with SessionPool(server.url, 1, CFG) as pool:  # the default: no retries
            pool.connect()
            first, second = (gather(pool, {0: stamped(f"b-{k}")})[0] for k in range(2))
        assert first.ok and isinstance(second.error, ServerError) and second.retries == 0


def test_a_fatal_server_error_is_retried_on_a_fresh_connection():
    """DreamZero's server sends a traceback and closes with 1011: a retry needs a reconnect first."""
    policy = StampPolicy()
    with start_server_thread(policy, flavor="dreamzero", fail_every=2) as server:
        retrying = TransportConfig(open_timeout=3, request_timeout=5, close_timeout=1, retry_server_errors=2)
        with SessionPool(server.url, 1, retrying) as pool:
            pool.connect()
            first, second = (gather(pool, {0: stamped(f"c-{k}")})[0] for k in range(2))
            connected = pool.is_connected(0)
    assert first.ok and second.ok, (first.error, second.error)
    assert (second.retries, second.reconnects) == (1, 1) and connected
    assert policy.duplicates() == {}


def test_a_request_the_server_may_have_processed_is_never_resent():
    """The server reads the request, then closes with 1011 without a reply: it may have computed it."""
    received = []

    async def read_then_fail(ws: ServerConnection) -> None:
        await ws.send(packb(DZ_METADATA))
        received.append(await ws.recv())
        await ws.close(1011, "internal error")

    with ServerThread(read_then_fail) as server, SessionPool(server.url, 1, CFG) as pool:
        pool.connect()
        outcome = gather(pool, {0: stamped("d-0")})[0]
        assert isinstance(outcome.error, ConnectionLost) and outcome.error.code == 1011
        assert outcome.reconnects == 0 and len(received) == 1 and server.connections == 1


def test_the_request_bound_covers_every_attempt():
    cfg = TransportConfig(request_timeout=10, resend_unprocessed=2, retry_server_errors=1)
    assert cfg.request_bound() >= 4 * 10 + 3 * cfg.connect_bound()
    assert TransportConfig(resend_unprocessed=0).request_bound() > TransportConfig().request_timeout
