"""This process's side of one transport worker (:class:`WorkerHandle`, for
:class:`~dz_gym.transport.ProcessSessionPool`): the process and its pipe, its arena (shared-memory segments,
:class:`~dz_gym.transport.workers.segments.SharedSegments`), the requests in flight and its sessions'
connected flags; the worker process itself is :mod:`dz_gym.transport.workers.process`.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import itertools
import logging
import multiprocessing
import os
import threading
import time
from typing import Any

from dz_gym.errors import ConnectionLost, DzGymError, WorkerError
from dz_gym.policy_client import Outcome
from dz_gym.protocol import parse_metadata
from dz_gym.protocol.packer import pieces_size, write_pieces
from dz_gym.spawning import start_worker
from dz_gym.transport.config import TransportConfig
from dz_gym.transport.workers import messages as msg
from dz_gym.transport.workers.messages import (
    Kind,
    MessageError,
    config_fields,
    pack_message,
    read_message,
    rebuild_error,
    reply_outcome,
    unpack_message,
)
from dz_gym.transport.workers.process import worker_main
from dz_gym.transport.workers.segments import SharedSegments
from dz_gym.transport.workers.views import HostViews

__all__ = [
    "ARENA_BYTES",
    "FIRST_SEGMENT_BYTES",
    "MAX_RESTARTS",
    "START_TIMEOUT_S",
    "STOP_GRACE_S",
    "WorkerHandle",
    "process_cpu_s",
]

logger = logging.getLogger("dz_gym.transport")

START_TIMEOUT_S = 60.0
"""Bound on a worker's start-up (a fresh interpreter importing the transport), and on each restart."""
FIRST_SEGMENT_BYTES = 32 * 2**20
"""A worker's first shared-memory segment; each further one doubles the worker's arena."""
ARENA_BYTES = 2**30
"""Default cap of one worker's shared memory (N = 1024 sessions of 0.5 MB over 2 workers need 256 MiB each)."""
MAX_RESTARTS = 3
BY_REFERENCE_BYTES = 4096
"""A piece of a request at least this large goes to the worker as a reference into the view memory."""
INLINE_MESSAGE_BYTES = 32 * 2**20
"""A ``send`` message goes out once the requests inline in it (no room in the arena) reach this many bytes, and
the rest follow in the next: the pipe's messages stay bounded while the arena is full."""
_MIN_SEGMENT_BYTES = 2**16
STOP_GRACE_S = 5.0  # a worker that answered "closed" (or died) exits within this


def process_cpu_s(pid: int | None) -> float | None:
    """User plus system CPU seconds of process ``pid`` (``/proc/PID/stat``), None where it cannot be read."""
    if pid is None:
        return None
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            fields = stat.read().rsplit(b")", 1)[1].split()  # after the command name, which may hold spaces
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime (fields 14, 15)
    except (OSError, ValueError, IndexError):
        return None


# ================================================================================== the worker process side
@dataclasses.dataclass
class _Pending:
    """A request of this process's that a worker has not answered yet."""

    kind: Kind  # the answer it waits for: OUT (infer), CONN, RESET_DONE, CLOSED, TOOK (a batch's view blocks)
    future: concurrent.futures.Future
    index: int
    extent: tuple[int, int] | None = None  # (segment, offset) to free when it is answered
    request_bytes: int = 0
    holds: list[tuple[int, int]] | None = None  # its blocks of the pool's view memory, until the worker took them


