"""One run segment: open a run directory (new or resumed), let an executor run what the plan has left, close it.

Every executor (one process: :class:`~dz_gym.eval.evaluate.InProcess`; a process per scene:
:class:`~dz_gym.eval.processes.SceneProcesses`; Ray shards: :class:`~dz_gym.eval.shards.driver.ShardedRun`)
runs inside :func:`run_segment`, which does the rest the same way for all of them:

- opening (:class:`RunSegment`): take the run directory's writer lock (:mod:`dz_gym.eval.runlock`), repair
  a truncated last row, read the rows and check each against the plan (:func:`checked_rows`: a duplicate, a
  foreign row or a row of another configuration is refused with ``episodes.jsonl:LINE: why``), withdraw the
  links to videos that cannot be read (:func:`~dz_gym.eval.video.withdraw_broken_videos`), the error
  budget's count, the plan's entries still without a row (:meth:`~dz_gym.eval.plan.RunPlan.remaining`; nothing once an A/B run's
  sequential test has decided), the progress bars, the capacity warnings;
- running: ``executor.run(segment)``, then always ``executor.close(segment, error)`` (its own clean-up);
- closing, also after Ctrl-C, an exhausted error budget or a crash: the links to videos that were not
  finished withdrawn (``video: null``, the reason in ``video_errors``), ``summary.json`` from every row and every
  segment's timing (:func:`~dz_gym.eval.summary.build_summary`), then ``report.html`` (``config.outputs.report``),
  written by the ``dz-gym-report`` command in a process of its own, so that the evaluator does not import the
  report and a report that fails never changes the run's outcome; then what ended the run early is raised; the lock is released.

An executor reads ``segment.todo`` (the plan left), ``control``, ``bars``, ``say``, ``pairs`` and reports back
through ``timing`` (``wall_s``, ``env_steps``, ``busy_s``), ``server_metadata``, ``video_errors``,
``dropped``, ``extra`` (more summary fields) and ``aborted``.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

from dz_gym.errors import first_line
from dz_gym.eval.capacity import IdleGapCheck, envs_per_server, session_warning
from dz_gym.eval.config import EvalConfig
from dz_gym.eval.control import RunControl
from dz_gym.eval.ledger import check_ledger, spec_of
from dz_gym.eval.plan import RunPlan
from dz_gym.eval.progress import Progress
from dz_gym.eval.provenance import provenance
from dz_gym.eval.rundir import ROWS_FILE, RunDir
from dz_gym.eval.runlock import RunLock
from dz_gym.eval.runner import task_name
from dz_gym.eval.shared import summary_lock
from dz_gym.eval.signals import shielded
from dz_gym.eval.summary import build_summary, pair_tracker, versions
from dz_gym.eval.video import withdraw_broken_videos

logger = logging.getLogger(__name__)

REPORT_TIMEOUT_S = 300.0  # the longest the end of a run waits for its report page


def server_profile(server_metadata: dict[str, Any]) -> dict[str, Any]:
    """``{"profile": NAME, "open_loop_horizon": H}``: the server profile (:mod:`dz_gym.protocol.profiles`) the
    run spoke and the actions it executed per chunk, from the servers' metadata entries (a list where arms'
    servers differ; each key absent before any server answered).

    >>> server_profile({"ws://a": {"profile": "sglang", "open_loop_horizon": 32}}), server_profile({})
    ({'profile': 'sglang', 'open_loop_horizon': 32}, {})
    """
    out: dict[str, Any] = {}
    for key in ("profile", "open_loop_horizon"):
        values = sorted({m[key] for m in server_metadata.values() if isinstance(m, dict) and m.get(key) is not None})
        if values:
            out[key] = values[0] if len(values) == 1 else values
    return out


SUMMARY_FROM_CHILDREN = ("server", "servers", "server_metadata", "video_errors", "provenance")

__all__ = ["Executor", "RunSegment", "checked_rows", "remaining", "run_segment", "write_report_page"]


class Executor(Protocol):
    """What :func:`run_segment` drives: ``run`` the segment's plan, then ``close`` (always, with the error)."""

    def run(self, segment: RunSegment) -> None: ...

    def close(self, segment: RunSegment, error: BaseException | None) -> None: ...


def checked_rows(config: EvalConfig, run_dir: RunDir) -> list[dict[str, Any]]:
    """The rows of ``run_dir``, each checked against ``config``'s plan (:func:`~dz_gym.eval.ledger.check_ledger`);
    a bad one is a one-line ``ValueError`` ``.../episodes.jsonl:LINE: why``."""
    spec = spec_of(config, {s: task_name(s) for s in config.plan.scenes})
    return check_ledger(run_dir.read_numbered_rows(), spec, str(run_dir.path / ROWS_FILE))  # type: ignore[return-value]


