"""The run directory as a ledger of its plan: one writer at a time (the lock), every row read back checked
against the plan, a finished run resumed starts nothing, outputs checked before anything starts, and a video
that cannot be read is never linked from its row.

The command-line tests point the run at a server on a port nothing listens on: reaching the server check at
all would end them with another error, so each one also shows that nothing was started.
"""

from __future__ import annotations

import errno
import json
import os
import select
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from dz_gym.eval import cli
from dz_gym.eval.config import EvalConfig
from dz_gym.eval.plan import plan_of
from dz_gym.eval.row import EpisodeRow
from dz_gym.eval.rundir import RunDir
from dz_gym.eval.runlock import LOCK_FILE, RunLock, RunLocked
from dz_gym.eval.segment import RunSegment, run_segment

NOWHERE = "ws://127.0.0.1:9/v1/realtime/robot/openpi"  # the discard port: nothing answers there


def config(**kw) -> EvalConfig:
    values = {"scenes": [1], "episodes": 4, "num_envs": 2, "max_steps": 8, "video": False, "report": False,
              "backend": "mujoco", "servers": [NOWHERE]}  # fmt: skip
    values.update(kw)
    return EvalConfig(**values)


def rows_of(cfg: EvalConfig, episodes, **kw) -> list[dict]:
    stand_in = {arm: ["embedded"] for arm in cfg.arms}  # the rows name a server; none runs here
    plan = plan_of(cfg).resolve(cfg.policies.servers or ["embedded"], arm_servers=stand_in)
    out = []
    for entry in plan.entries:
        if entry.episode in episodes:
            row = EpisodeRow.of(entry, prompt="p", task="DROID-CubeInBowl", max_steps=cfg.plan.max_steps,
                                backend=cfg.plan.backend, steps=8, ended_by="time_limit", success_at_end=True,
                                success_any_step=True)  # fmt: skip
            out.append({**row.to_dict(), **kw})
    return out


def run_with_rows(tmp_path, cfg: EvalConfig, rows: list[dict]) -> RunDir:
    run_dir = RunDir.create(tmp_path / "runs", cfg)
    for row in rows:
        run_dir.append_row(row)
    return run_dir


def resume(capsys, run_dir: RunDir, *extra: str) -> tuple[int, str]:
    code = cli.main(["--resume", str(run_dir.path), "--no-progress", *extra])
    return code, capsys.readouterr().err


def one_error(err: str) -> str:
    errors = [line for line in err.splitlines() if "error" in line]
    assert len(errors) == 1 and errors[0].startswith("dz-gym-eval: error: "), err
    assert "Traceback" not in err and "--server" not in errors[0], err  # the server check was not reached
    return errors[0]


# -- the lock ----------------------------------------------------------------------------------------------


HOLDER = """
import sys
from pathlib import Path
from dz_gym.eval.runlock import RunLock
lock = RunLock.acquire(sys.argv[1])
print("locked", flush=True)
sys.stdin.read()
"""


@pytest.fixture
def holder():
    """Starts a process that locks a run directory and holds it until its stdin closes (or it is killed)."""
    procs = []

    def start(path) -> subprocess.Popen:
        proc = subprocess.Popen([sys.executable, "-c", HOLDER, str(path)], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, text=True, env=dict(os.environ))  # fmt: skip
        procs.append(proc)
        ready, _, _ = select.select([proc.stdout], [], [], 120)
        assert ready and proc.stdout.readline().strip() == "locked"
        return proc

    yield start
    for proc in procs:
        proc.kill()
        proc.wait(timeout=60)


def test_a_second_writer_is_refused_naming_the_holder_and_how_to_break_a_stale_lock(capsys, tmp_path, holder):
    cfg = config()
    run_dir = run_with_rows(tmp_path, cfg, rows_of(cfg, [0, 1]))
    proc = holder(run_dir.path)
    code, err = resume(capsys, run_dir)
    line = one_error(err)
    assert code == 1 and "being written by another dz-gym-eval" in line and f"pid {proc.pid}" in line, line
    assert str(run_dir.path / LOCK_FILE) in line  # how to break a lock no process holds any more
    assert len(run_dir.read_rows()) == 2
    proc.kill()  # a crash: the kernel releases the lock with the process
    proc.wait(timeout=60)
    RunLock.acquire(run_dir.path).release()


