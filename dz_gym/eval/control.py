"""What the command line, the executors and the scene runners share about a run in progress: :class:`RunControl`.

One object per run: the stop request (set by a signal, a test or an exhausted error budget, read at every step
boundary), the count of errored episodes against the error budget (``--max-errors``), and a hook that sees each
finished episode's row (the experiment trackers hang on it).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["RunControl"]


class RunControl:
    """The stop request and the error budget of a run.

    ``stop`` is set by Ctrl-C (or a test); ``record`` counts errored episodes and sets ``aborted`` (and
    ``stop``) once more than ``error_budget`` have errored.

    >>> control = RunControl(error_budget=1)
    >>> control.record({"error": "lost"}); control.record({"error": "lost"})
    >>> control.aborted, control.stop.is_set(), control.interrupted
    ('more than --max-errors=1 errored episodes', True, False)
    """

    def __init__(self, error_budget: int | None = None, errored: int = 0):
        self.stop = threading.Event()
        self.error_budget = error_budget
        self.errored = int(errored)
        self.aborted: str | None = None
        self.rows_written = 0
        self.on_row: Callable[[dict], None] | None = None  # hook called with each finished episode's row

    def record(self, row: Mapping[str, Any]) -> None:
        self.rows_written += 1
        if row["error"] is not None:
            self.errored += 1
            if self.error_budget is not None and self.errored > self.error_budget and self.aborted is None:
                self.aborted = f"more than --max-errors={self.error_budget} errored episodes"
                self.stop.set()
        if self.on_row is not None:
            self.on_row(dict(row))

    @property
    def interrupted(self) -> bool:
        """Whether the run was asked to stop (rather than aborted by its error budget)."""
        return self.stop.is_set() and self.aborted is None
