"""``dz-gym-eval`` in a process of its own, as a user runs it from a terminal, for the tests that signal it.

:class:`Evaluator` starts ``python -m dz_gym.eval.cli`` in its own process group (a terminal's job), with
SIGINT at its default as in a terminal even where the test process inherited it ignored, and reads its
stderr line by line, so a test can wait for what the evaluator says it is doing instead of sleeping.
"""

from __future__ import annotations

import os
import queue
import signal
import subprocess
import threading
import time

import pytest

from dz_gym.testing.sigint import python_argv

BOUND_S = 180  # every wait on the evaluator subprocess is bounded by this


class Evaluator:
    """``python -m dz_gym.eval.cli ...`` in its own process group (a terminal's job), stderr read by lines.

    SIGINT starts at its default, as in a terminal, even where this test process inherited it ignored;
    ``sigint="ignore"`` starts it ignored instead (a background job of a script)."""

    def __init__(self, argv, sigint: str = "default"):
        env = dict(os.environ, MUJOCO_GL=os.environ.get("MUJOCO_GL", "egl"))
        self.proc = subprocess.Popen(
            python_argv("-m", "dz_gym.eval.cli", *argv, sigint=sigint),
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        self.err_lines: list[str] = []
        self.out_lines: list[str] = []
        self._lines: queue.Queue = queue.Queue()
        self._readers = [
            threading.Thread(target=self._read, daemon=True),
            threading.Thread(target=self._read_out, daemon=True),
        ]
        for reader in self._readers:
            reader.start()

    def _read(self):
        for line in self.proc.stderr:
            self._lines.put(line)
        self._lines.put(None)

    def _read_out(self):
        self.out_lines.extend(self.proc.stdout)

    def wait_for_line(self, needle: str) -> str:
        """The first stderr line containing ``needle`` (bounded; fails if the process ends first)."""
        deadline = time.monotonic() + BOUND_S
        while time.monotonic() < deadline:
            line = self._lines.get(timeout=max(0.1, deadline - time.monotonic()))
            if line is None:
                pytest.fail(f"the evaluator ended before printing {needle!r}: {''.join(self.err_lines)}")
            self.err_lines.append(line)
            if needle in line:
                return line
        pytest.fail(f"no line with {needle!r} within {BOUND_S} s")

    def signal_group(self, signum=signal.SIGINT):
        os.killpg(self.proc.pid, signum)  # like Ctrl-C in a terminal: the whole process group gets it

    def finish(self) -> tuple[int, str, str]:
        """Wait (bounded) for the process to end: its exit status, stdout and the whole of stderr."""
        try:
            self.proc.wait(BOUND_S)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
        for reader in self._readers:
            reader.join(BOUND_S)
        out = "".join(self.out_lines)
        while not self._lines.empty():
            line = self._lines.get_nowait()
            if line is not None:
                self.err_lines.append(line)
        return self.proc.returncode, out, "".join(self.err_lines)
