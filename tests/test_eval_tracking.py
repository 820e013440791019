"""Experiment logging (--log): a real run's episodes, summary and decision written to TensorBoard event files
and to a W&B offline run, then read back from those files (no network)."""

from __future__ import annotations

import importlib.util
import json
import struct
import time

import pytest

from dz_gym import extras
from dz_gym.eval import tracking
from dz_gym.eval.config import EvalConfig
from dz_gym.eval.control import RunControl
from dz_gym.eval.evaluate import evaluate
from dz_gym.eval.rundir import RunDir
from dz_gym.server.launch import start_server_thread
from dz_gym.testing.toy_env import STAGED_LENGTH, StagedToyEnv

PATH = "/v1/realtime/robot/openpi"
EPISODES = 8  # one episode of each staged script: every failure mode but server_error


def _logged_run(tmp_path, choices):
    config = EvalConfig(scenes=[1], episodes=EPISODES, num_envs=4, max_steps=STAGED_LENGTH, video=False,
                        report=False, log=list(choices))  # fmt: skip
    run_dir = RunDir.create(tmp_path, config)
    control = RunControl()
    log = tracking.open_logs(config.outputs.log, run_dir.path, config.to_flat_dict(), "dz-gym-test")
    log.attach(control)
    with start_server_thread("hold") as server:
        summary = evaluate(config, run_dir, [server.url + PATH], control=control, progress=False,
                           env_factory=lambda scene, cfg: StagedToyEnv(cfg.plan.num_envs, scene))  # fmt: skip
    log.finish(run_dir.path, run_dir.read_rows(), summary)
    return run_dir, summary


