"""Where requests lie in a shared-memory arena: :class:`Extents`, a first-fit allocator of byte ranges (no I/O).

:class:`~dz_gym.transport.workers.pool.ProcessSessionPool` encodes each request straight into a segment shared
with the worker process that sends it, and frees the range when the worker reports the request done (until
then the worker may re-send it on a fresh connection). Requests of different sessions end out of order, so
freed ranges are kept sorted and merged with their neighbours; a round that has ended leaves one free range
again. Only the bookkeeping lives here; the segments themselves are the pool's.

>>> extents = Extents(1024)
>>> a, b = extents.alloc(100), extents.alloc(100)
>>> a, b, extents.free_bytes
(0, 128, 768)
>>> extents.free(a); extents.free(b); extents.free_bytes, extents.alloc(2000)
(1024, None)
"""

from __future__ import annotations

import bisect

__all__ = ["ALIGN", "Extents"]

ALIGN = 64
"""Every range starts on a multiple of this (a cache line: copies into neighbouring ranges do not share one)."""


class Extents:
    """First-fit allocation of ``size`` bytes in ranges aligned to :data:`ALIGN` (not thread-safe)."""

    def __init__(self, size: int):
        if not isinstance(size, int) or isinstance(size, bool) or size < ALIGN:
            raise ValueError(f"size: expected an int >= {ALIGN}, got {size!r}")
        self.size = size - size % ALIGN
        self._starts: list[int] = [0]  # free ranges, sorted by start
        self._lengths: list[int] = [self.size]
        self._used: dict[int, int] = {}  # start -> length of each allocated range

    @property
    def free_bytes(self) -> int:
        return sum(self._lengths)

    @property
    def allocated(self) -> int:
        """How many ranges are allocated."""
        return len(self._used)

    def alloc(self, nbytes: int) -> int | None:
        """The start of a free range of at least ``nbytes`` (> 0) bytes, now allocated; None when none is."""
        length = max(ALIGN, -(-nbytes // ALIGN) * ALIGN)
        for k, free in enumerate(self._lengths):
            if free >= length:
                start = self._starts[k]
                if free == length:
                    del self._starts[k], self._lengths[k]
                else:
                    self._starts[k] = start + length
                    self._lengths[k] = free - length
                self._used[start] = length
                return start
        return None

    def free(self, start: int) -> None:
        """Give back the range that :meth:`alloc` returned at ``start``; ``KeyError`` for any other."""
        length = self._used.pop(start)
        k = bisect.bisect_left(self._starts, start)
        if k > 0 and self._starts[k - 1] + self._lengths[k - 1] == start:  # merge with the range before
            k -= 1
            self._lengths[k] += length
        else:
            self._starts.insert(k, start)
            self._lengths.insert(k, length)
        if k + 1 < len(self._starts) and self._starts[k] + self._lengths[k] == self._starts[k + 1]:
            self._lengths[k] += self._lengths.pop(k + 1)  # and with the range after
            del self._starts[k + 1]
