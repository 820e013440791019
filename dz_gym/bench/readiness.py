"""Is the server ready? A bounded handshake probe, plus the HTTP health endpoint when the server has one.

The metadata handshake is the readiness test (vLLM-Omni's ``/health`` can say 200 while the robot policy
cannot serve): :func:`wait_ready` opens a session and reads the metadata frame, retrying timeouts (a server
that accepts connections but is still loading) until ``timeout`` seconds have passed, then gives up with one
line. A refused connection (nothing listens on the port) is retried only for ``REFUSED_GRACE_S`` seconds,
so a wrong ``--server`` fails within seconds instead of after the whole readiness bound. The health endpoint
(``/healthz`` on openpi servers, ``/health`` on vLLM-Omni, both at the root of the host) is asked once, with
a short bound, and only recorded: a server without one is fine.
"""

from __future__ import annotations

import asyncio
import dataclasses
import ssl
import time
from urllib.parse import urlsplit

from dz_gym.errors import ConnectionLost, DzGymError, RequestTimeout
from dz_gym.protocol import ServerMetadata
from dz_gym.transport import AsyncSession, TransportConfig

__all__ = ["HEALTH_PATHS", "REFUSED_GRACE_S", "ServerInfo", "probe_health", "wait_ready"]

HEALTH_PATHS = ("/healthz", "/health")
REFUSED_GRACE_S = 3.0
"""How long refused connections are retried: covers a server that is binding its port right now."""


def _refused(exc: BaseException) -> bool:
    """Whether a failed connect was refused by the host (nothing listens on that port)."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, ConnectionRefusedError):
            return True
        seen = seen.__cause__
    return False


@dataclasses.dataclass
class ServerInfo:
    """What the readiness check learnt about one server."""

    url: str
    metadata: ServerMetadata
    ready_s: float
    health: dict | None = None


async def _http_get(host: str, port: int, path: str, use_tls: bool, timeout: float) -> tuple[int, str]:
    context = ssl.create_default_context() if use_tls else None

    async def exchange() -> tuple[int, str]:
        reader, writer = await asyncio.open_connection(
            host, port, ssl=context, server_hostname=host if use_tls else None
        )
        try:
            writer.write(f"GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n".encode("ascii"))
            await writer.drain()
            head = await reader.read(4096)
        finally:
            writer.close()
        status_line, _, rest = head.partition(b"\r\n")
        parts = status_line.split(b" ", 2)
        if len(parts) < 2 or not parts[0].startswith(b"HTTP/") or not parts[1].isdigit():
            raise ValueError("not an HTTP reply")
        body = rest.partition(b"\r\n\r\n")[2]
        return int(parts[1]), body[:200].decode("utf-8", "replace").strip()

    return await asyncio.wait_for(exchange(), timeout)


async def probe_health(url: str, timeout: float = 2.0) -> dict | None:
    """``{"path", "status", "body"}`` of the first health path that answers 200, else ``None`` (never raises)."""
    parts = urlsplit(url)
    use_tls = parts.scheme == "wss"
    host = parts.hostname or ""
    port = parts.port or (443 if use_tls else 80)
    for path in HEALTH_PATHS:
        try:
            status, body = await _http_get(host, port, path, use_tls, timeout)
        except (OSError, ValueError, asyncio.TimeoutError, TimeoutError):
            continue
        if status == 200:
            return {"path": path, "status": status, "body": body}
    return None


async def wait_ready(url: str, timeout: float, config: TransportConfig | None = None) -> ServerInfo:
    """Handshake with ``url`` until it answers or ``timeout`` s pass; then ask its health endpoint once.

    Silent servers are retried about twice a second until the bound, refused connections for at most
    :data:`REFUSED_GRACE_S` seconds. Raises
    :class:`~dz_gym.errors.ConnectionLost` or :class:`~dz_gym.errors.RequestTimeout` (one line, naming the
    URL and the last failure) when the server never became ready, and a server's own refusal
    (:class:`~dz_gym.errors.ServerError`, e.g. vLLM-Omni without a robot policy) at once.
    """
    start = time.perf_counter()
    deadline = start + timeout
    base = config or TransportConfig()
    last: DzGymError | None = None
    refused_since: float | None = None
    while True:
        left = deadline - time.perf_counter()
        if left <= 0:
            break
        probe_config = dataclasses.replace(
            base, open_timeout=max(min(base.open_timeout, left), 0.05), connect_retries=0, close_timeout=1.0
        )
        session = AsyncSession(url, probe_config)
        try:
            metadata = await asyncio.wait_for(session.connect(), left + 1.0)
        except (ConnectionLost, RequestTimeout, asyncio.TimeoutError, TimeoutError) as exc:
            last = exc if isinstance(exc, DzGymError) else RequestTimeout(f"handshake with {url} timed out")
            if _refused(exc):
                now = time.perf_counter()
                refused_since = now if refused_since is None else refused_since
                if now - refused_since >= min(REFUSED_GRACE_S, timeout):
                    host = f"{urlsplit(url).hostname}:{urlsplit(url).port or (443 if url.startswith('wss') else 80)}"
                    raise ConnectionLost(
                        f"server at {url} refused the connection for {now - refused_since:.0f} s (nothing listens on "
                        f"{host}); check --server or start the server first"
                    ) from None
            else:
                refused_since = None
            await asyncio.sleep(min(0.5, max(deadline - time.perf_counter(), 0.0)))
            continue
        finally:
            await session.close()
        ready_s = time.perf_counter() - start
        health = await probe_health(url, timeout=min(2.0, base.open_timeout))
        return ServerInfo(url=url, metadata=metadata, ready_s=ready_s, health=health)
    detail = f": {last}" if last is not None else ""
    if isinstance(last, ConnectionLost):
        raise ConnectionLost(f"server at {url} not ready within {timeout:g} s{detail}")
    raise RequestTimeout(f"server at {url} not ready within {timeout:g} s{detail}")
