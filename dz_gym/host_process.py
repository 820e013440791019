"""What dz-gym may do to the process it runs in, each a setting that the process opts into:
:class:`HostProcessSettings`, in effect while :func:`applied` is entered.

A library user who builds a :class:`~dz_gym.transport.SessionPool`, a
:class:`~dz_gym.transport.ProcessSessionPool` (or :func:`~dz_gym.transport.open_pool`'s) or the wrapper gets
none of it: their process's allocator, garbage collector and memory stay as they are. ``dz-gym-eval`` opts in
to all of it (its in-process executor and each Ray shard enter :func:`applied`), so its behaviour is the same
whoever calls it; why each one is on there is measured in benchmarks/README.md
(``benchmarks/bench_mechanisms.py`` turns each off in turn). The settings, all on in ``HostProcessSettings()``
and all off in :data:`UNTOUCHED`:

- ``heap_thresholds``: glibc's mmap threshold raised to 64 MiB and its trim threshold to 256 MiB
  (``mallopt``; what ``MALLOC_MMAP_THRESHOLD_`` and ``MALLOC_TRIM_THRESHOLD_`` do), once a pool of this
  process sends its first round of requests (:func:`keep_round`; the simulator was built by then). Each
  request is about 0.5 MB (three 180x320 views): its msgpack bytes, its websocket frame and the frame's
  masked copy are each one allocation above glibc's default threshold, so each would be mapped, faulted in
  page by page and unmapped again; with the thresholds they are reused from the heap. A round larger than
  the trim threshold raises it to cover the round (up to :data:`TRIM_CAP`), so the heap is not trimmed
  between rounds. The price: the process keeps up to the trim threshold of freed memory. Only on glibc, and
  never where either variable is set (the user decided). A :class:`~dz_gym.transport.ProcessSessionPool`
  given this setting has its worker processes set the same thresholds in their own process.
- ``freeze_collector``: the objects a built simulator holds (about 1.3 million for Isaac Lab: torch, Warp,
  USD, the task's managers) kept out of the cyclic garbage collector's full passes while a scene's batch
  steps (:func:`freeze_collector`: :func:`gc.freeze`), and while it is built the survivors of each full pass
  as well, so that a full pass walks only what came since. Reference counting still frees a frozen object as
  soon as nothing refers to it; only reference cycles among them wait for the thaw, after the batch is
  closed. A freeze the process's owner made before is never thawed here.
- ``page_lock``: the transport's view memory (:class:`~dz_gym.transport.workers.views.HostViews`, where a GPU
  batch's views are copied for the worker processes) registered with CUDA as page-locked
  (``cudaHostRegister``) where this process has CUDA initialised, so that the copy from the GPU is one DMA
  transfer; unregistered when the pool closes. Off: the memory stays pageable and CUDA stages the copy.
- ``populate_views``: that view memory made ahead, when the wrapper resets the envs, with its pages mapped
  (``madvise(MADV_POPULATE_WRITE)``) and page-locked on a thread of its own while the env resets, so that
  the first request round's copy finds them ready. Off: the first batch that needs a segment makes it and
  its first copy faults the pages in.

The evaluator gives the settings in effect to the pools it builds (``open_pool(..., host=...)``: a
:class:`~dz_gym.transport.ProcessSessionPool`'s view memory and workers do what they say); the one thing the
transport asks here is :func:`keep_round`, which does nothing in a process that did not opt in.

Not settings, because every worker start needs them, and each is undone at once
(:func:`dz_gym.spawning.start_worker`): dz-gym's worker processes (the transport's, the embedded simulator's)
start from a ``spawn`` context (the process's default start method is never set), with the caller's
``__main__`` hidden, the variables the workers need in the environment and ``SIGINT`` blocked, each for the
moment of the start. Besides, a GPU batch's views that go to an in-process pool are copied through PyTorch's
own page-locked buffers (its host allocator's, which it reuses: :mod:`dz_gym.requests`), the embedded
simulator sets ``MUJOCO_GL`` to ``egl`` where it is unset (:mod:`dz_gym.envs.mujoco.gl`: MuJoCo reads it at
its import), and the evaluator's command line handles ``SIGINT`` and ``SIGTERM`` while it runs
(:mod:`dz_gym.eval.signals`).

:func:`applied` puts back the settings in effect before it on the way out. Freezes are thawed by their
holders; page-locked and populated memory goes with its pool; the heap thresholds go back to glibc's initial
values (128 KiB), which is close to, not exactly, a process that never set them: glibc's own raising of the
mmap threshold stays off once it was set.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import dataclasses
import gc
import os
import threading
from collections.abc import Callable, Iterator
from typing import Any

__all__ = [
    "MMAP_THRESHOLD",
    "TRIM_CAP",
    "TRIM_THRESHOLD",
    "UNTOUCHED",
    "HostProcessSettings",
    "applied",
    "freeze_collector",
    "in_effect",
    "keep_round",
    "set_heap_thresholds",
    "trim_threshold",
]


@dataclasses.dataclass(frozen=True)
class HostProcessSettings:
    """What dz-gym may do to this process (see the module docstring); every field on by default, as
    ``dz-gym-eval`` runs."""

    heap_thresholds: bool = True
    freeze_collector: bool = True
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


UNTOUCHED = HostProcessSettings(heap_thresholds=False, freeze_collector=False, page_lock=False, populate_views=False)
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
    ``HostProcessSettings()``. On the way out the settings in effect before are put back (see the module
    docstring for what that undoes)."""
    with _lock:
        if settings is None:
            settings = _stack[-1] if _stack else HostProcessSettings()
        if not isinstance(settings, HostProcessSettings):
            raise ValueError(f"settings: expected a HostProcessSettings, got {type(settings).__name__}")
        _stack.append(settings)
        if not settings.heap_thresholds:
            _set_heap_thresholds(False)
    try:
        yield settings
    finally:
        with _lock:
            _stack.pop()
            if not (_stack[-1] if _stack else UNTOUCHED).heap_thresholds:
                _set_heap_thresholds(False)


