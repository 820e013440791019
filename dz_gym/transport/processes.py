"""Sessions spread over worker processes: :class:`ProcessSessionPool`, a
:class:`~dz_gym.policy_client.PolicyClient` with the behaviour of :class:`~dz_gym.transport.SessionPool`.

With hundreds of sessions of 0.5 MB requests (three 180x320 views), one process moves every request's bytes
under one interpreter lock: the caller encodes them and one loop thread masks, copies and sends each frame and
parses each reply. Here session ``i`` lives in worker process ``i % P`` (and talks to ``urls[i % len(urls)]``,
as in SessionPool), where an :class:`~dz_gym.transport.session.AsyncSession` on the worker's own asyncio loop
sends it; the caller only encodes.

How the bytes move (no pickle for anything per request):

- The caller encodes each request straight into a shared-memory segment of its worker
  (:mod:`multiprocessing.shared_memory`; the ranges are kept by :class:`~dz_gym.transport.arena.Extents`) and
  sends a small msgpack descriptor (session, segment, offset, length, token) with ``Connection.send_bytes``;
  the worker sends a ``memoryview`` of the segment. A range is reused once the worker reports the request
  done (its outcome: until then it may re-send the request on a fresh connection). A worker's segments grow
  by doubling up to ``arena_bytes`` per worker; a request that finds no room then (or where /dev/shm cannot
  hold a segment) goes through the pipe as bytes instead: nothing waits for room.
- The worker answers with the raw reply frame and the outcome's stamps, counts and error (type name, message
  and the fields its class needs, rebuilt from :mod:`dz_gym.errors` here); this process parses the frame with
  the parser AsyncSession uses, so the reply is the one SessionPool gives.
- Workers start with the ``spawn`` context (never ``fork``: the caller may hold CUDA state and threads); the
  transport config goes over the pipe as msgpack of its fields. A token named by ``auth_env`` is read by the
  worker from its environment, inherited from this process: it never appears in argv, in the pipe or in logs.
  An ``ssl_context`` cannot be handed over (``TransportConfig`` refuses it with ``processes``).

One reader thread per worker resolves the futures. A worker that dies (killed, crashed) fails all its
requests in flight at once with :class:`~dz_gym.errors.ConnectionLost` and its sessions read as not
connected; the other workers' sessions go on. ``reconnect`` (or ``connect``) of a session of a dead worker
starts a fresh worker for it first, at most ``max_restarts`` times per worker (then
:class:`~dz_gym.errors.WorkerError`); its other sessions are then connected again by their own reconnects.
Every wait is bounded: worker start-up (``start_timeout``), connects, closing (the workers are joined, killed
if they do not exit, and the segments unlinked).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import itertools
import logging
import math
import multiprocessing
import os
import signal
import threading
import time
import weakref
from collections.abc import Iterable
from multiprocessing import shared_memory
from typing import Any

import msgpack

from dz_gym import errors as _errors
from dz_gym.errors import ConnectionLost, DzGymError, PartialConnectError, RequestTimeout, ServerError, WorkerError
from dz_gym.policy_client import Outcome
from dz_gym.protocol import ServerMetadata, packb, parse_metadata
from dz_gym.protocol.contract import releases_sessions
from dz_gym.protocol.packer import pieces_size, write_pieces
from dz_gym.transport.arena import Extents
from dz_gym.transport.base import PoolBase
from dz_gym.transport.config import TransportConfig, check_pool_args
from dz_gym.transport.heap import keep_freed_buffers
from dz_gym.transport.session import AsyncSession, request_pieces

__all__ = ["ARENA_BYTES", "FIRST_SEGMENT_BYTES", "PARALLEL_COPY_BYTES", "START_TIMEOUT_S", "ProcessSessionPool"]

logger = logging.getLogger("dz_gym.transport")

START_TIMEOUT_S = 60.0
"""Bound on a worker's start-up (a fresh interpreter importing the transport), and on each restart."""
FIRST_SEGMENT_BYTES = 32 * 2**20
"""A worker's first shared-memory segment; each further one doubles the worker's arena."""
ARENA_BYTES = 2**30
"""Default cap of one worker's shared memory (N = 1024 sessions of 0.5 MB over 2 workers need 256 MiB each)."""
MAX_RESTARTS = 3
PARALLEL_COPY_BYTES = 8 * 2**20
"""A ``submit_many`` of at least this many bytes writes each worker's requests on a thread of its own."""
COPY_TIMEOUT_S = 60.0
"""Bound on writing one ``submit_many``'s requests into the arenas (memory copies)."""
_MIN_SEGMENT_BYTES = 2**16
_STOP_GRACE_S = 5.0  # a worker that answered "closed" (or died) exits within this


def _pack(message: Any) -> bytes:
    return msgpack.packb(message, use_bin_type=True)


def _unpack(data: bytes) -> Any:
    return msgpack.unpackb(data, raw=False)


