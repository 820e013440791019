"""Host memory the transport's worker processes can read: :class:`HostViews`, where a GPU batch's views are
copied to so that the caller never copies their bytes again.

With :class:`~dz_gym.transport.ProcessSessionPool`, a request's bytes must lie in memory its worker can read.
Views copied from the GPU into this process's own page-locked buffer would then be copied once more, into the
worker's arena: at N = 1024 that second copy is about half a GiB per request round on the caller's thread
(benchmarks/README.md). Here the GPU's copy itself lands in shared memory that every worker of the pool has
mapped; a request whose large pieces lie here goes to its worker as references (segment, offset, length)
plus its few small pieces inline, and the worker joins them into the frame it sends (on its own core).

- :meth:`HostViews.alloc` hands out a uint8 array of one batch's bytes (None when there is no room: the
  caller then uses memory of its own and the requests go through the arenas as before). A segment is made
  when none has room, up to ``capacity`` bytes in all. With ``page_lock`` (the ``page_lock`` setting of
  :mod:`dz_gym.host_process`, which the pool is given) each is page-locked for CUDA when this process has
  CUDA (``cudaHostRegister``, so the copy from the GPU is one DMA transfer); it is left pageable otherwise.
- With ``populate`` (the ``populate_views`` setting), :meth:`HostViews.reserve` makes room for a batch ahead
  of time (the wrapper calls it at reset with a full round's views): a segment made then is also populated
  (its pages mapped in one call) before it is page-locked, so the first request round pays neither: mapping
  and page-locking a GiB is kernel and driver work that grows with the segment, which the first round's copy
  would otherwise wait on (benchmarks/README.md has the measurements). With ``wait=False`` the pages are
  mapped on a thread of their own (the kernel's work, outside the interpreter lock) while the caller goes on,
  and page-locked there too, on the caller's current CUDA device; the wrapper starts it from the
  observation space before the env's reset, which then overlaps it, and the next :meth:`alloc` or
  :meth:`reserve` takes the segment (page-locking it on the caller's thread only if CUDA came up since).
  Without ``populate`` nothing is made ahead: the first :meth:`alloc` that needs a segment makes it.
- A block is given back once the caller's arrays of it are gone (a ``weakref.finalize`` on the block's
  array, which every view of it keeps alive) and every worker that was handed a reference to it has said it
  took its bytes (:meth:`refer`, which also tells where a request's views lie,
  and :meth:`release`): until both, nothing else is written there.

The segments are unlinked at :meth:`close`; a mapping still viewed by an array is unmapped when the array goes.
"""

from __future__ import annotations

import ctypes
import errno
import logging
import mmap
import os
import sys
import threading
import weakref
from collections.abc import Callable
from typing import Any

import numpy as np

from dz_gym.transport.workers.messages import VIEWS
from dz_gym.transport.workers.segments import Segment, SharedSegments

__all__ = ["FIRST_VIEWS_SEGMENT_BYTES", "VIEWS_BYTES", "HostViews", "address_of"]

logger = logging.getLogger("dz_gym.transport")

VIEWS_BYTES = 4 * 2**30
"""Default cap of a pool's view segments (a round of N = 1024 requests of three 180x320 views is 0.5 GiB)."""
FIRST_VIEWS_SEGMENT_BYTES = 64 * 2**20
"""The smallest view segment; a batch larger than half of it gets a segment of twice its size."""


def address_of(array: np.ndarray) -> int:
    """The address of a C-contiguous array's first byte (a writable one's through ctypes, which is fast)."""
    if array.flags.writeable:
        return ctypes.addressof(ctypes.c_char.from_buffer(array))
    return array.__array_interface__["data"][0]


class _ViewSegment(Segment):
    """A :class:`~dz_gym.transport.workers.segments.Segment` of views: also its mapping's address and its
    page-lock state (its pages populated first where asked)."""

    def __init__(self, memory: Any, pin: bool, populate: bool = False):
        super().__init__(memory)
        self.address = address_of(np.frombuffer(self.mapping, np.uint8))
        if populate:
            _populate(self.address, self.size)
        self.pinned = _page_lock(self.address, self.size) if pin else False


