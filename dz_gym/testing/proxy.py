"""A fault-injecting TCP proxy on loopback, for testing what a client does when the network misbehaves.

:class:`FaultProxy` listens on ``127.0.0.1`` and forwards every accepted connection to one target
(``host:port``), byte for byte, on its own event loop in a daemon thread. Connections are numbered in
accept order (0, 1, ...); :meth:`FaultProxy.inject` arms a :class:`Fault` on one of them (or, with
:meth:`FaultProxy.inject_next`, on the next one accepted) while the others keep forwarding untouched:

``latency``
    every chunk, both ways, is held ``latency_s`` before it is forwarded (a long link).
``stall``
    after ``after_bytes`` more bytes from the server, forwarding towards the client stops; the
    connection stays open (a peer stuck in the middle of a frame).
``reset``
    after ``after_bytes`` more bytes from the server, the client's connection is reset (RST, no close
    frame, no FIN) in the middle of a frame, and the server's connection closed.
``half_open``
    from now on nothing is forwarded either way and nothing is closed: no FIN, no RST, the peer is gone
    as after a network partition or a dead host.
``slow_reader``
    the proxy reads what the client sends at ``rate_bytes_per_s`` (a peer that reads slowly: the
    client's writes back up).

Not covered: packet-level faults (loss, reordering, duplication: TCP hides them from the client) and
TLS; the proxy forwards bytes and does not parse them.

>>> import asyncio, socket
>>> async def echo(reader, writer):
...     writer.write(await reader.read(100)); await writer.drain(); writer.close()
>>> class EchoServer:
...     def __init__(self):
...         self.loop = asyncio.new_event_loop()
...         self.server = self.loop.run_until_complete(asyncio.start_server(echo, "127.0.0.1", 0))
...         self.port = self.server.sockets[0].getsockname()[1]
...         threading.Thread(target=self.loop.run_forever, daemon=True).start()
>>> target = EchoServer()
>>> with FaultProxy(target.port) as proxy:
...     with socket.create_connection(("127.0.0.1", proxy.port), timeout=5) as sock:
...         _ = sock.sendall(b"hello")
...         sock.recv(100)
b'hello'
"""

from __future__ import annotations

import asyncio
import dataclasses
import socket
import struct
import threading
from typing import Literal

__all__ = ["Fault", "FaultProxy"]

FaultKind = Literal["latency", "stall", "reset", "half_open", "slow_reader"]
_KINDS = ("latency", "stall", "reset", "half_open", "slow_reader")


@dataclasses.dataclass(frozen=True)
class Fault:
    """One fault of a connection (see the module docstring for what each kind does)."""

    kind: FaultKind
    latency_s: float = 0.0
    after_bytes: int = 0
    rate_bytes_per_s: float = 65536.0

    def __post_init__(self) -> None:
        if self.kind not in _KINDS:
            raise ValueError(f"Fault.kind: expected one of {', '.join(_KINDS)}, got {self.kind!r}")
        if self.latency_s < 0 or self.after_bytes < 0 or self.rate_bytes_per_s <= 0:
            raise ValueError("Fault: expected latency_s >= 0, after_bytes >= 0 and rate_bytes_per_s > 0")


class _Link:
    """One proxied connection: the two sockets' streams and the fault armed on it."""

    def __init__(self, index: int, client: asyncio.StreamWriter, server: asyncio.StreamWriter):
        self.index = index
        self.client = client
        self.server = server
        self.fault: Fault | None = None
        self.budget: int | None = None  # bytes still forwarded to the client before a stall/reset
        self.frozen = asyncio.Event()  # what a stalled or half-open pump waits on; set only by release()
        self.done = asyncio.Event()
        self.bytes_up = 0
        self.bytes_down = 0

    def arm(self, fault: Fault) -> None:
        self.fault = fault
        self.budget = fault.after_bytes if fault.kind in ("stall", "reset") else None

    def reset_client(self) -> None:
        """RST the client's connection: SO_LINGER with a zero timeout, then close."""
        sock = self.client.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.client.transport.abort()
        self.server.close()


