"""Tests of dz_gym.transport: config validation, sessions, the loop thread and the pool (loopback only)."""

from __future__ import annotations

import asyncio
import http
import logging
import shutil
import ssl
import subprocess
import threading

import numpy as np
import pytest

from dz_gym.errors import ConnectionLost, DzGymError, RequestTimeout, ServerError
from dz_gym.protocol import build_infer_request, packb, unpackb
from dz_gym.server.launch import start_server_thread
from dz_gym.testing.servers import DZ_METADATA, ServerLogWatch, ServerThread, chunk, free_port, gather, good, replying
from dz_gym.transport import (
    AsyncSession,
    LoopThread,
    Outcome,
    PartialConnectError,
    SessionPool,
    SessionState,
    TransportConfig,
    validate_url,
)

pytestmark = pytest.mark.timeout(60)

FAST = TransportConfig(open_timeout=3, request_timeout=5, close_timeout=1, connect_retries=0)


def infer(pool: SessionPool, i: int, payload) -> object:
    """One request on session ``i``; the reply, or the typed error raised."""
    outcome = gather(pool, {i: payload})[i]
    if outcome.error is not None:
        raise outcome.error
    return outcome.reply


def reset(pool: SessionPool, i: int, session_id: str | None = None) -> str:
    return pool.loop.run(pool.session(i).reset(session_id), 10)


def request(value: int = 0) -> dict:
    """A small request with an image-like array, as the pool would get it from the adapter."""
    return {
        "observation/exterior_image_0_left": np.full((18, 32, 3), value % 256, dtype=np.uint8),
        "observation/joint_position": np.zeros(7),
        "prompt": "put the cube in the bowl",
        "session_id": f"s{value}",
        "endpoint": "infer",
    }


# ------------------------------------------------------------------------------------------------ config
@pytest.mark.parametrize(
    ("field", "value", "words"),
    [
        ("open_timeout", 0, "open_timeout"),
        ("request_timeout", float("inf"), "request_timeout"),
        ("request_timeout", None, "request_timeout"),
        ("ping_interval", -1, "ping_interval"),
        ("connect_retries", -1, "connect_retries"),
        ("connect_retries", 1.5, "connect_retries"),
        ("max_frame_bytes", 0, "max_frame_bytes"),
        ("max_frame_bytes", None, "max_frame_bytes"),
        ("auth_env", "MY TOKEN", "auth_env"),
        ("auth_env", "A=B", "auth_env"),
        ("auth_scheme", "Api Key", "auth_scheme"),
        ("compression", "gzip", "compression"),
        ("connect_concurrency", 0, "connect_concurrency"),
    ],
)
def test_config_rejects_bad_fields_with_one_line(field, value, words):
    with pytest.raises(ValueError, match=words) as info:
        TransportConfig(**{field: value})
    assert "\n" not in str(info.value)


def test_config_defaults_are_bounded_and_generous():
    cfg = TransportConfig()
    assert (cfg.ping_interval, cfg.ping_timeout) == (60.0, 600.0)
    assert cfg.request_timeout >= 60 and np.isfinite(cfg.request_timeout)
    assert cfg.max_frame_bytes == 64 * 1024 * 1024
    assert cfg.compression is None and cfg.auth_env is None
    assert np.isfinite(cfg.connect_bound())
    # ping may be disabled explicitly
    assert TransportConfig(ping_interval=None, ping_timeout=None).ping_interval is None


def test_backoff_doubles_and_is_capped():
    cfg = TransportConfig(retry_backoff=0.5, retry_backoff_max=3.0, connect_retries=5)
    assert [cfg.backoff(k) for k in range(5)] == [0.5, 1.0, 2.0, 3.0, 3.0]


@pytest.mark.parametrize(
    "url", ["http://127.0.0.1:1", "127.0.0.1:8000", "ws://", "ws://host:notaport", "ws://u:p@host:1/x", 5]
)
def test_bad_urls_are_rejected(url):
    with pytest.raises(ValueError, match="url"):
        validate_url(url)


def test_auth_header_comes_from_the_named_env_var(monkeypatch):
    cfg = TransportConfig(auth_env="DZ_TEST_TOKEN", auth_scheme="Bearer")
    monkeypatch.delenv("DZ_TEST_TOKEN", raising=False)
    with pytest.raises(ValueError, match="DZ_TEST_TOKEN"):
        cfg.auth_header()
    monkeypatch.setenv("DZ_TEST_TOKEN", "s3cret")
    assert cfg.auth_header() == {"Authorization": "Bearer s3cret"}
    assert "s3cret" not in repr(cfg)
    assert TransportConfig().auth_header() == {}


