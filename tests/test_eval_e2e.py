"""End-to-end runs of dz-gym-eval on the embedded MuJoCo simulator against the reference server (real loopback
websockets): complete and consistent outputs, rows independent of num_envs, faults, Ctrl-C/SIGTERM at any
moment and resume.

Signals are sent at known points without sleeps: a server in this process holds its replies (a gate) from a
chosen request on, and the tests read the evaluator's stderr line by line for what it says it is doing.
Every run is short (2 envs, a few episodes of 16 steps).
"""

from __future__ import annotations

import json
import signal
import threading
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("mujoco")

from eval_process import BOUND_S, Evaluator  # noqa: E402

from dz_gym.eval import cli, results  # noqa: E402
from dz_gym.eval.config import EvalConfig  # noqa: E402
from dz_gym.eval.control import RunControl  # noqa: E402
from dz_gym.eval.evaluate import evaluate  # noqa: E402
from dz_gym.eval.row import PLACEMENT, comparable  # noqa: E402
from dz_gym.eval.rundir import RunDir  # noqa: E402
from dz_gym.server.launch import start_server_process, start_server_thread  # noqa: E402
from dz_gym.server.policies import load_policy  # noqa: E402
from dz_gym.testing.gated import GatedPolicy  # noqa: E402

BASE = ["--num-envs", "2", "--episodes", "4", "--max-steps", "16", "--no-progress"]


def stable(rows, *ignore):
    """What two runs of the same plan share (the runs compared here differ in slots, servers and videos)."""
    return comparable(rows, ignore=PLACEMENT | {"video", *ignore})


def run_dir_of(root: Path) -> RunDir:
    (path,) = [p for p in root.iterdir() if p.is_dir()]
    return RunDir(path)


@pytest.fixture(scope="module")
def reference_run(tmp_path_factory):
    """One uninterrupted run with videos: 2 envs, 4 episodes of 16 steps, embedded server."""
    root = tmp_path_factory.mktemp("reference")
    assert cli.main([*BASE, "--output-root", str(root)]) == 0
    return run_dir_of(root)


def test_outputs_complete_and_consistent(reference_run):
    import imageio.v2 as imageio

    run = reference_run
    rows = run.read_rows()
    summary = json.loads((run.path / "summary.json").read_text())
    assert len(rows) == 4 and sorted(r["episode"] for r in rows) == [0, 1, 2, 3]
    assert [r["seed"] for r in sorted(rows, key=lambda r: r["episode"])] == [0, 1, 2, 3]
    assert all(r["env_seed"] == r["seed"] and r["env"] == r["episode"] % 2 for r in rows)
    assert len({r["session_id"] for r in rows}) == 4
    assert all(r["error"] is None and r["steps"] == 16 and r["server_calls"] == 2 for r in rows)
    # summary.json is recomputable from the rows.
    again = results.summarize(rows, planned={1: 4})
    for key in ("1", "overall"):
        for field in (
            "episodes",
            "errored",
            "success_at_end",
            "success_any_step",
            "server_calls",
            "env_steps",
            "latency_ms",
        ):
            assert summary[key][field] == again[key][field], (key, field)
    assert summary["complete"] and not summary["interrupted"] and summary["aborted"] is None
    assert summary["server"]["embedded"] and summary["server_metadata"]
    assert summary["env_steps_per_s"] > 0 and 0 <= summary["server_utilization"] <= 1
    assert summary["command"].startswith("dz-gym-eval ")
    config = json.loads((run.path / "config.json").read_text())
    assert config["plan"]["episodes"] == 4 and config["plan"]["max_steps"] == 16
    for row in rows:
        data = np.load(run.path / row["trajectory"])
        assert data["actions"].shape == (16, 8) and data["joint_pos"].shape == (16, 7)
        assert data["policy_called"].sum() == row["server_calls"]
        reader = imageio.get_reader(run.path / row["video"])
        frames = sum(1 for _ in reader)
        reader.close()
        assert frames == row["steps"]


