"""Misbehaving servers and networks: each fault must give its typed error within its bound, never a hang.

Every case uses a tiny raw websockets server (or a real process that gets killed) on loopback, small
explicit timeouts in the client config, and a pytest-timeout bound on the test itself.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import http
import os
import signal
import threading

import numpy as np
import pytest

import dz_gym.transport.session as transport_session
from dz_gym.errors import ConnectionLost, ProtocolError, RequestTimeout, ServerError
from dz_gym.protocol import packb
from dz_gym.server.launch import start_server_process
from dz_gym.testing.servers import (
    DZ_METADATA,
    Fifo,
    ServerThread,
    chunk,
    dies_mid_request,
    free_port,
    gather,
    good,
    idle_close,
    replying,
    silent_after_handshake,
    silent_before_handshake,
    text_error_at_handshake,
)
from dz_gym.transport import AsyncSession, PartialConnectError, SessionPool, TransportConfig

pytestmark = pytest.mark.timeout(30)

# Bounds that only a broken server reaches are generous, so a loaded machine never trips them; the tests of
# a timeout itself use short ones against servers that never answer (only a timeout can end those waits).
CFG = TransportConfig(open_timeout=10.0, request_timeout=10.0, close_timeout=5.0, connect_retries=0)
SILENT_REPLY = TransportConfig(open_timeout=10.0, request_timeout=1.0, close_timeout=5.0, connect_retries=0)
SILENT_OPEN = TransportConfig(open_timeout=3.0, request_timeout=10.0, close_timeout=5.0, connect_retries=0)
BOUND_S = 30.0  # waits for events that come at once unless something is broken
REQUEST = {"observation/joint_position": np.zeros(7), "prompt": "p", "endpoint": "infer"}


def infer(pool: SessionPool, i: int, payload) -> object:
    """One request on session ``i``; the reply, or the typed error raised."""
    outcome = gather(pool, {i: payload})[i]
    if outcome.error is not None:
        raise outcome.error
    return outcome.reply


def connected_pool(url: str, config: TransportConfig = CFG) -> SessionPool:
    pool = SessionPool(url, 1, config)
    pool.connect()
    return pool


def infer_error(handler, config: TransportConfig = CFG):
    """Connect one session to a server running ``handler``, send one request, return (error, connected)."""
    with ServerThread(handler) as server, connected_pool(server.url, config) as pool:
        outcome = gather(pool, {0: REQUEST})[0]
        assert outcome.reply is None
        return outcome.error, pool.is_connected(0)


def connect_error(handler, config: TransportConfig = CFG, **serve_kwargs):
    with ServerThread(handler, **serve_kwargs) as server, SessionPool(server.url, 1, config) as pool:
        with pytest.raises(PartialConnectError) as info:
            pool.connect()
        assert not pool.is_connected(0)
        return info.value.errors[0], server


# ------------------------------------------------------------------------------------------------ replies
def test_server_that_never_answers_gives_request_timeout():
    error, connected = infer_error(silent_after_handshake, SILENT_REPLY)
    assert isinstance(error, RequestTimeout) and "request_timeout" in str(error)
    assert not connected  # the late reply would desynchronize the stream: the connection is dropped


def test_server_dropping_the_connection_mid_request_gives_connection_lost():
    error, connected = infer_error(dies_mid_request)
    assert isinstance(error, ConnectionLost) and error.code == 1006
    assert not connected


def test_oversize_reply_frame_gives_protocol_error():
    config = TransportConfig(open_timeout=10, request_timeout=10, close_timeout=5, max_frame_bytes=4096)
    error, connected = infer_error(replying(lambda f, n: chunk(200, 8)), config)  # about 6.4 kB
    assert isinstance(error, ProtocolError) and "too big" in str(error)
    assert not connected


def test_garbage_bytes_give_protocol_error():
    error, connected = infer_error(replying(lambda f, n: b"\xc1\x00\xffgarbage"))
    assert isinstance(error, ProtocolError)
    assert not connected


@pytest.mark.parametrize(
    ("reply", "words"),
    [
        (np.zeros(8, dtype=np.float32), "shape"),
        ({"no_actions": 1}, "actions"),
        (np.full((24, 8), np.nan, dtype=np.float32), "finite"),
        (np.array([[0.0] * 7 + [np.inf]] * 24, dtype=np.float32), "finite"),
        ("not an array", "str"),
    ],
)
def test_malformed_action_chunks_give_protocol_error(reply, words):
    error, connected = infer_error(replying(lambda f, n: packed(reply)))
    assert isinstance(error, ProtocolError) and words in str(error)
    assert not connected


def test_chunk_of_the_wrong_width_is_a_protocol_error_of_that_env():
    """The transport decodes any 2-D chunk; the wrapper checks the width against the env's 8-D actions (the
    one shape check, protocol.contract.check_chunk), flags that env and reconnects, as for a garbled frame."""
    from dz_gym.testing.toy_env import ToyDroidEnv
    from dz_gym.wrapper import DreamZeroPolicyWrapper

    with ServerThread(replying(lambda f, n: chunk(24, 7))) as server:
        env = DreamZeroPolicyWrapper(ToyDroidEnv(1, image_shape=(18, 32)), server=server.url, transport=CFG, prompt="p")
        try:
            env.reset(seed=0)
            _, _, _, _, info = env.step()
            assert info["integrity_event"].tolist() == ["protocol_error"]
            assert "last dim 8" in info["policy_error"][0] and info["policy_held"][0]
            assert env.episode_stats(0).reconnects == 1 and env.is_connected(0)
        finally:
            env.close()


def packed(value):
    from dz_gym.protocol import packb

    return packb(value)


def test_text_frame_instead_of_binary_reply_is_a_fatal_server_error_then_connection_lost():
    """openpi/DreamZero send the traceback as text and close 1011; the session is gone afterwards."""

    async def traceback_then_close(ws):
        from dz_gym.protocol import packb

        await ws.send(packb({}))
        await ws.recv()
        await ws.send("Traceback (most recent call last):\n  ...\nKeyError: 'endpoint'")
        await ws.close(1011, "Internal server error. Traceback included in previous frame.")

    with ServerThread(traceback_then_close) as server, connected_pool(server.url) as pool:
        with pytest.raises(ServerError) as info:
            infer(pool, 0, REQUEST)
        assert info.value.fatal and "KeyError" in str(info.value)
        assert not pool.is_connected(0)
        with pytest.raises(ConnectionLost, match="not connected"):
            infer(pool, 0, REQUEST)


def test_binary_error_reply_keeps_the_connection():
    reply = replying(lambda f, n: {"type": "error", "message": "Invalid request payload"} if n == 0 else chunk())
    with ServerThread(reply) as server, connected_pool(server.url) as pool:
        first = gather(pool, {0: REQUEST})[0]
        assert isinstance(first.error, ServerError) and not first.error.fatal
        assert pool.is_connected(0)
        assert gather(pool, {0: REQUEST})[0].ok


def test_idle_close_by_the_server_gives_connection_lost_with_code():
    """vLLM-Omni closes idle connections normally (ConnectionClosedOK): without re-sends, a ConnectionLost."""
    config = TransportConfig(open_timeout=10, request_timeout=10, close_timeout=5, resend_unprocessed=0)
    with ServerThread(idle_close) as server, connected_pool(server.url, config) as pool:
        outcome = gather(pool, {0: REQUEST})[0]
        error = outcome.error
        assert isinstance(error, ConnectionLost) and error.code == 1000 and error.reason == "idle timeout"
        assert outcome.reconnects == 0 and not pool.is_connected(0)
        again = gather(pool, {0: REQUEST})[0].error  # later calls say why the session is gone
        assert isinstance(again, ConnectionLost) and again.code == 1000
        pool.reconnect(0)
        assert pool.is_connected(0)


def test_resends_after_clean_closes_are_bounded():
    """A server that closes every connection cleanly right after the handshake: the request is re-sent on
    ``resend_unprocessed`` fresh connections, then the close is reported; it never reached a handler."""
    with ServerThread(idle_close) as server, connected_pool(server.url) as pool:
        outcome = gather(pool, {0: REQUEST})[0]
        assert isinstance(outcome.error, ConnectionLost) and outcome.error.code == 1000
        assert outcome.reconnects == CFG.resend_unprocessed == 2
        assert server.connections == 3


def test_cancelled_wait_drops_the_session():
    """A caller-side bound shorter than request_timeout cancels the request; the stream is out of sync."""
    config = TransportConfig(open_timeout=10, request_timeout=20, close_timeout=5)
    with ServerThread(silent_after_handshake) as server, connected_pool(server.url, config) as pool:
        session = pool.session(0)
        with pytest.raises(RequestTimeout):
            pool.loop.run(session.infer(REQUEST), 0.2)
        assert not pool.is_connected(0)


# ------------------------------------------------------------------------------------------------ handshake
def test_server_that_never_sends_the_handshake_gives_request_timeout():
    error, _ = connect_error(silent_before_handshake, SILENT_OPEN)
    assert isinstance(error, RequestTimeout) and "metadata" in str(error)


def test_text_json_error_at_handshake_gives_server_error():
    frame = '{"type":"error","error":"Robot policy not available","code":"unsupported"}'
    error, _ = connect_error(text_error_at_handshake(frame))
    assert isinstance(error, ServerError) and error.code == "unsupported"
    assert "Robot policy not available" in str(error)


def test_garbage_handshake_gives_protocol_error():
    error, _ = connect_error(replying(lambda f, n: chunk(), metadata=b"\xc1\xc1"))
    assert isinstance(error, ProtocolError)


def test_non_map_handshake_gives_protocol_error():
    error, _ = connect_error(replying(lambda f, n: chunk(), metadata=[1, 2, 3]))
    assert isinstance(error, ProtocolError) and "metadata" in str(error)


def test_server_closing_before_the_handshake_gives_connection_lost():
    async def close_at_once(ws):
        await ws.close(1001, "going away")

    error, _ = connect_error(close_at_once)
    assert isinstance(error, ConnectionLost) and error.code == 1001


# ------------------------------------------------------------------------------------------------ connecting
class CountingConnect:
    """Counts websocket open attempts; optionally refuses the first ``refuse`` of them."""

    def __init__(self, refuse: int = 0):
        self.calls = 0
        self.refuse = refuse
        self._real = transport_session.ws_connect

    async def __call__(self, *args, **kwargs):
        self.calls += 1
        if self.calls <= self.refuse:
            raise ConnectionRefusedError(111, "Connection refused")
        return await self._real(*args, **kwargs)


def test_connection_refused_is_retried_then_connection_lost(monkeypatch):
    counter = CountingConnect()
    monkeypatch.setattr(transport_session, "ws_connect", counter)
    config = TransportConfig(open_timeout=10, close_timeout=5, connect_retries=2, retry_backoff=0.01)

    async def attempt():
        with pytest.raises(ConnectionLost, match="after 3 attempt"):
            await AsyncSession(f"ws://127.0.0.1:{free_port()}", config).connect()

    asyncio.run(attempt())
    assert counter.calls == 3


def test_refused_then_accepted_connects_after_a_retry(monkeypatch):
    counter = CountingConnect(refuse=2)
    monkeypatch.setattr(transport_session, "ws_connect", counter)
    config = TransportConfig(open_timeout=10, close_timeout=5, connect_retries=3, retry_backoff=0.01)
    with ServerThread(good()) as server, SessionPool(server.url, 1, config) as pool:
        pool.connect()
        assert pool.is_connected(0) and counter.calls == 3


@pytest.mark.parametrize(("status", "attempts"), [(503, 3), (404, 1)])
def test_http_errors_on_upgrade_retry_only_5xx(status, attempts):
    def refuse(connection, request):
        return connection.respond(http.HTTPStatus(status), "nope\n")

    config = TransportConfig(open_timeout=10, close_timeout=5, connect_retries=2, retry_backoff=0.01)
    with ServerThread(good(), process_request=refuse) as server, SessionPool(server.url, 1, config) as pool:
        with pytest.raises(PartialConnectError) as info:
            pool.connect()
    error = info.value.errors[0]
    assert isinstance(error, ConnectionLost) and f"HTTP {status}" in str(error)
    assert f"after {attempts} attempt" in str(error)


def test_tcp_server_that_never_upgrades_gives_request_timeout():
    """A plain TCP listener that never answers the HTTP upgrade: bounded by open_timeout."""

    async def scenario():
        server = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        try:
            with pytest.raises(RequestTimeout, match="open_timeout"):
                await AsyncSession(f"ws://127.0.0.1:{port}", SILENT_OPEN).connect()
        finally:
            server.close()

    asyncio.run(scenario())


@pytest.mark.parametrize(("answer", "attempts"), [(b"", 3), (b"HELLO\r\n\r\n", 1)])
def test_tcp_server_that_drops_or_garbles_the_upgrade(answer, attempts):
    """Dropping the connection during the upgrade is retried (a restarting server); garbage is not."""
    accepted = []

    async def scenario():
        async def handle(reader, writer):
            accepted.append(1)
            await reader.read(1)
            writer.write(answer)
            await writer.drain()
            writer.close()

        server = await asyncio.start_server(handle, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        config = TransportConfig(open_timeout=10, close_timeout=5, connect_retries=2, retry_backoff=0.01)
        try:
            with pytest.raises(ConnectionLost, match=f"after {attempts} attempt"):
                await AsyncSession(f"ws://127.0.0.1:{port}", config).connect()
        finally:
            server.close()

    asyncio.run(scenario())
    assert len(accepted) == attempts


# ------------------------------------------------------------------------------------------------ a real kill
@pytest.mark.parametrize("flavor", ["vllm-omni", "dreamzero"])
def test_server_process_killed_mid_request_gives_connection_lost(flavor, tmp_path):
    """A reference server process is killed (SIGKILL) while its model computes a 3 s request; the policy
    reports through a named pipe when it has the request."""
    with Fifo(tmp_path / "started") as started:
        server = start_server_process(
            ["--flavor", flavor, "--latency-ms", "3000", "--quiet", "--policy", "dz_gym.testing.servers:StampPolicy",
             "--policy-arg", f"started_fifo={started.path}"],
            timeout=30,
        )  # fmt: skip
        try:
            config = TransportConfig(open_timeout=10, request_timeout=20, close_timeout=5, retry_backoff=0.05)
            with connected_pool(server.url, config) as pool:
                future = pool.submit(0, {**REQUEST, "request_id": "r1"})
                assert started.read_line(BOUND_S) == "r1"  # the model holds the request now
                os.kill(server.pid, signal.SIGKILL)
                outcome = future.result(BOUND_S)
                assert isinstance(outcome.error, ConnectionLost) and outcome.error.code == 1006
                assert outcome.reconnects == 0  # it may have been processed: never re-sent
                assert not pool.is_connected(0)
                server.proc.wait(BOUND_S)  # the lost connection may come before the process is gone
                with pytest.raises(ConnectionLost):
                    pool.reconnect(0)  # nothing listens any more: retries, then gives up
        finally:
            server.stop(5)


def test_a_callers_bound_cancels_a_stuck_request_and_keeps_the_others():
    """A caller that stops waiting cancels the stuck request; the other session's requests are untouched,
    while it is stuck and after it is cancelled."""
    config = TransportConfig(open_timeout=10, request_timeout=30, close_timeout=5)
    with ServerThread(silent_after_handshake) as silent, ServerThread(good()) as ok:
        with SessionPool([ok.url, silent.url], 2, config) as pool:
            pool.connect()
            stuck = pool.submit(1, REQUEST)
            assert gather(pool, {0: REQUEST})[0].ok and not stuck.done()
            with pytest.raises(concurrent.futures.TimeoutError):
                stuck.result(0.2)  # the caller's bound: the silent server never answers
            assert stuck.cancel()
            assert gather(pool, {0: REQUEST})[0].ok


def test_closing_the_pool_ends_a_request_in_flight():
    received = threading.Event()

    async def note_requests(ws):
        await ws.send(packb(DZ_METADATA))
        async for _ in ws:
            received.set()

    config = TransportConfig(open_timeout=10, request_timeout=30, close_timeout=5)
    with ServerThread(note_requests) as server:
        pool = connected_pool(server.url, config)
        future = pool.submit(0, REQUEST)
        assert received.wait(BOUND_S)  # the server holds the request and will never answer it
        pool.close()
        outcome = future.result(BOUND_S)
        assert isinstance(outcome.error, ConnectionLost) and outcome.error.code == 1000
        assert outcome.reconnects == 0  # closed by the caller: not re-sent
