"""A transport worker process (spawned by :class:`~dz_gym.transport.ProcessSessionPool`): its sessions on one
asyncio loop, the requests read from the parent's shared-memory segments, the outcomes sent back over the pipe
(:mod:`dz_gym.transport.workers.messages`).
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import threading
import time
from multiprocessing import shared_memory
from typing import Any

from dz_gym.errors import DzGymError
from dz_gym.protocol import packb
from dz_gym.protocol.request_batch import frame_of
from dz_gym.transport.config import TransportConfig
from dz_gym.transport.session import AsyncSession
from dz_gym.transport.workers import messages as msg
from dz_gym.transport.workers.messages import MessageError, error_fields, pack_message, read_message, unpack_message

__all__ = ["worker_main"]

logger = logging.getLogger("dz_gym.transport")


class FrameKeepingSession(AsyncSession):
    """An AsyncSession whose replies keep their raw frame (sent back to the parent, which parses it again)."""

    @staticmethod
    def _parse_infer(frame: Any) -> Any:
        return (AsyncSession._parse_infer(frame), frame)


class SendClock:
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


class _Took:
    """The countdown of one ``sendt`` batch: when the last of its requests has been framed, the parent is
    told (``took``) that the batch's view blocks are free as far as this worker is concerned."""

    def __init__(self, loop: WorkerLoop, token: int, count: int):
        self.loop, self.token, self.left = loop, token, count
        if count == 0:
            loop.post(msg.TOOK(token))

    def one_done(self) -> None:
        self.left -= 1
        if self.left == 0:
            self.loop.post(msg.TOOK(self.token))


class _Templated:
    """One request of a ``sendt`` batch before it is framed: the template's parts, the batch's columns, its
    row and its packed strings."""

    __slots__ = ("columns", "countdown", "parts", "row", "strings")

    def __init__(self, parts: list, columns: list, row: int, strings: list[bytes], countdown: _Took):
        self.parts, self.columns, self.row, self.strings, self.countdown = parts, columns, row, strings, countdown


