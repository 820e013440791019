"""dz-gym-bench: pure parts (metrics, arrivals, payloads, report) and runs against loopback servers.

The load tests assert the *shape* of the numbers with generous margins (ratios, never absolute times):
with one FIFO worker of 100 ms the throughput stays ~10 req/s at any concurrency while latency grows with
it; with 8 workers throughput scales with concurrency at flat latency.
"""

from __future__ import annotations

import asyncio
import json
import socket
import subprocess
import sys
import threading
import time

import imageio.v3 as iio
import numpy as np
import pytest
from websockets.asyncio.server import serve

from dz_gym.bench import cli
from dz_gym.bench.load import LoadSpec, arrival_offsets
from dz_gym.bench.metrics import RequestRecord, control_budget_s, latency_stats, summarize
from dz_gym.bench.payloads import PayloadSet, load_views, split_views, synthetic_views
from dz_gym.bench.report import build_document, format_run, format_sweep
from dz_gym.envs import droid
from dz_gym.protocol import packb, unpackb
from dz_gym.server.launch import start_server_thread
from dz_gym.testing.servers import ServerLogWatch

pytestmark = pytest.mark.timeout(120)

RUN_KEYS = ("requests_per_s", "actions_per_s", "latency_ms", "goodput", "errors", "completed", "concurrency")
LATENCY_KEYS = ("mean", "p50", "p90", "p95", "p99", "max")


def bench(*args: str) -> int:
    return cli.main([str(a) for a in args])


def load_json(path) -> dict:
    with open(path, encoding="utf-8") as handle:
        return json.load(handle)


# ---------------------------------------------------------------------------------------------- metrics
def record(
    latency_ms: float,
    *,
    t0: float = 0.0,
    kind: str | None = None,
    infer_ms: float | None = None,
    first: bool = False,
    session: int = 0,
) -> RequestRecord:
    return RequestRecord(
        session=session,
        server=0,
        sent_at=t0,
        received_at=t0 + latency_ms / 1e3,
        request_bytes=1000,
        error_kind=kind,
        error_message=None if kind is None else f"{kind} happened",
        first_of_episode=first,
        infer_ms=infer_ms,
    )


def test_summarize_throughput_latency_goodput_and_errors():
    records = [record(100.0 * (k + 1), first=(k == 0)) for k in range(8)]  # 100..800 ms
    records += [record(50.0, kind="ServerError"), record(50.0, kind="ServerError"), record(9.0, kind="RequestTimeout")]
    metrics = summarize(records, duration_s=2.0, open_loop_horizon=8, sessions=2, client_cpu_s=0.011)
    assert metrics["completed"] == 8 and metrics["failed"] == 3
    assert metrics["requests_per_s"] == pytest.approx(4.0)
    assert metrics["actions_per_s"] == pytest.approx(32.0)
    assert metrics["control_hz_per_session"] == pytest.approx(16.0)
    assert metrics["realtime_factor"] == pytest.approx(16.0 / 15.0)
    assert metrics["latency_ms"]["p50"] == pytest.approx(450.0)
    assert metrics["latency_ms"]["max"] == pytest.approx(800.0)
    assert metrics["first_chunk_ms"]["mean"] == pytest.approx(100.0)
    # 100..500 ms are within 533 ms: 5 of the 11 requests (failed ones are never good).
    assert metrics["goodput"] == pytest.approx(5 / 11)
    assert metrics["goodput_budget_ms"] == pytest.approx(8 / 15 * 1e3)
    assert metrics["errors"] == {"RequestTimeout": 1, "ServerError": 2}
    assert metrics["error_examples"]["ServerError"] == "ServerError happened"
    assert metrics["mb_sent"] == pytest.approx(11 * 1000 / 1e6)
    assert metrics["client_cpu_ms_per_request"] == pytest.approx(1.0)
    assert metrics["server_infer_ms"] is None and metrics["queue_ms"] is None


