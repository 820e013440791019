"""The reference server, driven by a plain websockets client and the protocol parsers.

Every server here binds 127.0.0.1 on a free port and is stopped by its fixture; every receive has a bound.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import signal
import threading
import time

import numpy as np
import pytest
from websockets.exceptions import ConnectionClosedError, ConnectionClosedOK
from websockets.sync.client import connect

from dz_gym.errors import ServerError
from dz_gym.protocol import (
    DREAMZERO_METADATA,
    build_infer_request,
    build_reset_request,
    packb,
    parse_infer_response,
    parse_metadata,
    parse_reset_response,
    unpackb,
)
from dz_gym.server import ProbePolicy, start_server_process, start_server_thread
from dz_gym.server.policies import load_policy, parse_policy_args
from dz_gym.testing.sigint import python_executable

RECV_S = 10.0
KEY = "observation/exterior_image_0_left"


def _request(session_id: str | None = "s1", endpoint: str | None = "infer", joints=None) -> dict:
    joints = np.arange(7, dtype=np.float64) if joints is None else joints
    return build_infer_request(
        images={KEY: np.zeros((8, 8, 3), np.uint8)},
        joint_position=joints,
        gripper_position=[0.0],
        prompt="put the cube in the bowl",
        session_id=session_id,
        endpoint=endpoint,
    )


@contextlib.contextmanager
def _open(url: str, path: str = "/v1/realtime/robot/openpi"):
    """A plain websockets client: yields (connection, first frame)."""
    with connect(url + path, open_timeout=RECV_S, max_size=None, compression=None) as ws:
        yield ws, ws.recv(RECV_S)


def _infer(ws, **kwargs) -> np.ndarray:
    ws.send(packb(_request(**kwargs)))
    return parse_infer_response(ws.recv(RECV_S), horizon=24).actions


def _probe(ws, session_id) -> tuple[int, bool]:
    """(calls in session, new_session flag) reported by the probe policy."""
    actions = _infer(ws, session_id=session_id)
    return int(actions[0, 0]), bool(actions[0, 1])


@pytest.fixture
def probe_server(request):
    params = getattr(request, "param", {})
    policy = ProbePolicy()
    handle = start_server_thread(policy, **params)
    handle.policy = policy
    yield handle
    handle.stop()


# ------------------------------------------------------------------------------------------- vllm-omni
def test_vllm_handshake_infer_and_reset_replies():
    with start_server_thread("hold") as server:
        with _open(server.url) as (ws, first):
            assert isinstance(first, bytes)
            meta = parse_metadata(first)
            assert meta.raw == DREAMZERO_METADATA and meta.image_resolution == (180, 320)
            ws.send(packb(_request()))
            reply = ws.recv(RECV_S)
            decoded = unpackb(reply)
            assert isinstance(decoded, np.ndarray) and decoded.shape == (24, 8) and decoded.dtype == np.float32
            np.testing.assert_array_equal(decoded[:, :7], np.tile(np.arange(7), (24, 1)))
            assert np.all(decoded[:, 7] == 0.0)  # gripper open
            ws.send(packb(build_reset_request()))
            reset = ws.recv(RECV_S)
            assert isinstance(reset, bytes) and unpackb(reset) == {"status": "reset successful"}
            assert parse_reset_response(reset) == "reset successful"
        assert server.stats().inferences == 1


def test_vllm_sessions_are_tracked_per_connection_and_reset_forgets_all(probe_server):
    with _open(probe_server.url) as (ws, _):
        assert _probe(ws, "a") == (1, True)
        assert _probe(ws, "a") == (2, False)
        assert _probe(ws, "b") == (1, True)
        assert _probe(ws, "a") == (3, False)  # interleaving on one connection keeps both sessions
        ws.send(packb(build_reset_request()))
        assert parse_reset_response(ws.recv(RECV_S)) == "reset successful"
        assert _probe(ws, "a") == (1, True)
        assert _probe(ws, "b") == (1, True)
        assert _probe(ws, None) == (2, False)  # no session_id: the connection's current one ("b")
    with _open(probe_server.url) as (ws2, _):
        assert _probe(ws2, "a") == (1, True)  # a new connection starts with an empty seen-set
        assert _probe(ws2, None) == (2, False)
    with _open(probe_server.url) as (ws3, _):
        assert _probe(ws3, None) == (1, True)
    assert probe_server.policy.log[-1] == ("default", True)
    assert probe_server.policy.resets == [None]


@pytest.mark.parametrize("probe_server", [{"fail_every": 2}], indirect=True)
def test_vllm_inference_error_is_binary_keeps_connection_and_releases_session(probe_server):
    with _open(probe_server.url) as (ws, _):
        assert _probe(ws, "a") == (1, True)
        ws.send(packb(_request(session_id="a")))
        reply = ws.recv(RECV_S)
        assert isinstance(reply, bytes)
        assert unpackb(reply) == {"type": "error", "message": "Internal inference error"}
        with pytest.raises(ServerError) as info:
            parse_infer_response(reply)
        assert not info.value.fatal
        assert _probe(ws, "a") == (1, True)  # the failed session starts over
        ws.send(packb(_request(session_id="a")))  # 4th inference fails again
        assert unpackb(ws.recv(RECV_S))["type"] == "error"
    stats = probe_server.stats()
    assert (stats.inferences, stats.failures) == (4, 2)


def test_vllm_bad_payloads_get_errors_text_and_empty_frames_are_ignored():
    with start_server_thread("hold", max_payload_bytes=4096) as server:
        with _open(server.url) as (ws, _):
            for bad in (b"\xc1garbage", packb([1, 2, 3]), b"x" * 5000):
                ws.send(bad)
                assert unpackb(ws.recv(RECV_S)) == {"type": "error", "message": "Invalid request payload"}
            ws.send("hello")  # ignored
            ws.send(b"")  # ignored
            ws.send(packb(_request()))
            assert unpackb(ws.recv(RECV_S)).shape == (24, 8)  # the very next reply is the infer reply
            ws.send(packb({**_request(), "observation/joint_position": "x"}))  # the policy raises
            assert unpackb(ws.recv(RECV_S)) == {"type": "error", "message": "Internal inference error"}


def test_vllm_idle_timeout_closes_normally():
    with start_server_thread("hold", idle_timeout_s=0.3) as server:
        with _open(server.url) as (ws, _):
            _infer(ws)
            with pytest.raises(ConnectionClosedOK) as info:
                ws.recv(RECV_S)
            assert info.value.rcvd.code == 1000


def test_vllm_without_robot_policy_sends_text_error_and_closes():
    with start_server_thread("hold", robot_policy_available=False) as server:
        with _open(server.url) as (ws, first):
            assert isinstance(first, str)
            with pytest.raises(ServerError) as info:
                parse_metadata(first)
            assert info.value.fatal and info.value.code == "unsupported"
            with pytest.raises(ConnectionClosedOK):
                ws.recv(RECV_S)


def _http_get(port: int, path: str) -> tuple[int, str, str]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=RECV_S)
    try:
        conn.request("GET", path)
        resp = conn.getresponse()
        return resp.status, resp.getheader("Content-Type") or "", resp.read().decode()
    finally:
        conn.close()


def test_health_endpoints_per_flavor():
    with start_server_thread("hold") as server:
        status, ctype, body = _http_get(server.port, "/health")
        assert status == 200 and json.loads(body) == {"status": "healthy"} and ctype == "application/json"
        assert _http_get(server.port, "/healthz")[0] == 404
    for flavor in ("openpi", "dreamzero"):
        with start_server_thread("hold", flavor=flavor) as server:
            assert _http_get(server.port, "/healthz")[:3:2] == (200, "OK\n")


# ------------------------------------------------------------------------------------------- dreamzero
def test_dreamzero_text_reset_and_required_endpoint():
    with start_server_thread("hold", flavor="dreamzero") as server:
        with _open(server.url, "") as (ws, first):
            assert parse_metadata(first).needs_session_id is True
            assert _infer(ws).shape == (24, 8)
            ws.send(packb(build_reset_request("s1")))
            reply = ws.recv(RECV_S)
            assert reply == "reset successful" and parse_reset_response(reply) == "reset successful"
            ws.send(packb(_request(endpoint=None)))  # no endpoint: KeyError traceback, then 1011
            text = ws.recv(RECV_S)
            assert isinstance(text, str) and text.startswith("Traceback") and "KeyError: 'endpoint'" in text
            with pytest.raises(ServerError) as info:
                parse_infer_response(text)
            assert info.value.fatal
            with pytest.raises(ConnectionClosedError) as closed:
                ws.recv(RECV_S)
            assert closed.value.rcvd.code == 1011


@pytest.mark.parametrize("probe_server", [{"flavor": "dreamzero"}], indirect=True)
def test_dreamzero_has_one_global_session(probe_server):
    with _open(probe_server.url, "") as (ws1, _), _open(probe_server.url, "") as (ws2, _):
        assert _probe(ws1, "a") == (1, True)
        assert _probe(ws1, "a") == (2, False)
        assert _probe(ws2, "a") == (3, False)  # the state is global: another connection continues it
        assert _probe(ws2, "b") == (1, True)
        assert _probe(ws1, "a") == (1, True)  # every switch resets: interleaved sessions never build up
        ws1.send(packb(build_reset_request()))
        assert ws1.recv(RECV_S) == "reset successful"
        assert _probe(ws2, "a") == (1, True)
    assert probe_server.policy.resets == ["a"]


@pytest.mark.parametrize("probe_server", [{"flavor": "dreamzero", "fail_every": 1}], indirect=True)
def test_dreamzero_inference_error_is_traceback_then_1011(probe_server):
    with _open(probe_server.url, "") as (ws, _):
        ws.send(packb(_request()))
        text = ws.recv(RECV_S)
        assert isinstance(text, str) and "InjectedFailure" in text
        with pytest.raises(ConnectionClosedError) as closed:
            ws.recv(RECV_S)
        assert closed.value.rcvd.code == 1011


# ------------------------------------------------------------------------------------------- openpi
def test_openpi_dict_reply_with_server_timing_and_fatal_errors():
    with start_server_thread("hold", flavor="openpi", fail_every=3, latency_ms=5) as server:
        with _open(server.url, "") as (ws, first):
            assert isinstance(first, bytes)
            ws.send(packb(_request(endpoint=None, session_id=None)))
            reply = parse_infer_response(ws.recv(RECV_S), horizon=24)
            assert set(reply.server_timing) == {"infer_ms"} and reply.server_timing["infer_ms"] > 0
            ws.send(packb(_request(endpoint=None, session_id=None)))
            reply = parse_infer_response(ws.recv(RECV_S), horizon=24)
            assert set(reply.server_timing) == {"infer_ms", "prev_total_ms"}
            ws.send(packb(_request(endpoint=None, session_id=None)))
            text = ws.recv(RECV_S)
            assert isinstance(text, str) and "InjectedFailure" in text
            with pytest.raises(ConnectionClosedError) as closed:
                ws.recv(RECV_S)
            assert closed.value.rcvd.code == 1011


def test_openpi_flavor_passes_endpoint_to_the_policy():
    seen = []

    class Recorder:
        def infer(self, request, *, session_id, new_session):
            seen.append(request.get("endpoint"))
            return {"actions": np.zeros((24, 8), np.float32), "policy_timing": {"x": 1.0}}

    with start_server_thread(Recorder(), flavor="openpi") as server:
        with _open(server.url, "") as (ws, first):
            assert parse_metadata(first).raw == DREAMZERO_METADATA  # the default when a policy has none
            ws.send(packb(_request()))
            reply = parse_infer_response(ws.recv(RECV_S))
            assert reply.extra == {"policy_timing": {"x": 1.0}}
    assert seen == ["infer"]


# ------------------------------------------------------------------------------------------- FIFO, workers
class GatedPolicy:
    """The first inference blocks until ``gate`` is set; every inference records its session in order."""

    def __init__(self, block_first: int = 1):
        self.gate = threading.Event()
        self.order: list[str] = []
        self.active = 0
        self.max_active = 0
        self._lock = threading.Lock()
        self._block = block_first

    def infer(self, request, *, session_id, new_session):
        with self._lock:
            self.active += 1
            self.max_active = max(self.max_active, self.active)
            blocking = self._block > 0
            self._block -= 1
        if blocking:
            assert self.gate.wait(RECV_S), "gate never opened"
        with self._lock:
            self.order.append(session_id)
            self.active -= 1
        return np.zeros((24, 8), np.float32)


def _wait_for(predicate, what: str) -> None:
    deadline = time.monotonic() + RECV_S
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.005)


def test_inference_is_fifo_across_connections():
    policy = GatedPolicy()
    with start_server_thread(policy) as server:
        with contextlib.ExitStack() as stack:
            conns = [stack.enter_context(_open(server.url))[0] for _ in range(5)]
            conns[0].send(packb(_request(session_id="first")))
            _wait_for(lambda: policy.active == 1, "the first inference to start")
            arrival = [3, 1, 4, 2]
            for depth, index in enumerate(arrival, start=1):
                conns[index].send(packb(_request(session_id=f"c{index}")))
                _wait_for(lambda d=depth: server.server.engine.queue_depth() == d, f"{depth} queued")
            policy.gate.set()
            for ws in conns:
                assert unpackb(ws.recv(RECV_S)).shape == (24, 8)
    assert policy.order == ["first"] + [f"c{i}" for i in arrival]
    assert policy.max_active == 1


def test_workers_serve_concurrently_and_report_utilization():
    policy = GatedPolicy(block_first=2)
    with start_server_thread(policy, workers=2) as server:
        with contextlib.ExitStack() as stack:
            conns = [stack.enter_context(_open(server.url))[0] for _ in range(3)]
            for i, ws in enumerate(conns):
                ws.send(packb(_request(session_id=f"s{i}")))
            _wait_for(lambda: policy.active == 2, "two inferences at once")
            policy.gate.set()
            for ws in conns:
                ws.recv(RECV_S)
        stats = server.stats()
    assert policy.max_active == 2
    assert stats.inferences == 3 and stats.workers == 2 and stats.busy_s > 0
    assert 0 < stats.utilization <= 1


# ------------------------------------------------------------------------------------------- policies, process
def test_policy_loading_and_arguments():
    assert parse_policy_args(["horizon=16", "gripper=1", "name=abc", 'meta={"a": [1]}']) == {
        "horizon": 16,
        "gripper": 1,
        "name": "abc",
        "meta": {"a": [1]},
    }
    with pytest.raises(ValueError, match="--policy-arg: expected key=value"):
        parse_policy_args(["oops"])
    hold = load_policy("dz_gym.server.policies:HoldPolicy", {"horizon": 4, "gripper": 1.0})
    out = hold.infer({"observation/joint_position": np.ones(7)}, session_id="s", new_session=True)
    assert out.shape == (4, 8) and np.all(out[:, 7] == 1.0)
    with pytest.raises(ValueError, match="--policy: expected one of"):
        load_policy("nope")
    with pytest.raises(ValueError, match="cannot import"):
        load_policy("no_such_module_xyz:f")
    with pytest.raises(ValueError, match="rejected the arguments"):
        load_policy("hold", {"bogus": 1})
    with pytest.raises(KeyError, match="observation/joint_position"):
        hold.infer({}, session_id="s", new_session=True)


def test_subprocess_server_serves_and_stops_on_sigterm():
    args = ["--flavor", "vllm-omni", "--policy", "hold", "--policy-arg", "gripper=1.0", "--fail-every", "2"]
    server = start_server_process(args, timeout=60)
    try:
        assert server.output[0].startswith(f"dz-gym-serve ready on {server.url} (flavor=vllm-omni, policy=hold")
        with _open(server.url) as (ws, _):
            actions = _infer(ws)
            assert np.all(actions[:, 7] == 1.0)
            ws.send(packb(_request()))
            assert unpackb(ws.recv(RECV_S))["type"] == "error"  # --fail-every 2
    finally:
        code = server.stop(timeout=20)
    assert code == 0  # SIGTERM is a clean shutdown
    summary = server.summary()
    assert summary["requests"] == "2" and summary["failures"] == "1" and "utilization" in summary
    assert "infer conn=1 session=s1 new=True" in server.log_text()


def test_subprocess_launcher_reports_startup_failures():
    with pytest.raises(RuntimeError, match="exited with 2 before it was ready.*--policy"):
        start_server_process(["--policy", "nope"], timeout=60)


def test_sigint_also_stops_the_subprocess(tmp_path):
    """SIGINT at its default, as in a terminal (even where this test process inherited it ignored)."""
    python = python_executable(tmp_path, sigint="default")
    server = start_server_process(["--flavor", "openpi", "--quiet"], timeout=60, python=python)
    server.proc.send_signal(signal.SIGINT)
    assert server.proc.wait(20) == 0
    server.stop()
    assert server.summary()["requests"] == "0"


def test_a_server_started_with_sigint_ignored_keeps_ignoring_it(tmp_path):
    """A background job of a script has SIGINT ignored: the server must not start reacting to Ctrl-C. An
    ignored signal is discarded when sent, so the request after it proves the server went on; SIGTERM stops."""
    python = python_executable(tmp_path, sigint="ignore")
    server = start_server_process(["--policy", "hold", "--quiet"], timeout=60, python=python)
    try:
        server.proc.send_signal(signal.SIGINT)
        with _open(server.url) as (ws, _):
            assert _infer(ws).shape[1] == 8
        assert server.proc.poll() is None
    finally:
        code = server.stop(timeout=20)
    assert code == 0 and server.summary()["requests"] == "1"


# ------------------------------------------------------------------------------------------- openpi-client
@pytest.mark.filterwarnings("ignore:connect\\(\\) must be used as a context manager:DeprecationWarning")
@pytest.mark.parametrize("flavor", ["vllm-omni", "openpi", "dreamzero"])
def test_the_pypi_openpi_client_talks_to_every_flavor(flavor):
    client_mod = pytest.importorskip("openpi_client.websocket_client_policy")
    with start_server_thread("hold", flavor=flavor) as server:
        policy = client_mod.WebsocketClientPolicy(server.url + "/v1/realtime/robot/openpi")
        try:
            assert policy.get_server_metadata() == DREAMZERO_METADATA
            obs = _request(session_id="s", endpoint=None)  # openpi-client never sends an endpoint
            if flavor == "dreamzero":
                with pytest.raises(RuntimeError, match="KeyError: 'endpoint'"):
                    policy.infer(obs)  # DreamZero requires it: traceback text, then 1011
                return
            result = policy.infer(obs)
            actions = result["actions"] if flavor == "openpi" else result
            assert actions.shape == (24, 8) and np.all(actions[:, :7] == np.arange(7))
            if flavor == "openpi":
                assert "infer_ms" in result["server_timing"]
        finally:
            policy._ws.close()


def test_cli_bad_flag_is_one_line(capsys):
    from dz_gym.server.cli import main

    with pytest.raises(SystemExit) as exc:
        main(["--workers", "0"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("dz-gym-serve: error: --workers"), err