def test_a_run_segment_holds_the_lock_until_it_closes(tmp_path, holder):
    cfg = config()
    run_dir = run_with_rows(tmp_path, cfg, [])
    proc = holder(run_dir.path)
    with pytest.raises(RunLocked, match=f"pid {proc.pid}"):
        RunSegment(
            cfg,
            run_dir,
            plan_of(cfg).resolve(cfg.policies.servers),
            servers=cfg.policies.servers,
            progress=False,
            log=lambda _: None,
        )
    proc.kill()
    proc.wait(timeout=60)
    segment = RunSegment(cfg, run_dir, plan_of(cfg).resolve(cfg.policies.servers), servers=cfg.policies.servers, progress=False,
                         log=lambda _: None)  # fmt: skip
    probe = [sys.executable, "-c", "import sys; from dz_gym.eval.runlock import RunLock; RunLock.acquire(sys.argv[1])",
             str(run_dir.path)]  # fmt: skip
    held = subprocess.run(probe, capture_output=True, text=True, timeout=120, env=dict(os.environ))
    assert held.returncode != 0 and "RunLocked" in held.stderr
    child = subprocess.run(probe, capture_output=True, text=True, timeout=120, pass_fds=(segment.lock.fd,),
                           env={**os.environ, **segment.lock.child_env()})  # fmt: skip
    assert child.returncode == 0, child.stderr  # a child handed the lock adopts it
    segment.close()
    assert subprocess.run(probe, timeout=120, env=dict(os.environ)).returncode == 0


# -- rows checked against the plan ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "make, needle",
    [
        (lambda c: rows_of(c, [0, 1]) + rows_of(c, [1]), ":3: a second row of scene 1 episode 1 (the first is on line 2)"),
        (lambda c: rows_of(config(seed=10), [0, 1]), ":1: seed 10 is not this run's seed for scene 1 episode 0"),
        (lambda c: rows_of(config(max_steps=30), [0]), ":1: max_steps 30, but this run's episodes have max_steps 8"),
        (lambda c: rows_of(config(episodes=8), [6]), ":1: episode 6 of scene 1 is not planned"),
        (lambda c: rows_of(config(scenes=[2]), [0], task="DROID-CanInMug"), ":1: scene 2 is not one of"),
        (lambda c: [{k: v for k, v in r.items() if k != "episode"} for r in rows_of(c, [0])], ":1: missing key 'episode'"),
        (lambda c: rows_of(c, [0]) + rows_of(config(backend="isaac"), [1]), ":2: backend 'isaac', but this run's backend is 'mujoco'"),
        (lambda c: rows_of(c, [0]) + rows_of(c, [1], backend="isaac"), ":2: backend 'isaac', but this run's backend is 'mujoco'"),
        (lambda c: rows_of(config(servers=[], policy="hold"), [0]), ":1: policy 'hold', but this run's policy is 'external'"),
        (lambda c: rows_of(c, [0, 1]) + rows_of(c, [2], policy="reference"), ":3: policy 'reference', but this run's policy is 'external'"),
    ],
)  # fmt: skip
def test_resume_refuses_duplicate_foreign_and_other_configuration_rows(capsys, tmp_path, make, needle):
    cfg = config()
    run_dir = run_with_rows(tmp_path, cfg, make(cfg))
    code, err = resume(capsys, run_dir)
    line = one_error(err)
    assert code == 1 and line.startswith("dz-gym-eval: error: --resume: ") and "episodes.jsonl" + needle in line, line
    assert not (run_dir.path / "summary.json").exists()


def test_resume_refuses_a_row_of_another_arm_policy_and_accepts_a_new_server_url(capsys, tmp_path):
    arms = lambda x: config(servers=[], arm_specs=[f"x={x}", f"y={NOWHERE}"])  # noqa: E731
    cfg = arms("reference")
    run_dir = run_with_rows(tmp_path, cfg, rows_of(cfg, [0]) + rows_of(arms("hold"), [1]))
    code, err = resume(capsys, run_dir)
    line = one_error(err)
    assert code == 1 and "episodes.jsonl:3: policy 'hold', but arm x's policy in this run is 'reference'" in line
    moved = config(servers=["ws://127.0.0.1:10/elsewhere"])  # the same external policy, served from elsewhere
    run_dir = run_with_rows(tmp_path, config(), rows_of(moved, range(4)))
    code, err = resume(capsys, run_dir)
    assert code == 0 and "is finished: 4 episode rows" in err, err