# ------------------------------------------------------------------------------------------------ session
def test_async_session_handshake_infer_reset_close():
    def reply(frame, n):
        msg = unpackb(frame)
        if msg.get("endpoint") == "reset":
            return "reset successful"
        return chunk(value=float(n))

    async def scenario(url):
        session = AsyncSession(url, FAST)
        assert not session.connected and session.metadata is None and session.state is SessionState.IDLE
        meta = await session.connect()
        assert meta.image_resolution == (180, 320) and session.metadata is meta and session.connected
        assert session.state is SessionState.OPEN and session.last_error is None
        first = await session.infer(request(1))
        second = await session.infer(packb(request(2)))  # pre-encoded bytes pass straight through
        status = await session.reset("abc")
        await session.close()
        await session.close()  # idempotent
        assert session.state is SessionState.CLOSED
        return first, second, status, session.connected

    with ServerThread(replying(reply)) as server:
        first, second, status, connected = asyncio.run(scenario(server.url))
    assert first.actions.shape == (24, 8) and first.actions.dtype == np.float32
    assert float(first.actions[0, 0]) == 0.0 and float(second.actions[0, 0]) == 1.0
    assert status == "reset successful" and not connected


def test_reset_sends_endpoint_and_session_id():
    seen = []

    def reply(frame, n):
        seen.append(unpackb(frame))
        return {"status": "reset successful"}

    with ServerThread(replying(reply)) as server, SessionPool(server.url, 1, FAST) as pool:
        pool.connect()
        assert reset(pool, 0, "episode-7") == "reset successful"
        assert reset(pool, 0) == "reset successful"
    assert seen == [{"endpoint": "reset", "session_id": "episode-7"}, {"endpoint": "reset"}]


def test_concurrent_calls_on_one_session_are_serialized():
    """Two requests submitted at once on one session both get their own reply, in order."""
    with ServerThread(good(delay_s=0.05)) as server, SessionPool(server.url, 1, FAST) as pool:
        pool.connect()
        futures = [pool.submit(0, request(k)) for k in range(3)]
        values = [float(f.result(10).reply.actions[0, 0]) for f in futures]
    assert values == [0.0, 1.0, 2.0]


def test_connect_twice_replaces_the_connection():
    with ServerThread(good()) as server, SessionPool(server.url, 1, FAST) as pool:
        pool.connect()
        pool.reconnect(0)
        assert pool.is_connected(0)
        assert infer(pool, 0, request()).actions.shape == (24, 8)
        # The server counts a connection before it sends the metadata that connect() waits for.
        assert server.connections == 2


# ------------------------------------------------------------------------------------------------ pool
def test_pool_assigns_sessions_round_robin_and_infers_many():
    with ServerThread(good()) as a, ServerThread(good()) as b:
        with SessionPool([a.url, b.url], 5, FAST) as pool:
            assert [pool.url(i) for i in range(5)] == [a.url, b.url, a.url, b.url, a.url]
            metas = pool.connect()
            assert len(metas) == 5 and all(m.needs_session_id for m in metas)
            assert pool.metadata(3) is metas[3]
            outcomes = gather(pool, {i: request(i) for i in (0, 2, 3)})
        assert (a.connections, b.connections) == (3, 2)
    assert sorted(outcomes) == [0, 2, 3]
    for i, outcome in outcomes.items():
        assert isinstance(outcome, Outcome) and outcome.ok and outcome.index == i
        assert outcome.reply.actions.shape == (24, 8)
        assert outcome.sent_at <= outcome.received_at and (outcome.reconnects, outcome.retries) == (0, 0)
        assert outcome.request_bytes == len(packb(request(i)))


