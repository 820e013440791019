"""Network faults between client and server, injected by a loopback TCP proxy (dz_gym.testing.proxy).

Three sessions go through the proxy to one reference server, each on its own connection; a fault is armed on
session 1's connection only. Each case must end within the transport's bound with a typed error for session
1, while sessions 0 and 2 get their replies; a reconnect afterwards works again.
"""

from __future__ import annotations

import numpy as np
import pytest

from dz_gym.errors import ConnectionLost, RequestTimeout
from dz_gym.protocol import JOINT_KEY
from dz_gym.server.launch import start_server_thread
from dz_gym.testing.proxy import Fault, FaultProxy
from dz_gym.testing.servers import gather
from dz_gym.transport import SessionPool, SessionState, TransportConfig

pytestmark = pytest.mark.timeout(60)

# One bound for every session of the pool: the faulty session must exceed it, the healthy ones never may, even
# on a loaded machine, so it is several seconds and each fault keeps its session silent far longer than that.
CFG = TransportConfig(open_timeout=10, request_timeout=5, close_timeout=0.5, connect_retries=0)
BOUND_S = 30.0  # waits for events that come at once unless something is broken


def request(k: int, extra_bytes: int = 0) -> dict:
    body = {JOINT_KEY: np.full(7, 0.1 * k), "prompt": "p", "session_id": f"s{k}"}
    if extra_bytes:
        body["observation/exterior_image_0_left"] = np.zeros(extra_bytes, dtype=np.uint8)
    return body


@pytest.fixture
def rig():
    """A reference server, the proxy in front of it and a 3-session pool whose session i is proxy
    connection i (they connect one after the other)."""
    with start_server_thread("hold", flavor="vllm-omni", workers=3) as server, FaultProxy(server.port) as proxy:
        with SessionPool(proxy.url(), 3, CFG) as pool:
            for i in range(3):
                pool.connect([i])
            assert proxy.wait_connections(3, BOUND_S)
            yield proxy, pool


def run_round(pool: SessionPool, big: int = 0) -> dict:
    return gather(pool, {0: request(0), 1: request(1, big), 2: request(2)}, timeout=30)


def check_only_session_1_failed(pool: SessionPool, outcomes: dict, error_type: type) -> None:
    assert outcomes[0].ok and outcomes[2].ok, (outcomes[0].error, outcomes[2].error)
    np.testing.assert_allclose(outcomes[2].reply.actions[:, :7], 0.2, rtol=1e-6)
    assert isinstance(outcomes[1].error, error_type), outcomes[1].error
    assert outcomes[1].reconnects == 0  # the server may have processed it: never re-sent
    assert pool.session(1).state is SessionState.BROKEN and pool.is_connected(0) and pool.is_connected(2)
    pool.reconnect(1)  # a fresh connection (no fault on it) serves again
    assert all(o.ok for o in run_round(pool).values())


def test_added_latency_within_the_bound_only_slows_the_reply(rig):
    proxy, pool = rig
    proxy.inject(1, Fault("latency", latency_s=0.05))
    outcomes = run_round(pool)
    assert all(o.ok for o in outcomes.values())
    assert proxy.traffic(1)[0] > 0


def test_added_latency_past_the_bound_is_a_request_timeout(rig):
    proxy, pool = rig
    proxy.inject(1, Fault("latency", latency_s=60.0))
    outcomes = run_round(pool)
    check_only_session_1_failed(pool, outcomes, RequestTimeout)


def test_stall_mid_frame_is_a_request_timeout(rig):
    proxy, pool = rig
    before = proxy.traffic(1)[1]
    proxy.inject(1, Fault("stall", after_bytes=100))
    outcomes = run_round(pool)
    assert proxy.traffic(1)[1] - before == 100  # the reply (about 800 bytes) stopped after 100
    check_only_session_1_failed(pool, outcomes, RequestTimeout)


def test_reset_mid_frame_is_connection_lost(rig):
    proxy, pool = rig
    before = proxy.traffic(1)[1]
    proxy.inject(1, Fault("reset", after_bytes=100))
    outcomes = run_round(pool)
    assert proxy.traffic(1)[1] - before == 100
    check_only_session_1_failed(pool, outcomes, ConnectionLost)
    assert outcomes[1].error.code == 1006


def test_half_open_connection_is_a_request_timeout(rig):
    proxy, pool = rig
    proxy.inject(1, Fault("half_open"))
    outcomes = run_round(pool)
    check_only_session_1_failed(pool, outcomes, RequestTimeout)


def test_half_open_connection_is_found_by_keepalive():
    """With keepalive pings shorter than the request bound, a half-open connection is declared dead by the
    ping timeout (close 1011) before the request bound runs out. The healthy session answers its pings well
    within the ping timeout, however loaded the machine."""
    config = TransportConfig(
        open_timeout=10, request_timeout=40, close_timeout=0.5, connect_retries=0, ping_interval=0.5, ping_timeout=3
    )
    with start_server_thread("hold", flavor="vllm-omni") as server, FaultProxy(server.port) as proxy:
        with SessionPool(proxy.url(), 2, config) as pool:
            pool.connect([0])
            pool.connect([1])
            proxy.inject(1, Fault("half_open"))
            outcomes = gather(pool, {0: request(0), 1: request(1)}, timeout=30)
    assert outcomes[0].ok
    error = outcomes[1].error
    assert isinstance(error, ConnectionLost) and error.code == 1011 and "keepalive" in error.reason
    assert outcomes[1].reconnects == 0


def test_slow_reader_backs_up_the_send_into_a_request_timeout(rig):
    """The proxy reads session 1's 8 MB request at 256 kB/s: the send cannot finish within the bound."""
    proxy, pool = rig
    proxy.inject(1, Fault("slow_reader", rate_bytes_per_s=256 * 1024))
    outcomes = run_round(pool, big=8 * 1024 * 1024)
    up, _ = proxy.traffic(1)
    assert up < 8 * 1024 * 1024  # the request never got through
    check_only_session_1_failed(pool, outcomes, RequestTimeout)


def test_faults_are_validated():
    with pytest.raises(ValueError, match="kind"):
        Fault("drop")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="rate_bytes_per_s"):
        Fault("slow_reader", rate_bytes_per_s=0)
