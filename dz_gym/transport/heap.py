"""Keep freed request-sized buffers in the process heap instead of handing them back to the OS.

Every request is ~0.5 MB (three 180x320 views): its msgpack bytes, the websocket frame and its masked copy
are each one fresh allocation above glibc's mmap threshold, so each is mapped, faulted in page by page and
unmapped again (hundreds of page faults per request, benchmarks/README.md's transport table). Raising
the mmap threshold to 64 MiB and the trim threshold to 256 MiB (``mallopt``, what the environment variables
``MALLOC_MMAP_THRESHOLD_`` and ``MALLOC_TRIM_THRESHOLD_`` do) lets those buffers be reused from the heap
(the encoding and the hand-off to the loop then cost less than half as much, benchmarks/README.md). The price is that the
process keeps up to the trim threshold of freed memory. Only on glibc; nothing happens where either variable is
already set (the user decided) or the C library has no ``mallopt``.

A round of N requests holds N request buffers at once (N = 1024: 0.5 GiB). Where that is more than the trim
threshold, the heap is trimmed every round and the next round faults half its buffers in again (64 faults per
request at N = 1024, which made encoding cost three times as much); so ``keep_freed_buffers(at_least=...)``
raises the trim threshold to cover what the caller holds, up to :data:`TRIM_CAP`.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import threading

__all__ = ["MMAP_THRESHOLD", "TRIM_CAP", "TRIM_THRESHOLD", "keep_freed_buffers", "trim_threshold"]

MMAP_THRESHOLD = 64 * 2**20
TRIM_THRESHOLD = 256 * 2**20
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # glibc's mallopt parameters


def _trim_cap() -> int:
    """A quarter of the physical memory, at most what mallopt's C ``int`` holds (2 GiB)."""
    try:
        physical = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return TRIM_THRESHOLD
    return max(TRIM_THRESHOLD, min(2**31 - 1, physical // 4))


TRIM_CAP = _trim_cap()
"""The most ``keep_freed_buffers(at_least=...)`` raises the trim threshold to."""

_lock = threading.Lock()
_mallopt = None  # set once the thresholds are in effect
_done: bool | None = None
_trim = 0


def keep_freed_buffers(at_least: int = 0) -> bool:
    """Set the thresholds once per process, the trim threshold to at least ``at_least`` bytes (up to
    :data:`TRIM_CAP`; later calls only raise it); whether the thresholds are in effect."""
    global _done, _trim
    with _lock:
        if _done is None:
            _done = _apply()
            _trim = TRIM_THRESHOLD if _done else 0
        if _done and at_least > _trim and _trim < TRIM_CAP:
            wanted = min(TRIM_CAP, max(at_least, 2 * _trim))  # doubling: few calls as a run grows
            if _mallopt(_M_TRIM_THRESHOLD, wanted):
                _trim = wanted
        return _done


def trim_threshold() -> int:
    """The trim threshold this module set (0 where it set none)."""
    return _trim


def _apply() -> bool:
    global _mallopt
    if "MALLOC_MMAP_THRESHOLD_" in os.environ or "MALLOC_TRIM_THRESHOLD_" in os.environ:
        return False
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name)
        mallopt = libc.mallopt
    except (OSError, AttributeError, TypeError):
        return False
    mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
    if mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD) and mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD):
        _mallopt = mallopt
        return True
    return False