def test_tensorboard_event_files_hold_episodes_summary_and_decision(tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run_dir, summary = _logged_run(tmp_path, ["tensorboard"])
    events = EventAccumulator(str(run_dir.path / tracking.TB_DIR), size_guidance={"scalars": 0, "tensors": 0})
    events.Reload()
    tags = events.Tags()
    steps = [e.step for e in events.Scalars("episode/steps")]
    assert sorted(steps) == list(range(1, EPISODES + 1))
    ok = sum(e.value for e in events.Scalars("episode/success_at_end"))
    assert ok == summary["overall"]["success_at_end"]["k"] == 1
    assert events.Scalars("failure_modes/misplaced")[-1].value == 2  # running counts per mode
    final = {t: events.Scalars(t)[-1].value for t in tags["scalars"] if t.startswith("summary/")}
    assert final["summary/overall/success_at_end"] == pytest.approx(summary["overall"]["success_at_end"]["rate"])
    assert final["summary/overall/failure_modes/dropped"] == 1
    assert final["summary/env_steps_per_s"] == pytest.approx(summary["env_steps_per_s"])
    assert "summary/latency_ms/p50" in final
    decision = events.Tensors("decision")[-1].tensor_proto.string_val[0].decode()
    assert decision == "run complete"


def _wandb_records(path):
    """The records of a W&B offline run file (its LevelDB-style log: 32 KiB blocks of checksummed chunks)."""
    from wandb.proto import wandb_internal_pb2

    data = path.read_bytes()
    assert data[:4] == b":W&B"
    block, pos, chunks, partial = 32768, 7, [], b""
    while pos + 7 <= len(data):
        left = block - pos % block
        _, length, kind = struct.unpack("<IHB", data[pos : pos + 7]) if left >= 7 else (0, 0, 0)
        if left < 7 or (kind == 0 and length == 0):
            pos += left
            continue
        chunk, pos = data[pos + 7 : pos + 7 + length], pos + 7 + length
        partial = chunk if kind in (1, 2) else partial + chunk
        if kind in (1, 4):
            chunks.append(partial)
    records = []
    for chunk in chunks:
        record = wandb_internal_pb2.Record()
        record.ParseFromString(chunk)
        records.append(record)
    return records


def _name(item) -> str:
    return item.key or "/".join(item.nested_key)


def test_wandb_offline_run_holds_episodes_summary_and_table(tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    run_dir, summary = _logged_run(tmp_path, ["wandb"])
    files = list((run_dir.path / "wandb").glob("offline-run-*/run-*.wandb"))
    assert len(files) == 1
    records = _wandb_records(files[0])
    deadline = time.monotonic() + 120  # the W&B service may still be writing the file when finish() returns
    while not any(r.WhichOneof("record_type") == "exit" for r in records) and time.monotonic() < deadline:
        time.sleep(0.2)
        records = _wandb_records(files[0])
    history, final = [], {}
    for record in records:
        kind = record.WhichOneof("record_type")
        if kind == "history":
            history.append({_name(item): json.loads(item.value_json) for item in record.history.item})
        elif kind == "summary":
            final.update({_name(item): json.loads(item.value_json) for item in record.summary.update})
    episodes = [h for h in history if "episode/steps" in h]
    assert len(episodes) == EPISODES
    assert sorted(h["episode/failure_mode"] for h in episodes) == sorted(
        ["success", "undone", "never_reached", "grasp_failed", "dropped", "timeout_near", "misplaced", "misplaced"]
    )
    assert final["summary/overall/success_at_end"] == pytest.approx(summary["overall"]["success_at_end"]["rate"])
    assert final["decision"] == "run complete"
    table = next(h for h in history if "episodes/_type" in h)  # the rows' table, logged after the last episode
    assert table["episodes/_type"] == "table-file" and table["episodes/nrows"] == EPISODES
    assert "episode/steps" not in table and table["decision"] == "run complete"


def test_a_missing_tracker_is_named_in_one_line():
    for choice in ("tensorboard", "wandb"):
        installed = importlib.util.find_spec(choice) is not None
        assert tracking.missing([choice]) == (None if installed else f"--log {choice}: {extras.missing([choice])}")
    assert tracking.missing(["mlflow"]) == "--log: expected one of wandb, tensorboard, got 'mlflow'"
    with pytest.raises(ValueError, match="^log: expected a list of wandb, tensorboard, got 'x'$"):
        EvalConfig(scenes=[1], log=["x"])


def _environ(tmp_path, **values):
    """An environment with no W&B settings and a home of its own (no netrc), plus ``values``."""
    home = tmp_path / "home"
    home.mkdir(exist_ok=True)
    return {"HOME": str(home), "PATH": "/usr/bin:/bin", **values}


def test_wandb_credentials_are_checked_where_wandb_reads_them(tmp_path):
    pytest.importorskip("wandb")
    env = _environ(tmp_path)
    problem = tracking.log_problem(["wandb"], env)
    assert problem.startswith("--log wandb: no W&B credentials for api.wandb.ai: set WANDB_API_KEY"), problem
    assert tracking.log_problem(["tensorboard", "wandb"], env) == (tracking.missing(["tensorboard"]) or problem)
    assert tracking.log_problem(["wandb"], {**env, "WANDB_API_KEY": "k" * 40}) is None
    assert tracking.log_problem(["wandb"], {**env, "WANDB_MODE": "offline"}) is None
    assert tracking.log_problem(["wandb"], {**env, "WANDB_MODE": "disabled"}) is None
    assert tracking.log_problem(["wandb"], {**env, "WANDB_MODE": "online"}) == problem
    netrc_file = tmp_path / "home" / ".netrc"
    netrc_file.write_text("machine api.wandb.ai\n  login user\n  password " + "k" * 40 + "\n")
    netrc_file.chmod(0o600)
    assert tracking.log_problem(["wandb"], env) is None  # what `wandb login` writes
    other = {**env, "WANDB_BASE_URL": "https://wandb.example.org"}
    assert "no W&B credentials for wandb.example.org" in tracking.log_problem(["wandb"], other)
    moved = tmp_path / "elsewhere.netrc"
    netrc_file.rename(moved)
    assert tracking.log_problem(["wandb"], env) == problem
    assert tracking.log_problem(["wandb"], {**env, "NETRC": str(moved)}) is None
    assert tracking.log_problem(["tensorboard"], env) == tracking.missing(["tensorboard"])  # no key needed


def test_wandb_dir_that_cannot_be_written_is_one_line(tmp_path):
    pytest.importorskip("wandb")
    (tmp_path / "file").write_text("a file, not a folder")
    env = _environ(tmp_path, WANDB_MODE="offline", WANDB_DIR=str(tmp_path / "file" / "wandb"))
    problem = tracking.log_problem(["wandb"], env)
    assert problem.startswith("--log wandb: WANDB_DIR: cannot create") and "is not a directory" in problem


def test_dz_gym_eval_log_wandb_without_credentials_is_one_line_before_anything_starts(tmp_path):
    """The real command: exit status 1, one error line, no run directory, no server started (its line absent)."""
    pytest.importorskip("wandb")
    import os
    import subprocess
    import sys

    root = tmp_path / "runs"
    env = {**_environ(tmp_path), "PYTHONPATH": os.environ.get("PYTHONPATH", ""), "MUJOCO_GL": "egl"}
    argv = ["--log", "wandb", "--backend", "mujoco", "--episodes", "1", "--num-envs", "1", "--no-video",
            "--output-root", str(root)]  # fmt: skip
    proc = subprocess.run([sys.executable, "-m", "dz_gym.eval.cli", *argv], env=env, capture_output=True, text=True,
                          timeout=120, check=False)  # fmt: skip
    assert proc.returncode == 1, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("dz-gym-eval: error: --log wandb: no W&B credentials"), lines
    assert not root.exists() and "embedded" not in proc.stdout + proc.stderr


def test_wandb_dir_is_where_wandb_writes(tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path / "wandb_dir"))
    (tmp_path / "wandb_dir").mkdir()
    run_dir, _ = _logged_run(tmp_path / "runs", ["wandb"])
    assert list((tmp_path / "wandb_dir" / "wandb").glob("offline-run-*/run-*.wandb"))
    assert not (run_dir.path / "wandb").exists()


@pytest.mark.slow  # W&B's own retries until its init timeout (5 s here)
def test_a_tracker_that_cannot_start_is_one_warning_and_the_run_goes_on(tmp_path, monkeypatch, caplog):
    """Credentials present, W&B's server unreachable (a closed loopback port): one warning line, no sink."""
    wandb = pytest.importorskip("wandb")
    wandb.teardown()  # W&B keeps its settings per process: an earlier test's offline mode would stay on
    for key in ("WANDB_MODE", "WANDB_DIR", "WANDB_IDENTITY_TOKEN_FILE"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("WANDB_API_KEY", "k" * 40)
    monkeypatch.setenv("WANDB_BASE_URL", f"http://127.0.0.1:{_closed_port()}")
    monkeypatch.setenv("WANDB_INIT_TIMEOUT", "5")
    monkeypatch.setenv("WANDB_SILENT", "true")
    log = tracking.open_logs(["wandb"], tmp_path, {}, "dz-gym-test")
    assert log.sinks == []
    (warning,) = [r.getMessage() for r in caplog.records if "--log wandb" in r.getMessage()]
    assert warning.startswith("--log wandb: cannot start (") and warning.endswith("); the run goes on without it")
    assert "\n" not in warning
    wandb.teardown()


def _closed_port() -> int:
    """A loopback port with nothing listening (bound, then closed)."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]
