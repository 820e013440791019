"""The per-scene-process executor: each scene of the plan in a fresh ``dz-gym-eval`` process, in turn.

Rebuilding an Isaac Lab stage in one process can render wrong poses, so on Isaac Lab (or with
``--process-per-scene``) the command line runs the plan's scenes one per child process: ``dz-gym-eval ...
--resume RUN_DIR --only-scene S``, the same flags otherwise. Each child runs that scene's entries of the same
run plan with the in-process executor and writes its rows and its run segment's timing; this process opened
the run directory, holds its lock (handed down to each child: :mod:`dz_gym.eval.runlock`) and closes it (the summary over every row and every child's segment, then the report) as
:func:`~dz_gym.eval.segment.run_segment` does for every executor.

A stop request (first Ctrl-C) is forwarded once to the running child (its own session, so a Ctrl-C in the
terminal reaches only this process); no further scene starts.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Sequence

from dz_gym.eval.flags import COMMAND_ENV, EXIT_ABORTED, EXIT_INTERRUPTED, EXIT_OK, EXIT_USAGE
from dz_gym.eval.segment import RunSegment
from dz_gym.eval.signals import StopOnSignal

__all__ = ["SceneProcesses", "child_argv"]

DROP_WITH_VALUE = ("--scene", "--task", "--resume", "--output-root", "--only-scene")


def child_argv(argv: Sequence[str], run_dir: str, scene: int) -> list[str]:
    """The child's command line: ``argv`` without what names the scenes or the run directory, then
    ``--resume RUN_DIR --only-scene S``.

    >>> child_argv(["--scene", "1", "--scene=2", "--num-envs", "4"], "runs/x", 2)[3:]
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
    return [sys.executable, "-m", "dz_gym.eval.cli", *base, "--resume", str(run_dir), "--only-scene", str(scene)]


class SceneProcesses:
    """Runs each scene of the segment's plan in a child process (see the module docstring); ``code`` is the
    exit status the command should end with (the first child's that was not 0, else 0)."""

    def __init__(self, argv: Sequence[str], command: str, say):
        self.argv = list(argv)
        self.command = command
        self.say = say
        self.code = EXIT_OK

    def run(self, segment: RunSegment) -> None:
        env = dict(os.environ)
        env[COMMAND_ENV] = self.command
        env.update(segment.lock.child_env())  # the children write under this process's lock
        children: list[subprocess.Popen] = []
        with StopOnSignal(segment.control.stop, self.say, children):
            for scene in segment.todo.scene_order():
                if segment.control.stop.is_set():
                    self.code = EXIT_INTERRUPTED
                    break
                self.say(f"dz-gym-eval: scene {scene} in a new process")
                argv = child_argv(self.argv, str(segment.run_dir.path), scene)
                proc = subprocess.Popen(argv, env=env, start_new_session=True, pass_fds=(segment.lock.fd,))
                children[:] = [proc]
                self.code = proc.wait()
                if self.code != EXIT_OK:
                    break
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