def test_rows_do_not_depend_on_num_envs(reference_run, tmp_path):
    assert cli.main([*BASE, "--num-envs", "1", "--no-video", "--output-root", str(tmp_path)]) == 0
    assert stable(run_dir_of(tmp_path).read_rows()) == stable(reference_run.read_rows())


@pytest.mark.slow  # 8-17 s; runs in the first environment's pass
def test_simulated_delay_is_recorded_and_independent_of_num_envs(tmp_path):
    flags = ["--prefetch", "4", "--simulated-delay", "3", "--no-video"]
    runs = []
    for n in ("1", "2"):
        root = tmp_path / n
        assert cli.main([*BASE, *flags, "--num-envs", n, "--output-root", str(root)]) == 0
        runs.append(run_dir_of(root).read_rows())
    assert stable(runs[0]) == stable(runs[1])
    for row in runs[0]:
        assert row["chunk_delays"] == [3] * len(row["chunk_delays"]) and len(row["chunk_delays"]) >= 2
        assert row["wait_steps"] == 3  # the first chunk of an episode also takes 3 steps: the arm holds
    config = json.loads((run_dir_of(tmp_path / "1").path / "config.json").read_text())
    assert config["schedule"]["prefetch"] == 4 and config["schedule"]["simulated_delay"] == 3


@pytest.mark.slow  # about 10 s
def test_latency_honest_delays_are_measured_recorded_and_replayed_on_resume(tmp_path, capsys):
    from dz_gym.chunks import honest_delay

    flags = ["--latency-honest", "--serve-arg=--latency-ms=100", "--no-video", "--episodes", "2"]
    assert cli.main([*BASE, *flags, "--output-root", str(tmp_path)]) == 0
    run = run_dir_of(tmp_path)
    for row in run.read_rows():
        delays, latencies = row["request_delays"], row["latencies_ms"]
        assert row["chunk_delays"] == delays[: len(row["chunk_delays"])]  # each applied at its delay
        assert len(delays) == len(latencies) >= 2 and min(delays) >= 2  # 100 ms at 15 Hz: at least 2 steps
        for delay, ms in zip(delays, latencies):  # each chunk's own round trip (ms rounded to 0.001)
            assert delay in (honest_delay(ms / 1e3, 1 / 15), honest_delay(ms / 1e3 + 1e-6, 1 / 15))
        assert 2 <= row["wait_steps"] <= sum(delays)  # the arm held its pose while each request was out
    config = json.loads((run.path / "config.json").read_text())
    assert config["schedule"]["latency_honest"] is True and config["schedule"]["control_hz"] == 15.0

    with pytest.raises(SystemExit) as refused:  # the mode is locked on resume
        cli.main(["--resume", str(run.path), "--no-progress", "--control-hz", "10"])
    assert refused.value.code == 2 and "control_hz: the run used 15.0" in capsys.readouterr().err
    # episode 2 ran before and errored: its attempt's delays are on record, and the rerun draws no new ones
    run.append_attempt({"scene": 1, "episode": 2, "arm": None, "seed": 2, "attempt": 1, "steps": 9,
                        "error_event": "timeout", "error": "no reply", "request_delays": [6, 9]})  # fmt: skip
    assert cli.main(["--resume", str(run.path), "--no-progress", "--episodes", "3"]) == 0
    (row,) = [r for r in run.read_rows() if r["episode"] == 2]
    assert row["request_delays"][:2] == [6, 9] and row["chunk_delays"][0] == 6 and row["attempts"] == 2
    assert all(d >= 2 for d in row["request_delays"][2:])  # later requests are measured again


def assert_clean_stop(code, err, run):
    """Exit 130, no traceback from this process or its workers, the summary written."""
    assert code == 130, err
    for bad in ("Traceback", "Fatal Python error", "KeyboardInterrupt", "WorkerError", "__main__"):
        assert bad not in err, err
    summary = json.loads((run.path / "summary.json").read_text())
    assert summary["interrupted"] is True and summary["complete"] is False and summary["aborted"] is None
    assert summary["env_steps_per_s"] is None or summary["env_steps_per_s"] == pytest.approx(
        summary["env_steps_taken"] / summary["wall_s"]
    )
    return summary


