"""Extents and SharedSegments: ranges handed out first-fit and merged when freed; segments made as needed by
one growth rule (the worker arenas' doubling one and the view memory's), within the capacity, warned once
when none can be made; real shared memory under /dev/shm, unlinked at close."""

from __future__ import annotations

import errno
import logging
import os

import numpy as np
import pytest

from dz_gym.transport.workers.segments import ALIGN, Extents, Segment, SharedSegments, create_segment

KIB = 1024


def exists(name: str) -> bool:
    return os.path.exists("/dev/shm/" + name.lstrip("/"))


def test_extents_merge_out_of_order_frees():
    extents = Extents(64 * 10)
    starts = [extents.alloc(64) for _ in range(10)]
    assert extents.alloc(1) is None
    for k in (3, 1, 2, 9, 0, 8, 4, 6, 5, 7):
        extents.free(starts[k])
    assert extents.free_bytes == 640 and extents.allocated == 0 and extents.alloc(640) == 0
    with pytest.raises(KeyError):
        extents.free(64)
    with pytest.raises(ValueError, match="size"):
        Extents(ALIGN - 1)


def test_a_doubling_set_grows_by_its_total_and_a_plain_one_by_the_range():
    announced: list[tuple[int, str]] = []
    doubling = SharedSegments(1024 * KIB, 64 * KIB, doubling=True, announce=lambda k, n: announced.append((k, n)))
    plain = SharedSegments(1024 * KIB, 64 * KIB)
    try:
        for shared in (doubling, plain):
            assert shared.alloc(30 * KIB) == (0, 0)  # the first segment: first_bytes
            assert shared.alloc(30 * KIB) == (0, 30 * KIB)  # first fit in the segments there are
            assert shared.alloc(30 * KIB) == (1, 0)  # no room left there: a second one
            assert shared.alloc(40 * KIB) == (2, 0)
            assert shared.alloc(100 * KIB) == (3, 0)
        assert [s.size // KIB for s in doubling.segments] == [64, 64, 128, 256]  # max(first, total, twice the range)
        assert [s.size // KIB for s in plain.segments] == [64, 64, 80, 200]  # max(first, twice the range)
        assert announced == [(k, s.name) for k, s in enumerate(doubling.segments)] == doubling.names
    finally:
        doubling.close()
        plain.close()


def test_the_capacity_bounds_the_segments_and_no_room_is_warned_once(caplog):
    shared = SharedSegments(100 * KIB, 64 * KIB, min_bytes=16 * KIB, label="the test's", warning="test: %s; meanwhile")
    try:
        with caplog.at_level(logging.WARNING, logger="dz_gym.transport"):
            assert shared.alloc(30 * KIB) == (0, 0)
            assert shared.alloc(30 * KIB) == (0, 30 * KIB)
            assert shared.alloc(20 * KIB) == (1, 0)  # the 36 KiB left of the capacity
            assert [s.size // KIB for s in shared.segments] == [64, 36]
            assert shared.alloc(20 * KIB) is None  # no room in the capacity
            assert shared.alloc(1) == (0, 60 * KIB)  # (the 4 KiB left in the first segment)
        assert caplog.text.count("test: the test's 102400 bytes are in use; meanwhile") == 1
        shared.free(0, 0)
        assert shared.alloc(20 * KIB) == (0, 0), "a freed range is handed out again"
    finally:
        shared.close()
    small = SharedSegments(72 * KIB, 64 * KIB, min_bytes=16 * KIB)
    try:
        assert small.alloc(32 * KIB) == (0, 0) and small.alloc(32 * KIB) == (0, 32 * KIB)
        assert small.alloc(8 * KIB) is None, "room for 8 KiB left in the capacity, but no segment below min_bytes"
    finally:
        small.close()


def test_a_segment_that_cannot_be_made_or_opened_gives_no_room_and_is_unlinked(caplog):
    made: list[str] = []

    def create(size):
        memory = create_segment(size)
        made.append(memory.name)
        return memory

    def refuse(memory):
        Segment(memory)
        raise OSError(errno.ENOMEM, "no memory to open")

    def full(size):
        raise OSError(errno.ENOSPC, "no space on /dev/shm")

    with caplog.at_level(logging.WARNING, logger="dz_gym.transport"):
        shared = SharedSegments(2**20, 64 * KIB, create=create)
        assert shared.alloc(KIB, refuse) is None and len(shared) == 0
        assert made and not exists(made[0]), "the segment that could not be opened was unlinked"
        assert "could not be made: [Errno 12] no memory to open" in caplog.text
        assert shared.alloc(KIB) == (0, 0), "a later segment still can be made"
        shared.close()
        assert SharedSegments(2**20, 64 * KIB, create=full).alloc(KIB) is None
    assert "no space on /dev/shm" in caplog.text


def test_close_unlinks_every_segment_and_a_view_outlives_it():
    shared = SharedSegments(2**20, 64 * KIB)
    k, start = shared.alloc(100)
    view = np.frombuffer(shared.segments[k].mapping, np.uint8, 100, start)
    view[:] = 7
    names = [name for _, name in shared.names]
    assert names and all(exists(name) for name in names)
    shared.close()
    shared.close()  # idempotent
    assert not any(exists(name) for name in names) and len(shared) == 0
    shared.free(k, start)  # nothing after close
    assert int(view.sum()) == 700, "the mapping lives while a view of it does"
    with pytest.raises(ValueError, match="capacity"):
        SharedSegments(-1, 64 * KIB)
