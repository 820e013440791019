"""Tiny loopback websocket servers for transport tests: well-behaved ones and deliberately broken ones.

Each server runs on its own event loop in a daemon thread (never the client's loop), binds 127.0.0.1 on a
free port and is stopped within a few seconds by ``stop()`` (or the context manager), whatever its handler
is doing. :class:`StampPolicy` is a policy for the reference server (:mod:`dz_gym.server`) that stamps each
request it processes, so a test can prove that no request was processed twice; :func:`gather` waits for
one outcome per session of a :class:`~dz_gym.transport.SessionPool`.

Not covered: these servers speak only what their handler says; for the real servers' behaviours use the
reference server (:mod:`dz_gym.server`) or the PyPI peers.

>>> import numpy as np
>>> from dz_gym.transport import SessionPool
>>> with ServerThread(good()) as server, SessionPool(server.url, 2) as pool:
...     _ = pool.connect()
...     outcomes = gather(pool, {0: {"prompt": "a"}, 1: {"prompt": "b"}})
>>> sorted((i, o.ok) for i, o in outcomes.items())
[(0, True), (1, True)]
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import logging
import os
import re
import select
import socket
import threading
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import numpy as np
from websockets.asyncio.server import Server, ServerConnection, serve

from dz_gym.errors import RequestTimeout
from dz_gym.protocol import JOINT_KEY, packb
from dz_gym.protocol.messages import DREAMZERO_METADATA
from dz_gym.transport import Outcome, SessionPool

__all__ = [
    "DZ_METADATA",
    "STAMP_KEY",
    "ServerLogWatch",
    "ServerThread",
    "StampPolicy",
    "chunk",
    "dies_mid_request",
    "free_port",
    "gather",
    "good",
    "idle_close",
    "Fifo",
    "replying",
    "serialized",
    "silent_after_handshake",
    "silent_before_handshake",
    "text_error_at_handshake",
]

DZ_METADATA = dict(DREAMZERO_METADATA)

Handler = Callable[[ServerConnection], Awaitable[None]]


def free_port() -> int:
    """A loopback port nothing listens on (it was free a moment ago)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def chunk(horizon: int = 24, dim: int = 8, value: float = 0.25) -> np.ndarray:
    """A valid bare action chunk, as DreamZero and vLLM-Omni reply."""
    return np.full((horizon, dim), value, dtype=np.float32)


class ServerThread:
    """A websockets server running ``handler`` on its own loop in a daemon thread."""

    def __init__(self, handler: Handler, **serve_kwargs: Any):
        self.connections = 0
        self.requests: list[bytes | str] = []
        self._handler = handler
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="test-ws-server", daemon=True)
        self._thread.start()
        kwargs = {"compression": None, "max_size": None, **serve_kwargs}
        self.server: Server = asyncio.run_coroutine_threadsafe(self._start(kwargs), self.loop).result(10)
        port = self.server.sockets[0].getsockname()[1]
        scheme = "wss" if serve_kwargs.get("ssl") is not None else "ws"
        self.port = port
        self.url = f"{scheme}://127.0.0.1:{port}"

    async def _start(self, kwargs: dict[str, Any]) -> Server:
        return await serve(self._counted, "127.0.0.1", 0, **kwargs)

    async def _counted(self, ws: ServerConnection) -> None:
        self.connections += 1
        await self._handler(ws)

    def stop(self) -> None:
        async def shutdown() -> None:
            self.server.close()
            try:
                await asyncio.wait_for(self.server.wait_closed(), 3.0)
            except asyncio.TimeoutError:
                pass
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in tasks:
                task.cancel()
            await asyncio.wait(tasks, timeout=2.0) if tasks else None

        if self._thread.is_alive():
            try:
                asyncio.run_coroutine_threadsafe(shutdown(), self.loop).result(10)
            finally:
                self.loop.call_soon_threadsafe(self.loop.stop)
                self._thread.join(5)

    def __enter__(self) -> ServerThread:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


