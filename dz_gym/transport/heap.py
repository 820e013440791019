"""Keep freed request-sized buffers in the process heap instead of handing them back to the OS.

Every request is ~0.5 MB (three 180x320 views): its msgpack bytes, the websocket frame and its masked copy
are each one fresh allocation above glibc's mmap threshold, so each is mapped, faulted in page by page and
unmapped again (hundreds of page faults per request, benchmarks/README.md's transport table). Raising
the mmap threshold to 64 MiB and the trim threshold to 256 MiB (``mallopt``, what the environment variables
``MALLOC_MMAP_THRESHOLD_`` and ``MALLOC_TRIM_THRESHOLD_`` do) lets those buffers be reused from the heap
(the encoding and the hand-off to the loop then cost less than half as much, benchmarks/README.md). The price is that the
process keeps up to the trim threshold of freed memory. Only on glibc; nothing happens where either variable is
already set (the user decided) or the C library has no ``mallopt``.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import threading

__all__ = ["MMAP_THRESHOLD", "TRIM_THRESHOLD", "keep_freed_buffers"]

MMAP_THRESHOLD = 64 * 2**20
TRIM_THRESHOLD = 256 * 2**20
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # glibc's mallopt parameters
_lock = threading.Lock()
_done: bool | None = None


def keep_freed_buffers() -> bool:
    """Set the thresholds once per process; whether they are in effect (set now or earlier)."""
    global _done
    with _lock:
        if _done is None:
            _done = _apply()
        return _done


def _apply() -> bool:
    if "MALLOC_MMAP_THRESHOLD_" in os.environ or "MALLOC_TRIM_THRESHOLD_" in os.environ:
        return False
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name)
        mallopt = libc.mallopt
    except (OSError, AttributeError, TypeError):
        return False
    mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
    return bool(mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD))