class HostViews:
    """Shared-memory blocks for view batches (see the module docstring); thread-safe.

    ``create``: makes a segment of a given size (raises ``OSError`` when it cannot); ``announce(k, name)`` is
    called with each new segment before :meth:`alloc` returns its first block, so that every worker maps it
    before any request names it. ``page_lock``, ``populate``: see the module docstring (both off: nothing
    done to this process beyond mapping the segments).
    """

    def __init__(self, create: Callable[[int], Any], announce: Callable[[int, str], None], *,
                 capacity: int = VIEWS_BYTES, page_lock: bool = False, populate: bool = False):  # fmt: skip
        self.page_lock, self.populate = bool(page_lock), bool(populate)
        self._shared = SharedSegments(capacity, FIRST_VIEWS_SEGMENT_BYTES, create=create, announce=self._added,
                                      label="the view segments'",
                                      warning="%s; views go through this process's own memory meanwhile")  # fmt: skip
        self._announce = announce
        self._lock = threading.RLock()  # a finalizer may run in any thread, also one that holds the lock
        self._holds: dict[tuple[int, int], int] = {}  # (segment, start) -> caller's hold + workers' holds
        self._lengths: dict[tuple[int, int], int] = {}  # (segment, start) -> bytes of each handed-out block
        self._closed = False
        self._preparing: _Preparing | None = None  # a segment whose pages a thread is mapping (reserve)

    # -- introspection ------------------------------------------------------------------------------------
    @property
    def capacity(self) -> int:
        """The most bytes of shared memory the segments may hold in all."""
        return self._shared.capacity

    @property
    def names(self) -> list[tuple[int, str]]:
        """``(k, name)`` of every segment (a worker started now maps these)."""
        with self._lock:
            return self._shared.names

    @property
    def pinned(self) -> bool:
        """Whether every segment is page-locked (False before the first)."""
        with self._lock:
            segments = self._shared.segments
            return bool(segments) and all(s.pinned for s in segments)

    @property
    def blocks(self) -> int:
        """How many blocks are handed out and not given back yet."""
        with self._lock:
            return len(self._holds)

    # -- blocks -------------------------------------------------------------------------------------------
    def alloc(self, nbytes: int) -> np.ndarray | None:
        """A writable uint8 array of ``nbytes`` in shared memory, or None when there is no room (or after
        :meth:`close`). A new segment is page-locked with ``page_lock`` when this process has CUDA initialised."""
        if not isinstance(nbytes, int) or nbytes <= 0:
            raise ValueError(f"nbytes: expected an int > 0, got {nbytes!r}")
        with self._lock:
            if self._closed:
                return None
            self._adopt()
            spot = self._shared.alloc(nbytes, self._opener())
            if spot is None:
                return None
            k, start = spot
            # its own array of the mapping, so that every view of it keeps it (not the segment's) alive
            block = np.frombuffer(self._shared.segments[k].mapping, np.uint8, nbytes, start)
            self._holds[spot] = 1
            self._lengths[spot] = nbytes
            weakref.finalize(block, self._give_back, spot)
            return block

    def _opener(self, *, pin: bool | None = None, populate: bool = False) -> Callable[[Any], _ViewSegment]:
        """What opens a new segment: page-locked (``pin`` None: with ``page_lock``, where this process has CUDA
        now), its pages populated first where asked."""
        pin = self._can_lock() if pin is None else pin
        return lambda memory: _ViewSegment(memory, pin=pin, populate=populate)

    def _can_lock(self) -> bool:
        """Whether a segment made now is page-locked: ``page_lock`` and CUDA initialised in this process."""
        return self.page_lock and _cudart() is not None

    def _added(self, k: int, name: str) -> None:
        """A segment was added: announced to the workers."""
        self._announce(k, name)
        if self.page_lock and not self._shared.segments[k].pinned:
            logger.info("view segment %d is not page-locked (no CUDA here, or it refused); copies to it from a "
                        "GPU are staged", k)  # fmt: skip

    def reserve(self, nbytes: int, *, wait: bool = True) -> bool:
        """With ``populate``, make room for a block of ``nbytes`` now, not at the first :meth:`alloc` that
        needs it: a segment made here has its pages populated (and page-locked, as every segment with
        ``page_lock`` and CUDA), so that the first copy into it is as fast as the later ones. Whether there is
        room (False after :meth:`close`, or when none can be made); nothing stays handed out. ``wait=False``:
        a segment that must be made has its pages mapped by a thread (see the module docstring); True once
        that has started. Without ``populate`` nothing is made (True until :meth:`close`)."""
        if not isinstance(nbytes, int) or isinstance(nbytes, bool) or nbytes <= 0:
            raise ValueError(f"nbytes: expected an int > 0, got {nbytes!r}")
        with self._lock:
            if self._closed or not self.populate:
                return not self._closed
            if wait:
                self._adopt()
            spot = self._shared.find(nbytes)
            if spot is None and not wait:
                if self._preparing is None:
                    segment = self._shared.make(nbytes, self._opener(pin=False))
                    if segment is None:
                        return False
                    self._preparing = _Preparing(segment, _cuda_device() if self.page_lock else None)
                return True
            spot = spot or self._shared.alloc(nbytes, self._opener(populate=True))
            if spot is None:
                return False
            self._shared.free(*spot)
            return True

    def _adopt(self) -> None:
        """Take the segment a :meth:`reserve` thread prepared, once its pages are mapped: page-locked with
        ``page_lock`` where this process has CUDA, and added (or discarded when mapping its pages failed)."""
        preparing, self._preparing = self._preparing, None
        if preparing is None:
            return
        segment, error = preparing.result()
        if error is not None:
            segment.discard()
            self._shared.warn(f"a shared-memory segment of {segment.size} bytes could not be made: {error}")
            return
        if preparing.device is None and self._can_lock():  # CUDA came up after the thread started
            segment.pinned = _page_lock(segment.address, segment.size)
        self._shared.add(segment)

    def refer(self, parts: list, min_bytes: int) -> tuple[list[Any], list[tuple[int, int]], int] | None:
        """A request as a worker joins it, from its packed parts (:func:`dz_gym.protocol.packer.fast_parts`):
        ``(parts, keys, nbytes)``, the parts of a ``send`` message's request: each numpy array of at least
        ``min_bytes`` is ``[VIEWS, segment, offset, length]`` of a block handed out here and everything between is
        joined inline (bytes); each block is held once (dropped by :meth:`release` of each key). None, holding
        nothing, when some large array lies elsewhere (or there is none)."""
        if not self._holds:
            return None
        out: list[Any] = []
        inline: list[Any] = []
        keys: list[tuple[int, int]] = []
        nbytes = 0
        with self._lock:
            block: tuple[int, int, int] | None = None  # (segment, start, end) of the last array's block
            for part in parts:
                if type(part) is not np.ndarray or part.nbytes < min_bytes:
                    inline.append(part)
                    continue
                size = part.nbytes
                spot = self._where(address_of(part), size, block)
                if spot is None:
                    return None
                k, offset, block = spot
                if (k, block[1]) not in keys:
                    keys.append((k, block[1]))
                if inline:
                    joined = b"".join(inline)
                    out.append(joined)
                    nbytes += len(joined)
                    inline = []
                out.append([VIEWS, k, offset, size])
                nbytes += size
            if not keys:
                return None
            for key in keys:
                self._holds[key] += 1
        if inline:
            joined = b"".join(inline)
            out.append(joined)
            nbytes += len(joined)
        return out, keys, nbytes

    def refer_arrays(self, arrays: list[np.ndarray]) -> tuple[list[tuple[int, int] | None], list[tuple[int, int]]]:
        """Where each C-contiguous array lies: ``(segment, offset)`` within a block handed out here, or None
        (it lies elsewhere); and the keys of those blocks, each held once (dropped by :meth:`release` of each
        key). The columns of a :class:`~dz_gym.protocol.request_batch.RequestBatch`, found once for all its
        requests."""
        spots: list[tuple[int, int] | None] = []
        keys: list[tuple[int, int]] = []
        if not self._holds:
            return [None] * len(arrays), keys
        with self._lock:
            block: tuple[int, int, int] | None = None
            for array in arrays:
                spot = None
                if type(array) is np.ndarray and array.flags.c_contiguous and array.nbytes > 0:
                    spot = self._where(address_of(array), array.nbytes, block)
                if spot is None:
                    spots.append(None)
                    continue
                k, offset, block = spot
                spots.append((k, offset))
                if (k, block[1]) not in keys:
                    keys.append((k, block[1]))
            for key in keys:
                self._holds[key] += 1
        return spots, keys

    def _where(self, address: int, size: int, last: tuple[int, int, int] | None):
        """``(segment, offset, (segment, start, end))`` of the handed-out block that holds the range, else
        None (caller holds the lock); ``last`` is tried first (a request's views share one block)."""
        if last is not None:
            k, start, end = last
            offset = address - self._shared.segments[k].address
            if start <= offset and offset + size <= end:
                return k, offset, last
        for k, segment in enumerate(self._shared.segments):
            offset = address - segment.address
            if 0 <= offset and offset + size <= segment.size:
                for (seg, start), length in self._lengths.items():
                    if seg == k and start <= offset and offset + size <= start + length:
                        return k, offset, (k, start, start + length)
                return None
        return None

    def release(self, key: tuple[int, int]) -> None:
        """Drop one hold of :meth:`refer` (a worker took the bytes, or died)."""
        self._give_back(key)

    def _give_back(self, key: tuple[int, int]) -> None:
        with self._lock:
            count = self._holds.get(key)
            if count is None:
                return
            if count > 1:
                self._holds[key] = count - 1
                return
            del self._holds[key]
            self._lengths.pop(key, None)
            if not self._closed:
                self._shared.free(*key)

    # -- teardown -----------------------------------------------------------------------------------------
    def close(self) -> None:
        """Unlock and unlink every segment (idempotent). Blocks still viewed keep their mapping until then."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._adopt()
            segments = list(self._shared.segments)
            self._holds.clear()
            self._lengths.clear()
        for segment in segments:
            if segment.pinned:
                _page_unlock(segment.address)
        with self._lock:
            self._shared.close()  # each mapping goes with the last block that views it


_LINUX_MADV_POPULATE_WRITE = 23
"""The value of ``MADV_POPULATE_WRITE`` in Linux's ``<asm-generic/mman-common.h>`` (kernel 5.14+), for a
Python whose :mod:`mmap` module lacks the name (3.11 does)."""
_MADV_POPULATE_WRITE = getattr(
    mmap, "MADV_POPULATE_WRITE", _LINUX_MADV_POPULATE_WRITE if sys.platform == "linux" else None
)
"""Linux's advice that maps every page of a range now, writable, in one call (None off Linux)."""