def test_connect_subset_and_partial_failure_keeps_the_others():
    dead = f"ws://127.0.0.1:{free_port()}"
    with ServerThread(good()) as server, SessionPool([server.url, dead], 4, FAST) as pool:
        assert len(pool.connect([0])) == 1
        assert pool.is_connected(0) and not pool.is_connected(1)
        with pytest.raises(PartialConnectError) as info:
            pool.connect()
        err = info.value
        assert sorted(err.connected) == [0, 2] and sorted(err.errors) == [1, 3]
        assert all(isinstance(e, ConnectionLost) for e in err.errors.values())
        assert pool.is_connected(2)
        outcomes = gather(pool, {0: request(), 1: request(), 2: request()})
    assert outcomes[0].ok and outcomes[2].ok
    assert isinstance(outcomes[1].error, ConnectionLost) and outcomes[1].reply is None


def test_one_bad_session_never_affects_the_others():
    bad = replying(lambda frame, n: b"\xc1\xc1 not msgpack")
    with ServerThread(good(delay_s=0.05)) as ok_server, ServerThread(bad) as bad_server:
        with SessionPool([ok_server.url, bad_server.url, ok_server.url], 3, FAST) as pool:
            pool.connect()
            outcomes = gather(pool, {i: request(i) for i in range(3)})
            assert outcomes[0].ok and outcomes[2].ok
            assert outcomes[1].error is not None and not pool.is_connected(1)
            assert pool.is_connected(0) and pool.is_connected(2)
            again = gather(pool, {0: request(), 2: request()})
    assert again[0].ok and again[2].ok


def test_pool_rejects_bad_arguments():
    with pytest.raises(ValueError, match="num_sessions"):
        SessionPool("ws://127.0.0.1:1", 0)
    with pytest.raises(ValueError, match="urls"):
        SessionPool([], 1)
    with pytest.raises(ValueError, match="url"):
        SessionPool(["tcp://x"], 1)
    with SessionPool("ws://127.0.0.1:1", 2, FAST) as pool:
        with pytest.raises(ValueError, match="session index"):
            pool.submit(2, request())
        with pytest.raises(ValueError, match="session index"):
            pool.submit(-1, request())
        outcome = pool.submit(0, [request()]).result(5)  # neither a dict nor bytes: fails without a send
        assert "request" in str(outcome.error) and not outcome.ok


def test_unencodable_request_fails_only_its_session():
    with ServerThread(good()) as server, SessionPool(server.url, 2, FAST) as pool:
        pool.connect()
        bad = {"x": np.array([1 + 2j])}  # complex dtypes never go on the wire
        outcomes = gather(pool, {0: bad, 1: request()})
        assert isinstance(outcomes[0].error, DzGymError) and outcomes[1].ok
        assert pool.is_connected(0)  # nothing was sent, the connection is still in sync


def test_pool_close_is_idempotent_and_closes_connections():
    with ServerThread(good()) as server:
        pool = SessionPool(server.url, 3, FAST)
        pool.connect()
        loop = pool.loop
        pool.close()
        pool.close()
        assert loop.closed
        with pytest.raises(RuntimeError, match="closed"):
            gather(pool, {0: request()})


def test_pool_on_a_shared_loop_leaves_the_loop_running():
    loop = LoopThread()
    try:
        with ServerThread(good()) as server:
            with SessionPool(server.url, 1, FAST, loop=loop) as pool:
                pool.connect()
            assert not loop.closed
            with SessionPool(server.url, 1, FAST, loop=loop) as pool:
                pool.connect()
                assert infer(pool, 0, request()).actions.shape == (24, 8)
    finally:
        loop.close()


def overlap_server(expected: int) -> tuple[ServerThread, dict]:
    """A server whose handler answers only once ``expected`` requests are inside it at the same time (bounded
    wait; a request that waited in vain is answered with an error). ``seen["max"]`` is the most requests it
    held at once."""
    seen = {"inside": 0, "max": 0}
    all_in: asyncio.Event | None = None

    async def handler(ws):
        nonlocal all_in
        if all_in is None:
            all_in = asyncio.Event()
        await ws.send(packb(DZ_METADATA))
        async for _ in ws:
            seen["inside"] += 1
            seen["max"] = max(seen["max"], seen["inside"])
            if seen["inside"] >= expected:
                all_in.set()
            try:
                await asyncio.wait_for(all_in.wait(), 10)
                answer = packb(chunk())
            except asyncio.TimeoutError:
                answer = packb({"type": "error", "message": "requests did not overlap"})
            seen["inside"] -= 1
            await ws.send(answer)

    return ServerThread(handler), seen