def test_summarize_queueing_from_server_timing_and_empty_runs():
    records = [record(120.0, infer_ms=20.0), record(220.0, infer_ms=20.0)]
    metrics = summarize(records, duration_s=1.0, open_loop_horizon=4, sessions=1)
    assert metrics["server_infer_ms"]["mean"] == pytest.approx(20.0)
    assert metrics["queue_ms"]["p50"] == pytest.approx(150.0)
    assert metrics["goodput_budget_ms"] == pytest.approx(control_budget_s(4) * 1e3)
    empty = summarize([], duration_s=0.0, open_loop_horizon=8, sessions=1)
    assert empty["requests_per_s"] == 0.0 and empty["latency_ms"] is None and empty["goodput"] == 0.0
    assert latency_stats([]) is None
    with pytest.raises(ValueError, match="open_loop_horizon"):
        summarize(records, duration_s=1.0, open_loop_horizon=0, sessions=1)


# ---------------------------------------------------------------------------------------------- arrivals
def test_arrival_offsets_constant_and_poisson():
    constant = arrival_offsets(4.0, "constant")
    assert [next(constant) for _ in range(4)] == [0.0, 0.25, 0.5, 0.75]
    gaps = np.diff([t for t, _ in zip(arrival_offsets(10.0, "poisson", seed=3), range(4001))])
    assert gaps.min() > 0
    assert gaps.mean() == pytest.approx(0.1, rel=0.1)
    assert gaps.std() == pytest.approx(0.1, rel=0.15)  # exponential: std == mean
    again = np.diff([t for t, _ in zip(arrival_offsets(10.0, "poisson", seed=3), range(4001))])
    assert np.array_equal(gaps, again)
    with pytest.raises(ValueError, match="request rate"):
        arrival_offsets(0.0)
    with pytest.raises(ValueError, match="arrival"):
        arrival_offsets(1.0, "gamma")
    with pytest.raises(ValueError, match="num_requests or duration_s"):
        LoadSpec(sessions=1)


# ---------------------------------------------------------------------------------------------- payloads
def test_payload_set_splices_session_ids_into_a_full_dreamzero_request():
    views = synthetic_views(3, (180, 320), seed=1)
    payloads = PayloadSet(views, prompt="put the banana in the bin")
    assert len(payloads) == 3
    for k, sid in enumerate(["a", "3f1c2b9e-5f2d-4a7e-9c1e-2b3d4e5f6a7b", "x" * 300]):
        data = payloads.payload(k, sid)
        assert len(data) == payloads.size(k, sid)
        request = unpackb(data)
        assert request["session_id"] == sid
        assert request["prompt"] == "put the banana in the bin"
        assert request["endpoint"] == "infer"
        for view, camera in zip(views[k], droid.CAMERA_KEYS):
            image = request[droid.REQUEST_IMAGE_KEYS[camera]]
            assert image.dtype == np.uint8 and image.shape == (180, 320, 3)
            assert np.array_equal(image, view)
        assert request[droid.REQUEST_JOINT_KEY].dtype == np.float64 and request[droid.REQUEST_JOINT_KEY].shape == (7,)
        assert request[droid.REQUEST_GRIPPER_KEY].shape == (1,)
        assert np.array_equal(request[droid.REQUEST_CARTESIAN_KEY], np.zeros(6))
    # About the 519 KB the protocol notes give for one DreamZero request.
    assert 500_000 < payloads.size(0) < 540_000
    # Spliced bytes equal a fresh encode of the same request.
    request = unpackb(payloads.payload(1, "abc"))
    assert packb(request) == payloads.payload(1, "abc")


def test_split_views_strip_order_and_auto_layout():
    height, third = 180, 320
    strip = np.zeros((height, 3 * third, 3), dtype=np.uint8)
    for k in range(3):
        strip[:, k * third : (k + 1) * third] = 10 * (k + 1)
    external, external_2, wrist = split_views(strip, (180, 320))
    # The evaluator's strip is right external | wrist | left external.
    assert external[0, 0, 0] == 10 and wrist[0, 0, 0] == 20 and external_2[0, 0, 0] == 30
    single = np.full((720, 1280, 3), 7, dtype=np.uint8)
    views = split_views(single, (180, 320))
    assert all(view is single or np.shares_memory(view, single) for view in views)
    assert (
        len(split_views(strip, (180, 320), "single")) == 3
        and split_views(strip, (180, 320), "single")[0].shape == strip.shape
    )
    with pytest.raises(ValueError, match="uint8"):
        split_views(strip.astype(np.float32), (180, 320))
    with pytest.raises(ValueError, match="layout"):
        split_views(strip, (180, 320), "grid")