@pytest.fixture
def gated_reference():
    policy = GatedPolicy(load_policy("reference" if cli.default_policy("mujoco") == "reference" else "hold"), free=4)
    with start_server_thread(policy) as server:
        try:
            yield policy, server.url + cli.DEFAULT_PATH
        finally:
            policy.open()


@pytest.fixture
def gated_hold():
    policy = GatedPolicy(load_policy("hold"), free=4)
    with start_server_thread(policy) as server:
        try:
            yield policy, server.url + cli.DEFAULT_PATH
        finally:
            policy.open()


@pytest.mark.slow  # about 9 s on 2 cores; runs in the first environment's pass
def test_sigint_then_resume_equals_an_uninterrupted_run(reference_run, gated_reference, tmp_path):
    policy, url = gated_reference
    run = Evaluator([*BASE, "--no-video", "--server", url, "--output-root", str(tmp_path)])
    assert policy.held.wait(BOUND_S), "the first episodes did not finish"
    run.signal_group(signal.SIGINT)
    line = run.wait_for_line("stopping after this step")
    assert "Ctrl-C again to stop now" in line
    policy.open()  # the step in flight completes, then the run stops at its boundary
    code, out, err = run.finish()
    run_dir = run_dir_of(tmp_path)
    assert_clean_stop(code, err, run_dir)
    assert sorted(r["episode"] for r in run_dir.read_rows()) == [0, 1]
    assert "INTERRUPTED" in out

    assert cli.main(["--resume", str(run_dir.path), "--no-progress"]) == 0
    rows = run_dir.read_rows()
    assert len(rows) == 4 and len({r["episode"] for r in rows}) == 4
    if cli.default_policy("mujoco") == "reference":
        reference = reference_run.read_rows()  # the same policy, here served by a server this run did not start
        assert {r["policy"] for r in rows} == {"external"} and {r["policy"] for r in reference} == {"reference"}
        assert stable(rows, "policy") == stable(reference, "policy")
    summary = json.loads((run_dir.path / "summary.json").read_text())
    assert summary["complete"] and not summary["interrupted"] and len(summary["segments"]) == 2


def test_double_sigint_mid_run_keeps_results_and_removes_partial_videos(gated_hold, tmp_path):
    """A second Ctrl-C right after the first (the run is blocked on a reply): stop now, still write the summary,
    keep the finished episodes' videos and delete the partial ones."""
    policy, url = gated_hold
    run = Evaluator([*BASE, "--server", url, "--output-root", str(tmp_path)])
    assert policy.held.wait(BOUND_S), "the first episodes did not finish"
    run.signal_group(signal.SIGINT)
    run.wait_for_line("stopping after this step")
    run.signal_group(signal.SIGINT)
    code, out, err = run.finish()
    run_dir = run_dir_of(tmp_path)
    assert_clean_stop(code, err, run_dir)
    rows = run_dir.read_rows()
    assert sorted(r["episode"] for r in rows) == [0, 1]
    assert sorted(p.name for p in (run_dir.path / "videos").iterdir()) == ["scene1_ep0000.mp4", "scene1_ep0001.mp4"]
    assert "INTERRUPTED" in out


def test_sigint_while_simulator_workers_start(gated_hold, tmp_path):
    """Ctrl-C to the whole process group while the MuJoCo worker processes are being spawned."""
    policy, url = gated_hold
    policy.allow(0)  # no reply until the test says so: the run cannot finish before the signal
    run = Evaluator([*BASE, "--no-video", "--server", url, "--output-root", str(tmp_path)])
    run.wait_for_line("scene 1: 4 episode(s)")  # printed right before the env (and its workers) is created
    run.signal_group(signal.SIGINT)
    run.wait_for_line("stopping after this step")
    policy.open()
    code, _, err = run.finish()
    assert_clean_stop(code, err, run_dir_of(tmp_path))


