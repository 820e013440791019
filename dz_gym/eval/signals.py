"""Ctrl-C and SIGTERM for the evaluator: stop at a step boundary, and never lose what is finished.

The first SIGINT/SIGTERM sets the run's stop event: the stepping loop ends at the next step boundary, the
episodes in progress are dropped (their partial videos deleted) and ``summary.json`` is written. A second
signal stops *now*, but only where stopping now is safe: inside an :func:`interruptible` block (the stepping
loop and the waits on the network) it raises ``KeyboardInterrupt``; elsewhere (start-up of the simulator's
worker processes, writing the results) it is noted and the work there finishes first, so the summary is
always written and no worker is left half-started. A third signal raises anyway, except inside a
:func:`shielded` block (writing the results).

A signal that is ignored when the ``with`` block starts stays ignored: a program started with SIGINT ignored
(a background job of a non-interactive shell, some CI runners) was asked not to react to Ctrl-C, so only
SIGTERM stops it then. The handlers in place before are restored at the end, whatever they were.

Only the main thread sets handlers (Python runs them there); :func:`interruptible` is process-wide state,
as signals are.
"""

from __future__ import annotations

import contextlib
import signal
import subprocess
import threading
from collections.abc import Callable, Iterator
from typing import Any

_depth = 0  # interruptible blocks entered; process-wide, as signal dispositions are
_shield = 0  # shielded blocks entered: no KeyboardInterrupt from a signal at all


@contextlib.contextmanager
def interruptible() -> Iterator[None]:
    """A block where a repeated stop signal may raise ``KeyboardInterrupt`` (a no-op without a handler)."""
    global _depth
    _depth += 1
    try:
        yield
    finally:
        _depth -= 1


@contextlib.contextmanager
def shielded() -> Iterator[None]:
    """A block that no stop signal interrupts (writing the results), however often it comes."""
    global _shield
    _shield += 1
    try:
        yield
    finally:
        _shield -= 1


def signal_name(signum: int) -> str:
    return "Ctrl-C" if signum == signal.SIGINT else signal.Signals(signum).name


class StopOnSignal:
    """Handle SIGINT/SIGTERM while the ``with`` block runs (see the module docstring).

    ``stop`` is the event the run polls at step boundaries; ``say`` prints one line to the user. With
    ``children`` (per-scene processes, each in its own session) every signal is forwarded to the running
    child instead, which stops the same way; this process only stops starting new children.
    """

    def __init__(
        self, stop: threading.Event, say: Callable[[str], None], children: list[subprocess.Popen] | None = None
    ):
        self.stop = stop
        self.say = say
        self.children = children
        self.signals = 0
        self.last: int | None = None
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> StopOnSignal:
        for sig in (signal.SIGINT, signal.SIGTERM):
            if signal.getsignal(sig) is signal.SIG_IGN:  # the user asked to ignore it: keep ignoring it
                continue
            try:
                self._previous[sig] = signal.signal(sig, self._handle)
            except ValueError:  # not the main thread: the caller handles signals
                pass
        return self

    def _handle(self, signum: int, frame: Any) -> None:
        self.signals += 1
        self.last = signum
        name = signal_name(signum)
        self.stop.set()
        if self.children is not None:
            for proc in self.children:
                if proc.poll() is None:
                    proc.send_signal(signum)
            return
        again = "Ctrl-C again" if signum == signal.SIGINT else f"send {name} again"
        if self.signals == 1:
            self.say(f"dz-gym-eval: {name}: stopping after this step (finished episodes are kept); {again} to stop now")
            return
        if _shield == 0 and (_depth > 0 or self.signals > 2):
            raise KeyboardInterrupt
        self.say(f"dz-gym-eval: {name} again: stopping as soon as start-up or the results' writing is done")

    def __exit__(self, *exc: Any) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()