def test_requests_of_different_sessions_are_in_flight_at_the_same_time():
    """8 sessions submit at once: the server holds all 8 requests at one moment (an event, no clock)."""
    server, seen = overlap_server(8)
    with server, SessionPool(server.url, 8, FAST) as pool:
        pool.connect()
        outcomes = gather(pool, {i: request(i) for i in range(8)})
    assert all(o.ok for o in outcomes.values()), [o.error for o in outcomes.values()]
    assert seen["max"] == 8


# ------------------------------------------------------------------------------------------------ loop thread
def test_loop_thread_runs_and_submits_and_closes():
    loop = LoopThread()

    async def add(a, b):
        await asyncio.sleep(0)
        return a + b

    assert loop.run(add(1, 2), 5) == 3
    assert loop.submit(add(2, 3)).result(5) == 5
    with pytest.raises(RequestTimeout):
        loop.run(asyncio.sleep(10), 0.05)
    loop.close()
    loop.close()
    assert loop.closed
    with pytest.raises(RuntimeError, match="closed"):
        loop.run(add(1, 1), 1)


def test_pool_works_while_the_callers_thread_runs_an_event_loop():
    """Isaac Lab/Kit and Jupyter call from inside a running loop: the pool must not touch that loop."""
    with ServerThread(good()) as server:

        async def main():
            with SessionPool(server.url, 2, FAST) as pool:
                pool.connect()
                outcomes = gather(pool, {0: request(), 1: request()})
            return all(o.ok for o in outcomes.values())

        assert asyncio.run(main())


def test_run_from_the_loop_thread_is_refused():
    loop = LoopThread()
    try:

        async def nested():
            coro = asyncio.sleep(0)
            with pytest.raises(RuntimeError, match="own loop thread"):
                loop.run(coro, 1)
            return True

        assert loop.run(nested(), 5)
    finally:
        loop.close()


def test_pool_is_usable_from_several_threads():
    with ServerThread(good(delay_s=0.01)) as server, SessionPool(server.url, 4, FAST) as pool:
        pool.connect()
        results: dict[int, list[bool]] = {}

        def worker(i):
            results[i] = [gather(pool, {i: request(i)})[i].ok for _ in range(5)]

        threads = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
    assert results == {i: [True] * 5 for i in range(4)}


# ------------------------------------------------------------------------------------------------ auth and TLS
def _auth_server(seen: list):
    def check(connection, req):
        value = req.headers.get("Authorization")
        seen.append(value)
        if value != "Api-Key s3cret-token":
            return connection.respond(http.HTTPStatus.UNAUTHORIZED, "no\n")
        return None

    return ServerThread(good(), process_request=check)


def test_auth_token_is_sent_from_env_and_never_logged(monkeypatch, caplog):
    monkeypatch.setenv("DZ_TEST_TOKEN", "s3cret-token")
    caplog.set_level(logging.DEBUG)
    seen: list = []
    cfg = TransportConfig(open_timeout=3, request_timeout=5, close_timeout=1, auth_env="DZ_TEST_TOKEN")
    with _auth_server(seen) as server, SessionPool(server.url, 1, cfg) as pool:
        pool.connect()
        assert infer(pool, 0, request()).actions.shape == (24, 8)
    assert seen == ["Api-Key s3cret-token"]
    client_lines = [r.getMessage() for r in caplog.records if r.name.startswith("dz_gym")]
    assert any(line.startswith("> Authorization") for line in client_lines)  # logged at DEBUG ...
    assert not any("s3cret-token" in line for line in client_lines)  # ... with its value redacted


def test_wrong_token_is_rejected_without_retries(monkeypatch):
    monkeypatch.setenv("DZ_TEST_TOKEN", "wrong")
    seen: list = []
    cfg = TransportConfig(
        open_timeout=3, close_timeout=1, connect_retries=3, retry_backoff=0.01, auth_env="DZ_TEST_TOKEN"
    )
    with _auth_server(seen) as server, SessionPool(server.url, 1, cfg) as pool:
        with pytest.raises(PartialConnectError) as info:
            pool.connect()
    error = info.value.errors[0]
    assert isinstance(error, ConnectionLost) and "401" in str(error) and "wrong" not in str(error)
    assert len(seen) == 1


@pytest.fixture(scope="module")
def tls_cert(tmp_path_factory):
    if shutil.which("openssl") is None:
        pytest.skip("openssl is needed to make a test certificate")
    folder = tmp_path_factory.mktemp("tls")
    cert, key = folder / "cert.pem", folder / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(cert),
         "-days", "1", "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1"],
        check=True, capture_output=True, timeout=60,
    )  # fmt: skip
    return cert, key


