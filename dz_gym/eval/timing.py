"""The timing of a stepping loop, which rows cannot carry: steps, wall time, each server's busy time (pure).

A :class:`SceneResult` is what :class:`~dz_gym.eval.runner.SceneRunner` returns for one scene's batch;
:func:`side_by_side` merges the results of batches that stepped in the same loop (their wall time is the
loop's, not the sum; a server's busy time is the union of every batch's requests to it).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence
from typing import Any

__all__ = ["SceneResult", "side_by_side", "union_seconds"]


@dataclasses.dataclass
class SceneResult:
    """Timing of one scene's stepping loop (what rows cannot carry)."""

    scene: int
    env_steps: int = 0  # steps of the episodes that ran (finished or not)
    wall_s: float = 0.0  # from the first reset to the end of the loop
    busy_s: dict[str, float] = dataclasses.field(default_factory=dict)  # per server URL
    stopped: bool = False  # ended by a stop request or the error budget
    dropped: list[dict[str, Any]] = dataclasses.field(default_factory=list)  # cut off by a sequential stop
    intervals: dict[str, list[tuple[float, float]]] = dataclasses.field(default_factory=dict)  # per URL


def union_seconds(intervals: Iterable[tuple[float, float]]) -> float:
    """Total length of the union of ``(start, end)`` intervals.

    >>> union_seconds([(0.0, 2.0), (1.0, 3.0), (5.0, 6.0)])
    4.0
    """
    total, end = 0.0, float("-inf")
    for start, stop in sorted(intervals):
        if stop <= end:
            continue
        total += stop - max(start, end)
        end = stop
    return total


def side_by_side(results: Sequence[SceneResult], wall_s: float) -> SceneResult:
    """One result for batches stepped in one loop of ``wall_s`` seconds (``scene``: the first batch's).

    >>> a = SceneResult(1, env_steps=4, intervals={"ws://s": [(0.0, 2.0)]})
    >>> b = SceneResult(2, env_steps=6, intervals={"ws://s": [(1.0, 3.0)]}, stopped=True)
    >>> both = side_by_side([a, b], 3.5)
    >>> both.env_steps, both.wall_s, both.busy_s, both.stopped
    (10, 3.5, {'ws://s': 3.0}, True)
    """
    if not results:
        raise ValueError("results: expected at least one scene's result")
    out = SceneResult(results[0].scene, wall_s=float(wall_s))
    for result in results:
        out.env_steps += result.env_steps
        out.stopped = out.stopped or result.stopped
        out.dropped.extend(result.dropped)
        for url, spans in result.intervals.items():
            out.intervals.setdefault(url, []).extend(spans)
    out.busy_s = {url: union_seconds(spans) for url, spans in out.intervals.items()}
    return out