class WorkerHandle:
    """This process's side of one worker process: the process, its pipe, its arena of shared-memory
    segments, the requests in flight, and its sessions' connected flags. Holds no reference to the pool (so
    a forgotten pool can be collected and its finalizer close the workers)."""

    def __init__(self, number: int, sessions: list[tuple[int, str]], config: TransportConfig, *, concurrency: int,
                 arena_bytes: int, start_timeout: float, max_restarts: int,
                 views: HostViews | None = None):  # fmt: skip
        self.number = number
        self.views = views  # the pool's view segments, mapped by every worker
        self.sessions = sessions
        self.config = config
        self.concurrency = concurrency
        self.start_timeout = start_timeout
        self.restarts_left = max_restarts
        self.lock = threading.Lock()  # pending, arena, alive, connected
        self.send_lock = threading.Lock()  # one writer on the pipe at a time (taken inside ``lock``, never around)
        self.pending: dict[int, _Pending] = {}
        self.arena = SharedSegments(
            arena_bytes,
            FIRST_SEGMENT_BYTES,
            doubling=True,
            min_bytes=_MIN_SEGMENT_BYTES,
            announce=self._announce_segment,
            label="the arena's",
            warning=f"transport worker {number}: %s; requests go through the pipe meanwhile",
        )
        self.connected = {i: False for i, _ in sessions}
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
        process = ctx.Process(target=worker_main, args=(child_conn,), name=f"dz-gym-transport-{self.number}",
                              daemon=True)  # fmt: skip
        start_worker(process)  # the caller's script is not run again in the worker
        child_conn.close()  # only the child holds its end now: its death is our EOF
        init = msg.INIT(
            config_fields(self.config),
            [[i, url] for i, url in self.sessions],
            self.concurrency,
            [[k, name] for k, name in self.arena.names],
            [] if self.views is None else [[k, name] for k, name in self.views.names],
        )
        parent_conn.send_bytes(pack_message(init))
        self.process, self.conn = process, parent_conn

    def wait_ready(self) -> None:
        """Wait (bounded by ``start_timeout``) for the worker's ready message, then start the reader thread."""
        conn, process = self.conn, self.process
        try:
            ready = conn.poll(self.start_timeout)
            batch = unpack_message(conn.recv_bytes()) if ready else None
            if batch is not None and read_message(batch[0], msg.TO_PARENT)[0] is not msg.READY:
                raise MessageError(f"expected {msg.READY.name} first, got {batch[0][0]!r}")
        except MessageError as exc:
            self._discard_process()
            raise WorkerError(f"transport worker {self.number} did not start: {exc}") from None
        except (EOFError, OSError):
            process.join(STOP_GRACE_S)
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
            process.join(STOP_GRACE_S)
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
            self.reader.join(STOP_GRACE_S)
        self.spawn()
        self.wait_ready()

    def shutdown(self, close_timeout: float) -> None:
        """Close the worker's sessions, join it (bounded; killed if it does not exit), fail what is left."""
        with self.lock:
            self.closing = True
            alive = self.alive
        if alive:
            closed: concurrent.futures.Future = concurrent.futures.Future()
            token = self._register(_Pending(msg.CLOSED, closed, -1))
            if token is not None and self._write(msg.CLOSE(token)):
                try:
                    closed.result(close_timeout + STOP_GRACE_S)
                except (concurrent.futures.TimeoutError, concurrent.futures.CancelledError):
                    logger.debug("transport worker %d did not close in time", self.number)
        process = self.process
        if process is not None:
            process.join(STOP_GRACE_S)
            if process.is_alive():
                process.kill()
                process.join(STOP_GRACE_S)
        if self.conn is not None:
            self.conn.close()
        if self.reader is not None and self.reader is not threading.current_thread():
            self.reader.join(STOP_GRACE_S)
        self._fail_pending("the pool was closed")
        with self.lock:
            self.arena.close()

    # -- the pipe -----------------------------------------------------------------------------------------
    def _write(self, message: list[Any]) -> bool:
        """Send one message; False when the worker is gone (its reader thread then fails what is pending).

        A write waits only while the worker's pipe is full; the worker drains it with a thread of its own."""
        data = pack_message(message)
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
            token = next(TOKENS)
            self.pending[token] = pending
            return token

    def _read(self, conn: Any, generation: int) -> None:
        while True:
            try:
                for message in unpack_message(conn.recv_bytes()):
                    self._deliver(*read_message(message, msg.TO_PARENT))
            except (EOFError, OSError):
                break
            except MessageError as exc:  # a bug of the worker's: it goes, and what it had pending fails
                logger.error("transport worker %d: %s; stopping it", self.number, exc)
                if self.process is not None:
                    self.process.kill()
                break
        self._died(generation)

    def _deliver(self, kind: Kind, fields: list[Any]) -> None:
        if kind is msg.READY:
            return
        token = fields[0]
        if kind is msg.TOOK:  # the worker joined the request's (or the batch's) view ranges into its frames
            with self.lock:
                pending = self.pending.get(token)
                holds = None if pending is None else pending.holds
                if pending is not None:
                    pending.holds = None
                    if pending.kind is msg.TOOK:
                        del self.pending[token]
            self._release_views(holds)
            return
        with self.lock:
            pending = self.pending.pop(token, None)
            if pending is None:
                return
            holds, pending.holds = pending.holds, None
            if pending.extent is not None:
                self.arena.free(*pending.extent)
            if kind is not msg.CLOSED:
                self.connected[pending.index] = bool(fields[-1])
        self._release_views(holds)
        future = pending.future
        if kind is msg.OUT:
            _, index, frame, stamps, error, send_s, _ = fields
            start = time.perf_counter()
            outcome = reply_outcome(index, frame, stamps, error)
            profiler = self.profiler
            if profiler is not None:
                profiler.add("send", send_s)  # the worker's, since its last outcome
                if outcome.reply is not None:
                    profiler.add("receive_decode", time.perf_counter() - start)
            future.set_result(outcome)
        elif kind is msg.CONN:
            _, index, meta, error, _ = fields
            if error is not None:
                future.set_result((None, rebuild_error(error)))
            else:
                try:
                    future.set_result((parse_metadata(meta), None))
                except DzGymError as exc:
                    future.set_result((None, exc))
        elif kind is msg.RESET_DONE:
            error = fields[2]
            future.set_result(None if error is None else rebuild_error(error))
        else:  # CLOSED
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
            process.join(STOP_GRACE_S)
        code = None if process is None else process.exitcode
        pid = None if process is None else process.pid
        self.death = f"pid {pid}, exit code {code}"
        if not self.closing:
            logger.warning("transport worker %d exited (%s); its sessions are not connected", self.number, self.death)
        self._fail_pending(
            "the pool was closed" if self.closing else f"transport worker {self.number} exited ({self.death})"
        )

    def _release_views(self, holds: list[tuple[int, int]] | None) -> None:
        if holds and self.views is not None:
            for key in holds:
                self.views.release(key)

    def _fail_pending(self, why: str) -> None:
        with self.lock:
            pending, self.pending = list(self.pending.values()), {}
            for item in pending:
                holds, item.holds = item.holds, None
                self._release_views(holds)
                if item.extent is not None:
                    self.arena.free(*item.extent)
        for item in pending:
            error = ConnectionLost(f"session {item.index}: {why}") if item.index >= 0 else None
            if item.kind is msg.OUT:
                item.future.set_result(Outcome.failed(item.index, error, request_bytes=item.request_bytes))
            elif item.kind is msg.CONN:
                item.future.set_result((None, error))
            elif item.kind is msg.RESET_DONE:
                item.future.set_result(error)
            else:
                item.future.set_result(None)

    # -- requests -----------------------------------------------------------------------------------------
    def _announce_segment(self, k: int, name: str) -> None:
        """Tell the worker to map the arena's new segment ``k`` (under ``lock``, before any request names it)."""
        self._write(msg.SEG(k, name))

    def place_many(self, entries: list[tuple[int, Any, concurrent.futures.Future, Any]]) -> None:
        """Register each ``(index, pieces, future, split)``'s future and send the requests in a ``send``
        message, in order (so one session's requests keep theirs); ``pieces`` is None where ``split`` is given.

        A request with a ``split`` of :meth:`by_reference` (its large pieces all lie in the pool's view memory)
        goes as references to them (the worker joins the frame): nothing of it is copied here. Any other is
        written into this worker's arena and goes as its range there, or, without room, inline as its bytes
        (:data:`INLINE_MESSAGE_BYTES` of those end a message, the rest go in the next). A dead worker's
        requests fail at once."""
        requests: list[list] = []
        inline = 0
        for index, pieces, future, split in entries:
            inline += self._place(index, pieces, split, future, requests)
            if inline >= INLINE_MESSAGE_BYTES:
                self._write(msg.SEND(requests))
                requests, inline = [], 0
        if requests:
            self._write(msg.SEND(requests))

    def _place(self, index: int, pieces: Any, split: Any, future: concurrent.futures.Future,
               requests: list) -> int:  # fmt: skip
        """Register ``future`` and append its request ``[token, session, parts]`` to ``requests``; the bytes
        it put inline (0 unless the arena had no room)."""
        parts, holds, nbytes = split if split is not None else (None, None, pieces_size(pieces))
        with self.lock:
            alive = self.alive
            if alive:
                token = next(TOKENS)
                spot = None if parts is not None else self.arena.alloc(nbytes)
                if spot is not None:
                    seg, offset = spot
                    # written under the lock: a range is never handed out again while it is being written
                    write_pieces(pieces, self.arena.segments[seg].mapping, offset)
                    parts = [[msg.ARENA, seg, offset, nbytes]]
                self.pending[token] = _Pending(msg.OUT, future, index, spot, nbytes, holds)
        if not alive:
            self._release_views(holds)
            future.set_result(Outcome.failed(index, self._not_connected(index), request_bytes=nbytes))
            return 0
        if parts is not None:
            requests.append([token, index, parts])
            return 0
        requests.append([token, index, [b"".join(pieces)]])
        return nbytes

    def by_reference(self, parts: list) -> tuple[list[Any], list[tuple[int, int]], int] | None:
        """``(parts, holds, nbytes)`` of a request's packed parts (:func:`dz_gym.protocol.packer.fast_parts`):
        the small ones joined inline and its large arrays as ``[VIEWS, segment, offset, length]`` of the view
        memory (each block held until the worker took it); None when some large array lies elsewhere (or there
        is no view memory in use)."""
        views = self.views
        return None if views is None else views.refer(parts, BY_REFERENCE_BYTES)

    def template_message(self, parts: list, columns: list[list[Any]], rows: list[tuple[int, int, list[bytes],
                         concurrent.futures.Future, int]], holds: list[tuple[int, int]]) -> list[Any] | None:  # fmt: skip
        """The ``sendt`` message of a batch's requests framed by the worker from one template
        (:class:`~dz_gym.protocol.request_batch.FrameTemplate`): ``parts``, ``columns`` (each ``[segment,
        offset, row bytes]`` of the view memory, or ``[bytes, 0, row bytes]`` inline) and per request ``(index,
        row, strings, future, nbytes)``; each future registered, the blocks of ``holds`` kept until the worker
        took them. None, with every future failed and the holds dropped, when the worker is dead."""
        message_rows = []
        with self.lock:
            if self.alive:
                token = next(TOKENS)
                self.pending[token] = _Pending(msg.TOOK, concurrent.futures.Future(), -1, holds=holds)
                for index, row, strings, future, nbytes in rows:
                    request_token = next(TOKENS)
                    self.pending[request_token] = _Pending(msg.OUT, future, index, None, nbytes)
                    message_rows.append([request_token, index, row, *strings])
                return msg.SENDT(token, parts, columns, message_rows)
        self._release_views(holds)
        for index, _, _, future, nbytes in rows:
            future.set_result(Outcome.failed(index, self._not_connected(index), request_bytes=nbytes))
        return None

    def send_message(self, message: list[Any]) -> None:
        """Send one message (a dead worker's reader fails what it had pending)."""
        self._write(message)

    def announce_views(self, k: int, name: str) -> None:
        """Tell the worker to map view segment ``k`` (a dead one maps them all when it is started again)."""
        if self.conn is not None:  # also while a restart starts (mapping twice is harmless)
            self._write(msg.VSEG(k, name))

    def connect(self, index: int) -> concurrent.futures.Future:
        """(Re)connect session ``index``; a future of ``(metadata, None)`` or ``(None, error)``."""
        return self._ask(msg.CONN, index, lambda token: msg.CONNECT([[token, index]]))

    def reset(self, index: int, session_id: str) -> concurrent.futures.Future:
        """Send a ``reset`` naming ``session_id`` on session ``index``'s connection; a future of None or the
        error."""
        return self._ask(msg.RESET_DONE, index, lambda token: msg.RESET(token, index, session_id))

    def _ask(self, answer: Kind, index: int, message: Any) -> concurrent.futures.Future:
        """Register a future for the worker's ``answer`` and send ``message(token)``."""
        future: concurrent.futures.Future = concurrent.futures.Future()
        token = self._register(_Pending(answer, future, index))
        if token is None:
            error = self._not_connected(index)
            future.set_result((None, error) if answer is msg.CONN else error)
            return future
        self._write(message(token))
        return future

    def _not_connected(self, index: int) -> ConnectionLost:
        """The error of a request for session ``index`` of a worker that is not alive (why it exited, if known)."""
        why = f" (its transport worker exited: {self.death})" if self.death else ""
        return ConnectionLost(f"session {index} is not connected{why}")


TOKENS = itertools.count(1)