class _Preparing:
    """A segment whose pages a thread maps (:meth:`HostViews.reserve` with ``wait=False``) and, where the
    caller has CUDA (``device``: its current device), page-locks on the caller's device. Both are the
    kernel's and the driver's work, outside the interpreter lock, and both grow with the segment (a GiB at
    N = 1024 envs; benchmarks/README.md has the measurements), so the env's reset overlaps them instead of
    the caller's thread waiting on them."""

    def __init__(self, segment: _ViewSegment, device: int | None = None):
        self.segment = segment
        self.device = device
        self._error: OSError | None = None
        self._thread = threading.Thread(target=self._run, name="dz-gym-view-pages", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            _populate(self.segment.address, self.segment.size)
        except OSError as exc:
            self._error = exc
            return
        if self.device is not None:
            self.segment.pinned = _page_lock(self.segment.address, self.segment.size, device=self.device)

    def result(self) -> tuple[_ViewSegment, OSError | None]:
        """The segment and the error of mapping its pages (None when they are mapped), once done."""
        self._thread.join()  # (the kernel maps the pages and returns: no wait on anything outside)
        return self.segment, self._error


def _madvise() -> Any:
    """libc's ``madvise`` through ctypes (called without the interpreter lock), or None where there is none."""
    try:
        function = ctypes.CDLL(None, use_errno=True).madvise
    except (OSError, AttributeError, TypeError):
        return None
    function.argtypes, function.restype = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int), ctypes.c_int
    return function