def _config_fields(config: TransportConfig) -> dict[str, Any]:
    """What a worker rebuilds its TransportConfig from: every field but the TLS context and ``processes``."""
    skip = ("ssl_context", "processes")
    return {f.name: getattr(config, f.name) for f in dataclasses.fields(config) if f.name not in skip}


def error_fields(error: DzGymError) -> list[Any]:
    """``error`` as msgpack-able fields: type name, message, and what its class's constructor needs."""
    extra: dict[str, Any] = {}
    if isinstance(error, ServerError):
        extra = {"message": error.message, "fatal": bool(error.fatal), "code": error.code}
    elif isinstance(error, ConnectionLost):
        extra = {"code": error.code, "reason": error.reason}
    return [type(error).__name__, str(error), extra]


def rebuild_error(fields: list[Any]) -> DzGymError:
    """The :mod:`dz_gym.errors` exception of :func:`error_fields` (a plain DzGymError for an unknown type)."""
    name, text, extra = fields
    cls = getattr(_errors, str(name), None)
    if not (isinstance(cls, type) and issubclass(cls, DzGymError)):
        return DzGymError(text)
    if issubclass(cls, ServerError):
        return cls(extra.get("message", text), fatal=bool(extra.get("fatal")), code=extra.get("code"))
    if issubclass(cls, ConnectionLost):
        return cls(text, code=extra.get("code"), reason=extra.get("reason", ""))
    try:
        return cls(text)
    except TypeError:  # a class whose constructor wants more than a message
        return DzGymError(text)


def _reply_outcome(index: int, frame: Any, stamps: list[Any], error: list[Any] | None) -> Outcome:
    """The Outcome of a worker's report: the reply parsed here as AsyncSession parses it."""
    sent_at, received_at, request_bytes, reconnects, retries = stamps
    if error is not None:
        return Outcome(index, None, rebuild_error(error), sent_at, received_at, request_bytes, reconnects, retries)
    try:
        reply = AsyncSession._parse_infer(frame)
    except DzGymError as exc:  # the worker parsed it already: only a bug gets here
        return Outcome(index, None, exc, sent_at, received_at, request_bytes, reconnects, retries)
    return Outcome(index, reply, None, sent_at, received_at, request_bytes, reconnects, retries)


def _process_cpu_s(pid: int | None) -> float | None:
    """User plus system CPU seconds of process ``pid`` (``/proc/PID/stat``), None where it cannot be read."""
    if pid is None:
        return None
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            fields = stat.read().rsplit(b")", 1)[1].split()  # after the command name, which may hold spaces
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime (fields 14, 15)
    except (OSError, ValueError, IndexError):
        return None


def _create_segment(size: int) -> shared_memory.SharedMemory:
    """A shared-memory segment with its pages reserved now: on a full /dev/shm (tmpfs) this raises OSError,
    where an unreserved segment would crash the writer (SIGBUS) at the first page that finds no room."""
    segment = shared_memory.SharedMemory(create=True, size=size)
    fd = getattr(segment, "_fd", -1)
    if fd >= 0 and hasattr(os, "posix_fallocate"):
        try:
            os.posix_fallocate(fd, 0, size)
        except OSError:
            segment.close()
            segment.unlink()
            raise
    return segment


# ================================================================================== the worker process side
class _FrameKeepingSession(AsyncSession):
    """An AsyncSession whose replies keep their raw frame (sent back to the parent, which parses it again)."""

    @staticmethod
    def _parse_infer(frame: Any) -> Any:
        return (AsyncSession._parse_infer(frame), frame)


class _SendClock:
    """A worker's stand-in for the parent's profiler (AsyncSession times its sends into ``add``): the send
    seconds since the last :meth:`take`, which the next outcome carries to the parent."""

    def __init__(self) -> None:
        self.send_s = 0.0

    def add(self, stage: str, seconds: float) -> None:
        if stage == "send":
            self.send_s += seconds

    def take(self) -> float:
        seconds, self.send_s = self.send_s, 0.0
        return seconds