# -- heap thresholds ---------------------------------------------------------------------------------------
MMAP_THRESHOLD = 64 * 2**20
TRIM_THRESHOLD = 256 * 2**20
GLIBC_INITIAL_THRESHOLD = 128 * 2**10
"""glibc's initial mmap and trim thresholds (what leaving ``heap_thresholds`` puts back)."""
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # glibc's mallopt parameters


def _trim_cap() -> int:
    """A quarter of the physical memory, at most what mallopt's C ``int`` holds (2 GiB)."""
    try:
        physical = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return TRIM_THRESHOLD
    return max(TRIM_THRESHOLD, min(2**31 - 1, physical // 4))


TRIM_CAP = _trim_cap()
"""The most :func:`keep_round` raises the trim threshold to."""

_trim = 0  # the trim threshold set here while the thresholds are in effect, else 0


_libc_mallopt: list[Any] = []  # the C library's mallopt (or None) once looked up


def _mallopt() -> Any:
    """The C library's ``mallopt`` (None where there is none, or where the user set the thresholds)."""
    if "MALLOC_MMAP_THRESHOLD_" in os.environ or "MALLOC_TRIM_THRESHOLD_" in os.environ:
        return None
    if not _libc_mallopt:  # looked up once (finding the library may run ldconfig)
        try:
            function = ctypes.CDLL(ctypes.util.find_library("c")).mallopt
            function.argtypes, function.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
        except (OSError, AttributeError, TypeError):
            function = None
        _libc_mallopt.append(function)
    return _libc_mallopt[0]


def set_heap_thresholds() -> bool:
    """Set the heap thresholds in this process now, whatever :func:`applied` says (what a transport worker
    process whose pool was given ``heap_thresholds`` does at its start); whether they are in effect."""
    with _lock:
        return _set_heap_thresholds(True)


def _set_heap_thresholds(on: bool) -> bool:
    """Put the thresholds in effect (``on``) or back to glibc's initial values where they were set here;
    whether they are in effect afterwards (caller holds the lock)."""
    global _trim
    if on == bool(_trim):
        return on
    mallopt = _mallopt()
    if mallopt is None:
        return False
    if not on:
        mallopt(_M_MMAP_THRESHOLD, GLIBC_INITIAL_THRESHOLD)
        mallopt(_M_TRIM_THRESHOLD, GLIBC_INITIAL_THRESHOLD)
        _trim = 0
        return False
    if mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD) and mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD):
        _trim = TRIM_THRESHOLD
    return bool(_trim)


def trim_threshold() -> int:
    """The trim threshold set here (0 while the heap thresholds are not in effect)."""
    return _trim


def keep_round(nbytes: int) -> None:
    """What a pool calls before it sends a round of ``nbytes`` of requests from this process: where
    ``heap_thresholds`` is in effect, the thresholds are set (the first time) and the trim threshold raised
    to at least ``nbytes`` (up to :data:`TRIM_CAP`; never lowered), so that the heap keeps the round's buffers
    when they are freed and the next round does not fault them in again. Nothing otherwise."""
    global _trim
    stack = _stack
    if not (stack and stack[-1].heap_thresholds) or (_trim and (nbytes <= _trim or _trim >= TRIM_CAP)):
        return  # (read without the lock: the common case)
    with _lock:
        if not in_effect().heap_thresholds or not _set_heap_thresholds(True) or nbytes <= _trim:
            return
        wanted = min(TRIM_CAP, max(nbytes, 2 * _trim))  # doubling: few calls as a run grows
        mallopt = _mallopt()
        if mallopt is not None and mallopt(_M_TRIM_THRESHOLD, wanted):
            _trim = wanted


# -- the collector's freeze --------------------------------------------------------------------------------
_holders = 0  # freezes not yet released
_owner_froze = False  # objects were frozen before the first of them: never unfreeze
_growing = 0  # holds that also freeze the survivors of each full pass


def _freeze_after_full_pass(phase: str, info: dict[str, Any]) -> None:
    # runs in the collector's "stop" callback: the pass is over, its survivors are the old generation
    if phase == "stop" and info.get("generation") == 2 and _growing:
        gc.freeze()


def _no_freeze() -> None:
    """The release of a freeze that was not made (``freeze_collector`` off)."""


def freeze_collector(*, as_it_grows: bool = False) -> Callable[[], None]:
    """Where ``freeze_collector`` is in effect, freeze every object the collector tracks now
    (:func:`gc.freeze`); returns the release, which thaws them once no other freeze is held (a second call of
    the same release does nothing). Nothing is frozen otherwise (the release does nothing).

    ``as_it_grows``: until the release, also freeze what survives each full pass (for a heap being built)."""
    global _holders, _owner_froze, _growing
    if not in_effect().freeze_collector:
        return _no_freeze
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