_MADVISE = _madvise() if _MADV_POPULATE_WRITE is not None else None


def _populate(address: int, size: int) -> None:
    """Map every page of ``size`` bytes at ``address`` now (a kernel without the advice leaves them to the
    first writes). The call leaves the interpreter lock to other threads while the kernel works."""
    if _MADVISE is None:
        return
    if _MADVISE(address, size, _MADV_POPULATE_WRITE) != 0:
        code = ctypes.get_errno()
        if code not in (errno.EINVAL, errno.ENOSYS):  # (an older kernel: nothing to do)
            raise OSError(code, os.strerror(code))


def _cudart() -> Any:
    """PyTorch's CUDA runtime bindings when this process has torch with CUDA initialised, else None."""
    torch = sys.modules.get("torch")
    if torch is None:
        return None
    try:
        if not torch.cuda.is_initialized():
            return None
        return torch.cuda.cudart()
    except (AttributeError, RuntimeError, AssertionError):
        return None


def _cuda_device() -> int | None:
    """The calling thread's current CUDA device where this process has CUDA initialised, else None."""
    if _cudart() is None:
        return None
    try:
        return int(sys.modules["torch"].cuda.current_device())  # (_cudart: torch is imported)
    except (AttributeError, RuntimeError):
        return None


def _set_device(device: int) -> None:
    """Make ``device`` the calling thread's current CUDA device (a new thread starts on device 0)."""
    sys.modules["torch"].cuda.set_device(device)


def _page_lock(address: int, size: int, device: int | None = None) -> bool:
    """Register ``size`` bytes at ``address`` with CUDA as page-locked host memory (on ``device``, made the
    calling thread's current device first, when given); whether it worked."""
    cudart = _cudart()
    if cudart is None:
        return False
    try:
        if device is not None:
            _set_device(device)
        return int(cudart.cudaHostRegister(address, size, 0)) == 0
    except (AttributeError, RuntimeError, TypeError):
        return False


def _page_unlock(address: int) -> None:
    cudart = _cudart()
    if cudart is not None:
        try:
            cudart.cudaHostUnregister(address)
        except (AttributeError, RuntimeError, TypeError):
            pass
