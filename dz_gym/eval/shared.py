"""What the processes of one run share in its run directory while they run at once (a process per scene).

- :class:`SharedTest`: the sequential A/B test (or ``--select-best`` race) of one of those processes. The
  test folds pairs in plan order, with the scenes interleaved (:mod:`dz_gym.eval.ab`), so a process that
  runs one scene can fold only as far as the other scenes' rows reach: besides the rows of its own scene
  (from its runner), it reads the rows the other processes append to ``episodes.jsonl`` as they come (at
  most every ``poll_s`` seconds, when the runner asks whether the test has stopped). Every process then
  reaches the same decision at the same pair, a moment after the row that decided it is on disk, and stops
  starting episodes as one process would.
- :func:`summary_lock`: an exclusive lock (``flock`` on ``.summary.lock``) around a process's read, merge
  and write of ``summary.json``, so that two processes ending at once do not lose each other's timing.

Only complete lines are read (a row being appended is read on a later poll); a row whose scene is this
process's own is skipped there (the runner has already given it to the test).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

from dz_gym.eval.rundir import ROWS_FILE, RunDir

__all__ = ["SharedTest", "summary_lock"]

LOCK_FILE = ".summary.lock"
POLL_S = 0.1


@contextlib.contextmanager
def summary_lock(run_dir: RunDir) -> Iterator[None]:
    """Hold the run directory's summary lock (blocks while another process of the run holds it)."""
    with open(run_dir.path / LOCK_FILE, "a+b") as f:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f.fileno(), fcntl.LOCK_UN)


class SharedTest:
    """The test of one process of a run whose scenes run in processes at once (see the module docstring).

    ``make(rows)`` builds the test from rows (:func:`~dz_gym.eval.summary.pair_tracker`); ``own``: this
    process's scenes. Built from every complete row on disk now; the runner passes its own rows to
    :meth:`add`; anything else (``eliminated_arms``, ``pairs_twins``, ``summary``, ...) is the test's."""

    def __init__(self, make: Callable[[Sequence[Mapping[str, Any]]], Any], run_dir: RunDir, own: Iterable[int],
                 *, poll_s: float = POLL_S):  # fmt: skip
        self.path = run_dir.path / ROWS_FILE
        self.own = {int(s) for s in own}
        self.poll_s = float(poll_s)
        self.offset = 0
        self.test = make(self._new_rows())
        self._next_poll = time.monotonic() + self.poll_s

    def _new_rows(self) -> list[dict[str, Any]]:
        """The complete rows appended since the last read (every row on the first)."""
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                data = f.read()
        except FileNotFoundError:
            return []
        end = data.rfind(b"\n") + 1
        self.offset += end
        return [json.loads(line) for line in data[:end].splitlines() if line.strip()]

    def poll(self) -> None:
        """Give the test the other processes' rows appended since the last poll."""
        self._next_poll = time.monotonic() + self.poll_s
        for row in self._new_rows():
            if int(row["scene"]) not in self.own:
                self.test.add(row)

    @property
    def stopped(self) -> bool:
        if not self.test.stopped and time.monotonic() >= self._next_poll:
            self.poll()
        return self.test.stopped

    def add(self, row: Mapping[str, Any]) -> bool:
        """Take one of this process's rows; returns :attr:`stopped` after it."""
        self.test.add(row)
        return self.stopped

    def __getattr__(self, name: str) -> Any:
        test = self.__dict__.get("test")
        if test is None:  # not built yet (or a copy being restored)
            raise AttributeError(name)
        return getattr(test, name)