def test_rows_of_an_older_run_without_backend_and_policy_still_resume(capsys, tmp_path):
    cfg = config()
    old = [{k: v for k, v in r.items() if k not in ("backend", "policy")} for r in rows_of(cfg, [0, 1])]
    assert all("backend" in r and "policy" in r for r in rows_of(cfg, [2, 3]))
    run_dir = run_with_rows(tmp_path, cfg, old + rows_of(cfg, [2, 3]))  # resumed once since: rows of both kinds
    code, err = resume(capsys, run_dir)
    assert code == 0 and "is finished: 4 episode rows, nothing left to run" in err and "error" not in err, err
    assert json.loads((run_dir.path / "summary.json").read_text())["overall"]["episodes"] == 4


@pytest.mark.parametrize("garbage", [b"\xff\xfe\x00binary\n", b'{"scene": 1, "epis\n'])
def test_a_corrupt_middle_row_is_refused_and_a_torn_last_line_is_recovered(capsys, tmp_path, garbage):
    cfg = config()
    run_dir = run_with_rows(tmp_path, cfg, rows_of(cfg, [0]))
    with open(run_dir.path / "episodes.jsonl", "ab") as f:
        f.write(garbage)
    run_dir.append_row(rows_of(cfg, [1])[0])
    code, err = resume(capsys, run_dir)
    assert code == 1 and "episodes.jsonl:2: not " in one_error(err)
    torn = run_with_rows(tmp_path, cfg, rows_of(cfg, [0]))
    with open(torn.path / "episodes.jsonl", "ab") as f:
        f.write(garbage)  # a crash while appending the last row
    torn.repair_rows()
    assert torn.read_rows() == rows_of(cfg, [0])
    torn.append_row(rows_of(cfg, [1])[0])
    assert [r["episode"] for r in torn.read_rows()] == [0, 1]


def test_resume_of_a_finished_run_says_so_and_starts_nothing(capsys, tmp_path):
    cfg = config()
    run_dir = run_with_rows(tmp_path, cfg, rows_of(cfg, range(4)))
    code, err = resume(capsys, run_dir)
    assert code == 0 and "is finished: 4 episode rows, nothing left to run" in err and "error" not in err, err
    summary = json.loads((run_dir.path / "summary.json").read_text())  # it had none: written from the rows
    assert summary["complete"] and summary["overall"]["episodes"] == 4 and summary["segments"] == []
    code, err = resume(capsys, run_dir)
    assert code == 0 and "is finished" in err
    assert json.loads((run_dir.path / "summary.json").read_text()) == summary  # complete: left as it was


def test_max_episodes_is_locked_on_resume(capsys, tmp_path):
    cfg = config(
        policy_b=None, servers_b=[NOWHERE], sequential=True, max_episodes=6, episodes=None, accept_lower_power=True
    )
    run_dir = RunDir.create(tmp_path / "runs", cfg)
    with pytest.raises(SystemExit) as exc:
        cli.main(["--resume", str(run_dir.path), "--max-episodes", "40"])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and "max_episodes: the run used 6, got 40" in err, err


# -- outputs checked before anything starts ------------------------------------------------------------------


def test_unwritable_outputs_are_one_line_and_exit_2_before_anything_starts(capsys, tmp_path):
    blocker = tmp_path / "a_file"
    blocker.write_text("x")
    for root in (blocker / "runs", "/dev/null/x"):
        code = cli.main(["--server", NOWHERE, "--output-root", str(root), "--no-progress"])
        line = one_error(capsys.readouterr().err)
        assert code == 2 and line.startswith("dz-gym-eval: error: --output-root: cannot create"), line
    assert blocker.read_text() == "x"
    from dz_gym.report import cli as report_cli

    run_dir = run_with_rows(tmp_path, config(), rows_of(config(), [0]))
    with pytest.raises(SystemExit) as exc:
        report_cli.main([str(run_dir.path), "-o", "/dev/null/x"])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and err.count("\n") == 1 and "-o/--out-dir: cannot create /dev/null/x" in err, err


# -- videos ------------------------------------------------------------------------------------------------


