"""End-to-end runs of dz-gym-eval on the embedded MuJoCo simulator against the reference server (real loopback
websockets): complete and consistent outputs, rows independent of num_envs, faults, Ctrl-C and resume.

Every run is short (2 envs, a few episodes of 16-24 steps), so the module stays within about a minute.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("mujoco")

from dz_gym.eval import cli, results  # noqa: E402
from dz_gym.eval.config import EvalConfig  # noqa: E402
from dz_gym.eval.evaluate import evaluate  # noqa: E402
from dz_gym.eval.rundir import RunDir  # noqa: E402
from dz_gym.eval.runner import RunControl  # noqa: E402
from dz_gym.server.launch import start_server_process  # noqa: E402

VOLATILE = {"env", "session_id", "server", "started_at", "wall_s", "latency_ms", "latencies_ms", "video"}
BASE = ["--num-envs", "2", "--episodes", "4", "--max-steps", "16", "--no-progress"]


def stable(rows):
    return sorted(({k: v for k, v in r.items() if k not in VOLATILE} for r in rows), key=lambda r: (r["scene"], r["episode"]))


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
        for field in ("episodes", "errored", "success_at_end", "success_any_step", "server_calls", "env_steps", "latency_ms"):
            assert summary[key][field] == again[key][field], (key, field)
    assert summary["complete"] and not summary["interrupted"] and summary["aborted"] is None
    assert summary["server"]["embedded"] and summary["server_metadata"]
    assert summary["env_steps_per_s"] > 0 and 0 <= summary["server_utilization"] <= 1
    assert summary["command"].startswith("dz-gym-eval ")
    config = json.loads((run.path / "config.json").read_text())
    assert config["episodes"] == 4 and config["max_steps"] == 16
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
    assert config["prefetch"] == 4 and config["simulated_delay"] == 3


def test_sigint_then_resume_equals_an_uninterrupted_run(reference_run, tmp_path):
    env = dict(os.environ, MUJOCO_GL=os.environ.get("MUJOCO_GL", "egl"))
    proc = subprocess.Popen(
        [sys.executable, "-m", "dz_gym.eval.cli", *BASE, "--no-video", "--output-root", str(tmp_path)],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 120
        rows_file = None
        while time.monotonic() < deadline and proc.poll() is None:
            found = list(tmp_path.glob("*/episodes.jsonl"))
            if found and found[0].read_text().count("\n") >= 1:
                rows_file = found[0]
                break
            time.sleep(0.05)
        assert rows_file is not None, "no episode finished in time"
        os.killpg(proc.pid, signal.SIGINT)  # like Ctrl-C in a terminal: the whole process group gets it
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, err
    run = run_dir_of(tmp_path)
    summary = json.loads((run.path / "summary.json").read_text())
    assert summary["interrupted"] is True and summary["complete"] is False
    done = run.read_rows()
    assert 1 <= len(done) < 4
    assert "INTERRUPTED" in out

    assert cli.main(["--resume", str(run.path), "--no-progress"]) == 0
    rows = run.read_rows()
    assert len(rows) == 4 and len({r["episode"] for r in rows}) == 4
    assert stable(rows) == stable(reference_run.read_rows())
    summary = json.loads((run.path / "summary.json").read_text())
    assert summary["complete"] and not summary["interrupted"] and len(summary["segments"]) == 2


def test_server_failures_are_recorded_per_episode(tmp_path):
    argv = [*BASE, "--no-video", "--max-errors", "10", "--serve-arg=--fail-every=3"]
    assert cli.main([*argv, "--output-root", str(tmp_path)]) == 0
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


def test_killed_and_restarted_server(tmp_path):
    """The server dies after the first finished episode and comes back on the same port ~1 s later."""
    server = start_server_process(["--policy", "hold", "--quiet"])
    url = server.url + cli.DEFAULT_PATH
    port = server.port
    restarted: list = []

    def restart_later():
        time.sleep(1.0)
        restarted.append(start_server_process(["--policy", "hold", "--quiet", "--port", str(port)]))

    def on_row(row):
        if control.rows_written == 1:
            server.proc.kill()
            server.stop()
            threading.Thread(target=restart_later, daemon=True).start()

    control = RunControl(error_budget=10)
    control.on_row = on_row
    config = EvalConfig(scenes=[1], episodes=6, num_envs=2, max_steps=16, video=False)
    run = RunDir.create(tmp_path, config)
    try:
        summary = evaluate(config, run, [url], control=control, progress=False)
    finally:
        server.stop()
        for handle in restarted:
            handle.stop()
    rows = sorted(run.read_rows(), key=lambda r: r["episode"])
    assert [r["episode"] for r in rows] == list(range(6))  # no lost rows
    errored = [r for r in rows if r["error"] is not None]
    assert errored, "episodes running when the server died must be recorded as errored"
    assert all(r["error_event"] in ("connection_lost", "reconnect_failed") for r in errored)
    assert rows[-1]["error"] is None, "episodes after the restart run normally"
    assert summary["overall"]["errored"] == len(errored)


def test_process_per_scene(tmp_path):
    """Scenes in fresh processes (the Isaac Lab default) append to one run directory and one summary."""
    argv = ["--scene", "1", "--scene", "3", "--process-per-scene", "--num-envs", "1", "--episodes", "1",
            "--max-steps", "8", "--no-video", "--no-progress", "--output-root", str(tmp_path)]
    assert cli.main(argv) == 0
    run = run_dir_of(tmp_path)
    rows = run.read_rows()
    assert sorted((r["scene"], r["episode"]) for r in rows) == [(1, 0), (3, 0)]
    summary = json.loads((run.path / "summary.json").read_text())
    assert summary["complete"] and summary["1"]["episodes"] == 1 and summary["3"]["episodes"] == 1
    assert summary["command"].startswith("dz-gym-eval --scene 1 --scene 3")
    assert len(summary["segments"]) == 2


@pytest.mark.slow
def test_reference_policy_successes_are_counted(tmp_path):
    """Long enough episodes for the vision reference policy to place the cube: successes show up."""
    if cli.default_policy() != "reference":
        pytest.skip("the reference policy is not registered")
    argv = ["--num-envs", "2", "--episodes", "2", "--max-steps", "160", "--no-video", "--no-progress",
            "--output-root", str(tmp_path)]
    assert cli.main(argv) == 0
    rows = run_dir_of(tmp_path).read_rows()
    assert any(r["success_any_step"] for r in rows)
    for row in rows:
        assert row["success_any_step"] == (row["first_success_step"] is not None)
        if row["success_at_end"]:
            assert row["success_any_step"]
