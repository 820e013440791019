"""The cyclic garbage collector while a scene steps: what the process held is kept out of its full passes, and
``--profile`` counts the pauses it still takes.

A process that has built Isaac Lab holds about 1.3 million objects that the collector tracks (torch, Warp,
Newton, USD, the task's managers). Each full (generation 2) collection walks all of them and stops every
thread meanwhile, about once per N = 1024 run; the pause landed on whatever allocated last, a request round's
packing or the episodes' bookkeeping, which then took many times their usual time in the profile
(benchmarks/journal/isaac3.md). Those
objects live as long as the scene's batch. So :func:`~dz_gym.eval.scene.scene_batch` calls
:func:`freeze_heap` once the batch is built, which moves them to the permanent generation
(:func:`gc.freeze`), and releases it after the batch is closed. Meanwhile collections walk only what the run
itself made. Reference counting still frees a frozen object as soon as nothing refers to it; only reference
cycles among them wait for the thaw. After the thaw the next full pass walks them once more, outside the
stepping.

Building that heap costs full passes too: the collector starts one each time the objects that survived its
younger generations grow by a quarter of what the last full pass kept, so importing and building Isaac Lab
walks the growing heap again and again (16 full passes in the GPU benchmark's child at N = 1024;
``benchmarks/bench_collector_build.py`` times them with and without the freeze, benchmarks/README.md).
``freeze_heap(as_it_grows=True)`` also freezes the survivors at the end of each full pass while it is held:
the next full pass then walks only what came since. :func:`~dz_gym.eval.scene.scene_batch` holds it while the
simulator is built, then takes the plain hold before it lets go of that one.

Scenes stepped side by side in one process nest: the last release thaws (:func:`gc.unfreeze`). A process
whose owner had frozen objects before the first freeze is never thawed here; that freeze is the owner's.

:class:`CollectorPauses` counts the passes per generation and the time they stopped the interpreter (all
threads wait for a pass); ``--profile`` reports them for the scene's stepping (``collector`` in
``profile.json``).
"""

from __future__ import annotations

import gc
import threading
import time
from collections.abc import Callable
from typing import Any

_lock = threading.Lock()
_holders = 0  # freezes not yet released
_owner_froze = False  # objects were frozen before the first of them: never unfreeze
_growing = 0  # holds that also freeze the survivors of each full pass


def _freeze_after_full_pass(phase: str, info: dict[str, Any]) -> None:
    # runs in the collector's "stop" callback: the pass is over, its survivors are the old generation
    if phase == "stop" and info.get("generation") == 2 and _growing:
        gc.freeze()


def freeze_heap(*, as_it_grows: bool = False) -> Callable[[], None]:
    """Freeze every object the collector tracks now (:func:`gc.freeze`); returns the release, which thaws
    them once no other freeze is held (a second call of the same release does nothing).

    ``as_it_grows``: until the release, also freeze what survives each full pass (for a heap being built)."""
    global _holders, _owner_froze, _growing
    with _lock:
        if _holders == 0:
            _owner_froze = gc.get_freeze_count() > 0
        _holders += 1
        gc.freeze()
        if as_it_grows:
            _growing += 1
            if _growing == 1:
                gc.callbacks.append(_freeze_after_full_pass)
    released = False

    def release() -> None:
        nonlocal released
        global _holders, _growing
        with _lock:
            if released:
                return
            released = True
            if as_it_grows:
                _growing -= 1
                if _growing == 0:
                    gc.callbacks.remove(_freeze_after_full_pass)
            _holders -= 1
            if _holders == 0 and not _owner_froze:
                gc.unfreeze()

    return release


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
