"""What dz-gym may do to the process it runs in, each a setting that the process opts into:
:class:`HostProcessSettings`, in effect while :func:`applied` is entered.

Both settings concern the memory where a transport's worker processes read a GPU batch's views; neither
touches the process's allocator or its garbage collector. A library user who builds a
:class:`~dz_gym.transport.SessionPool`, a :class:`~dz_gym.transport.ProcessSessionPool` (or
:func:`~dz_gym.transport.open_pool`'s) or the wrapper gets none of it: their process's memory stays as it is.
``dz-gym-eval`` opts in to both (its in-process executor and each Ray shard enter :func:`applied`), so its
behaviour is the same whoever calls it; why each one is on there is measured in benchmarks/README.md
(``benchmarks/bench_mechanisms.py`` turns each off in turn). The settings, both on in
``HostProcessSettings()`` and both off in :data:`UNTOUCHED`:

- ``page_lock``: the transport's view memory (:class:`~dz_gym.transport.workers.views.HostViews`, where a GPU
  batch's views are copied for the worker processes) registered with CUDA as page-locked
  (``cudaHostRegister``) where this process has CUDA initialised, so that the copy from the GPU is one DMA
  transfer; unregistered when the pool closes. Off: the memory stays pageable and CUDA stages the copy.
- ``populate_views``: that view memory made ahead, when the wrapper resets the envs, with its pages mapped
  (``madvise(MADV_POPULATE_WRITE)``) and page-locked on a thread of its own while the env resets, so that
  the first request round's copy finds them ready. Off: the first batch that needs a segment makes it and
  its first copy faults the pages in.

The evaluator gives the settings in effect to the pools it builds (``open_pool(..., host=...)``: a
:class:`~dz_gym.transport.ProcessSessionPool`'s view memory does what they say); nothing else of the
transport asks here.

dz-gym neither sets glibc's heap thresholds (``mallopt``) nor freezes the garbage collector's heap
(``gc.freeze``): both were measured end to end and gained nothing beyond the run-to-run spread (the A/B of
benchmarks/README.md). A user who wants the thresholds sets ``MALLOC_MMAP_THRESHOLD_`` and
``MALLOC_TRIM_THRESHOLD_`` in the environment; the worker processes inherit them.

Not settings, because every worker start needs them, and each is undone at once
(:func:`dz_gym.spawning.start_worker`): dz-gym's worker processes (the transport's, the embedded simulator's)
start from a ``spawn`` context (the process's default start method is never set), with the caller's
``__main__`` hidden, the variables the workers need in the environment and ``SIGINT`` blocked, each for the
moment of the start. Besides, a GPU batch's views that go to an in-process pool are copied through PyTorch's
own page-locked buffers (its host allocator's, which it reuses: :mod:`dz_gym.requests`), the embedded
simulator sets ``MUJOCO_GL`` to ``egl`` where it is unset (:mod:`dz_gym.envs.mujoco.gl`: MuJoCo reads it at
its import), and the evaluator's command line handles ``SIGINT`` and ``SIGTERM`` while it runs
(:mod:`dz_gym.eval.signals`).

:func:`applied` puts back the settings in effect before it on the way out; page-locked and populated memory
goes with its pool.
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
from collections.abc import Iterator

__all__ = ["UNTOUCHED", "HostProcessSettings", "applied", "in_effect"]


@dataclasses.dataclass(frozen=True)
class HostProcessSettings:
    """What dz-gym may do to this process (see the module docstring); every field on by default, as
    ``dz-gym-eval`` runs."""

    page_lock: bool = True
    populate_views: bool = True

    def __post_init__(self) -> None:
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if not isinstance(value, bool):
                raise ValueError(f"HostProcessSettings.{field.name}: expected True or False, got {value!r}")

    def without(self, *names: str) -> HostProcessSettings:
        """These settings with ``names`` turned off (an A/B's arm); a one-line error names an unknown one."""
        known = [field.name for field in dataclasses.fields(self)]
        for name in names:
            if name not in known:
                raise ValueError(f"HostProcessSettings: expected settings from {', '.join(known)}, got {name!r}")
        return dataclasses.replace(self, **dict.fromkeys(names, False))


UNTOUCHED = HostProcessSettings(page_lock=False, populate_views=False)
"""Nothing done to the process: what a library user gets who did not opt in."""

_lock = threading.RLock()
_stack: list[HostProcessSettings] = []  # the settings of each applied() entered, innermost last


def in_effect() -> HostProcessSettings:
    """The settings of the innermost :func:`applied` entered in this process, else :data:`UNTOUCHED`."""
    with _lock:
        return _stack[-1] if _stack else UNTOUCHED


@contextlib.contextmanager
def applied(settings: HostProcessSettings | None = None) -> Iterator[HostProcessSettings]:
    """Opt this process in to ``settings`` while entered; yields them. None: the settings already in effect
    when some are (a benchmark's arm that turned one off keeps it through the evaluator's own opt-in), else
    ``HostProcessSettings()``. On the way out the settings in effect before are put back."""
    with _lock:
        if settings is None:
            settings = _stack[-1] if _stack else HostProcessSettings()
        if not isinstance(settings, HostProcessSettings):
            raise ValueError(f"settings: expected a HostProcessSettings, got {type(settings).__name__}")
        _stack.append(settings)
    try:
        yield settings
    finally:
        with _lock:
            _stack.pop()
