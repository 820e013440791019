"""The driver-side collector: a small Ray actor on the driver's node that shards push their rows to.

Shards cannot call the driver process, so they push to this actor (:meth:`Collector.push`), and the driver
drains it (:meth:`Collector.drain`) in bounded batches; both calls are short and bounded on the caller's side.
The reply to a push carries the stop request (Ctrl-C on the driver, an exhausted error budget), so a shard
learns of it within one push interval. Rows wait here only until the next drain; the driver writes them to
``episodes.jsonl``.

It also holds the start line of a run: the shards first started :meth:`arrive` once their simulators are
built, and step only once every one of them has arrived (or left: its actor failed before, see
:meth:`leave`), so that their stepping loops run side by side from the first step. The shards have equal
work, so the last to be built ends last either way: waiting costs the run no time, and the run's env-steps/s
(first reset to last step) then measures the shards stepping together, not their staggered start-up.
"""

from __future__ import annotations

from collections import deque
from typing import Any


class Collector:
    """Rows, step counts and the stop flag shared by the driver and its shards (used as a Ray actor)."""

    def __init__(self) -> None:
        self._items: deque[tuple[int, int, dict[str, Any]]] = deque()
        self._steps = 0
        self._latency_ms: float | None = None
        self._stop = False
        self._start_waiting: set[int] = set()

    def expect_start(self, shards: list[int]) -> None:
        """The shards whose first call waits at the start line (the driver, before it submits them)."""
        self._start_waiting = {int(s) for s in shards}

    def arrive(self, shard: int) -> bool:
        """Shard ``shard`` is ready to step; returns whether every expected shard is (the start is given)."""
        self._start_waiting.discard(int(shard))
        return self.started()

    def leave(self, shard: int) -> None:
        """Shard ``shard`` will not arrive (its actor failed or was lost): nobody waits for it."""
        self._start_waiting.discard(int(shard))

    def started(self) -> bool:
        return not self._start_waiting or self._stop

    def push(
        self, shard: int, attempt: int, payloads: list[dict[str, Any]], steps: int, latency_ms: float | None
    ) -> bool:
        """A shard's finished episodes and steps since its last push; returns whether to stop."""
        for payload in payloads:
            self._items.append((int(shard), int(attempt), payload))
        self._steps += int(steps)
        if latency_ms is not None:
            self._latency_ms = float(latency_ms)
        return self._stop

    def drain(self, max_items: int = 64) -> tuple[list[tuple[int, int, dict[str, Any]]], int, float | None]:
        """Up to ``max_items`` rows in arrival order, the steps pushed since the last drain, the last latency."""
        out = []
        while self._items and len(out) < max_items:
            out.append(self._items.popleft())
        steps, self._steps = self._steps, 0
        return out, steps, self._latency_ms

    def request_stop(self) -> None:
        self._stop = True

    def stopping(self) -> bool:
        return self._stop