class VideoRows:
    """Runs each entry of the segment as a short episode with a real video (VideoRecorder, ffmpeg), its row
    linking it."""

    def __init__(self):
        from dz_gym.eval.video import VideoRecorder

        self.recorder = VideoRecorder(fps=15)

    def run(self, segment: RunSegment) -> None:
        frame = np.zeros((16, 48, 3), dtype=np.uint8)
        for entry in segment.todo.entries:
            key = f"scene{entry.scene}_ep{entry.episode:04d}"
            self.recorder.open(key, segment.run_dir.video_path(entry.scene, entry.episode))
            for _ in range(3):
                self.recorder.add(key, frame)
            self.recorder.finish(key)
            row = EpisodeRow.of(entry, prompt="p", task=None, max_steps=8, backend=segment.config.plan.backend, steps=8,
                                ended_by="time_limit", success_at_end=True, success_any_step=True,
                                video=segment.run_dir.video_relpath(entry.scene, entry.episode))  # fmt: skip
            segment.run_dir.append_row(row.to_dict())

    def close(self, segment: RunSegment, error) -> None:
        self.recorder.close()
        segment.video_errors.update(self.recorder.failed)


def disk_full_for(monkeypatch, name: str) -> None:
    """The encoder of the video whose path contains ``name`` fails on its second frame as on a full disk."""
    import imageio.v2 as imageio

    real = imageio.get_writer

    def get_writer(path, *args, **kwargs):
        writer = real(path, *args, **kwargs)
        if name in str(path):
            frames = []

            def append_data(frame):
                frames.append(frame)
                if len(frames) == 2:
                    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
                writer_append(frame)

            writer_append = writer.append_data
            writer.append_data = append_data
        return writer

    monkeypatch.setattr(imageio, "get_writer", get_writer)


def test_a_video_that_failed_is_deleted_and_unlinked_and_resume_never_links_an_unreadable_file(tmp_path, monkeypatch):
    pytest.importorskip("imageio_ffmpeg")
    cfg = config(episodes=3, video=True)
    run_dir = RunDir.create(tmp_path / "runs", cfg)

    def segment() -> RunSegment:
        return RunSegment(cfg, run_dir, plan_of(cfg).resolve(cfg.policies.servers), servers=cfg.policies.servers, progress=False,
                          log=lambda _: None)  # fmt: skip

    disk_full_for(monkeypatch, "ep0001")
    summary = run_segment(segment(), VideoRows())
    monkeypatch.undo()
    rows = {r["episode"]: r for r in run_dir.read_rows()}
    assert rows[1]["video"] is None and not (run_dir.path / "videos/scene1_ep0001.mp4").exists()
    assert "No space left on device" in summary["video_errors"]["scene1_ep0001"]
    assert rows[0]["video"] == "videos/scene1_ep0000.mp4" and rows[2]["video"] == "videos/scene1_ep0002.mp4"
    broken = run_dir.path / rows[2]["video"]  # left broken by a crash: a player says "moov atom not found"
    broken.write_bytes(broken.read_bytes()[:-200])
    resumed = run_segment(segment(), VideoRows())
    rows = {r["episode"]: r for r in run_dir.read_rows()}
    assert rows[2]["video"] is None and not broken.exists() and rows[0]["video"] == "videos/scene1_ep0000.mp4"
    assert set(resumed["video_errors"]) == {"scene1_ep0001", "scene1_ep0002"}  # this segment's and the last one's
    assert "torn" in resumed["video_errors"]["scene1_ep0002"] or "moov" in resumed["video_errors"]["scene1_ep0002"]
    assert resumed["overall"]["episodes"] == 3