def write_image_dir(path):
    """A directory with two png strips (360x1920: three 360x640 views) and a short mp4 of 180x960 strips."""
    path.mkdir()
    for k in range(2):
        strip = np.zeros((360, 1920, 3), dtype=np.uint8)
        strip[:, :640] = (200, 10 * k, 0)
        strip[:, 640:1280] = (0, 200, 10 * k)
        strip[:, 1280:] = (10 * k, 0, 200)
        iio.imwrite(path / f"frame_{k}.png", strip)
    frames = np.zeros((6, 176, 960, 3), dtype=np.uint8)
    frames[:, :, :320] = (250, 0, 0)
    frames[:, :, 320:640] = (0, 250, 0)
    frames[:, :, 640:] = (0, 0, 250)
    iio.imwrite(path / "video.mp4", frames, fps=15)
    return path


def test_load_views_splits_strips_from_frames_and_videos(tmp_path):
    directory = write_image_dir(tmp_path / "frames")
    triples = load_views(directory, (180, 320), max_frames=8)
    assert len(triples) == 8
    for external, external_2, wrist in triples:
        for view in (external, external_2, wrist):
            assert view.shape == (180, 320, 3) and view.dtype == np.uint8
        # Colours survive resizing and video compression: right view red, wrist green, left view blue.
        centre = (slice(80, 100), slice(150, 170))
        assert external[centre].mean(axis=(0, 1)).argmax() == 0
        assert wrist[centre].mean(axis=(0, 1)).argmax() == 1
        assert external_2[centre].mean(axis=(0, 1)).argmax() == 2
    with pytest.raises(ValueError, match="no .png"):
        (tmp_path / "empty").mkdir()
        load_views(tmp_path / "empty", (180, 320))
    with pytest.raises(ValueError, match="expected a directory"):
        load_views(tmp_path / "missing", (180, 320))


# ---------------------------------------------------------------------------------------------- report
def fake_run(concurrency: int, rate: float) -> dict:
    records = [record(100.0 * concurrency, t0=k / rate) for k in range(10)]
    run = summarize(records, duration_s=10 / rate, open_loop_horizon=8, sessions=concurrency)
    run.update(
        mode="concurrency",
        concurrency=concurrency,
        request_rate=None,
        arrival=None,
        reconnects=0,
        warmup_completed=concurrency,
        warmup_errors=0,
        per_server=[],
    )
    return run


def test_sweep_table_is_fixed_width_and_document_has_stable_keys():
    runs = [fake_run(1, 10.0), fake_run(2, 19.0), fake_run(16, 150.0)]
    table = format_sweep(runs).splitlines()
    assert len({len(line) for line in table}) == 1
    assert table[0].split()[:3] == ["C", "req/s", "actions/s"]
    assert table[-1].split()[0] == "16" and table[-1].split()[4] == "15.00"  # speedup vs the first run
    result = {
        "servers": [{"url": "ws://127.0.0.1:1", "metadata": {"image_resolution": np.array([180, 320])}}],
        "payload": {},
        "runs": runs,
    }
    single = build_document(result, argv=["--server", "ws://127.0.0.1:1"], sweep=False)
    for key in RUN_KEYS + ("command", "servers", "versions"):
        assert key in single
    assert single["servers"][0]["metadata"]["image_resolution"] == [180, 320]
    json.dumps(single, allow_nan=False)
    sweep = build_document(result, argv=[], sweep=True)
    assert [run["concurrency"] for run in sweep["runs"]] == [1, 2, 16]
    assert "requests_per_s" not in sweep and "versions" in sweep
    assert "closed loop, concurrency 1" in format_run(runs[0])


