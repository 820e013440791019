"""The driver-side collector: a small Ray actor on the driver's node that shards push their rows to.

Shards cannot call the driver process, so they push to this actor (:meth:`Collector.push`), and the driver
drains it (:meth:`Collector.drain`) in bounded batches; both calls are short and bounded on the caller's side.
The reply to a push carries the stop request (Ctrl-C on the driver, an exhausted error budget), so a shard
learns of it within one push interval. Rows wait here only until the next drain; the driver writes them to
``episodes.jsonl``.
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