def test_wss_with_a_trusted_certificate(tls_cert):
    cert, key = tls_cert
    server_ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_ctx.load_cert_chain(cert, key)
    client_ctx = ssl.create_default_context(cafile=str(cert))
    cfg = TransportConfig(open_timeout=5, request_timeout=5, close_timeout=1, ssl_context=client_ctx)
    with ServerThread(good(), ssl=server_ctx) as server, SessionPool(server.url, 2, cfg) as pool:
        assert server.url.startswith("wss://")
        pool.connect()
        assert all(o.ok for o in gather(pool, {0: request(), 1: request()}).values())


def test_wss_with_an_untrusted_certificate_fails_at_once(tls_cert, monkeypatch):
    cert, key = tls_cert
    server_ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_ctx.load_cert_chain(cert, key)
    cfg = TransportConfig(open_timeout=5, close_timeout=1, connect_retries=3, retry_backoff=0.01)
    with ServerThread(good(), ssl=server_ctx) as server:

        async def attempt():
            session = AsyncSession(server.url, cfg)
            with pytest.raises(ConnectionLost, match="TLS"):
                await session.connect()

        asyncio.run(attempt())


def test_metadata_for_servers_that_send_an_empty_map():
    with ServerThread(replying(lambda f, n: {"actions": chunk()}, metadata={})) as server:
        with SessionPool(server.url, 1, FAST) as pool:
            (meta,) = pool.connect()
            assert meta.image_resolution is None and meta.raw == {}
            assert infer(pool, 0, request()).actions.shape == (24, 8)


def test_the_transport_passes_any_chunk_shape_through():
    """What a chunk must look like is the client's (the wrapper checks it against the env and the announced
    contract); the transport only decodes a finite numeric 2-D array."""
    cfg = TransportConfig(open_timeout=3, request_timeout=5, close_timeout=1)
    with ServerThread(replying(lambda f, n: chunk(16, 7))) as server, SessionPool(server.url, 1, cfg) as pool:
        pool.connect()
        assert infer(pool, 0, request()).actions.shape == (16, 7)
        assert pool.is_connected(0)


def test_server_error_reply_keeps_the_session_when_not_fatal():
    def reply(frame, n):
        return {"type": "error", "message": "Internal inference error"} if n == 0 else chunk()

    with ServerThread(replying(reply)) as server, SessionPool(server.url, 1, FAST) as pool:
        pool.connect()
        with pytest.raises(ServerError) as info:
            infer(pool, 0, request())
        assert not info.value.fatal and "Internal inference error" in str(info.value)
        assert pool.is_connected(0)
        assert infer(pool, 0, request()).actions.shape == (24, 8)


# ------------------------------------------------------------------------------------------------ reference server
def dz_request(k: int = 0, session_id: str | None = None) -> dict:
    image = np.zeros((180, 320, 3), dtype=np.uint8)
    return build_infer_request(
        images={key: image for key in ("observation/exterior_image_0_left", "observation/wrist_image_left")},
        joint_position=np.full(7, 0.01 * k),
        gripper_position=[0.0],
        prompt="put the cube in the bowl",
        session_id=session_id or f"episode-{k}",
    )


@pytest.mark.parametrize("flavor", ["vllm-omni", "dreamzero", "openpi"])
def test_reference_server_handshake_infer_and_reset(flavor):
    with start_server_thread("hold", flavor=flavor) as server, SessionPool(server.url, 2, FAST) as pool:
        metas = pool.connect()
        assert all(m.image_resolution == (180, 320) and m.needs_session_id for m in metas)
        outcomes = gather(pool, {0: dz_request(1), 1: dz_request(2)})
        for k, outcome in ((1, outcomes[0]), (2, outcomes[1])):
            assert outcome.ok, outcome.error
            np.testing.assert_allclose(outcome.reply.actions[:, :7], 0.01 * k, rtol=1e-6)
            assert (outcome.reply.server_timing is not None) == (flavor == "openpi")
        if flavor == "openpi":  # openpi does not route "reset": its policy gets the request and fails on it
            with pytest.raises(ServerError) as info:
                reset(pool, 0)
            assert info.value.fatal and not pool.is_connected(0)
        else:  # text (dreamzero) or binary (vllm-omni) reply, same result
            assert reset(pool, 0, "episode-1") == "reset successful"
            assert infer(pool, 0, dz_request(3)).actions.shape == (24, 8)