# ------------------------------------------------------------------------------------------------ handlers
def replying(reply: Callable[[bytes | str, int], Any], metadata: Any = DZ_METADATA, delay_s: float = 0.0) -> Handler:
    """Send ``metadata``, then answer the n-th request with ``reply(request, n)`` (bytes/str sent as-is,
    anything else encoded with msgpack) after ``delay_s`` (an async sleep, so connections overlap)."""

    async def handler(ws: ServerConnection) -> None:
        await ws.send(metadata if isinstance(metadata, (bytes, str)) else packb(metadata))
        n = 0
        async for request in ws:
            if delay_s:
                await asyncio.sleep(delay_s)
            answer = reply(request, n)
            n += 1
            await ws.send(answer if isinstance(answer, (bytes, str)) else packb(answer))

    return handler


def serialized(handler_reply: Callable[[bytes | str, int], Any], delay_s: float) -> Handler:
    """Like :func:`replying`, but one request at a time across all connections (a one-worker server)."""
    lock = asyncio.Lock()

    async def handler(ws: ServerConnection) -> None:
        await ws.send(packb(DZ_METADATA))
        n = 0
        async for request in ws:
            async with lock:
                await asyncio.sleep(delay_s)
            answer = handler_reply(request, n)
            n += 1
            await ws.send(packb(answer))

    return handler


def good(delay_s: float = 0.0) -> Handler:
    """A DreamZero-like server: bare (24, 8) chunks for infers, text ``reset successful`` for resets."""
    return replying(lambda request, n: chunk(value=float(n)), delay_s=delay_s)


async def silent_before_handshake(ws: ServerConnection) -> None:
    """Accepts the websocket and never sends the metadata frame."""
    await ws.wait_closed()


async def silent_after_handshake(ws: ServerConnection) -> None:
    """Sends metadata, then reads requests and never answers."""
    await ws.send(packb(DZ_METADATA))
    async for _ in ws:
        pass


async def dies_mid_request(ws: ServerConnection) -> None:
    """Sends metadata, reads one request, then drops the TCP connection without a close frame."""
    await ws.send(packb(DZ_METADATA))
    await ws.recv()
    ws.transport.abort()


async def idle_close(ws: ServerConnection) -> None:
    """Sends metadata, then closes normally (1000) at once, as vLLM-Omni does after its idle timeout."""
    await ws.send(packb(DZ_METADATA))
    await ws.close(1000, "idle timeout")


def text_error_at_handshake(ws_frame: str) -> Handler:
    """Sends a text frame instead of the metadata, then closes (vLLM-Omni without a robot policy)."""

    async def handler(ws: ServerConnection) -> None:
        await ws.send(ws_frame)
        await ws.close(1000)

    return handler


# ------------------------------------------------------------------------------------------------ helpers
def gather(pool: SessionPool, requests: Mapping[int, Any], timeout: float | None = None) -> dict[int, Outcome]:
    """Submit one request per session at once and return every :class:`Outcome` (by session index).

    Each wait is bounded by ``timeout`` (default: the pool config's ``request_bound()``); a request still
    running past it is cancelled and reported as a :class:`~dz_gym.errors.RequestTimeout` outcome.
    """
    bound = pool.config.request_bound() if timeout is None else timeout
    futures = {i: pool.submit(i, request) for i, request in requests.items()}
    concurrent.futures.wait(futures.values(), timeout=bound)
    outcomes: dict[int, Outcome] = {}
    for i, future in futures.items():
        if future.done() and not future.cancelled():
            outcomes[i] = future.result()
        else:
            future.cancel()
            outcomes[i] = Outcome.failed(i, RequestTimeout(f"session {i}: no outcome within {bound:g} s"))
    return outcomes


STAMP_KEY = "request_id"
"""The request field :class:`StampPolicy` stamps (any string unique per request)."""


