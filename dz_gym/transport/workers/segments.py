"""Growing sets of shared-memory segments and where things lie in them: :class:`SharedSegments`, on top of
:class:`Extents`, a first-fit allocator of byte ranges (no I/O).

Both kinds of shared memory of a :class:`~dz_gym.transport.ProcessSessionPool` are one of these: each
worker's arena, which the pool encodes requests straight into, and the pool's view memory
(:class:`~dz_gym.transport.workers.views.HostViews`), which GPU views are copied to. A range is handed out
by :meth:`SharedSegments.alloc` and given back by :meth:`SharedSegments.free` once the worker is done with it
(until then it may re-send a request on a fresh connection). Ranges end out of order, so freed ranges are
kept sorted and merged with their neighbours; a round of requests that has ended leaves one free range
again. When no segment has room, a new one is made, within the set's capacity, by its growth rule; a set
that can make none warns once and its owner sends another way meanwhile.

>>> extents = Extents(1024)
>>> a, b = extents.alloc(100), extents.alloc(100)
>>> a, b, extents.free_bytes
(0, 128, 768)
>>> extents.free(a); extents.free(b); extents.free_bytes, extents.alloc(2000)
(1024, None)
"""

from __future__ import annotations

import bisect
import logging
import mmap
import os
from collections.abc import Callable
from multiprocessing import shared_memory
from typing import Any

__all__ = ["ALIGN", "Extents", "Segment", "SharedSegments", "create_segment"]

logger = logging.getLogger("dz_gym.transport")

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


def create_segment(size: int) -> shared_memory.SharedMemory:
    """A shared-memory segment with its pages reserved now: on a full /dev/shm (tmpfs) this raises OSError,
    where an unreserved segment would crash the writer (SIGBUS) at the first page that finds no room."""
    segment = shared_memory.SharedMemory(create=True, size=size)
    fd = getattr(segment, "_fd", -1)
    if fd >= 0 and hasattr(os, "posix_fallocate"):
        try:
            os.posix_fallocate(fd, 0, size)
        except OSError:
            _discard(segment)
            raise
    return segment


class Segment:
    """One shared-memory segment: its name (for the workers and the unlink), its size, this process's mapping
    of it and its :class:`Extents`.

    Whatever is written or viewed goes through a mapping of this process's own (``mmap`` of the segment's
    file), never closed explicitly: it is unmapped when the last view of it goes, so an array of it outlives
    :meth:`SharedSegments.close` safely (and no close ever meets a view still exporting it)."""

    def __init__(self, memory: Any):
        self.name = memory.name
        self.size = memory.size
        fd = getattr(memory, "_fd", -1)
        self.mapping: Any = mmap.mmap(fd, self.size) if fd >= 0 else memory.buf  # (no descriptor: its own)
        self.memory = memory
        if fd >= 0:
            memory.close()  # its own mapping has no views: the segment lives on in ours and in its name
        self.extents = Extents(self.size)

    def discard(self) -> None:
        """Drop this process's mapping (unmapped with the last view of it) and unlink the segment's name."""
        self.mapping = None
        try:
            self.memory.unlink()  # (after close, as SharedMemory allows)
        except FileNotFoundError:
            pass


class SharedSegments:
    """Shared-memory segments made as they are needed, up to ``capacity`` bytes in all, and the ranges handed
    out in them (not thread-safe: the owner holds its lock around every call).

    A new segment is ``first_bytes``, or twice the range that needs it when that is more, or (``doubling``)
    as large as all before it, so that the set doubles; never beyond the capacity, and never one smaller
    than ``min_bytes``. ``create(size)`` makes the segment (raises ``OSError`` when it cannot),
    ``opener(memory)`` the :class:`Segment` of it (a subclass may do more; an ``OSError`` discards it), and
    ``announce(k, name)`` is called with each segment as it is added, before any range of it is handed out.
    When no segment can be made, ``warning`` (a logging format of the reason: "``label`` N bytes are in use",
    or why a segment could not be made) is logged once.
    """

    def __init__(self, capacity: int, first_bytes: int, *, doubling: bool = False, min_bytes: int = 1,
                 create: Callable[[int], Any] = create_segment, announce: Callable[[int, str], None] | None = None,
                 label: str = "the segments'", warning: str = "%s") -> None:  # fmt: skip
        if not isinstance(capacity, int) or isinstance(capacity, bool) or capacity < 0:
            raise ValueError(f"capacity: expected an int >= 0, got {capacity!r}")
        self.capacity, self.first_bytes, self.doubling, self.min_bytes = capacity, first_bytes, doubling, min_bytes
        self._create, self._announce, self.label, self._warning = create, announce, label, warning
        self.segments: list[Segment] = []
        self.closed = False
        self.warned = False

    def __len__(self) -> int:
        return len(self.segments)

    @property
    def names(self) -> list[tuple[int, str]]:
        """``(k, name)`` of every segment (a worker started now maps these)."""
        return [(k, s.name) for k, s in enumerate(self.segments)]

    def find(self, nbytes: int) -> tuple[int, int] | None:
        """``(segment, start)`` of a free range of ``nbytes`` in the segments there are, now handed out; None
        when none has room."""
        for k, segment in enumerate(self.segments):
            start = segment.extents.alloc(nbytes)
            if start is not None:
                return k, start
        return None

    def alloc(self, nbytes: int, opener: Callable[[Any], Segment] = Segment) -> tuple[int, int] | None:
        """:meth:`find`, else the range at the start of a new segment (:meth:`make`, :meth:`add`); None when
        there is no room (warned once)."""
        spot = self.find(nbytes)
        if spot is not None:
            return spot
        segment = self.make(nbytes, opener)
        return None if segment is None else (self.add(segment), segment.extents.alloc(nbytes))

    def make(self, nbytes: int, opener: Callable[[Any], Segment] = Segment) -> Segment | None:
        """A new segment with room for ``nbytes`` by the growth rule, not added yet; None (warned once) when
        the capacity leaves no room for it or it cannot be made."""
        have = sum(s.size for s in self.segments)
        size = min(max(self.first_bytes, have if self.doubling else 0, 2 * nbytes), self.capacity - have)
        if size < max(nbytes, self.min_bytes):
            self.warn(f"{self.label} {self.capacity} bytes are in use")
            return None
        memory = None
        try:
            memory = self._create(size)
            return opener(memory)
        except OSError as exc:
            if memory is not None:
                _discard(memory)
            self.warn(f"a shared-memory segment of {size} bytes could not be made: {exc}")
            return None

    def add(self, segment: Segment) -> int:
        """Add ``segment`` (announced); its index."""
        self.segments.append(segment)
        k = len(self.segments) - 1
        if self._announce is not None:
            self._announce(k, segment.name)
        return k

    def free(self, k: int, start: int) -> None:
        """Give back the range at ``start`` of segment ``k`` (nothing after :meth:`close`)."""
        if not self.closed:
            self.segments[k].extents.free(start)

    def warn(self, why: str) -> None:
        """Log ``warning`` with ``why``, the first time only."""
        if not self.warned:
            self.warned = True
            logger.warning(self._warning, why)

    def close(self) -> None:
        """Drop every segment (:meth:`Segment.discard`); idempotent. Views of them keep their mapping."""
        self.closed = True
        segments, self.segments = self.segments, []
        for segment in segments:
            segment.discard()


def _discard(memory: Any) -> None:
    """Close and unlink a segment that could not be set up."""
    try:
        memory.close()
    except (BufferError, OSError):
        pass
    try:
        memory.unlink()
    except FileNotFoundError:
        pass
