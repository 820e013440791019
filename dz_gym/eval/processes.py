"""The per-scene-process executor: each scene of the plan in a fresh ``dz-gym-eval`` process, all at once.

Rebuilding an Isaac Lab stage in one process can render wrong poses, so on Isaac Lab (or with
``--process-per-scene``) the command line runs the plan's scenes one per child process: ``dz-gym-eval ...
--resume RUN_DIR --only-scene S``, the same flags otherwise. The children run side by side (started
together), so the scenes advance in step as in one process (:mod:`dz_gym.eval.sidebyside`): a sequential
A/B test or a race, which folds the scenes' pairs interleaved in plan order, can stop early in any scene.
Each child runs that scene's entries of the same run plan with the in-process executor, appends its rows to
the one ``episodes.jsonl`` (a line per write) and, with a test, reads the other children's rows from it
(:class:`~dz_gym.eval.shared.SharedTest`): every child stops starting episodes at the same decision. This
process opened the run directory, holds its lock (handed down to each child: :mod:`dz_gym.eval.runlock`) and
closes it (the summary over every row, then the report) as
:func:`~dz_gym.eval.segment.run_segment` does for every executor; the children's stepping loops ran at the
same time, so their timing becomes one segment here (the steps added up, the wall time and each server's
busy time the longest child's: a lower bound for both).

With ``--scene-processes P`` at most P children run at once (each holds its simulator: on Isaac Lab an app on
the GPU); the next scene starts when one ends, and a test can then stop early only once the last scenes run
(their segments then stay one per child).
A stop request (first Ctrl-C) is forwarded to every running child (each in its own session, so a Ctrl-C in
the terminal reaches only this process). A child that fails does not stop the others. A child stops as on
SIGTERM when this process is gone, however it ended (``kill -9`` included): its stdin is a pipe from here
(:mod:`dz_gym.lifeline`).
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Sequence

from dz_gym.eval.flags import COMMAND_ENV, EXIT_ABORTED, EXIT_INTERRUPTED, EXIT_OK, EXIT_USAGE
from dz_gym.eval.rundir import RunDir
from dz_gym.eval.segment import RunSegment
from dz_gym.eval.shared import summary_lock
from dz_gym.eval.signals import StopOnSignal

__all__ = ["SceneProcesses", "child_argv", "merge_segments", "merged_timing"]

WAIT_S = 0.2  # the longest this process waits on one child before it looks at the others
DROP_WITH_VALUE = ("--scene", "--task", "--resume", "--output-root", "--only-scene", "--parent-pid")


def child_argv(argv: Sequence[str], run_dir: str, scene: int) -> list[str]:
    """The child's command line: ``argv`` without what names the scenes or the run directory, then
    ``--resume RUN_DIR --only-scene S`` and ``--parent-pid`` this process's (:mod:`dz_gym.lifeline`).

    >>> child_argv(["--scene", "1", "--scene=2", "--num-envs", "4"], "runs/x", 2)[3:-2]
    ['--num-envs', '4', '--resume', 'runs/x', '--only-scene', '2']
    """
    base: list[str] = []
    skip = False
    for item in argv:
        if skip:
            skip = False
            continue
        if item.split("=", 1)[0] in DROP_WITH_VALUE:
            skip = "=" not in item
            continue
        base.append(item)
    return [sys.executable, "-m", "dz_gym.eval.cli", *base, "--resume", str(run_dir), "--only-scene", str(scene),
            "--parent-pid", str(os.getpid())]  # fmt: skip


def merged_timing(segments: Sequence[dict]) -> dict:
    """One segment for stepping loops that ran at the same time (see the module docstring).

    >>> merged_timing([{"started_at": "t1", "wall_s": 2.0, "env_steps": 10, "busy_s": {"ws://a": 1.0}},
    ...                {"started_at": "t0", "wall_s": 3.0, "env_steps": 5, "busy_s": {"ws://a": 0.5}}])
    {'started_at': 't0', 'wall_s': 3.0, 'env_steps': 15, 'busy_s': {'ws://a': 1.0}}
    """
    busy: dict[str, float] = {}
    for seg in segments:
        for url, seconds in seg.get("busy_s", {}).items():
            busy[url] = max(busy.get(url, 0.0), float(seconds))
    return {"started_at": min(seg["started_at"] for seg in segments),
            "wall_s": max(float(seg["wall_s"]) for seg in segments),
            "env_steps": sum(int(seg["env_steps"]) for seg in segments), "busy_s": busy}  # fmt: skip


def merge_segments(run_dir: RunDir, before: int) -> None:
    """Replace the segments the children added to ``summary.json`` (those after the first ``before``) by one."""
    with summary_lock(run_dir):
        summary = run_dir.read_summary()
        if summary is None or len(summary.get("segments", [])) - before < 2:
            return
        summary["segments"] = summary["segments"][:before] + [merged_timing(summary["segments"][before:])]
        run_dir.write_summary(summary)


class SceneProcesses:
    """Runs each scene of the segment's plan in a child process, all at once (see the module docstring);
    ``code`` is the exit status the command should end with (the first child's in scene order that was not
    0, else 0)."""

    def __init__(self, argv: Sequence[str], command: str, say, at_once: int | None = None):
        if at_once is not None and (not isinstance(at_once, int) or at_once < 1):
            raise ValueError(f"at_once: expected an integer >= 1 (scene processes at the same time), got {at_once!r}")
        self.argv = list(argv)
        self.command = command
        self.say = say
        self.at_once = at_once  # None: every scene's process at once
        self.code = EXIT_OK

    def run(self, segment: RunSegment) -> None:
        env = dict(os.environ)
        env[COMMAND_ENV] = self.command
        env.update(segment.lock.child_env())  # the children write under this process's lock
        children: list[subprocess.Popen] = []  # the running ones (a signal is forwarded to them)
        before = len((segment.run_dir.read_summary() or {}).get("segments", []))
        pending, codes, scene_of = list(segment.todo.scene_order()), {}, {}
        at_once = self.at_once or max(1, len(pending))
        together = at_once >= len(pending)  # every child at once: their stepping loops overlap
        with StopOnSignal(segment.control.stop, self.say, children):
            while pending or children:
                if pending and segment.control.stop.is_set():
                    codes.update({scene: EXIT_INTERRUPTED for scene in pending})
                    pending.clear()
                if pending and len(children) < at_once:
                    scene = pending.pop(0)
                    self.say(f"dz-gym-eval: scene {scene} in a new process")
                    proc = subprocess.Popen(child_argv(self.argv, str(segment.run_dir.path), scene), env=env,
                                            stdin=subprocess.PIPE, start_new_session=True,
                                            pass_fds=(segment.lock.fd,))  # fmt: skip
                    scene_of[proc.pid] = scene
                    children.append(proc)
                    continue
                try:
                    children[0].wait(timeout=WAIT_S)
                except subprocess.TimeoutExpired:
                    pass
                for proc in [p for p in children if p.poll() is not None]:
                    codes[scene_of[proc.pid]] = proc.returncode
                    children.remove(proc)
                    proc.stdin.close()  # the child's pipe to this process (never written: its end is the signal)
                    if proc.returncode == EXIT_USAGE:  # the flags: every scene's process would end the same way
                        pending.clear()
        order = segment.todo.scene_order()
        self.code = next((codes[s] for s in order if codes.get(s, EXIT_OK) != EXIT_OK), EXIT_OK)
        if together:
            merge_segments(segment.run_dir, before)
        if self.code == EXIT_INTERRUPTED:
            segment.control.stop.set()
        elif self.code not in (EXIT_OK, EXIT_USAGE):
            child = segment.run_dir.read_summary() or {}
            segment.aborted = child.get("aborted") or f"scene process exited with status {self.code}"

    def close(self, segment: RunSegment, error: BaseException | None) -> None:
        return None

    def exit_code(self, summary: dict | None) -> int:
        """The command's exit status after the summary is written."""
        code = self.code
        if code == EXIT_OK and (summary is None or not summary.get("complete")):
            code = EXIT_ABORTED
        return code if code in (EXIT_OK, EXIT_ABORTED, EXIT_USAGE, EXIT_INTERRUPTED) else EXIT_ABORTED
