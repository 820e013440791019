"""Tiny loopback websocket servers for the transport tests: well-behaved ones and deliberately broken ones.

Each server runs on its own event loop in a daemon thread (never the client's loop), binds 127.0.0.1 on a
free port and is stopped within a few seconds by ``stop()`` (or the context manager), whatever its handler
is doing.
"""

from __future__ import annotations

import asyncio
import socket
import threading
from collections.abc import Awaitable, Callable
from typing import Any

import numpy as np
from websockets.asyncio.server import Server, ServerConnection, serve

from dz_gym.protocol import packb
from dz_gym.protocol.messages import DREAMZERO_METADATA

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
