"""A policy for the reference server that answers a set number of inferences, then holds the rest.

Tests that stop a run (Ctrl-C, SIGTERM) must send the signal while the run is certainly still going, whatever
the machine's speed: with ``GatedPolicy(inner, free=k)`` the run cannot get past its ``k``-th reply until the
test says so. ``held`` is set as soon as an inference waits at the gate; :meth:`allow` raises the number of
inferences answered in all (so a test can let the steps in flight finish while the run still cannot
complete), :meth:`open` answers everything. Every wait is bounded (``hold_s``): a forgotten gate ends a test
slowly, never hangs it. Everything else (``metadata``, ``reset``, ...) is the inner policy's.

>>> from dz_gym.server.policies import load_policy
>>> gated = GatedPolicy(load_policy("hold"), free=0, hold_s=0.01)
>>> gated.allow(1)
>>> gated.answered, gated.held.is_set()
(0, False)
"""

from __future__ import annotations

import math
import threading
from typing import Any

HOLD_S = 180.0  # the longest an inference waits at a closed gate


class GatedPolicy:
    """Answers the first ``free`` inferences, holds later ones until :meth:`allow` or :meth:`open`."""

    def __init__(self, inner: Any, free: int, hold_s: float = HOLD_S):
        self.inner = inner
        self.hold_s = float(hold_s)
        self.limit: float = free
        self.calls = 0  # inferences received
        self.answered = 0  # inferences let through the gate
        self.held = threading.Event()
        self._cond = threading.Condition()

    def __getattr__(self, name: str) -> Any:  # metadata, reset, ...: the inner policy's
        return getattr(self.__dict__["inner"], name)

    def allow(self, total: int) -> None:
        """Let inferences through until ``total`` have been answered in all."""
        with self._cond:
            self.limit = total
            self._cond.notify_all()

    def open(self) -> None:
        """Answer every inference from now on."""
        self.allow(math.inf)

    def infer(self, request, *, session_id, new_session):
        with self._cond:
            self.calls += 1
            if self.answered >= self.limit:
                self.held.set()
                self._cond.wait_for(lambda: self.answered < self.limit, timeout=self.hold_s)
            self.answered += 1
        return self.inner.infer(request, session_id=session_id, new_session=new_session)
