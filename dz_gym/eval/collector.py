"""The cyclic garbage collector's pauses while a scene steps, which ``--profile`` reports (``collector`` in
``profile.json``): :class:`CollectorPauses` counts the passes per generation and the time they stopped the
interpreter (all threads wait for a pass).

A process that has built a simulator holds many objects the collector tracks (about 1.3 million for Isaac
Lab), and each full (generation 2) pass walks all of them; these counts show how often that happens and what
it costs.
"""

from __future__ import annotations

import gc
import time
from typing import Any


class CollectorPauses:
    """While entered (a context manager): the collector's passes, per generation, and their seconds."""

    def __init__(self) -> None:
        self.passes = [0, 0, 0]
        self.seconds = [0.0, 0.0, 0.0]
        self._started = 0.0

    def __enter__(self) -> CollectorPauses:
        gc.callbacks.append(self._on_pass)
        return self

    def __exit__(self, *exc: Any) -> None:
        gc.callbacks.remove(self._on_pass)

    def _on_pass(self, phase: str, info: dict[str, Any]) -> None:
        # a pass holds the interpreter lock from its start to its stop: one start at a time
        if phase == "start":
            self._started = time.perf_counter()
            return
        generation = int(info.get("generation", 2))
        if 0 <= generation < 3:
            self.passes[generation] += 1
            self.seconds[generation] += time.perf_counter() - self._started

    def report(self) -> dict[str, list]:
        """``{"passes": [gen 0, 1, 2], "seconds": [gen 0, 1, 2]}``."""
        return {"passes": list(self.passes), "seconds": list(self.seconds)}