def test_sigterm_is_worded_as_such(gated_hold, tmp_path):
    policy, url = gated_hold
    run = Evaluator([*BASE, "--no-video", "--server", url, "--output-root", str(tmp_path)])
    assert policy.held.wait(BOUND_S)
    run.proc.send_signal(signal.SIGTERM)  # like kill PID: this process only
    line = run.wait_for_line("stopping after this step")
    assert "SIGTERM" in line and "Ctrl-C" not in line
    policy.open()
    code, _, err = run.finish()
    assert_clean_stop(code, err, run_dir_of(tmp_path))


def test_an_ignored_sigint_stays_ignored_and_sigterm_still_stops(gated_hold, tmp_path):
    """Started with SIGINT ignored (a background job of a script), Ctrl-C to the process group changes
    nothing (an ignored signal is discarded when sent, so the order is certain); SIGTERM then stops the run
    as a first signal does."""
    policy, url = gated_hold
    run = Evaluator([*BASE, "--no-video", "--server", url, "--output-root", str(tmp_path)], sigint="ignore")
    assert policy.held.wait(BOUND_S)
    run.signal_group(signal.SIGINT)
    run.signal_group(signal.SIGINT)
    run.proc.send_signal(signal.SIGTERM)
    line = run.wait_for_line("stopping after this step")
    assert "SIGTERM" in line and "send SIGTERM again to stop now" in line
    policy.open()
    code, _, err = run.finish()
    assert_clean_stop(code, err, run_dir_of(tmp_path))
    assert "Ctrl-C" not in err


def test_server_failures_are_recorded_per_episode(tmp_path, capsys):
    # --episode-retries 0: every errored attempt stays errored (with retries the same run has no errored row)
    argv = [*BASE, "--no-video", "--max-errors", "10", "--serve-arg=--fail-every=3", "--episode-retries", "0"]
    capacity = ["--server-max-sessions", "1", "--server-idle-timeout", "0.001"]
    assert cli.main([*argv, *capacity, "--output-root", str(tmp_path)]) == 0
    captured = capsys.readouterr()
    assert "2 envs share the server" in captured.err and "--server-max-sessions=1" in captured.err
    assert captured.err.count("--server-idle-timeout=0.001") == 1  # warned once, from the first replies
    assert "completed," in captured.out and " errored" in captured.out
    assert all(line == line.rstrip() for line in captured.out.splitlines())
    rows = run_dir_of(tmp_path).read_rows()
    assert sorted(r["episode"] for r in rows) == [0, 1, 2, 3]
    errored = [r for r in rows if r["error"] is not None]
    assert errored, "every third inference fails, so some episodes must error"
    for row in errored:
        assert row["error_event"] == "server_error" and row["success_at_end"] is None
        assert (row["error_step"] - 1) % 8 == 0  # failures happen at the steps that call the server
    summary = json.loads((run_dir_of(tmp_path).path / "summary.json").read_text())
    assert summary["overall"]["errored"] == len(errored)
    assert summary["overall"]["success_at_end"]["n"] == 4 - len(errored)


def test_open_loop_horizon_longer_than_the_chunk(capsys, tmp_path):
    """The hold server sends 24-row chunks: a horizon of 30 is a usage error once the first chunk arrives,
    and the run directory (no episode ran) is removed, so no config.json records 30."""
    root = tmp_path / "runs"
    with start_server_thread("hold") as server:
        argv = [*BASE, "--no-video", "--open-loop-horizon", "30", "--server", server.url + cli.DEFAULT_PATH]
        assert cli.main([*argv, "--output-root", str(root)]) == 2
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if "error:" in line.lower()]
    assert len(errors) == 1 and errors[0].startswith("dz-gym-eval: error: --open-loop-horizon: 30"), err
    assert "24" in errors[0] and "Traceback" not in err
    assert not any(root.iterdir())