def remaining(config: EvalConfig, plan: RunPlan, rows: Sequence[Mapping[str, Any]]) -> tuple[RunPlan, Any]:
    """What ``plan`` has left to run after ``rows``, and the run's pair tracker: nothing once an A/B run's
    sequential test has decided; without the arms a ``--select-best`` race has eliminated."""
    pairs = pair_tracker(config, rows)
    todo = plan.remaining(rows)
    if pairs is not None and pairs.stopped:  # the sequential test has decided (a resumed run)
        todo = dataclasses.replace(todo, entries=())
    out = getattr(pairs, "eliminated_arms", None)  # --select-best: arms out of the race run no more
    if out:
        todo = dataclasses.replace(todo, entries=tuple(e for e in todo.entries if e.arm not in out))
    return todo, pairs


class RunSegment:
    """The state of one run segment over ``run_dir`` (see the module docstring).

    ``plan``: the whole run's plan (its entries with a row are skipped); ``servers``/``servers_b``: what the
    summary names as the run's servers; ``report``: write ``report.html`` at the end (default
    ``config.outputs.report``; a per-scene child leaves it to its parent); ``inherit``: the executor's processes write
    their own segments, so the summary keeps their timing and server fields."""

    def __init__(
        self,
        config: EvalConfig,
        run_dir: RunDir,
        plan: RunPlan,
        *,
        servers: Sequence[str],
        servers_b: Sequence[str] = (),
        control: RunControl | None = None,
        progress: bool | None = None,
        log: Callable[[str], None] | None = None,
        command: str = "",
        server_info: Mapping[str, Any] | None = None,
        report: bool | None = None,
        inherit: bool = False,
    ):
        self.config, self.run_dir, self.plan = config, run_dir, plan
        self.servers, self.servers_b = list(servers), list(servers_b)
        self.command, self.server_info = command, server_info
        self.report = config.outputs.report if report is None else bool(report)
        self.inherit = inherit
        self.lock = RunLock.acquire(run_dir.path)
        try:
            # A per-scene child (the parent's lock, inherited) shares episodes.jsonl with its siblings, which
            # append to it at the same time: the parent repaired it and withdrew broken videos before they
            # started, and withdraws again once they have ended; a child only reads.
            owner = not self.lock.inherited
            if owner:
                run_dir.repair_rows()
            rows = checked_rows(config, run_dir)
            self.video_errors: dict[str, str] = withdraw_broken_videos(run_dir, rows) if owner else {}
        except BaseException:
            self.lock.release()
            raise
        previous = run_dir.read_summary() or {}
        self.control = control if control is not None else RunControl(config.error_budget)
        self.control.errored = sum(1 for r in rows if r.get("error") is not None)
        self.todo, self.pairs = remaining(config, plan, rows)
        self.dropped: list[dict[str, Any]] = list((previous.get("sequential") or {}).get("dropped", []))
        self.server_metadata: dict[str, Any] = {}
        self.extra: dict[str, Any] = {}
        self.aborted: str | None = None
        self.timing: dict[str, Any] = {"started_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                                       "wall_s": 0.0, "env_steps": 0, "busy_s": {}}  # fmt: skip
        self.bars, self.say = self._bars(progress, log)

    def _bars(self, progress: bool | None, log: Callable[[str], None] | None):
        config, total = self.config, len(self.todo)
        say_later: list[Callable[[str], None]] = []
        per_server = (
            config.envs_per_server() if config.armed else envs_per_server(config.plan.num_envs, len(self.servers))
        )
        idle_check = IdleGapCheck(per_server, config.transport.server_idle_timeout, lambda line: say_later[0](line))
        bars = Progress(total, total * config.plan.max_steps, enabled=progress, on_latency=idle_check.observe)
        say = log or bars.write
        say_later.append(say)
        per_arm = config.plan.num_envs // max(1, len(config.arms))  # a run with K arms: 1/K of the slots per arm
        per_arm *= max(1, len(self.todo.scene_order()))  # the scenes run side by side, a batch each
        crowded = session_warning(per_arm, self.servers, config.transport.server_max_sessions) if self.servers else None
        if crowded is None and config.ab and self.servers_b:
            crowded = session_warning(per_arm, self.servers_b, config.transport.server_max_sessions)
        if crowded is not None:
            say(f"dz-gym-eval: warning: {crowded}")
        return bars, say

    def add_time(self, wall_s: float, env_steps: int, busy_s: Mapping[str, float]) -> None:
        """Add one stepping loop's timing (a scene's, in one process) to this segment's."""
        self.timing["wall_s"] += wall_s
        self.timing["env_steps"] += env_steps
        for url, seconds in busy_s.items():
            self.timing["busy_s"][url] = self.timing["busy_s"].get(url, 0.0) + seconds

    def failed(self, exc: BaseException) -> None:
        """Note what ended the run early: a stop (Ctrl-C, or a failure that came with one) or an abort."""
        if isinstance(exc, KeyboardInterrupt) or (self.control.stop.is_set() and self.control.aborted is None):
            self.control.stop.set()  # a stop request, or a failure that came with it (a worker got the signal too)
        else:
            self.aborted = self.aborted or f"{type(exc).__name__}: {first_line(exc)}"

    def close(self) -> dict[str, Any]:
        """Withdraw the links to videos not finished, write ``summary.json`` (and the report), release the
        lock; returns the summary."""
        try:
            return self._close()
        finally:
            self.lock.release()

    def _close(self) -> dict[str, Any]:
        self.bars.close()
        if not self.lock.inherited:  # a child: its siblings may still append rows (see __init__)
            try:
                rows = self.run_dir.read_rows()
                self.video_errors.update(withdraw_broken_videos(self.run_dir, rows, self.video_errors))
            except OSError as exc:  # e.g. a full disk: the next segment's opening withdraws them
                logger.warning("%s: could not unlink the broken videos from their rows now: %s", self.run_dir.path, exc)
        with summary_lock(self.run_dir):  # the processes of a run (one per scene) may end at once
            summary = self._write_summary()
        if self.report:
            write_report_page(self.run_dir, self.say)
        return summary

    def _write_summary(self) -> dict[str, Any]:
        previous = self.run_dir.read_summary() or {}  # re-read: a per-scene child may have written it
        segments = list(previous.get("segments", []))
        if self.timing["env_steps"] or self.timing["wall_s"]:
            segments.append(self.timing)
        aborted = self.aborted or self.control.aborted
        server_metadata = self.server_metadata or previous.get("server_metadata", {})
        extra = {
            "interrupted": self.control.interrupted and aborted is None,
            "aborted": aborted,
            "command": self.command,
            "backend": self.config.plan.backend,
            "servers": list(self.servers),
            "server": {**(self.server_info or {}), **server_profile(server_metadata)},
            "server_metadata": server_metadata,
            "video_errors": {},
            "versions": versions(),
            **({"servers_b": list(self.servers_b)} if self.config.ab else {}),
            **self.extra,
            "dropped": _merged(self.dropped, (previous.get("sequential") or {}).get("dropped", [])),
        }
        extra["provenance"] = provenance(self.config, extra["server_metadata"], extra["server"])
        if self.inherit:  # (the scenes' processes ran the simulator and spoke to the servers)
            extra.update({k: previous[k] for k in SUMMARY_FROM_CHILDREN if k in previous})
        extra["video_errors"] = {**previous.get("video_errors", {}), **self.video_errors}  # every segment's
        summary = build_summary(self.config, self.run_dir, segments=segments, extra=extra)
        self.run_dir.write_summary(summary)
        return summary


def _merged(mine: list[dict[str, Any]], theirs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The dropped episodes of this segment and those another process of the run wrote meanwhile, once each."""
    out = {(d["scene"], d["episode"], d.get("arm")): d for d in theirs}
    out.update({(d["scene"], d["episode"], d.get("arm")): d for d in mine})
    return list(out.values())


def run_segment(segment: RunSegment, executor: Executor) -> dict[str, Any]:
    """Run ``executor`` over ``segment`` and close both (see the module docstring); returns the summary.

    Raises what ended the run early, after the summary is written: ``KeyboardInterrupt`` on a repeated stop
    signal, or the simulator's, a server's or a shard's error (the summary then says ``aborted``)."""
    error: BaseException | None = None
    summary: dict[str, Any] = {}
    try:
        if len(segment.todo):
            executor.run(segment)
    except BaseException as exc:  # noqa: BLE001 - record what happened, write the summary, then re-raise
        error = exc
        segment.failed(exc)
    finally:
        with shielded():
            try:
                executor.close(segment, error)
            finally:
                summary = segment.close()
    if error is not None:
        raise error
    return summary


def write_report_page(run_dir: RunDir, say: Callable[[str], None] | None = None) -> bool:
    """Write ``report.html`` with ``dz-gym-report RUN_DIR`` (a process of its own, bounded by
    :data:`REPORT_TIMEOUT_S`); a failure is one warning line, never a lost run. True when it was written."""
    argv = [sys.executable, "-m", "dz_gym.report.cli", str(run_dir.path)]
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=REPORT_TIMEOUT_S, start_new_session=True,
                              env=dict(os.environ), check=False)  # fmt: skip
    except (OSError, subprocess.TimeoutExpired) as exc:
        logger.warning("report: could not write report.html in %s: %s", run_dir.path, first_line(exc))
        return False
    if done.returncode != 0:
        lines = [line for line in done.stderr.strip().splitlines() if line.strip()]
        logger.warning("report: could not write report.html in %s: %s", run_dir.path, lines[-1] if lines else "?")
        return False
    if say is not None:
        say(f"report: {done.stdout.strip()}")
    return True