class _WorkerLoop:
    """The worker process: its sessions on one asyncio loop, fed by a thread reading the parent's pipe."""

    def __init__(self, conn: Any, init: dict[str, Any]):
        self.conn = conn
        config = TransportConfig(**init["config"])
        self.close_timeout = config.close_timeout
        self.sessions = {int(i): _FrameKeepingSession(url, config) for i, url in init["sessions"]}
        self.sends = _SendClock()  # the sends' time, reported with each outcome (the parent's --profile)
        for session in self.sessions.values():
            session.profiler = self.sends
        self.concurrency = int(init["concurrency"])
        self.segments: dict[int, shared_memory.SharedMemory] = {}
        for seg, name in init["segments"]:
            self._attach(seg, name)
        self.outbox: list[Any] = []
        self.tasks: set[asyncio.Task[None]] = set()
        self.loop: asyncio.AbstractEventLoop | None = None

    def _attach(self, seg: int, name: str) -> None:
        # Attaching registers the name with the resource tracker that spawn shares with the parent (a set: the
        # parent's unlink unregisters it once for both).
        self.segments[int(seg)] = shared_memory.SharedMemory(name=name)

    async def run(self) -> None:
        self.loop = asyncio.get_running_loop()
        self.semaphore = asyncio.Semaphore(self.concurrency)
        self.stopped = asyncio.Event()
        threading.Thread(target=self._read, name="dz-gym-worker-pipe", daemon=True).start()
        self.post(["ready", os.getpid()])
        await self.stopped.wait()

    def _read(self) -> None:
        assert self.loop is not None
        while True:
            try:
                data = self.conn.recv_bytes()
            except (EOFError, OSError):
                data = None
            try:
                self.loop.call_soon_threadsafe(self.handle, data)
            except RuntimeError:  # the loop is gone
                return
            if data is None:
                return

    # -- messages from the parent -------------------------------------------------------------------------
    def handle(self, data: bytes | None) -> None:
        if data is None:  # the parent is gone: nobody is left to answer
            self._spawn(self._close(None))
            return
        message = _unpack(data)
        kind = message[0]
        if kind == "send":
            for token, index, seg, offset, length in message[1]:
                payload = self.segments[seg].buf[offset : offset + length]
                self._spawn(self._send(token, index, payload))
        elif kind == "sendb":
            _, token, index, payload = message
            self._spawn(self._send(token, index, payload))
        elif kind == "seg":
            self._attach(message[1], message[2])
        elif kind == "connect":
            for token, index in message[1]:
                self._spawn(self._connect(token, index))
        elif kind == "reset":
            _, token, index, session_id = message
            self._spawn(self._reset(token, index, session_id))
        elif kind == "close":
            self._spawn(self._close(message[1]))

    def _spawn(self, coro: Any) -> None:
        task = asyncio.ensure_future(coro)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def _send(self, token: int, index: int, payload: Any) -> None:
        session = self.sessions[index]
        try:
            outcome = await session.send(payload, index=index)
        except BaseException as exc:  # noqa: BLE001 - cancelled at exit; the parent fails it on its own
            if not isinstance(exc, asyncio.CancelledError):
                logger.exception("session %d: send failed unexpectedly", index)
            raise
        finally:
            if isinstance(payload, memoryview):
                payload.release()  # the segment closes only once no view of it is left
        kept = outcome.reply
        frame = kept[1] if kept is not None else None
        error = None if outcome.error is None else error_fields(outcome.error)
        stamps = [outcome.sent_at, outcome.received_at, outcome.request_bytes, outcome.reconnects, outcome.retries]
        self.post(["out", token, index, frame, stamps, error, self.sends.take(), session.connected])

    async def _connect(self, token: int, index: int) -> None:
        session = self.sessions[index]
        try:
            async with self.semaphore:
                metadata = await session.connect()
            self.post(["conn", token, index, packb(metadata.raw), None, session.connected])
        except DzGymError as exc:
            self.post(["conn", token, index, None, error_fields(exc), session.connected])
        except Exception as exc:  # noqa: BLE001 - stays with its session, as in SessionPool
            error = DzGymError(f"session {index}: connect failed: {type(exc).__name__}: {exc}")
            self.post(["conn", token, index, None, error_fields(error), session.connected])

    async def _reset(self, token: int, index: int, session_id: str | None) -> None:
        session = self.sessions[index]
        try:
            await session.reset(session_id)
            error = None
        except DzGymError as exc:
            error = error_fields(exc)
        self.post(["reset", token, index, error, session.connected])

    async def _close(self, token: int | None) -> None:
        """Close every session (a request in flight ends with ConnectionLost and is reported), then stop."""
        await asyncio.gather(*(s.close() for s in self.sessions.values()), return_exceptions=True)
        others = [t for t in self.tasks if t is not asyncio.current_task()]
        if others:
            await asyncio.wait(others, timeout=self.close_timeout + 2.0)
        for segment in self.segments.values():
            try:
                segment.close()
            except BufferError:  # a send still holds a view: the exit unmaps it
                pass
        if token is not None:
            self.post(["closed", token])
            self.flush()
        self.stopped.set()

    # -- messages to the parent ---------------------------------------------------------------------------
    def post(self, message: list[Any]) -> None:
        """Queue ``message``; everything queued in one turn of the loop goes in one write."""
        if not self.outbox:
            assert self.loop is not None
            self.loop.call_soon(self.flush)
        self.outbox.append(message)

    def flush(self) -> None:
        if not self.outbox:
            return
        batch, self.outbox = self.outbox, []
        try:
            self.conn.send_bytes(_pack(batch))
        except (OSError, ValueError):  # the parent is gone
            self.stopped.set()