class StampPolicy:
    """A reference-server policy that records every request it processes, keyed by ``request[STAMP_KEY]``.

    ``processed`` counts how often each stamp reached the model (server side: the truth about duplicates);
    ``order`` lists them in processing order with their session id and ``new_session`` flag. The reply chunk
    holds the request's joints in columns 0-6 and, in column 7, how many times this stamp has been processed
    so far (1.0 for a first time), so a client that cannot see the server still learns of a duplicate.
    With ``started_fifo`` (a named pipe a test reads, see :class:`Fifo`), each inference writes its stamp
    and a newline there when it starts: a test can wait for "the server is computing it" across processes.
    """

    def __init__(self, horizon: int = 24, metadata: dict | None = None, started_fifo: str | None = None):
        self.horizon = int(horizon)
        self.metadata = dict(DZ_METADATA if metadata is None else metadata)
        self.started_fifo = started_fifo
        self._lock = threading.Lock()
        self.processed: collections.Counter[str] = collections.Counter()
        self.order: list[tuple[str, str, bool]] = []

    def infer(self, request: dict, *, session_id: str, new_session: bool) -> np.ndarray:
        stamp = str(request.get(STAMP_KEY, ""))
        with self._lock:
            self.processed[stamp] += 1
            count = self.processed[stamp]
            self.order.append((stamp, session_id, new_session))
        if self.started_fifo is not None:  # tell a test in another process that the model holds the request
            _announce(self.started_fifo, stamp)
        out = np.zeros((self.horizon, 8), dtype=np.float32)
        joints = np.asarray(request.get(JOINT_KEY, np.zeros(7)), dtype=np.float32).reshape(-1)[:7]
        out[:, : joints.size] = joints
        out[:, 7] = count
        return out

    def duplicates(self) -> dict[str, int]:
        """Stamps processed more than once (empty when every request reached the model at most once)."""
        with self._lock:
            return {stamp: n for stamp, n in self.processed.items() if n > 1}


class ServerLogWatch(logging.Handler):
    """Counts log records of an in-process server that match ``pattern`` and lets a test wait for them.

    The reference server reports what it does on the ``dz_gym.server`` logger (a connection opened, closed,
    closed for idleness, an inference); waiting on those reports is how a test synchronizes with the server
    without sleeping. Use it as a context manager: it attaches itself and lowers the logger to INFO, and
    restores both on exit.
    """

    def __init__(self, pattern: str, logger: str = "dz_gym.server"):
        super().__init__(logging.INFO)
        self._pattern = re.compile(pattern)
        self._logger = logging.getLogger(logger)
        self._previous_level = self._logger.level
        self._cond = threading.Condition()
        self.count = 0

    def emit(self, record: logging.LogRecord) -> None:
        if self._pattern.search(record.getMessage()):
            with self._cond:
                self.count += 1
                self._cond.notify_all()

    def wait(self, count: int, timeout: float) -> bool:
        """True once ``count`` matching records were seen; False when ``timeout`` seconds passed first."""
        with self._cond:
            return self._cond.wait_for(lambda: self.count >= count, timeout)

    def __enter__(self) -> ServerLogWatch:
        self._previous_level = self._logger.level
        if self._logger.getEffectiveLevel() > logging.INFO:
            self._logger.setLevel(logging.INFO)
        self._logger.addHandler(self)
        return self

    def __exit__(self, *exc: object) -> None:
        self._logger.removeHandler(self)
        self._logger.setLevel(self._previous_level)


def _announce(path: str, stamp: str) -> None:
    try:
        fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK)
    except OSError:  # nobody reads: nothing to tell
        return
    try:
        os.write(fd, (stamp + "\n").encode("utf-8", "replace"))
    finally:
        os.close(fd)


class Fifo:
    """A named pipe at ``path`` that this process reads line by line, for waiting on another process.

    It holds a write end open itself, so a reader never sees end-of-file between the writer's lines and
    :meth:`read_line` blocks in ``select`` until a line arrives or its bound runs out.
    """

    def __init__(self, path: str):
        self.path = str(path)
        os.mkfifo(self.path)
        self._read = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK)
        self._hold = os.open(self.path, os.O_WRONLY | os.O_NONBLOCK)
        self._buffer = b""

    def read_line(self, timeout: float) -> str | None:
        """The next line written to the pipe (without the newline), or ``None`` after ``timeout`` s."""
        deadline = time.monotonic() + timeout
        while b"\n" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            ready, _, _ = select.select([self._read], [], [], left)
            if ready:
                self._buffer += os.read(self._read, 4096)
        line, _, self._buffer = self._buffer.partition(b"\n")
        return line.decode("utf-8", "replace")

    def close(self) -> None:
        for fd in (self._read, self._hold):
            try:
                os.close(fd)
            except OSError:
                pass

    def __enter__(self) -> Fifo:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