class WorkerLoop:
    """The worker process: its sessions on one asyncio loop, fed by a thread reading the parent's pipe."""

    def __init__(self, conn: Any, config: dict[str, Any], sessions: list, concurrency: int, segments: list,
                 views: list):  # fmt: skip
        """The fields of the parent's ``init`` message."""
        self.conn = conn
        transport = TransportConfig(**config)
        self.close_timeout = transport.close_timeout
        self.sessions = {int(i): FrameKeepingSession(url, transport) for i, url in sessions}
        self.sends = SendClock()  # the sends' time, reported with each outcome (the parent's --profile)
        for session in self.sessions.values():
            session.profiler = self.sends
        self.concurrency = int(concurrency)
        self.segments: dict[int, shared_memory.SharedMemory] = {}
        for seg, name in segments:
            self._attach(seg, name)
        self.views: dict[int, shared_memory.SharedMemory] = {}  # the pool's view segments (every worker's)
        for seg, name in views:
            self._attach_views(seg, name)
        self.outbox: list[Any] = []
        self.tasks: set[asyncio.Task[None]] = set()
        self.loop: asyncio.AbstractEventLoop | None = None
        self.handlers = {
            msg.SEND: self._on_send,
            msg.SENDT: self._on_sendt,
            msg.SEG: self._attach,
            msg.VSEG: self._attach_views,
            msg.CONNECT: self._on_connect,
            msg.RESET: self._on_reset,
            msg.CLOSE: self._on_close,
        }

    def _attach(self, seg: int, name: str) -> None:
        # Attaching registers the name with the resource tracker that spawn shares with the parent (a set: the
        # parent's unlink unregisters it once for both).
        self.segments[int(seg)] = shared_memory.SharedMemory(name=name)

    def _attach_views(self, seg: int, name: str) -> None:
        known = self.views.get(int(seg))
        if known is None or known.name.lstrip("/") != str(name).lstrip("/"):
            self.views[int(seg)] = shared_memory.SharedMemory(name=name)

    async def run(self) -> None:
        self.loop = asyncio.get_running_loop()
        self.semaphore = asyncio.Semaphore(self.concurrency)
        self.stopped = asyncio.Event()
        threading.Thread(target=self._read, name="dz-gym-worker-pipe", daemon=True).start()
        self.post(msg.READY(os.getpid()))
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
        try:
            kind, fields = read_message(unpack_message(data), msg.TO_WORKER)
            self.handlers[kind](*fields)
        except MessageError as exc:  # a bug of the parent's: stop, and the parent fails what this worker had
            logger.error("transport worker: %s; closing", exc)
            self._spawn(self._close(None))

    def _on_send(self, requests: list) -> None:
        """Requests as their parts (inline bytes, ranges of the arena or of the view memory): joined by the
        send."""
        for token, index, parts in requests:
            self._spawn(self._send(token, index, parts))

    def _on_sendt(self, token: int, parts: list, columns: list, rows: list) -> None:
        """One batch's requests, each framed here from its template (RequestBatch)."""
        took = _Took(self, token, len(rows))
        for request_token, index, row, *strings in rows:
            self._spawn(self._send(request_token, index, _Templated(parts, columns, row, strings, took)))

    def _on_connect(self, sessions: list) -> None:
        for token, index in sessions:
            self._spawn(self._connect(token, index))

    def _on_reset(self, token: int, index: int, session_id: str | None) -> None:
        self._spawn(self._reset(token, index, session_id))

    def _on_close(self, token: int) -> None:
        self._spawn(self._close(token))

    def _spawn(self, coro: Any) -> None:
        task = asyncio.ensure_future(coro)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    def _range(self, part: list) -> memoryview:
        """The bytes of a ``send`` part ``[memory, segment, offset, length]``, in place."""
        memory, seg, offset, length = part
        segments = self.segments if memory == msg.ARENA else self.views
        return segments[seg].buf[offset : offset + length]

    def _join(self, token: int, parts: list[Any]) -> bytes | memoryview:
        """The frame of a ``send`` request. A request of one part (its range of the arena, or its bytes
        inline when the arena had no room) is that part, not copied; any other is its inline pieces and view
        ranges joined in order (the one copy of the views' bytes after the GPU's), and the parent is told at
        once that the view ranges are free again."""
        if len(parts) == 1 and (isinstance(parts[0], bytes) or parts[0][0] == msg.ARENA):
            return parts[0] if isinstance(parts[0], bytes) else self._range(parts[0])
        views = [part if isinstance(part, bytes) else self._range(part) for part in parts]
        try:
            return b"".join(views)
        finally:
            for view in views:
                if isinstance(view, memoryview):
                    view.release()
            if any(isinstance(part, list) and part[0] == msg.VIEWS for part in parts):
                self.post(msg.TOOK(token))

    def _frame(self, templated: _Templated) -> bytes:
        """The frame of a ``sendt`` request: the template's parts, its row of each column (view ranges or
        inline bytes) and its strings; the parent is told the batch's ranges are free once every request of
        it has been framed."""
        rows: list[Any] = []
        row = templated.row
        try:
            for source, offset, size in templated.columns:
                start = offset + row * size
                if isinstance(source, int):
                    rows.append(self.views[source].buf[start : start + size])
                else:
                    rows.append(source[start : start + size])
            return frame_of(templated.parts, rows, templated.strings)
        finally:
            for view in rows:
                if isinstance(view, memoryview):
                    view.release()
            templated.countdown.one_done()

    async def _send(self, token: int, index: int, request: list | _Templated) -> None:
        """Send one request (a ``send`` request's parts, or a ``sendt`` batch's request) and post its outcome."""
        session = self.sessions[index]
        try:
            payload = self._join(token, request) if isinstance(request, list) else self._frame(request)
        except (KeyError, IndexError, TypeError, ValueError) as exc:  # only a bug of the parent's gets here
            now = time.perf_counter()
            error = DzGymError(f"session {index}: the request's bytes could not be read: {exc!r}")
            self.post(msg.OUT(token, index, None, [now, now, 0, 0, 0], error_fields(error), 0.0, session.connected))
            return
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
        self.post(msg.OUT(token, index, frame, stamps, error, self.sends.take(), session.connected))

    async def _connect(self, token: int, index: int) -> None:
        session = self.sessions[index]
        try:
            async with self.semaphore:
                metadata = await session.connect()
            self.post(msg.CONN(token, index, packb(metadata.raw), None, session.connected))
        except DzGymError as exc:
            self.post(msg.CONN(token, index, None, error_fields(exc), session.connected))
        except Exception as exc:  # noqa: BLE001 - stays with its session, as in SessionPool
            error = DzGymError(f"session {index}: connect failed: {type(exc).__name__}: {exc}")
            self.post(msg.CONN(token, index, None, error_fields(error), session.connected))

    async def _reset(self, token: int, index: int, session_id: str | None) -> None:
        session = self.sessions[index]
        try:
            await session.reset(session_id)
            error = None
        except DzGymError as exc:
            error = error_fields(exc)
        self.post(msg.RESET_DONE(token, index, error, session.connected))

    async def _close(self, token: int | None) -> None:
        """Close every session (a request in flight ends with ConnectionLost and is reported), then stop."""
        await asyncio.gather(*(s.close() for s in self.sessions.values()), return_exceptions=True)
        others = [t for t in self.tasks if t is not asyncio.current_task()]
        if others:
            await asyncio.wait(others, timeout=self.close_timeout + 2.0)
        for segment in [*self.segments.values(), *self.views.values()]:
            try:
                segment.close()
            except BufferError:  # a send still holds a view: the exit unmaps it
                pass
        if token is not None:
            self.post(msg.CLOSED(token))
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
            self.conn.send_bytes(pack_message(batch))
        except (OSError, ValueError):  # the parent is gone
            self.stopped.set()


def worker_main(conn: Any) -> None:
    """Entry point of a worker process (spawned): read the init message, run the loop until told to stop."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C is the parent's to handle; it closes us
    try:
        kind, fields = read_message(unpack_message(conn.recv_bytes()), msg.TO_WORKER)
    except (EOFError, OSError):
        return
    if kind is not msg.INIT:
        raise MessageError(f"transport worker: expected an {msg.INIT.name} message first, got {kind.name}")
    asyncio.run(WorkerLoop(conn, *fields).run())