@pytest.mark.slow  # about 15 s on 2 cores; runs in the first environment's pass
def test_killed_and_restarted_server(tmp_path, monkeypatch):
    """The server is killed (SIGKILL) after the first finished episode and comes back on the same port once
    the client has found it gone: the first connection attempt refused after the kill starts the new server
    (the attempt still fails, so the retry path runs), whatever the machine's speed."""
    import asyncio

    import dz_gym.transport.session as transport_session

    server = start_server_process(["--policy", "hold", "--quiet"])
    url = server.url + cli.DEFAULT_PATH
    port = server.port
    restarted: list = []
    killed = threading.Event()
    restart_lock = threading.Lock()
    refused_after_kill: list[int] = []

    def restart_once():
        with restart_lock:
            if not restarted:
                restarted.append(start_server_process(["--policy", "hold", "--quiet", "--port", str(port)]))

    real_connect = transport_session.ws_connect

    async def connect_or_restart(*args, **kwargs):
        try:
            return await real_connect(*args, **kwargs)
        except OSError:
            if killed.is_set():
                refused_after_kill.append(1)
                await asyncio.to_thread(restart_once)  # back before the retry, however slow the start
            raise

    monkeypatch.setattr(transport_session, "ws_connect", connect_or_restart)

    def on_row(row):
        if control.rows_written == 1:
            server.proc.kill()
            server.stop()
            killed.set()

    control = RunControl(error_budget=10)
    control.on_row = on_row
    config = EvalConfig(scenes=[1], episodes=6, num_envs=2, max_steps=16, video=False, servers=[url])
    run = RunDir.create(tmp_path, config)
    try:
        summary = evaluate(config, run, control=control, progress=False)
    finally:
        server.stop()
        for handle in restarted:
            handle.stop()
    rows = sorted(run.read_rows(), key=lambda r: r["episode"])
    assert [r["episode"] for r in rows] == list(range(6))  # no lost rows
    assert refused_after_kill and len(restarted) == 1  # the client did find the server gone
    errored = [r for r in rows if r["error"] is not None]
    # Episodes running when the server died either errored, or their unprocessed requests were sent again
    # once it was back (counted in reconnects).
    assert errored or sum(r.get("reconnects", 0) for r in rows) > 0
    assert all(r["error_event"] == "connection_lost" for r in errored)  # one name for one cause
    assert rows[-1]["error"] is None, "episodes after the restart run normally"
    assert summary["overall"]["errored"] == len(errored)


@pytest.mark.slow  # about 6 s on 2 cores; runs in the first environment's pass
def test_process_per_scene(tmp_path):
    """Scenes in fresh processes (the Isaac Lab default), all at once, append to one run directory and one
    summary."""
    argv = [
        "--scene",
        "1",
        "--scene",
        "3",
        "--process-per-scene",
        "--num-envs",
        "1",
        "--episodes",
        "1",
        "--max-steps",
        "8",
        "--no-video",
        "--no-progress",
        "--output-root",
        str(tmp_path),
    ]
    assert cli.main(argv) == 0
    run = run_dir_of(tmp_path)
    rows = run.read_rows()
    assert sorted((r["scene"], r["episode"]) for r in rows) == [(1, 0), (3, 0)]
    summary = json.loads((run.path / "summary.json").read_text())
    assert summary["complete"] and summary["1"]["episodes"] == 1 and summary["3"]["episodes"] == 1
    assert summary["command"].startswith("dz-gym-eval --scene 1 --scene 3")
    assert len(summary["segments"]) == 1  # the two scene processes stepped at once: their timing is one segment
    assert summary["segments"][0]["env_steps"] >= 2 * 8


@pytest.mark.slow
def test_reference_policy_successes_are_counted(tmp_path):
    """Long enough episodes for the vision reference policy to place the cube: successes show up."""
    if cli.default_policy() != "reference":
        pytest.skip("the reference policy is not registered")
    argv = [
        "--num-envs",
        "2",
        "--episodes",
        "2",
        "--max-steps",
        "160",
        "--no-video",
        "--no-progress",
        "--output-root",
        str(tmp_path),
    ]
    assert cli.main(argv) == 0
    rows = run_dir_of(tmp_path).read_rows()
    assert any(r["success_any_step"] for r in rows)
    for row in rows:
        assert row["success_any_step"] == (row["first_success_step"] is not None)
        if row["success_at_end"]:
            assert row["success_any_step"]
