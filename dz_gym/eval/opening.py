"""Before a run starts anything: its outputs can be written, and a resumed run directory is a ledger of its plan.

:func:`check_outputs` says (one line) why the output root of a new run, or the run directory and its videos
folder of a resumed one, cannot be written; the caller refuses the run before any server or simulator starts.
:func:`open_ledger` takes a resumed run directory's writer lock (:mod:`dz_gym.eval.runlock`), checks every row
against the plan (:func:`~dz_gym.eval.segment.checked_rows`) and tells whether anything is left: a finished run
says so, rewrites its summary only where it is missing or stale, and starts nothing. A per-scene child adopts
its parent's lock and only reads: its siblings append to the same ``episodes.jsonl`` at the same time, so the
parent alone repairs a torn last line.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any

from dz_gym.eval.config import EvalConfig
from dz_gym.eval.flag_table import DEFAULT_OUTPUT_ROOT
from dz_gym.eval.rundir import RunDir

__all__ = ["Ledger", "check_outputs", "open_ledger"]


def check_outputs(config: EvalConfig, run_dir: RunDir | None, output_root: str | Path | None) -> str | None:
    """Why the run's outputs cannot be written (one line naming the flag), or None."""
    from dz_gym.eval.preflight import check_writable

    if run_dir is None:
        return check_writable(output_root or DEFAULT_OUTPUT_ROOT, "--output-root")
    problem = check_writable(run_dir.path, "--resume")
    if problem is None and config.outputs.video:
        problem = check_writable(run_dir.path / "videos", "--resume")
    return problem


@dataclasses.dataclass
class Ledger:
    """What :func:`open_ledger` found: the lock to hold while the run goes on (None: nothing to hold), or why
    the run must not start (``error``, one line), or that it is finished (``summary``)."""

    lock: Any = None
    error: str | None = None
    finished: bool = False
    summary: dict[str, Any] | None = None

    def release(self) -> None:
        if self.lock is not None:
            self.lock.release()
            self.lock = None


def open_ledger(config: EvalConfig, run_dir: RunDir | None, *, part: bool, say: Callable[[str], None]) -> Ledger:
    """A resume: the run directory's lock, its rows checked against the plan, and whether anything is left.
    ``part``: this process runs a part of the run (a scene's child), which never counts as finished here."""
    if run_dir is None:
        return Ledger()
    from dz_gym.errors import first_line
    from dz_gym.eval.runlock import RunLock, RunLocked
    from dz_gym.eval.segment import checked_rows

    try:
        lock = RunLock.acquire(run_dir.path)
    except (RunLocked, OSError) as exc:
        return Ledger(error=first_line(exc))
    try:
        if not lock.inherited:
            run_dir.repair_rows()
        rows = checked_rows(config, run_dir)
        if part or not _finished(config, rows):
            return Ledger(lock=lock)
        say(
            f"{run_dir.path} is finished: {len(rows)} episode rows, nothing left to run (no server or simulator started)"
        )
        summary = _finished_summary(config, run_dir, say)
        lock.release()
        return Ledger(finished=True, summary=summary)
    except (ValueError, OSError) as exc:
        lock.release()
        return Ledger(error=f"--resume: {first_line(exc)}")


def _finished(config: EvalConfig, rows: list[dict[str, Any]]) -> bool:
    """Whether the plan has nothing left after ``rows`` (every entry has a row, or an adaptive stop ended it)."""
    from dz_gym.eval.plan import plan_of
    from dz_gym.eval.segment import remaining

    todo, _ = remaining(config, plan_of(config), rows)
    return len(todo) == 0


def _finished_summary(config: EvalConfig, run_dir: RunDir, say: Callable[[str], None]) -> dict[str, Any] | None:
    """The summary of a finished run; rewritten (as an empty run segment) where it is missing, does not say
    complete, or a row linked a video that cannot be read."""
    from dz_gym.eval.plan import plan_of
    from dz_gym.eval.segment import RunSegment, run_segment
    from dz_gym.eval.video import withdraw_broken_videos

    summary = run_dir.read_summary()
    withdrawn = withdraw_broken_videos(run_dir, run_dir.read_rows())
    if summary is not None and summary.get("complete") and not withdrawn:
        return summary
    previous = summary or {}
    servers = list(previous.get("servers") or config.policies.servers)
    segment = RunSegment(config, run_dir, plan_of(config), servers=servers,
                         servers_b=list(previous.get("servers_b") or []), progress=False, log=say,
                         command=str(previous.get("command", "")), server_info=previous.get("server"),
                         report=config.outputs.report)  # fmt: skip
    segment.video_errors.update(withdrawn)
    return run_segment(segment, _NoEpisodes())


class _NoEpisodes:
    """The executor of a run segment with nothing to run (a finished run's summary rewritten)."""

    def run(self, segment: Any) -> None:
        return None

    def close(self, segment: Any, error: BaseException | None) -> None:
        return None