class FaultProxy:
    """A loopback TCP proxy to ``target_host:target_port`` with per-connection faults (thread-safe API)."""

    def __init__(self, target_port: int, target_host: str = "127.0.0.1", *, bind: str = "127.0.0.1"):
        self.target = (target_host, int(target_port))
        self._links: list[_Link] = []
        self._next: list[Fault] = []
        self._lock = threading.Lock()
        self._accepted = threading.Condition(self._lock)
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="dz-gym-fault-proxy", daemon=True)
        self._thread.start()
        self._server = asyncio.run_coroutine_threadsafe(asyncio.start_server(self._handle, bind, 0), self.loop).result(
            10
        )
        self.port: int = self._server.sockets[0].getsockname()[1]
        self._stopped = False

    def url(self, path: str = "") -> str:
        """``ws://127.0.0.1:PORT`` plus ``path``: the address a websocket client uses instead of the target."""
        return f"ws://127.0.0.1:{self.port}{path}"

    @property
    def connections(self) -> int:
        """Connections accepted so far."""
        with self._lock:
            return len(self._links)

    def wait_connections(self, count: int, timeout: float) -> bool:
        """True once ``count`` connections were accepted; False if ``timeout`` seconds passed first."""
        with self._accepted:
            return self._accepted.wait_for(lambda: len(self._links) >= count, timeout)

    def traffic(self, index: int) -> tuple[int, int]:
        """Bytes forwarded on connection ``index`` so far: (client to server, server to client)."""
        with self._lock:
            link = self._links[index]
        return link.bytes_up, link.bytes_down

    def inject(self, index: int, fault: Fault) -> None:
        """Arm ``fault`` on connection ``index`` (accept order) now; the other connections are untouched."""
        with self._lock:
            if not 0 <= index < len(self._links):
                raise ValueError(f"connection index: expected 0..{len(self._links) - 1}, got {index}")
            link = self._links[index]
        done = threading.Event()

        def arm() -> None:
            link.arm(fault)
            if fault.kind == "reset" and fault.after_bytes == 0:
                link.reset_client()
            done.set()

        self.loop.call_soon_threadsafe(arm)
        if not done.wait(5):
            raise RuntimeError("FaultProxy.inject: the proxy loop did not answer within 5 s")

    def active(self) -> list[int]:
        """Indices of the connections still forwarding (or held by a fault), in accept order."""
        with self._lock:
            return [link.index for link in self._links if not link.done.is_set()]

    def clear(self, index: int) -> None:
        """Disarm connection ``index``'s fault (added latency or a slow reader end; a stall or half-open link
        stays held until :meth:`release`)."""
        with self._lock:
            link = self._links[index]

        def disarm() -> None:
            if link.fault is not None and link.fault.kind in ("latency", "slow_reader"):
                link.fault = None

        self.loop.call_soon_threadsafe(disarm)

    def release(self, index: int) -> None:
        """End connection ``index`` now: both sides are reset (a stalled or half-open link goes away)."""
        with self._lock:
            link = self._links[index]

        def abort() -> None:
            for writer in (link.client, link.server):
                writer.transport.abort()
            link.frozen.set()

        self.loop.call_soon_threadsafe(abort)

    def inject_next(self, fault: Fault) -> None:
        """Arm ``fault`` on the next connection accepted (from its first byte)."""
        with self._lock:
            self._next.append(fault)

    # -- forwarding ---------------------------------------------------------------------------------------
    async def _handle(self, client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        try:
            server_reader, server_writer = await asyncio.wait_for(asyncio.open_connection(*self.target), 10)
        except (OSError, asyncio.TimeoutError):
            client_writer.transport.abort()
            return
        with self._accepted:
            link = _Link(len(self._links), client_writer, server_writer)
            if self._next:
                link.arm(self._next.pop(0))
            self._links.append(link)
            self._accepted.notify_all()
        up = asyncio.ensure_future(self._pump(link, client_reader, server_writer, upstream=True))
        down = asyncio.ensure_future(self._pump(link, server_reader, client_writer, upstream=False))
        try:
            await asyncio.wait({up, down}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (up, down):
                task.cancel()
            await asyncio.gather(up, down, return_exceptions=True)
            for writer in (client_writer, server_writer):
                writer.close()
            link.done.set()

    async def _pump(
        self, link: _Link, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, *, upstream: bool
    ) -> None:
        while True:
            fault = link.fault
            size = 65536
            if upstream and fault is not None and fault.kind == "slow_reader":
                size = max(1, int(fault.rate_bytes_per_s / 20))
            data = await reader.read(size)
            if not data:
                if writer.can_write_eof():
                    writer.write_eof()
                return
            fault = link.fault
            if fault is not None:
                if fault.kind == "half_open":
                    await link.frozen.wait()  # drop everything, close nothing (until released)
                    return
                if fault.kind == "latency" and fault.latency_s > 0:
                    await asyncio.sleep(fault.latency_s)
                if fault.kind == "slow_reader" and upstream:
                    await asyncio.sleep(len(data) / fault.rate_bytes_per_s)
                if not upstream and link.budget is not None:
                    if len(data) >= link.budget:
                        head = data[: link.budget]
                        if head:
                            writer.write(head)
                            await writer.drain()
                            link.bytes_down += len(head)
                        link.budget = 0
                        if fault.kind == "reset":
                            link.reset_client()
                            return
                        await link.frozen.wait()  # stall: the rest of the frame never comes (until released)
                        return
                    link.budget -= len(data)
            writer.write(data)
            await writer.drain()
            if upstream:
                link.bytes_up += len(data)
            else:
                link.bytes_down += len(data)

    # -- teardown ---------------------------------------------------------------------------------------
    def stop(self) -> None:
        """Close the listener and every connection, stop the loop (idempotent, bounded)."""
        if self._stopped:
            return
        self._stopped = True

        async def shutdown() -> None:
            self._server.close()
            for link in list(self._links):
                link.client.transport.abort()
                link.server.transport.abort()
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in tasks:
                task.cancel()
            if tasks:
                await asyncio.wait(tasks, timeout=2.0)

        try:
            asyncio.run_coroutine_threadsafe(shutdown(), self.loop).result(10)
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(5)
            if not self._thread.is_alive():
                self.loop.close()

    def __enter__(self) -> FaultProxy:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