# ---------------------------------------------------------------------------------------------- flags
@pytest.mark.parametrize(
    "args",
    [
        [],
        ["--server", "http://127.0.0.1:1"],
        ["--server", "ws://127.0.0.1:1", "--concurrency", "0"],
        ["--server", "ws://127.0.0.1:1", "--sweep", "1,two"],
        ["--server", "ws://127.0.0.1:1", "--sweep", "1,2", "--concurrency", "2"],
        ["--server", "ws://127.0.0.1:1", "--request-rate", "-1"],
        ["--server", "ws://127.0.0.1:1", "--concurrency", "2", "--request-rate", "3"],
        ["--server", "ws://127.0.0.1:1", "--plot", "x.png"],
        ["--server", "ws://127.0.0.1:1", "--arrival", "constant"],
        ["--server", "ws://127.0.0.1:1", "--duration", "nan"],
        ["--server", "ws://127.0.0.1:1", "--arrival", "bursty", "--request-rate", "1"],
    ],
)
def test_bad_flags_exit_2(args, capsys):
    with pytest.raises(SystemExit) as exc:
        cli.main(args)
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("dz-gym-bench: error:")


def test_console_script_bad_flag_exit_code():
    proc = subprocess.run(
        [sys.executable, "-m", "dz_gym.bench", "--server", "ws://127.0.0.1:1", "--num-requests", "0"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2 and "--num-requests" in proc.stderr


# ---------------------------------------------------------------------------------------------- shapes
class ServerProbe:
    """A reference-server policy that records, at the start of each inference, how many requests the
    server held (this one, the others running and those queued behind them): server-side counts instead of
    clocks. With ``gate``, an inference waits (bounded) until ``gate`` inferences have run at once."""

    def __init__(self, gate: int = 0, queue_at: int | None = None):
        self.engine = None  # set once the server has started
        self.gate = gate
        self.queue_at = queue_at  # inference number that starts only once another request waits in the queue
        self.cond = threading.Condition()
        self.running = 0
        self.max_running = 0
        self.held: list[int] = []

    def infer(self, request, *, session_id, new_session):
        if self.queue_at is not None and len(self.held) == self.queue_at:
            # a count, not a clock: polled until a second request is queued, bounded
            deadline = time.monotonic() + 60.0
            while self.engine.queue_depth() < 1 and time.monotonic() < deadline:
                time.sleep(0.005)
        with self.cond:
            self.running += 1
            self.max_running = max(self.max_running, self.running)
            self.held.append(self.running + self.engine.queue_depth())
            self.cond.notify_all()
            if self.gate:
                # until ``gate`` ran at once (once is enough: later inferences go on at once); a bound, not a clock
                self.cond.wait_for(lambda: self.max_running >= self.gate, timeout=60.0)
            self.running -= 1
        return np.zeros((24, 8), dtype=np.float32)


def probed_server(probe: ServerProbe, **config):
    server = start_server_thread(probe, **config)
    probe.engine = server.server.engine
    return server


def test_single_fifo_worker_queues_what_concurrency_sends(tmp_path):
    out, plot = tmp_path / "sweep.json", tmp_path / "sweep.png"
    probe = ServerProbe(queue_at=13)  # the first inference at C=4 waits until the others queue behind it
    with probed_server(probe, latency_ms=50, workers=1) as server:
        rc = bench("--server", server.url, "--sweep", "1,4", "--num-requests", 12, "--json", out, "--plot", plot)
    assert rc == 0
    doc = load_json(out)
    runs = {run["concurrency"]: run for run in doc["runs"]}
    assert sorted(runs) == [1, 4]
    for run in runs.values():
        assert run["completed"] == 12 and run["failed"] == 0 and run["errors"] == {}
        for key in RUN_KEYS:
            assert key in run
        assert set(LATENCY_KEYS) <= set(run["latency_ms"])
    # Server side: one worker runs one inference at a time. At C=1 (one warm-up and 12 timed requests) the
    # server never holds a second request; at C=4 requests wait in its queue behind the running one.
    assert probe.max_running == 1 and len(probe.held) == 13 + 16
    assert max(probe.held[:13]) == 1
    assert max(probe.held[13:]) > 1
    assert doc["servers"][0]["health"]["path"] == "/health"
    assert doc["payload"]["request_bytes"] > 500_000
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_eight_workers_run_eight_sessions_at_once(tmp_path):
    out = tmp_path / "run.json"
    probe = ServerProbe(gate=8)
    with probed_server(probe, workers=8) as server:
        rc = bench("--server", server.url, "--concurrency", 8, "--num-requests", 16, "--json", out, "--quiet")
    assert rc == 0
    run = load_json(out)
    assert run["completed"] == 16 and run["failed"] == 0
    assert probe.max_running == 8  # all eight sessions' requests computed at the same moment


def test_open_loop_never_exceeds_max_outstanding(tmp_path):
    out = tmp_path / "open.json"
    probe = ServerProbe()
    with probed_server(probe, latency_ms=20, workers=4) as server:
        rc = bench(
            "--server",
            server.url,
            "--request-rate",
            40,
            "--arrival",
            "constant",
            "--max-outstanding",
            2,
            "--num-requests",
            16,
            "--json",
            out,
            "--quiet",
        )
    assert rc == 0
    run = load_json(out)
    assert run["mode"] == "request-rate" and run["concurrency"] == 2 and run["completed"] == 16
    # Four workers could run more, but the client never has more than two requests out.
    assert 1 <= max(probe.held) <= 2 and probe.max_running <= 2
    assert run["schedule_lag_ms"]["max"] >= 0


# ---------------------------------------------------------------------------------------------- servers
@pytest.mark.parametrize("flavor", ["vllm-omni", "dreamzero", "openpi"])
def test_every_reference_flavor(flavor, tmp_path):
    out = tmp_path / "run.json"
    with start_server_thread("hold", flavor=flavor, latency_ms=5) as server:
        rc = bench(
            "--server", server.url, "--concurrency", 2, "--num-requests", 10, "--episode-length", 3, "--json", out
        )
    assert rc == 0
    run = load_json(out)
    assert run["completed"] == 10 and run["failed"] == 0 and run["concurrency"] == 2
    # Episodes of 3 requests over 2 sessions: each session's first request and every third after it.
    assert run["first_chunk_ms"] is not None
    if flavor == "openpi":
        assert run["server_infer_ms"]["mean"] >= 4.0
        assert run["queue_ms"] is not None
        assert run["servers"][0]["health"]["path"] == "/healthz"
    else:
        assert run["server_infer_ms"] is None


class DictPolicy:
    """A small openpi policy: a dict with ``actions`` and an extra field, as openpi policies return."""

    def infer(self, obs: dict) -> dict:
        joints = np.asarray(obs["observation/joint_position"], dtype=np.float32)
        actions = np.zeros((24, 8), dtype=np.float32)
        actions[:, :7] = joints
        return {"actions": actions, "policy_timing": {"infer_ms": 0.1}}

    def reset(self) -> None:
        pass


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def run_in_thread(coro_factory):
    """Run ``coro_factory()`` on a fresh loop in a daemon thread; returns (loop, task, thread)."""
    loop = asyncio.new_event_loop()
    task = loop.create_task(coro_factory())
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    return loop, task, thread


def stop_thread(loop, task, thread):
    async def cancel():
        task.cancel()
        await asyncio.wait([task], timeout=5)

    asyncio.run_coroutine_threadsafe(cancel(), loop).result(10)
    loop.call_soon_threadsafe(loop.stop)
    thread.join(5)


def test_pypi_openpi_server(tmp_path):
    openpi_server = pytest.importorskip("openpi_server")
    port = free_port()
    server = openpi_server.WebsocketPolicyServer(DictPolicy(), host="127.0.0.1", port=port, metadata={})
    handles = run_in_thread(server.run)
    out = tmp_path / "openpi.json"
    try:
        rc = bench(
            "--server",
            f"ws://127.0.0.1:{port}",
            "--concurrency",
            2,
            "--num-requests",
            8,
            "--ready-timeout",
            20,
            "--json",
            out,
        )
    finally:
        stop_thread(*handles)
    assert rc == 0
    run = load_json(out)
    assert run["completed"] == 8 and run["failed"] == 0
    assert run["server_infer_ms"] is not None and run["queue_ms"] is not None
    assert run["servers"][0]["health"] == {"path": "/healthz", "status": 200, "body": "OK"}
    # Empty metadata: the payloads use DreamZero's default 180x320.
    assert run["servers"][0]["image_resolution"] == [180, 320]


def test_image_directory_input(tmp_path):
    directory = write_image_dir(tmp_path / "frames")
    out = tmp_path / "images.json"
    with start_server_thread("hold", latency_ms=1) as server:
        rc = bench(
            "--server",
            server.url,
            "--concurrency",
            2,
            "--num-requests",
            6,
            "--images",
            directory,
            "--max-frames",
            4,
            "--json",
            out,
        )
    assert rc == 0
    run = load_json(out)
    assert run["completed"] == 6 and run["payload"]["templates"] == 4 and run["payload"]["source"] == str(directory)
    assert bench("--server", "ws://127.0.0.1:1", "--images", tmp_path / "nowhere", "--ready-timeout", 0.2) == 1


@pytest.mark.parametrize("flavor,closes", [("vllm-omni", False), ("dreamzero", True)])
def test_errors_by_kind_with_fail_every(flavor, closes, tmp_path):
    out = tmp_path / "faults.json"
    with start_server_thread("hold", flavor=flavor, fail_every=4) as server:
        rc = bench("--server", server.url, "--concurrency", 1, "--num-requests", 12, "--warmup", 0, "--json", out)
    assert rc == 0
    run = load_json(out)
    assert run["errors"] == {"ServerError": 3}
    assert run["completed"] == 9 and run["failed"] == 3
    # vLLM-Omni hides the cause ("Internal inference error"); DreamZero sends its traceback.
    assert ("internal inference error" if flavor == "vllm-omni" else "injected") in run["error_examples"][
        "ServerError"
    ].lower()
    assert run["goodput"] == pytest.approx(9 / 12)
    # DreamZero-style servers close the connection after an error: the bench reconnects (a new episode)
    # before the next request, i.e. after the 4th and the 8th (the 12th is the last request).
    assert run["reconnects"] == (2 if closes else 0)


def test_idle_closed_connections_are_resent_and_counted(tmp_path):
    """Think time longer than the server's idle timeout: the server closes each idle connection cleanly, the
    transport re-sends the request on a fresh one, and the run counts those reconnects instead of errors."""
    out = tmp_path / "idle.json"
    with start_server_thread("hold", flavor="vllm-omni", idle_timeout_s=0.2) as server:
        with ServerLogWatch(r"idle for .* closing") as idle:
            rc = bench(
                "--server",
                server.url,
                "--concurrency",
                2,
                "--num-requests",
                4,
                "--think-ms",
                400,
                "--json",
                out,
                "--quiet",
            )
            closed = idle.count
    assert rc == 0
    run = load_json(out)
    assert run["completed"] == 4 and run["failed"] == 0
    assert closed > 0 and run["reconnects"] > 0


# ---------------------------------------------------------------------------------------------- bounds
@pytest.mark.timeout(30)  # bounded: a hang fails the test
def test_dead_server_is_a_clear_bounded_error(capsys):
    rc = bench("--server", f"ws://127.0.0.1:{free_port()}", "--ready-timeout", 1, "--num-requests", 5)
    assert rc == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("dz-gym-bench: error: server at ws://127.0.0.1:")
    assert "not ready within 1 s" in err[0]


@pytest.mark.timeout(20)  # far below the default --ready-timeout of 60 s: a refused port must not wait it out
def test_refused_port_fails_within_seconds():
    proc = subprocess.run(
        [sys.executable, "-m", "dz_gym.bench", "--server", f"ws://127.0.0.1:{free_port()}/x"],
        capture_output=True,
        text=True,
        timeout=15,
    )
    assert proc.returncode == 1
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "refused the connection" in lines[0] and "--server" in lines[0]


@pytest.mark.timeout(30)
def test_silent_server_is_waited_for_until_the_ready_timeout(capsys):
    """A server that accepts TCP but never answers the upgrade (still loading) is not a refused port."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    try:
        port = listener.getsockname()[1]
        rc = bench(
            "--server", f"ws://127.0.0.1:{port}", "--ready-timeout", 1, "--open-timeout", 0.5, "--num-requests", 5
        )
    finally:
        listener.close()
    assert rc == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "not ready within 1 s" in err[0]


@pytest.mark.timeout(40)  # --duration 30 would outlast it if the dead server were not noticed
def test_server_that_dies_mid_run_ends_the_run(capsys):
    served = threading.Event()

    class StopsAfterTen:
        """Holds the joints; sets ``served`` at the 10th inference (the warm-up is 2): mid-run."""

        def __init__(self):
            self.calls = 0

        def infer(self, request, *, session_id, new_session):
            self.calls += 1
            if self.calls >= 10:
                served.set()
            return np.zeros((24, 8), dtype=np.float32)

    server = start_server_thread(StopsAfterTen(), latency_ms=20)
    killer = threading.Thread(target=lambda: served.wait(30) and server.stop(), daemon=True)
    killer.start()
    try:
        rc = bench("--server", server.url, "--concurrency", 2, "--duration", 30)
    finally:
        served.set()
        killer.join(15)
        server.stop()
    assert rc == 1
    err = capsys.readouterr().err.strip().splitlines()
    # the server may die during the warm-up (the connection closes under a request) or after it
    assert len(err) == 1 and ("unreachable" in err[0] or "closed" in err[0]), err


@pytest.mark.timeout(40)
def test_server_that_never_replies_is_bounded(capsys):
    metadata = packb({"image_resolution": [180, 320]})

    async def silent(ws):
        await ws.send(metadata)
        async for _ in ws:  # swallow requests, never answer
            pass

    async def main_server(port):
        async with serve(silent, "127.0.0.1", port, max_size=None, compression=None) as srv:
            await srv.serve_forever()

    port = free_port()
    handles = run_in_thread(lambda: main_server(port))
    try:
        rc = bench(
            "--server",
            f"ws://127.0.0.1:{port}",
            "--concurrency",
            2,
            "--num-requests",
            50,
            "--ready-timeout",
            10,
            "--request-timeout",
            0.5,
            "--max-consecutive-errors",
            2,
        )
    finally:
        stop_thread(*handles)
    assert rc == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "failed in a row" in err[0] and "RequestTimeout" in err[0]


@pytest.mark.timeout(40)  # --duration 60 would outlast it if --timeout did not end the run
def test_overall_timeout_ends_a_long_run(capsys):
    with start_server_thread("hold", latency_ms=50) as server:
        rc = bench("--server", server.url, "--duration", 60, "--timeout", 1.0)
    assert rc == 1
    assert "--timeout 1 s" in capsys.readouterr().err


def test_two_servers_share_sessions_round_robin_and_records_file(tmp_path):
    out, rows = tmp_path / "two.json", tmp_path / "records.jsonl"
    with (
        start_server_thread("hold", latency_ms=5) as first,
        start_server_thread("hold", flavor="openpi", latency_ms=5) as second,
    ):
        rc = bench(
            "--server",
            first.url,
            "--server",
            second.url,
            "--concurrency",
            4,
            "--num-requests",
            20,
            "--json",
            out,
            "--records",
            rows,
            "--label",
            "two loopback servers",
        )
    assert rc == 0
    run = load_json(out)
    assert run["label"] == "two loopback servers"
    assert [s["url"] for s in run["servers"]] == [first.url, second.url]
    per_server = run["per_server"]
    assert sum(s["completed"] for s in per_server) == 20 and all(s["completed"] >= 5 for s in per_server)
    assert run["chunk_rows"] == {"min": 24, "max": 24}
    lines = [json.loads(line) for line in rows.read_text().splitlines()]
    assert len(lines) == 20 and all(line["ok"] for line in lines)
    assert {line["server"] for line in lines} == {0, 1}
    assert {line["session"] % 2 for line in lines if line["server"] == 1} == {1}
    # Only the openpi server reports its model time.
    assert all((line["infer_ms"] is not None) == (line["server"] == 1) for line in lines)


@pytest.mark.timeout(25)  # not retried until the 30 s ready timeout
def test_server_that_refuses_the_handshake_ends_the_run_at_once(capsys):
    with start_server_thread("hold", flavor="vllm-omni", robot_policy_available=False) as server:
        rc = bench("--server", server.url, "--num-requests", 5, "--ready-timeout", 30)
    assert rc == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "Robot policy not available" in err[0]


class NarrowEvery:
    """A policy whose every ``k``-th reply is a ``(24, 3)`` chunk (DROID takes 8 values per step)."""

    def __init__(self, k: int):
        self.k, self.calls = k, 0

    def infer(self, request, *, session_id, new_session):
        self.calls += 1
        return np.zeros((24, 3 if self.calls % self.k == 0 else 8), dtype=np.float32)


def test_replies_that_break_the_policy_contract_are_errors_as_dz_gym_eval_sees_them(tmp_path, capsys):
    out = tmp_path / "contract.json"
    with start_server_thread(NarrowEvery(3)) as server:
        rc = bench("--server", server.url, "--concurrency", 1, "--num-requests", 9, "--warmup", 0, "--json", out)
    assert rc == 0
    run = load_json(out)
    assert run["errors"] == {"ProtocolError": 3} and run["completed"] == 6 and run["failed"] == 3
    assert "expected last dim 8, got shape (24, 3)" in run["error_examples"]["ProtocolError"]
    assert run["goodput"] <= 6 / 9
    capsys.readouterr()
    with start_server_thread(NarrowEvery(1)) as server:  # nothing but (24, 3): the run cannot go on
        rc = bench("--server", server.url, "--concurrency", 1, "--num-requests", 30, "--warmup", 0)
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 1 and len(err) == 1 and "failed in a row" in err[0] and "(24, 3)" in err[0], err


def test_a_server_announcing_a_contract_the_client_cannot_follow_ends_the_run_at_once(capsys):
    from dz_gym.testing.servers import DZ_METADATA, ServerThread, chunk, replying

    metadata = {**DZ_METADATA, "action_horizon": 16}  # chunks of 16 rows: an open-loop horizon of 24 cannot run
    with ServerThread(replying(lambda request, n: chunk(16), metadata=metadata)) as server:
        rc = bench("--server", server.url, "--open-loop-horizon", 24, "--num-requests", 5, "--warmup", 0)
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 1 and len(err) == 1 and "announces action_horizon=16" in err[0], err


@pytest.mark.parametrize("flavor", ["flux3-bfl", "sglang"])
def test_flux_flavors_get_their_profiles_payloads_and_errors(flavor, tmp_path):
    from dz_gym.protocol.profiles import PROFILES

    out = tmp_path / "flux.json"
    url_path = PROFILES[flavor].url_path
    with start_server_thread("hold", flavor=flavor, fail_every=4) as server:
        rc = bench("--server", server.url + url_path, "--concurrency", 1, "--num-requests", 12, "--warmup", 0,
                   "--json", out)  # fmt: skip
    assert rc == 0
    run = load_json(out)
    assert run["servers"][0]["profile"] == flavor and run["servers"][0]["image_resolution"] == [360, 640]
    assert run["open_loop_horizon"] == 32 and run["payload"]["episode_length"] == 15  # ceil(450 / 32)
    images = 540 * 640 * 3 if flavor == "flux3-bfl" else 3 * 360 * 640 * 3  # a composite, or three views
    assert images < run["payload"]["request_bytes"] < images + 2000
    # every 4th inference raises: the flavor's error frame, then close 1011; the bench reconnects
    assert run["errors"] == {"ServerError": 3} and run["completed"] == 9 and run["reconnects"] == 2


def test_a_flux_chunk_of_another_geometry_is_a_protocol_error(tmp_path):
    from dz_gym.server.policies import HoldPolicy

    out = tmp_path / "geometry.json"
    with start_server_thread(HoldPolicy(horizon=24), flavor="flux3-bfl") as server:
        # 24 rows cover an open-loop horizon of 8: only the geometry is off
        args = ["--concurrency", 1, "--num-requests", 4, "--warmup", 0, "--open-loop-horizon", 8]
        rc = bench("--server", server.url, *args, "--json", out)
    assert rc == 0
    run = load_json(out)
    assert run["errors"] == {"ProtocolError": 4} and "expected horizon 32" in run["error_examples"]["ProtocolError"]


@pytest.mark.timeout(30)  # the check comes before the benchmark: no server is ever waited for
@pytest.mark.parametrize("flag", ["--json", "--records", "--plot"])
@pytest.mark.parametrize("where", ["missing/out", "file/out", "folder"])
def test_an_output_path_that_cannot_be_written_is_refused_before_the_benchmark(tmp_path, capsys, flag, where):
    (tmp_path / "file").write_text("a file, not a folder")
    (tmp_path / "folder").mkdir()
    sweep = ["--sweep", "1,2"] if flag == "--plot" else []
    with pytest.raises(SystemExit) as exc:  # the server does not exist: the check must come first
        bench("--server", f"ws://127.0.0.1:{free_port()}", "--ready-timeout", 20, *sweep, flag, tmp_path / where)
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"dz-gym-bench: error: {flag}"), err