@pytest.mark.slow
def test_a_full_disk_while_writing_rows_stops_the_run_cleanly_and_a_resume_finishes_it(tmp_path, monkeypatch):
    """End to end on the toy env and a real server: the third row's write fails with ENOSPC; the run stops
    with that error (the summary says aborted, two rows kept, every linked video complete), and a resume runs
    the rest with every row's video a complete mp4."""
    pytest.importorskip("imageio_ffmpeg")
    from dz_gym.eval.evaluate import evaluate
    from dz_gym.eval.video import mp4_problem
    from dz_gym.server.launch import start_server_thread
    from dz_gym.testing.toy_env import ToyDroidEnv

    cfg = EvalConfig(scenes=[1], episodes=4, num_envs=2, max_steps=6, video=True, report=False, backend="mujoco")
    run_dir = RunDir.create(tmp_path, cfg)
    real, written = RunDir.append_rows, []

    def append_rows(self, rows):  # the disk fills after two rows, whatever the batches
        for row in rows:
            if len(written) == 2:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            written.append(row["episode"])
            real(self, [row])

    def factory(scene, c):
        return ToyDroidEnv(c.plan.num_envs, scene=scene, max_episode_length=c.plan.max_steps, image_shape=(18, 32))

    with start_server_thread("hold") as server:
        url = server.url + "/v1/realtime/robot/openpi"
        monkeypatch.setattr(RunDir, "append_rows", append_rows)
        with pytest.raises(OSError, match="No space left on device"):
            evaluate(cfg, run_dir, [url], env_factory=factory, progress=False)
        monkeypatch.undo()
        summary = json.loads((run_dir.path / "summary.json").read_text())
        assert "No space left on device" in summary["aborted"] and summary["overall"]["episodes"] == 2
        assert all(mp4_problem(run_dir.path / r["video"]) is None for r in run_dir.read_rows())
        summary = evaluate(cfg, run_dir, [url], env_factory=factory, progress=False)
    rows = run_dir.read_rows()
    assert summary["complete"] and sorted(r["episode"] for r in rows) == [0, 1, 2, 3]
    assert all(r["video"] and mp4_problem(run_dir.path / r["video"]) is None for r in rows)


@pytest.fixture
def tmpfs(tmp_path):
    """Mounts a tmpfs of ``size`` (``mount(size, ro=False)``; again to remount it) at a fresh folder; skipped
    where mounting is not allowed (not root, no CAP_SYS_ADMIN)."""
    target = tmp_path / "mnt"
    target.mkdir()
    mounted = []

    def mount(size: str, ro: bool = False):
        options = f"size={size}" + (",ro" if ro else "") + (",remount" if mounted else "")
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(target)], capture_output=True,
                              text=True, timeout=60)  # fmt: skip
        if done.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
        mounted.append(options)
        return target

    yield mount
    if mounted:
        subprocess.run(["umount", "-l", str(target)], capture_output=True, timeout=60)  # lazy: never left mounted


def test_a_read_only_output_root_is_refused_before_anything_starts(capsys, tmpfs):
    root = tmpfs("1m", ro=True)
    code = cli.main(["--server", NOWHERE, "--output-root", str(root / "runs"), "--no-progress"])
    line = one_error(capsys.readouterr().err)
    assert code == 2 and line.startswith("dz-gym-eval: error: --output-root: cannot write in") and "Read-only" in line


@pytest.mark.slow
def test_a_real_full_disk_mid_run_then_a_resume_once_there_is_room(tmp_path, tmpfs):
    """A tmpfs too small for the run (config.json fits; the episodes' trajectories and rows alone do not,
    one page each): the run stops with ENOSPC and leaves no temporary file; with the tmpfs grown, a resume
    unlinks whatever video the full disk broke, finishes the run and links only complete videos."""
    pytest.importorskip("imageio_ffmpeg")
    from dz_gym.eval.evaluate import evaluate
    from dz_gym.eval.video import mp4_problem
    from dz_gym.server.launch import start_server_thread
    from dz_gym.testing.toy_env import ToyDroidEnv

    root = tmpfs("16k")
    cfg = EvalConfig(scenes=[1], episodes=4, num_envs=2, max_steps=6, video=True, report=False, backend="mujoco")
    run_dir = RunDir.create(root, cfg)

    def factory(scene, c):
        return ToyDroidEnv(c.plan.num_envs, scene=scene, max_episode_length=c.plan.max_steps, image_shape=(18, 32))

    def leftovers():
        return sorted(p.name for p in run_dir.path.rglob(".*tmp*"))

    with start_server_thread("hold") as server:
        url = server.url + "/v1/realtime/robot/openpi"
        with pytest.raises(OSError) as failed:
            evaluate(cfg, run_dir, [url], env_factory=factory, progress=False)
        assert failed.value.errno == errno.ENOSPC, failed.value
        assert leftovers() == []
        tmpfs("64m")
        summary = evaluate(cfg, run_dir, [url], env_factory=factory, progress=False)
    rows = run_dir.read_rows()
    assert summary["complete"] and sorted(r["episode"] for r in rows) == [0, 1, 2, 3] and leftovers() == []
    linked = {r["video"] for r in rows if r["video"]}
    assert all(mp4_problem(run_dir.path / v) is None for v in linked)
    assert set(summary["video_errors"]) == {Path(r["trajectory"]).stem for r in rows if not r["video"]}