@pytest.mark.parametrize(("flavor", "fatal"), [("vllm-omni", False), ("dreamzero", True), ("openpi", True)])
def test_reference_server_error_replies(flavor, fatal):
    with start_server_thread("hold", flavor=flavor, fail_every=2) as server, SessionPool(server.url, 1, FAST) as pool:
        pool.connect()
        assert infer(pool, 0, dz_request(1)).actions.shape == (24, 8)
        with pytest.raises(ServerError) as info:
            infer(pool, 0, dz_request(2))  # the 2nd inference fails on the server
        assert info.value.fatal is fatal
        assert pool.is_connected(0) is not fatal
        if fatal:
            assert "Traceback" in info.value.message
            with pytest.raises(ConnectionLost):
                infer(pool, 0, dz_request(3))
            pool.reconnect(0)
        assert infer(pool, 0, dz_request(3)).actions.shape == (24, 8)


def test_reference_vllm_idle_timeout_and_missing_policy():
    """After vLLM-Omni's idle close the next request goes out on a fresh connection by itself."""
    with start_server_thread("hold", flavor="vllm-omni", idle_timeout_s=0.2) as server:
        with ServerLogWatch(r"idle for .* closing") as idle, SessionPool(server.url, 1, FAST) as pool:
            pool.connect()
            assert idle.wait(1, 10)  # the server reports that it closed the connection
            outcome = gather(pool, {0: dz_request()})[0]
            assert outcome.ok and outcome.reconnects == 1 and outcome.reply.actions.shape == (24, 8)
            assert pool.is_connected(0) and server.server.connections == 2
    with start_server_thread("hold", flavor="vllm-omni", robot_policy_available=False) as server:
        with SessionPool(server.url, 1, FAST) as pool, pytest.raises(PartialConnectError) as info:
            pool.connect()
        error = info.value.errors[0]
        assert isinstance(error, ServerError) and error.code == "unsupported"


class BarrierPolicy:
    """Answers only when ``parties`` inferences run at once (a threading barrier with a bound): proves that
    the server's workers overlap the sessions' requests without timing anything."""

    def __init__(self, parties: int):
        self.barrier = threading.Barrier(parties, timeout=10)
        self.lock = threading.Lock()
        self.running = 0
        self.max_running = 0

    def infer(self, request, *, session_id, new_session):
        with self.lock:
            self.running += 1
            self.max_running = max(self.max_running, self.running)
        try:
            self.barrier.wait()
        finally:
            with self.lock:
                self.running -= 1
        return chunk()


@pytest.mark.timeout(90)
def test_reference_server_workers_overlap_concurrent_sessions():
    """8 sessions at once against 8 workers: all 8 inferences run at the same moment on the server."""
    policy = BarrierPolicy(8)
    with start_server_thread(policy, flavor="vllm-omni", workers=8) as server:
        with SessionPool(server.url, 8, FAST) as pool:
            pool.connect()
            outcomes = gather(pool, {i: dz_request(i) for i in range(8)})
    assert all(o.ok for o in outcomes.values()), [o.error for o in outcomes.values()]
    assert policy.max_running == 8


def test_reference_server_with_one_worker_runs_one_inference_at_a_time():
    """The same 8 sessions against one worker: the server never runs two inferences at once, and every
    request still gets its own reply."""
    policy = BarrierPolicy(1)
    with start_server_thread(policy, flavor="vllm-omni", workers=1) as server:
        with SessionPool(server.url, 8, FAST) as pool:
            pool.connect()
            outcomes = gather(pool, {i: dz_request(i) for i in range(8)})
    assert all(o.ok for o in outcomes.values())
    assert policy.max_running == 1


def test_forgotten_pool_is_closed_when_collected():
    import gc

    with ServerThread(good()) as server:
        pool = SessionPool(server.url, 2, FAST)
        pool.connect()
        loop = pool.loop
        del pool
        gc.collect()
        assert loop.closed


def test_forgotten_loop_thread_stops_when_collected():
    import gc

    loop = LoopThread()
    thread = loop._thread
    del loop
    gc.collect()
    thread.join(10)
    assert not thread.is_alive()