def _worker_main(conn: Any) -> None:
    """Entry point of a worker process (spawned): read the init message, run the loop until told to stop."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C is the parent's to handle; it closes us
    keep_freed_buffers()  # frame-sized buffers (the masked copies) are reused, as in the parent
    try:
        message = _unpack(conn.recv_bytes())
    except (EOFError, OSError):
        return
    if not (isinstance(message, list) and message and message[0] == "init"):
        return
    asyncio.run(_WorkerLoop(conn, message[1]).run())


# ======================================================================================= the parent's side
@dataclasses.dataclass
class _Pending:
    """A request of this process's that a worker has not answered yet."""

    kind: str  # "out" (infer), "conn", "reset", "closed"
    future: concurrent.futures.Future
    index: int
    extent: tuple[int, int] | None = None  # (segment, offset) to free when it is answered
    request_bytes: int = 0


class _Worker:
    """This process's side of one worker process: the process, its pipe, its shared-memory segments and
    extents, the requests in flight, and its sessions' connected flags. Holds no reference to the pool (so
    a forgotten pool can be collected and its finalizer close the workers)."""

    def __init__(self, number: int, sessions: list[tuple[int, str]], config: TransportConfig, *, concurrency: int,
                 arena_bytes: int, start_timeout: float, max_restarts: int):  # fmt: skip
        self.number = number
        self.sessions = sessions
        self.config = config
        self.concurrency = concurrency
        self.arena_bytes = arena_bytes
        self.start_timeout = start_timeout
        self.restarts_left = max_restarts
        self.lock = threading.Lock()  # pending, extents, segments, alive, connected
        self.send_lock = threading.Lock()  # one writer on the pipe at a time (taken inside ``lock``, never around)
        self.pending: dict[int, _Pending] = {}
        self.segments: list[shared_memory.SharedMemory] = []
        self.extents: list[Extents] = []
        self.connected = {i: False for i, _ in sessions}
        self.no_room_warned = False
        self.process: Any = None
        self.conn: Any = None
        self.reader: threading.Thread | None = None
        self.generation = 0
        self.alive = False
        self.closing = False
        self.death = ""
        self.profiler = None

    # -- life cycle ---------------------------------------------------------------------------------------
    def spawn(self) -> None:
        """Start the process and send its init message (wait for it with :meth:`wait_ready`)."""
        ctx = multiprocessing.get_context("spawn")
        parent_conn, child_conn = ctx.Pipe(duplex=True)
        process = ctx.Process(target=_worker_main, args=(child_conn,), name=f"dz-gym-transport-{self.number}",
                              daemon=True)  # fmt: skip
        process.start()
        child_conn.close()  # only the child holds its end now: its death is our EOF
        init = {
            "config": _config_fields(self.config),
            "sessions": [[i, url] for i, url in self.sessions],
            "concurrency": self.concurrency,
            "segments": [[k, s.name] for k, s in enumerate(self.segments)],
        }
        parent_conn.send_bytes(_pack(["init", init]))
        self.process, self.conn = process, parent_conn

    def wait_ready(self) -> None:
        """Wait (bounded by ``start_timeout``) for the worker's ready message, then start the reader thread."""
        conn, process = self.conn, self.process
        try:
            ready = conn.poll(self.start_timeout)
            batch = _unpack(conn.recv_bytes()) if ready else None
        except (EOFError, OSError):
            process.join(_STOP_GRACE_S)
            self._discard_process()
            raise WorkerError(
                f"transport worker {self.number} exited during start-up (exit code {process.exitcode})"
            ) from None
        if batch is None:
            self._discard_process()
            raise WorkerError(f"transport worker {self.number} did not start within {self.start_timeout:g} s")
        with self.lock:
            self.generation += 1
            self.alive, self.death = True, ""
            self.connected = dict.fromkeys(self.connected, False)
        self.reader = threading.Thread(target=self._read, args=(conn, self.generation),
                                       name=f"dz-gym-transport-reader-{self.number}", daemon=True)  # fmt: skip
        self.reader.start()

    def _discard_process(self) -> None:
        process = self.process
        if process is not None and process.is_alive():
            process.kill()
            process.join(_STOP_GRACE_S)
        if self.conn is not None:
            self.conn.close()

    def ensure_alive(self) -> None:
        """Start a fresh worker if this one died (bounded; at most ``max_restarts`` times)."""
        with self.lock:
            if self.alive:
                return
            if self.closing:
                raise WorkerError(f"transport worker {self.number}: the pool is closed")
            if self.restarts_left <= 0:
                raise WorkerError(f"transport worker {self.number} died ({self.death}) and was restarted too often")
            self.restarts_left -= 1
        logger.warning("restarting transport worker %d (%s)", self.number, self.death)
        if self.reader is not None:
            self.reader.join(_STOP_GRACE_S)
        self.spawn()
        self.wait_ready()

    def shutdown(self, close_timeout: float) -> None:
        """Close the worker's sessions, join it (bounded; killed if it does not exit), fail what is left."""
        with self.lock:
            self.closing = True
            alive = self.alive
        if alive:
            closed: concurrent.futures.Future = concurrent.futures.Future()
            token = self._register(_Pending("closed", closed, -1))
            if token is not None and self._write(["close", token]):
                try:
                    closed.result(close_timeout + _STOP_GRACE_S)
                except (concurrent.futures.TimeoutError, concurrent.futures.CancelledError):
                    logger.debug("transport worker %d did not close in time", self.number)
        process = self.process
        if process is not None:
            process.join(_STOP_GRACE_S)
            if process.is_alive():
                process.kill()
                process.join(_STOP_GRACE_S)
        if self.conn is not None:
            self.conn.close()
        if self.reader is not None and self.reader is not threading.current_thread():
            self.reader.join(_STOP_GRACE_S)
        self._fail_pending("the pool was closed")
        for segment in self.segments:
            try:
                segment.close()
            except BufferError:
                pass
            try:
                segment.unlink()
            except FileNotFoundError:
                pass
        self.segments, self.extents = [], []

    # -- the pipe -----------------------------------------------------------------------------------------
    def _write(self, message: list[Any]) -> bool:
        """Send one message; False when the worker is gone (its reader thread then fails what is pending).

        A write waits only while the worker's pipe is full; the worker drains it with a thread of its own."""
        data = _pack(message)
        try:
            with self.send_lock:
                self.conn.send_bytes(data)
            return True
        except (OSError, ValueError):
            return False

    def _register(self, pending: _Pending) -> int | None:
        """A token for ``pending`` (kept until the worker answers or dies); None when the worker is dead."""
        with self.lock:
            if not self.alive:
                return None
            token = next(_TOKENS)
            self.pending[token] = pending
            return token

    def _read(self, conn: Any, generation: int) -> None:
        while True:
            try:
                batch = _unpack(conn.recv_bytes())
            except (EOFError, OSError):
                break
            for message in batch:
                self._deliver(message)
        self._died(generation)

    def _deliver(self, message: list[Any]) -> None:
        kind = message[0]
        if kind == "ready":
            return
        token = message[1]
        with self.lock:
            pending = self.pending.pop(token, None)
            if pending is None:
                return
            if pending.extent is not None:
                seg, offset = pending.extent
                self.extents[seg].free(offset)
            if kind in ("out", "conn", "reset"):
                self.connected[pending.index] = bool(message[-1])
        future = pending.future
        if kind == "out":
            _, _, index, frame, stamps, error, send_s, _ = message
            start = time.perf_counter()
            outcome = _reply_outcome(index, frame, stamps, error)
            profiler = self.profiler
            if profiler is not None:
                profiler.add("send", send_s)  # the worker's, since its last outcome
                if outcome.reply is not None:
                    profiler.add("receive_decode", time.perf_counter() - start)
            future.set_result(outcome)
        elif kind == "conn":
            _, _, index, meta, error, _ = message
            if error is not None:
                future.set_result((None, rebuild_error(error)))
            else:
                try:
                    future.set_result((parse_metadata(meta), None))
                except DzGymError as exc:
                    future.set_result((None, exc))
        elif kind == "reset":
            future.set_result(None if message[3] is None else rebuild_error(message[3]))
        elif kind == "closed":
            future.set_result(None)

    def _died(self, generation: int) -> None:
        """The worker's pipe closed: fail every request it had in flight, at once."""
        process = self.process
        with self.lock:
            if generation != self.generation or not self.alive:
                return
            self.alive = False
            self.connected = dict.fromkeys(self.connected, False)
        if process is not None:
            process.join(_STOP_GRACE_S)
        code = None if process is None else process.exitcode
        pid = None if process is None else process.pid
        self.death = f"pid {pid}, exit code {code}"
        if not self.closing:
            logger.warning("transport worker %d exited (%s); its sessions are not connected", self.number, self.death)
        self._fail_pending(
            "the pool was closed" if self.closing else f"transport worker {self.number} exited ({self.death})"
        )

    def _fail_pending(self, why: str) -> None:
        with self.lock:
            pending, self.pending = list(self.pending.values()), {}
            for item in pending:
                if item.extent is not None:
                    seg, offset = item.extent
                    if seg < len(self.extents):
                        self.extents[seg].free(offset)
        for item in pending:
            error = ConnectionLost(f"session {item.index}: {why}") if item.index >= 0 else None
            if item.kind == "out":
                item.future.set_result(Outcome.failed(item.index, error, request_bytes=item.request_bytes))
            elif item.kind == "conn":
                item.future.set_result((None, error))
            elif item.kind == "reset":
                item.future.set_result(error)
            else:
                item.future.set_result(None)

    # -- requests -----------------------------------------------------------------------------------------
    def place(self, index: int, pieces: list[memoryview], future: concurrent.futures.Future, batch: list) -> None:
        """Register ``future`` and write the request into this worker's arena, its descriptor appended to
        ``batch`` (sent by :meth:`send_descriptors`); without room it goes through the pipe now (``batch``
        first, so one session's requests keep their order); a dead worker's fails at once."""
        nbytes = pieces_size(pieces)
        with self.lock:
            if not self.alive:
                why = f" (its transport worker exited: {self.death})" if self.death else ""
                error = ConnectionLost(f"session {index} is not connected{why}")
                future.set_result(Outcome.failed(index, error, request_bytes=nbytes))
                return
            spot = self._alloc(nbytes)
            token = next(_TOKENS)
            if spot is not None:
                seg, offset = spot
                # written under the lock: a range is never handed out again while it is being written
                write_pieces(pieces, self.segments[seg].buf, offset)
                self.pending[token] = _Pending("out", future, index, spot, nbytes)
                batch.append([token, index, seg, offset, nbytes])
                return
            self.pending[token] = _Pending("out", future, index, None, nbytes)
        self.send_descriptors(batch)
        batch.clear()
        self._write(["sendb", token, index, b"".join(pieces)])

    def _alloc(self, nbytes: int) -> tuple[int, int] | None:
        """(segment, offset) of room for ``nbytes`` (caller holds the lock); a new segment when the arena
        may grow; None when it is full."""
        for seg, extents in enumerate(self.extents):
            offset = extents.alloc(nbytes)
            if offset is not None:
                return seg, offset
        have = sum(e.size for e in self.extents)
        size = max(FIRST_SEGMENT_BYTES, have, 2 * nbytes)
        size = min(size, self.arena_bytes - have)
        if size < max(nbytes, _MIN_SEGMENT_BYTES):
            self._warn_no_room(f"the arena's {self.arena_bytes} bytes are in use")
            return None
        try:
            segment = _create_segment(size)
        except OSError as exc:
            self._warn_no_room(f"a shared-memory segment of {size} bytes could not be made: {exc}")
            return None
        self.segments.append(segment)
        self.extents.append(Extents(size))
        seg = len(self.segments) - 1
        self._write(["seg", seg, segment.name])  # before any descriptor that names it
        return seg, self.extents[seg].alloc(nbytes)

    def _warn_no_room(self, why: str) -> None:
        if not self.no_room_warned:
            self.no_room_warned = True
            logger.warning("transport worker %d: %s; requests go through the pipe meanwhile", self.number, why)

    def place_many(self, entries: list[tuple[int, list[memoryview], concurrent.futures.Future]]) -> None:
        """:meth:`place` each ``(index, pieces, future)`` in order, then send their descriptors at once."""
        batch: list[list] = []
        for index, pieces, future in entries:
            self.place(index, pieces, future, batch)
        self.send_descriptors(batch)

    def send_descriptors(self, descriptors: list[list]) -> None:
        if descriptors:
            self._write(["send", descriptors])

    def request(self, kind: str, index: int, message: list[Any]) -> concurrent.futures.Future:
        """Send a ``connect`` or ``reset`` for session ``index``; a future of its answer."""
        future: concurrent.futures.Future = concurrent.futures.Future()
        token = self._register(_Pending(kind, future, index))
        if token is None:
            why = f" (its transport worker exited: {self.death})" if self.death else ""
            error = ConnectionLost(f"session {index} is not connected{why}")
            future.set_result((None, error) if kind == "conn" else error)
            return future
        if kind == "conn":
            self._write(["connect", [[token, index]]])
        else:
            self._write(["reset", token, index, *message])
        return future


