"""The run segment: opened over a new or resumed run directory, closed with the summary and the report whatever
ended the executor (normal end, a stop, a crash), and the report a process of its own that cannot fail a run.

The executors here are the smallest ones that honour the segment's contract (they write rows through the run
directory and report their timing), so that each way a run can end is reached without a simulator.
"""

from __future__ import annotations

import json
import logging

import pytest

from dz_gym.eval.config import EvalConfig
from dz_gym.eval.plan import plan_of
from dz_gym.eval.row import EpisodeRow
from dz_gym.eval.rundir import RunDir
from dz_gym.eval.segment import RunSegment, run_segment, write_report_page


def config(**kw) -> EvalConfig:
    values = {"scenes": [1], "episodes": 4, "num_envs": 2, "max_steps": 8, "video": False, "report": False}
    values["backend"] = "mujoco"
    values.update(kw)
    return EvalConfig(**values)


class Rows:
    """Writes a finished row for the first ``n`` entries of the segment's plan, then raises ``fail`` if given."""

    def __init__(self, n: int, fail: BaseException | None = None):
        self.n, self.fail = n, fail
        self.closed_with: list = []

    def run(self, segment: RunSegment) -> None:
        for entry in segment.todo.entries[: self.n]:
            row = EpisodeRow.of(entry, prompt="p", task=None, max_steps=8, backend=segment.config.plan.backend, steps=8,
                                ended_by="time_limit", success_at_end=entry.episode % 2 == 0,
                                success_any_step=True)  # fmt: skip
            segment.run_dir.append_row(row.to_dict())
            segment.control.record(row.to_dict())
        segment.add_time(1.5, 8 * self.n, {"ws://a": 0.5})
        if self.fail is not None:
            raise self.fail

    def close(self, segment: RunSegment, error: BaseException | None) -> None:
        self.closed_with.append(error)


def segment(run_dir: RunDir, cfg: EvalConfig, **kw) -> RunSegment:
    return RunSegment(cfg, run_dir, plan_of(cfg).resolve(["ws://a"]), servers=["ws://a"], progress=False,
                      log=lambda _: None, **kw)  # fmt: skip


def test_a_finished_segment_writes_the_summary_and_a_resume_adds_a_segment(tmp_path):
    cfg = config()
    run_dir = RunDir.create(tmp_path, cfg)
    first = Rows(3)
    summary = run_segment(segment(run_dir, cfg), first)
    assert first.closed_with == [None] and not summary["complete"] and len(summary["segments"]) == 1
    resumed = segment(run_dir, cfg)
    assert [e.episode for e in resumed.todo.entries] == [3]  # only the entry without a row
    summary = run_segment(resumed, Rows(1))
    assert summary["complete"] and summary["overall"]["episodes"] == 4 and len(summary["segments"]) == 2
    assert json.loads((run_dir.path / "summary.json").read_text())["complete"]


@pytest.mark.parametrize(
    "fail,state", [(KeyboardInterrupt(), "interrupted"), (RuntimeError("sim\ncrashed"), "aborted")]
)
def test_the_summary_is_written_whatever_ends_the_executor(tmp_path, fail, state):
    cfg = config()
    run_dir = RunDir.create(tmp_path, cfg)
    executor = Rows(2, fail=fail)
    with pytest.raises(type(fail)):
        run_segment(segment(run_dir, cfg), executor)
    assert executor.closed_with == [fail]  # the executor's own clean-up saw what ended it
    summary = json.loads((run_dir.path / "summary.json").read_text())
    assert summary["overall"]["episodes"] == 2
    if state == "interrupted":
        assert summary["interrupted"] and summary["aborted"] is None
    else:
        assert not summary["interrupted"] and summary["aborted"] == "RuntimeError: sim"  # one line


def test_the_report_is_written_by_its_own_process_and_a_failure_is_a_warning(tmp_path, caplog):
    cfg = config(report=True)
    run_dir = RunDir.create(tmp_path / "ok", cfg)
    run_segment(segment(run_dir, cfg), Rows(4))
    assert (run_dir.path / "report.html").is_file()
    broken = RunDir(tmp_path / "broken")
    broken.path.mkdir()
    with caplog.at_level(logging.WARNING, logger="dz_gym.eval.segment"):
        assert write_report_page(broken) is False
    assert "could not write report.html" in caplog.text and not (broken.path / "report.html").exists()
