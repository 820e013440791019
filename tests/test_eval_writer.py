"""EpisodeWriter: trajectories then rows, in order, off the caller's thread; errors reach the caller."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from dz_gym.eval.config import EvalConfig
from dz_gym.eval.rundir import RunDir
from dz_gym.eval.writer import EpisodeWriter


class _LoggingRunDir:
    """Records the order of writes; ``gate`` holds the writer thread; ``fail_at`` makes one write fail."""

    def __init__(self, fail_at: int | None = None):
        self.events: list[tuple[str, int]] = []
        self.gate = threading.Event()
        self.gate.set()
        self.fail_at = fail_at
        self.thread_names: set[str] = set()
        self.failed = threading.Event()
        self.batches: list[int] = []
        self.entered = threading.Event()  # the writer thread is in save_trajectory

    def save_trajectory(self, scene, episode, arrays, arm=None):
        self.entered.set()
        self.gate.wait(10)
        self.thread_names.add(threading.current_thread().name)
        if episode == self.fail_at:
            self.failed.set()
            raise OSError("disk full")
        self.events.append(("trajectory", episode))

    def append_rows(self, rows):
        self.batches.append(len(rows))
        self.events.extend(("row", row["episode"]) for row in rows)


def test_trajectory_then_row_in_order_on_the_writer_thread(tmp_path):
    run_dir = RunDir.create(tmp_path / "run", EvalConfig(scenes=[1], episodes=3, num_envs=1))
    writer = EpisodeWriter(run_dir)
    for k in range(3):
        rel = run_dir.trajectory_relpath(1, k)
        writer.submit(1, k, None, {"actions": np.full((4, 8), k, np.float32)}, {"episode": k, "trajectory": rel})
    writer.close()
    rows = run_dir.read_rows()
    assert [r["episode"] for r in rows] == [0, 1, 2]
    for row in rows:
        with np.load(run_dir.path / row["trajectory"]) as data:
            assert np.all(data["actions"] == row["episode"])
    fake = _LoggingRunDir()
    writer = EpisodeWriter(fake)
    for k in range(5):
        writer.submit(1, k, None, {}, {"episode": k})
    writer.close()
    assert sorted(fake.events) == sorted((kind, k) for k in range(5) for kind in ("trajectory", "row"))
    rows = [k for kind, k in fake.events if kind == "row"]
    assert rows == list(range(5))  # in order, each after its trajectory
    assert all(fake.events.index(("trajectory", k)) < fake.events.index(("row", k)) for k in range(5))
    assert fake.thread_names == {"dz-gym-episode-writer"}


def test_episodes_waiting_together_go_to_disk_in_one_append():
    """Episodes queued while the writer is busy are written as one batch: one append (one fsync) for their
    rows, after all of their trajectories."""
    fake = _LoggingRunDir()
    fake.gate.clear()
    writer = EpisodeWriter(fake)
    writer.submit(1, 0, None, {}, {"episode": 0})
    assert fake.entered.wait(10)  # the thread took it alone and waits at the gate
    for k in range(1, 6):
        writer.submit(1, k, None, {}, {"episode": k})
    fake.gate.set()
    writer.close()
    assert fake.batches == [1, 5]
    assert fake.events[2:] == [("trajectory", k) for k in range(1, 6)] + [("row", k) for k in range(1, 6)]


def test_run_dir_rows_appended_together_read_back_in_order(tmp_path):
    run_dir = RunDir.create(tmp_path / "run", EvalConfig(scenes=[1], episodes=3, num_envs=1))
    run_dir.append_rows([{"episode": k, "scene": 1} for k in range(3)])
    run_dir.append_rows([])
    run_dir.append_row({"episode": 3, "scene": 1})
    assert [r["episode"] for r in run_dir.read_rows()] == [0, 1, 2, 3]


def test_a_full_queue_waits_for_the_disk_and_close_writes_everything():
    fake = _LoggingRunDir()
    fake.gate.clear()
    writer = EpisodeWriter(fake, max_pending=1)
    writer.submit(1, 0, None, {}, {"episode": 0})  # taken by the thread, which waits at the gate
    writer.submit(1, 1, None, {}, {"episode": 1})  # fills the queue
    third = threading.Thread(target=writer.submit, args=(1, 2, None, {}, {"episode": 2}))
    third.start()
    third.join(0.2)
    assert third.is_alive() and fake.events == []  # the caller waits: nothing is dropped
    fake.gate.set()
    third.join(10)
    writer.close()
    assert [k for kind, k in fake.events if kind == "row"] == [0, 1, 2]


def test_a_failed_write_reaches_the_caller_and_later_rows_are_not_written():
    fake = _LoggingRunDir(fail_at=1)
    writer = EpisodeWriter(fake)
    for k in range(3):
        writer.submit(1, k, None, {}, {"episode": k})
    with pytest.raises(OSError, match="disk full"):
        writer.close()
    assert fake.events == [("trajectory", 0), ("row", 0)]  # no row after the failed one: the order holds
    with pytest.raises(RuntimeError, match="closed"):
        writer.submit(1, 3, None, {}, {"episode": 3})


def test_arrays_given_as_a_function_are_packed_on_the_writer_thread_and_its_error_is_a_write_error(tmp_path):
    run_dir = RunDir.create(tmp_path / "run", EvalConfig(scenes=[1], episodes=3, num_envs=1))
    writer = EpisodeWriter(run_dir)
    packed_on: list[str] = []

    def pack(k):
        def arrays():
            packed_on.append(threading.current_thread().name)
            if k == 2:
                raise ValueError("trajectory: 'actions' expected shape (T, 8), got (4, 7)")
            return {"actions": np.full((4, 8), k, np.float32)}

        return arrays

    for k in range(3):
        writer.submit(1, k, None, pack(k), {"episode": k, "trajectory": run_dir.trajectory_relpath(1, k)})
    with pytest.raises(ValueError, match="expected shape"):
        writer.close()
    assert packed_on == ["dz-gym-episode-writer"] * 3
    assert [r["episode"] for r in run_dir.read_rows()] == [0, 1]  # none from the one that failed on
    with np.load(run_dir.path / run_dir.trajectory_relpath(1, 1)) as data:
        assert data["actions"].tolist() == np.full((4, 8), 1, np.float32).tolist()


def test_nothing_is_written_after_a_failure_even_once_it_was_raised():
    fake = _LoggingRunDir(fail_at=0)
    writer = EpisodeWriter(fake)
    writer.submit(1, 0, None, {}, {"episode": 0})
    assert fake.failed.wait(10)
    with pytest.raises(OSError, match="disk full"):  # reported at the next submit, which queues nothing
        writer.submit(1, 1, None, {}, {"episode": 1})
    writer.submit(1, 2, None, {}, {"episode": 2})  # the caller went on: still not written
    writer.close()
    assert fake.events == []


def _general_to_json(value):
    """The conversion by the isinstance chain alone (what rundir._to_json's type shortcuts must equal)."""
    from collections.abc import Mapping
    from pathlib import Path

    if isinstance(value, Mapping):
        return {str(k): _general_to_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_general_to_json(v) for v in value]
    if isinstance(value, np.ndarray):
        return _general_to_json(value.tolist())
    if isinstance(value, np.generic):
        return _general_to_json(value.item())
    if isinstance(value, float) and value != value:
        return None
    if isinstance(value, Path):
        return str(value)
    return value


def test_row_json_conversion_equals_the_general_one():
    import collections
    import json
    from pathlib import Path

    from dz_gym.eval.rundir import _to_json

    class Key(str):
        pass

    nan = float("nan")
    cases = [1, 1.5, nan, np.float64(nan), np.float32(2.5), np.int64(3), np.bool_(True), True, None, "x", Key("y"),
             (1, nan, np.int64(2)), [np.arange(3), {"a": nan}], {1: 2, False: 3, None: [1.0, nan], Key("k"): np.zeros(2)},
             collections.OrderedDict(a=1, b=(nan,)), Path("/a/b"), {"m": {"lift": None, "x": 3}}, {2.5: "f"},
             [[1.0, 2.0], (np.float32(1),)], np.array([[1, 2]]), {"latencies_ms": [0.5, 1.25], "error": None}]  # fmt: skip
    for value in cases:
        got, want = _to_json(value), _general_to_json(value)
        assert json.dumps(got, allow_nan=False) == json.dumps(want, allow_nan=False)
        assert type(got) is type(want)