_TOKENS = itertools.count(1)


class ProcessSessionPool(PoolBase):
    """:class:`~dz_gym.transport.SessionPool`'s behaviour with session ``i`` in worker process ``i % P``
    (see the module docstring). Methods are thread-safe; every call is bounded by the config.

    ``processes``: how many workers (at most one per session). ``arena_bytes``: the most shared memory of one
    worker. ``start_timeout``: bound on a worker's start-up. ``max_restarts``: how often a dead worker is
    restarted by ``connect``/``reconnect``.
    """

    def __init__(
        self,
        urls: list[str] | str,
        num_sessions: int,
        config: TransportConfig | None = None,
        *,
        processes: int = 2,
        arena_bytes: int = ARENA_BYTES,
        start_timeout: float = START_TIMEOUT_S,
        max_restarts: int = MAX_RESTARTS,
    ):
        urls, self._config = check_pool_args(urls, num_sessions, config)
        if not isinstance(processes, int) or isinstance(processes, bool) or processes < 1:
            raise ValueError(f"processes: expected an int >= 1, got {processes!r}")
        if not isinstance(arena_bytes, int) or isinstance(arena_bytes, bool) or arena_bytes < 0:
            raise ValueError(f"arena_bytes: expected an int >= 0, got {arena_bytes!r}")
        if self._config.ssl_context is not None:
            raise ValueError("config.ssl_context: a TLS context cannot be handed to worker processes; expected None")
        self._num = num_sessions
        self._urls = [urls[i % len(urls)] for i in range(num_sessions)]
        count = min(processes, num_sessions)
        concurrency = max(1, math.ceil(self._config.connect_concurrency / count))
        self._workers = [
            _Worker(
                w,
                [(i, self._urls[i]) for i in range(w, num_sessions, count)],
                self._config,
                concurrency=concurrency,
                arena_bytes=arena_bytes,
                start_timeout=start_timeout,
                max_restarts=max_restarts,
            )  # fmt: skip
            for w in range(count)
        ]
        self._metadata: list[ServerMetadata | None] = [None] * num_sessions
        self._profiler = None
        self._copiers: list[concurrent.futures.ThreadPoolExecutor] = []  # at most one (see _copier)
        self._copier_lock = threading.Lock()
        self._finalizer = weakref.finalize(
            self, _close_workers, list(self._workers), self._config.close_timeout, self._copiers
        )
        try:
            for worker in self._workers:
                worker.spawn()
            for worker in self._workers:
                worker.wait_ready()
        except BaseException:
            self._finalizer()
            raise

    # -- introspection ------------------------------------------------------------------------------------
    @property
    def num_sessions(self) -> int:
        return self._num

    @property
    def processes(self) -> int:
        return len(self._workers)

    def url(self, i: int) -> str:
        self._check(i)
        return self._urls[i]

    def metadata(self, i: int) -> ServerMetadata | None:
        """Metadata of session ``i``'s last handshake (``None`` if it never connected)."""
        self._check(i)
        return self._metadata[i]

    def is_connected(self, i: int) -> bool:
        worker = self._worker(i)
        with worker.lock:
            return worker.alive and worker.connected[i]

    def worker_pid(self, i: int) -> int | None:
        """The process id of session ``i``'s worker (None while it is not running)."""
        worker = self._worker(i)
        return worker.process.pid if worker.alive else None

    def shared_memory_names(self) -> list[str]:
        """The names of the shared-memory segments the workers use now (under /dev/shm on Linux)."""
        return [s.name for w in self._workers for s in w.segments]

    def _check(self, i: int) -> None:
        if self.closed:
            raise RuntimeError("ProcessSessionPool is closed")
        if not isinstance(i, int) or isinstance(i, bool) or not 0 <= i < self._num:
            raise ValueError(f"session index: expected an int in [0, {self._num}), got {i!r}")

    def _worker(self, i: int) -> _Worker:
        self._check(i)
        return self._workers[i % len(self._workers)]

    # -- connecting ---------------------------------------------------------------------------------------
    def connect(self, indices: Iterable[int] | None = None) -> list[ServerMetadata]:
        """Connect the given sessions (default: all) concurrently, at most ``connect_concurrency`` at once
        over all workers (a dead worker is restarted first).

        Returns their metadata in the order of ``indices``. If some fail, the rest stay connected and
        :class:`PartialConnectError` is raised with both the metadata and the per-session errors.
        """
        order = list(range(self._num)) if indices is None else list(indices)
        for i in order:
            self._check(i)
        errors: dict[int, DzGymError] = {}
        futures: dict[int, concurrent.futures.Future] = {}
        for i in order:
            worker = self._worker(i)
            try:
                worker.ensure_alive()
            except DzGymError as exc:
                errors[i] = exc
                continue
            futures[i] = worker.request("conn", i, [])
        per_worker = max((sum(1 for i in futures if self._worker(i) is w) for w in self._workers), default=0)
        concurrency = self._workers[0].concurrency
        bound = self._config.connect_bound() * math.ceil(per_worker / concurrency) + 5.0
        done, _ = concurrent.futures.wait(futures.values(), timeout=bound)
        connected: dict[int, ServerMetadata] = {}
        for i, future in futures.items():
            if future not in done:
                errors[i] = RequestTimeout(f"session {i}: connect did not finish within {bound:g} s")
                continue
            metadata, error = future.result()
            if error is not None:
                errors[i] = error
            else:
                self._metadata[i] = connected[i] = metadata
        if errors:
            raise PartialConnectError(connected, errors)
        return [connected[i] for i in order]

    def reconnect(self, i: int) -> ServerMetadata:
        """Close session ``i``'s connection and open a new one (bounded); returns the new metadata. A dead
        worker is restarted first (``max_restarts`` per worker, then :class:`~dz_gym.errors.WorkerError`)."""
        worker = self._worker(i)
        worker.ensure_alive()
        bound = self._config.connect_bound() + 5.0
        try:
            metadata, error = worker.request("conn", i, []).result(bound)
        except concurrent.futures.TimeoutError:
            raise RequestTimeout(f"session {i}: reconnect did not finish within {bound:g} s") from None
        if error is not None:
            raise error
        self._metadata[i] = metadata
        return metadata

    # -- requests -----------------------------------------------------------------------------------------
    def submit(self, i: int, request: dict | bytes) -> concurrent.futures.Future[Outcome]:
        """Issue one infer request for session ``i`` without waiting; the future never raises, its
        :class:`Outcome` carries the reply or the error. A dict is encoded here, into the worker's arena."""
        return self.submit_many([(i, request)])[0]

    def submit_many(self, items) -> list[concurrent.futures.Future[Outcome]]:
        """:meth:`submit` for each ``(i, request)``: each encoded here into its worker's arena, then one
        descriptor message per worker.

        A call of at least :data:`PARALLEL_COPY_BYTES` writes each worker's requests on a thread of its own,
        side by side (the copies let go of the interpreter lock), and returns once all are written: the caller
        may reuse its arrays as soon as this returns, as with SessionPool."""
        profiler = self._profiler
        start = time.perf_counter()
        futures: list[concurrent.futures.Future[Outcome]] = []
        entries: dict[int, list[tuple[int, list[memoryview], concurrent.futures.Future]]] = {}
        nbytes = 0
        for i, request in items:
            worker = self._worker(i)
            future: concurrent.futures.Future[Outcome] = concurrent.futures.Future()
            futures.append(future)
            try:
                pieces = request_pieces(request)
            except DzGymError as exc:
                future.set_result(Outcome.failed(i, exc))
                continue
            nbytes += pieces_size(pieces)
            entries.setdefault(worker.number, []).append((i, pieces, future))
        if len(entries) > 1 and nbytes >= PARALLEL_COPY_BYTES:
            copier = self._copier()
            tasks = [copier.submit(self._workers[n].place_many, batch) for n, batch in entries.items()]
            done, _ = concurrent.futures.wait(tasks, timeout=COPY_TIMEOUT_S)
            if len(done) < len(tasks):  # memory copies: only a machine that has stopped gets here
                raise RuntimeError(f"writing {nbytes} bytes of requests took over {COPY_TIMEOUT_S:g} s")
            for task in tasks:
                task.result()
        else:
            for n, batch in entries.items():
                self._workers[n].place_many(batch)
        if profiler is not None:
            profiler.add("encode", time.perf_counter() - start)
        return futures

    def _copier(self) -> concurrent.futures.ThreadPoolExecutor:
        """The threads that write requests into the arenas, one per worker (made at first use)."""
        with self._copier_lock:
            if not self._copiers:
                self._copiers.append(
                    concurrent.futures.ThreadPoolExecutor(
                        len(self._workers), thread_name_prefix="dz-gym-transport-copy"
                    )
                )
            return self._copiers[0]

    def transport_cpu_s(self) -> float | None:
        """CPU seconds the worker processes have used so far (all of them, live ones; Linux's ``/proc``), the
        counterpart of SessionPool's loop thread for ``--profile``; None where it cannot be read."""
        total = 0.0
        for worker in self._workers:
            process = worker.process
            seconds = None if process is None else _process_cpu_s(process.pid)
            if seconds is None:
                return None
            total += seconds
        return total

    def set_profiler(self, profiler) -> None:
        """Time the encoding into the arenas and the hand-offs (the caller's side) and the parsing of the
        replies into ``profiler`` (a :class:`dz_gym.profiling.StageProfiler`; None: stop); the workers time
        their sends and each outcome carries them here."""
        self._profiler = profiler
        for worker in self._workers:
            worker.profiler = profiler

    def release(self, i: int, session_id: str) -> concurrent.futures.Future[None]:
        """Ask session ``i``'s server to free ``session_id`` (a ``reset`` naming it) without waiting; best
        effort, as :meth:`SessionPool.release <dz_gym.transport.SessionPool.release>`."""
        answer = self._worker(i).request("reset", i, [session_id])
        done: concurrent.futures.Future[None] = concurrent.futures.Future()

        def settle(future: concurrent.futures.Future) -> None:
            error = future.result()
            if error is not None:
                logger.info("session %d: releasing %s failed: %s", i, session_id, error)
            done.set_result(None)

        answer.add_done_callback(settle)
        return done

    def end_session(self, i: int, session_id: str) -> None:
        """As :meth:`SessionPool.end_session <dz_gym.transport.SessionPool.end_session>`."""
        metadata = self.metadata(i)
        if metadata is not None and releases_sessions(metadata.contract) and self.is_connected(i):
            self.release(i, session_id)

    # -- teardown -----------------------------------------------------------------------------------------
    def close(self) -> None:
        """Close every connection, join the workers and unlink their shared memory; idempotent."""
        self._finalizer()


def _close_workers(
    workers: list[_Worker], close_timeout: float, copiers: list[concurrent.futures.ThreadPoolExecutor]
) -> None:
    """The pool's one close path (also run when a forgotten pool is collected or the interpreter exits);
    the workers close side by side."""
    for copier in copiers:
        copier.shutdown(wait=True)  # a write in progress ends before its arena can go
    threads = [threading.Thread(target=w.shutdown, args=(close_timeout,), daemon=True) for w in workers]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(close_timeout + 4 * _STOP_GRACE_S)
