"""Client transport: one websocket per policy session, driven by a background asyncio loop.

This is the I/O edge of dz-gym. It opens connections, sends encoded requests, waits for replies within
bounds and turns every failure into a typed error from :mod:`dz_gym.errors`. What the bytes mean is left
to :mod:`dz_gym.protocol` (the codec and the reply parsers); this module only calls it.

Three layers, each usable on its own:

- :class:`AsyncSession` -- one connection (``ws://`` or ``wss://``) to one server, for asyncio code.
  One request is in flight at a time (the protocol is strictly request/reply). After a timeout, a
  protocol error or a fatal server error the connection is dropped, because its reply stream can no
  longer be trusted; ``connected`` turns False and the caller decides whether to reconnect.
- :class:`LoopThread` -- a private event loop in a daemon thread, so synchronous callers (and callers
  whose own thread already runs a loop, such as Isaac Lab/Kit or Jupyter) can drive sessions.
- :class:`SessionPool` -- the synchronous facade for batched evaluation: session ``i`` talks to
  ``urls[i % len(urls)]``; :meth:`SessionPool.infer_many` issues all requests at once and returns one
  :class:`Outcome` per session, so one session's failure never touches the others' results.

Example::

    from dz_gym.transport import SessionPool, TransportConfig

    with SessionPool(["ws://127.0.0.1:8000"], num_sessions=4, config=TransportConfig(request_timeout=60)) as pool:
        pool.connect()
        outcomes = pool.infer_many({i: request_for(i) for i in range(4)})
        for i, outcome in outcomes.items():
            print(i, outcome.error or outcome.reply.actions.shape, f"{outcome.latency_s * 1e3:.0f} ms")
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import logging
import math
import os
import re
import ssl
import threading
import time
import weakref
from collections.abc import Callable, Coroutine, Iterable, Mapping
from typing import Any, TypeVar
from urllib.parse import urlsplit

from websockets.asyncio.client import ClientConnection
from websockets.asyncio.client import connect as ws_connect
from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidMessage, InvalidStatus, InvalidURI

from dz_gym.errors import ConnectionLost, DzGymError, ProtocolError, RequestTimeout, ServerError
from dz_gym.protocol import (
    InferReply,
    ServerMetadata,
    build_reset_request,
    packb,
    parse_infer_response,
    parse_metadata,
    parse_reset_response,
)

__all__ = [
    "AsyncSession",
    "LoopThread",
    "Outcome",
    "PartialConnectError",
    "SessionPool",
    "TransportConfig",
]

logger = logging.getLogger(__name__)

_T = TypeVar("_T")

# Close codes this client sends when the *server's* frames break the rules: the failure is a protocol error,
# not a lost connection (1002 protocol error, 1007 invalid payload, 1009 message too big).
_LOCAL_PROTOCOL_CLOSE_CODES = {1002: "broke the websocket protocol", 1007: "sent invalid data", 1009: "too big"}
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_SCHEME = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")


def _positive(name: str, value: Any, *, allow_none: bool = False) -> None:
    if value is None and allow_none:
        return
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value > 0
    if not ok:
        expected = "a finite number > 0" + (" or None" if allow_none else "")
        raise ValueError(f"TransportConfig.{name}: expected {expected}, got {value!r}")


@dataclasses.dataclass(frozen=True)
class TransportConfig:
    """Bounds and options of every connection of a session or pool (all times in seconds).

    The defaults fit DreamZero servers that block for seconds per request and take minutes to warm up:
    keepalive pings every 60 s that may go unanswered for 600 s (a busy server may not answer pings),
    and a generous but finite wait for each reply.

    Attributes:
        open_timeout: bound on opening the websocket, and separately on the server's metadata frame.
        connect_retries: extra attempts after a refused/unreachable connection (``OSError``), a connection
            dropped during the upgrade, or an HTTP 5xx answer to the upgrade; the wait between attempts doubles from ``retry_backoff`` up to
            ``retry_backoff_max``.
        ping_interval, ping_timeout: websocket keepalive; ``None`` disables it.
        request_timeout: bound on one request (send plus reply). Past it the connection is dropped and
            :class:`~dz_gym.errors.RequestTimeout` raised.
        max_frame_bytes: largest reply frame accepted; a bigger one is a :class:`~dz_gym.errors.ProtocolError`.
        close_timeout: bound on the closing handshake.
        auth_env: NAME of an environment variable holding an API token, sent as
            ``Authorization: <auth_scheme> <token>``. The token itself never appears in configs, argv or logs.
        auth_scheme: the scheme word in front of the token (``Api-Key`` as openpi-client, or ``Bearer``).
        compression: ``None`` (the servers' own setting) or ``"deflate"``.
        action_dim, action_horizon: the reply shape the parser enforces (``action_horizon=None`` accepts
            any number of rows).
        connect_concurrency: how many sessions of a pool open at once.
        ssl_context: TLS settings for ``wss://``; ``None`` uses Python's default (system CAs, hostname check).
    """

    open_timeout: float = 10.0
    connect_retries: int = 3
    retry_backoff: float = 0.5
    retry_backoff_max: float = 8.0
    ping_interval: float | None = 60.0
    ping_timeout: float | None = 600.0
    request_timeout: float = 600.0
    max_frame_bytes: int = 64 * 1024 * 1024
    close_timeout: float = 10.0
    auth_env: str | None = None
    auth_scheme: str = "Api-Key"
    compression: str | None = None
    action_dim: int = 8
    action_horizon: int | None = None
    connect_concurrency: int = 16
    ssl_context: ssl.SSLContext | None = dataclasses.field(default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        for name in ("open_timeout", "retry_backoff", "retry_backoff_max", "request_timeout", "close_timeout"):
            _positive(name, getattr(self, name))
        _positive("ping_interval", self.ping_interval, allow_none=True)
        _positive("ping_timeout", self.ping_timeout, allow_none=True)
        for name, low in (("connect_retries", 0), ("max_frame_bytes", 1), ("action_dim", 1), ("connect_concurrency", 1)):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < low:
                raise ValueError(f"TransportConfig.{name}: expected an int >= {low}, got {value!r}")
        if self.action_horizon is not None and (
            not isinstance(self.action_horizon, int) or isinstance(self.action_horizon, bool) or self.action_horizon < 1
        ):
            raise ValueError(f"TransportConfig.action_horizon: expected an int >= 1 or None, got {self.action_horizon!r}")
        if self.auth_env is not None and (not isinstance(self.auth_env, str) or not _ENV_NAME.match(self.auth_env)):
            raise ValueError(
                f"TransportConfig.auth_env: expected the NAME of an environment variable (letters, digits, _), "
                f"got {self.auth_env!r}"
            )
        if not isinstance(self.auth_scheme, str) or not _SCHEME.match(self.auth_scheme):
            raise ValueError(f"TransportConfig.auth_scheme: expected one word such as 'Api-Key' or 'Bearer', got {self.auth_scheme!r}")
        if self.compression not in (None, "deflate"):
            raise ValueError(f"TransportConfig.compression: expected None or 'deflate', got {self.compression!r}")
        if self.ssl_context is not None and not isinstance(self.ssl_context, ssl.SSLContext):
            raise ValueError(f"TransportConfig.ssl_context: expected an ssl.SSLContext or None, got {type(self.ssl_context).__name__}")

    def connect_bound(self) -> float:
        """Upper bound of one :meth:`AsyncSession.connect` call, retries and backoff included."""
        attempts = self.connect_retries + 1
        backoff = sum(self._backoff(k) for k in range(self.connect_retries))
        return attempts * (2 * self.open_timeout + self.close_timeout) + backoff

    def _backoff(self, attempt: int) -> float:
        return min(self.retry_backoff * (2**attempt), self.retry_backoff_max)

    def auth_header(self) -> dict[str, str]:
        """The ``Authorization`` header read from ``auth_env`` now (empty without ``auth_env``)."""
        if self.auth_env is None:
            return {}
        token = os.environ.get(self.auth_env, "")
        if not token.strip():
            raise ValueError(f"TransportConfig.auth_env: environment variable {self.auth_env} is not set or is empty")
        if any(c in token for c in "\r\n\0"):
            raise ValueError(f"TransportConfig.auth_env: environment variable {self.auth_env} holds a line break or NUL")
        return {"Authorization": f"{self.auth_scheme} {token.strip()}"}


def validate_url(url: Any) -> str:
    """Return ``url`` if it is a ``ws://``/``wss://`` URL with a host; one-line ``ValueError`` otherwise."""
    if not isinstance(url, str):
        raise ValueError(f"url: expected a ws:// or wss:// URL string, got {type(url).__name__}")
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - raises ValueError on a bad port
    except ValueError as exc:
        raise ValueError(f"url: expected a ws:// or wss:// URL, got {url!r} ({exc})") from None
    if parts.scheme not in ("ws", "wss") or not parts.hostname:
        raise ValueError(f"url: expected a ws:// or wss:// URL with a host, got {url!r}")
    if parts.username is not None or parts.password is not None:
        raise ValueError("url: credentials in the URL are not allowed; put the token in an env var named by auth_env")
    return url


class _RedactAuthorization(logging.Filter):
    """Keeps the token out of websockets' debug log of the upgrade request's headers."""

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args
        if isinstance(args, tuple) and len(args) == 2 and str(args[0]).lower() in ("authorization", "proxy-authorization"):
            record.args = (args[0], "<redacted>")
        return True


_wire_logger = logging.getLogger(__name__ + ".wire")
_wire_logger.addFilter(_RedactAuthorization())


def _closed_error(exc: ConnectionClosed, url: str, during: str) -> DzGymError:
    """Map a websockets close to ConnectionLost, or to ProtocolError when we closed over a bad frame."""
    if exc.sent is not None and exc.rcvd is None and exc.sent.code in _LOCAL_PROTOCOL_CLOSE_CODES:
        what = _LOCAL_PROTOCOL_CLOSE_CODES[exc.sent.code]
        detail = f": {exc.sent.reason}" if exc.sent.reason else ""
        return ProtocolError(f"reply from {url} during {during}: frame {what}{detail}")
    close = exc.rcvd if exc.rcvd is not None else exc.sent
    code = close.code if close is not None else 1006
    reason = close.reason if close is not None else ""
    if exc.rcvd is not None and (exc.sent is None or exc.rcvd_then_sent):
        side = "server"
    else:
        side = "client" if exc.sent is not None else "network"
    text = f"connection to {url} closed during {during} (code {code}, by {side}"
    text += f": {reason})" if reason else ")"
    return ConnectionLost(text, code=code, reason=reason)


def _transient(exc: BaseException) -> bool:
    """Whether a failed websocket open is worth retrying: network errors, a connection closed during the
    upgrade (a server restarting), HTTP 5xx. Not: HTTP 4xx, garbage answers."""
    if isinstance(exc, InvalidStatus):
        return exc.response.status_code >= 500
    if isinstance(exc, InvalidMessage):
        return isinstance(exc.__cause__, EOFError)
    return isinstance(exc, (OSError, EOFError))


class _Stamps:
    """perf_counter stamps of one exchange, filled as it goes (so failures keep them too)."""

    __slots__ = ("sent_at", "received_at")

    def __init__(self) -> None:
        self.sent_at: float | None = None
        self.received_at: float | None = None


class AsyncSession:
    """One websocket connection to one policy server (asyncio API; not thread-safe, use one loop).

    ``connect()`` opens the connection and reads the server's metadata frame; ``infer()`` and ``reset()``
    each send one request and read one reply. Calls are serialized by a lock, so concurrent callers queue
    instead of interleaving replies.
    """

    def __init__(self, url: str, config: TransportConfig | None = None):
        self._url = validate_url(url)
        self._config = config if config is not None else TransportConfig()
        if not isinstance(self._config, TransportConfig):
            raise ValueError(f"config: expected a TransportConfig, got {type(self._config).__name__}")
        self._ws: ClientConnection | None = None
        self._metadata: ServerMetadata | None = None
        self._lock = asyncio.Lock()
        self._closing: set[asyncio.Task[None]] = set()
        self.last_error: DzGymError | None = None
        """Why the last connection was dropped (a close, timeout, protocol or fatal server error)."""

    # -- properties -------------------------------------------------------------------------------------
    @property
    def url(self) -> str:
        return self._url

    @property
    def config(self) -> TransportConfig:
        return self._config

    @property
    def metadata(self) -> ServerMetadata | None:
        """The metadata of the current connection's handshake (``None`` before the first connect)."""
        return self._metadata

    @property
    def connected(self) -> bool:
        return self._ws is not None

    # -- connection -------------------------------------------------------------------------------------
    async def connect(self) -> ServerMetadata:
        """Open the connection and read the metadata frame (closes a previous connection first).

        Refused or unreachable connections, connections dropped during the upgrade and HTTP 5xx answers
        are retried with exponential backoff, ``connect_retries`` times, then :class:`ConnectionLost`. A silent server gives
        :class:`RequestTimeout`; a text error frame gives :class:`ServerError`; garbage gives
        :class:`ProtocolError`.
        """
        async with self._lock:
            await self._close_now()
            cfg = self._config
            headers = cfg.auth_header()
            attempt = 0
            while True:
                try:
                    ws = await self._open(headers)
                    break
                except (asyncio.TimeoutError, TimeoutError):  # RequestTimeout; TimeoutError is an OSError too
                    raise
                except ssl.SSLError as exc:  # certificate or TLS failure: retrying cannot help
                    raise ConnectionLost(f"TLS handshake with {self._url} failed: {exc}") from exc
                except (OSError, EOFError, ValueError, LookupError, InvalidHandshake) as exc:
                    if not _transient(exc) or attempt >= cfg.connect_retries:
                        raise self._open_error(exc, attempt + 1) from exc
                    delay = cfg._backoff(attempt)
                    logger.debug("connect to %s failed (%s); retry in %.2f s", self._url, type(exc).__name__, delay)
                    await asyncio.sleep(delay)
                    attempt += 1
            try:
                frame = await asyncio.wait_for(ws.recv(), cfg.open_timeout)
                metadata = parse_metadata(frame)
            except BaseException as exc:
                self._abort(ws)
                if isinstance(exc, (asyncio.TimeoutError, TimeoutError)):
                    raise RequestTimeout(
                        f"server at {self._url} sent no metadata frame within open_timeout={cfg.open_timeout:g} s"
                    ) from None
                if isinstance(exc, ConnectionClosed):
                    raise _closed_error(exc, self._url, "handshake") from None
                raise
            self._ws = ws
            self._metadata = metadata
            self.last_error = None
            return metadata

    async def _open(self, headers: dict[str, str]) -> ClientConnection:
        cfg = self._config
        kwargs: dict[str, Any] = {}
        if cfg.ssl_context is not None and self._url.startswith("wss://"):
            kwargs["ssl"] = cfg.ssl_context
        try:
            return await ws_connect(
                self._url,
                additional_headers=headers or None,
                compression=cfg.compression,
                open_timeout=cfg.open_timeout,
                ping_interval=cfg.ping_interval,
                ping_timeout=cfg.ping_timeout,
                close_timeout=cfg.close_timeout,
                max_size=cfg.max_frame_bytes,
                logger=_wire_logger,
                **kwargs,
            )
        except (asyncio.TimeoutError, TimeoutError):
            raise RequestTimeout(
                f"opening the websocket to {self._url} took longer than open_timeout={cfg.open_timeout:g} s"
            ) from None
        except InvalidURI as exc:
            raise ConnectionLost(f"url: {exc}") from None

    def _open_error(self, exc: BaseException, attempts: int) -> ConnectionLost:
        """The ConnectionLost for a failed open. Older websockets versions raise EOFError/ValueError/
        LookupError unwrapped where newer ones raise InvalidMessage; all mean a broken upgrade."""
        if isinstance(exc, (EOFError, ValueError, LookupError, InvalidMessage)):
            return ConnectionLost(
                f"server at {self._url} closed or garbled the websocket upgrade after {attempts} attempt(s): {exc}"
            )
        if isinstance(exc, InvalidStatus):
            status = exc.response.status_code
            return ConnectionLost(
                f"server at {self._url} rejected the websocket upgrade with HTTP {status} after {attempts} attempt(s)",
                code=None,
                reason=f"HTTP {status}",
            )
        if isinstance(exc, InvalidHandshake):
            return ConnectionLost(f"websocket upgrade to {self._url} failed after {attempts} attempt(s): {exc}")
        return ConnectionLost(f"cannot connect to {self._url} after {attempts} attempt(s): {exc}")

    async def close(self) -> None:
        """Close the connection (bounded by ``close_timeout``); idempotent.

        It does not wait for a request in flight: that request ends at once with :class:`ConnectionLost`.
        """
        await self._close_now()

    async def _close_now(self) -> None:
        ws, self._ws = self._ws, None
        if ws is not None:
            self._closing.add(asyncio.ensure_future(self._polite_close(ws)))
        if self._closing:
            await asyncio.wait(list(self._closing), timeout=self._config.close_timeout + 1.0)

    def _drop(self, error: DzGymError | None = None) -> None:
        """Forget the current connection now; its closing handshake runs in the background."""
        ws, self._ws = self._ws, None
        if error is not None:
            self.last_error = error
        if ws is not None:
            task = asyncio.ensure_future(self._polite_close(ws))
            self._closing.add(task)

    def _abort(self, ws: ClientConnection) -> None:
        task = asyncio.ensure_future(self._polite_close(ws))
        self._closing.add(task)

    async def _polite_close(self, ws: ClientConnection) -> None:
        try:
            await asyncio.wait_for(ws.close(), self._config.close_timeout + 1.0)
        except BaseException:  # noqa: BLE001 - closing is best effort; never let it mask the real error
            transport = ws.transport
            if transport is not None:
                transport.abort()
        finally:
            task = asyncio.current_task()
            if task is not None:
                self._closing.discard(task)

    # -- requests ---------------------------------------------------------------------------------------
    async def infer(self, request: dict | bytes) -> InferReply:
        """Send one infer request (a request dict, or bytes already encoded) and parse the reply."""
        return await self._infer(request, _Stamps())

    async def _infer(self, request: dict | bytes | bytearray | memoryview, stamps: _Stamps) -> InferReply:
        payload = request if isinstance(request, (bytes, bytearray, memoryview)) else packb(request)
        cfg = self._config
        async with self._lock:
            frame = await self._exchange(payload, "infer", stamps)
            return self._parse(parse_infer_response, frame, action_dim=cfg.action_dim, horizon=cfg.action_horizon)

    async def reset(self, session_id: str | None = None) -> str:
        """Send a reset request and return the server's status text.

        On vLLM-Omni a reset forgets every session seen on this connection and on DreamZero's own server
        it is global, so a multi-env client should rotate session ids instead of resetting.
        """
        payload = packb(build_reset_request(session_id))
        async with self._lock:
            frame = await self._exchange(payload, "reset", _Stamps())
            return self._parse(parse_reset_response, frame)

    def _parse(self, parser: Callable[..., _T], frame: bytes | str, **kwargs: Any) -> _T:
        """``parser(frame)``; a reply that breaks the stream (protocol error, fatal server error) drops the
        connection, since the next frame could no longer be matched to its request."""
        try:
            return parser(frame, **kwargs)
        except ServerError as exc:
            if exc.fatal:
                self._drop(exc)
            raise
        except ProtocolError as exc:
            self._drop(exc)
            raise

    async def _exchange(self, payload: bytes | bytearray | memoryview, what: str, stamps: _Stamps) -> bytes | str:
        """Send ``payload`` and return the next frame, within ``request_timeout`` (caller holds the lock)."""
        ws = self._ws
        if ws is None:
            last = self.last_error
            why = f" (dropped after: {last})" if last is not None else ""
            code = last.code if isinstance(last, ConnectionLost) else None
            reason = last.reason if isinstance(last, ConnectionLost) else ""
            raise ConnectionLost(f"session to {self._url} is not connected{why}", code=code, reason=reason)
        timeout = self._config.request_timeout
        stamps.sent_at = time.perf_counter()
        try:
            return await asyncio.wait_for(self._send_recv(ws, payload, stamps), timeout)
        except (asyncio.TimeoutError, TimeoutError):
            error = RequestTimeout(f"no {what} reply from {self._url} within request_timeout={timeout:g} s")
            self._drop(error)
            raise error from None
        except ConnectionClosed as exc:
            error = _closed_error(exc, self._url, what)
            self._drop(error)
            raise error from None
        except asyncio.CancelledError:
            self._drop()
            raise
        except OSError as exc:
            error = ConnectionLost(f"connection to {self._url} failed during {what}: {exc}")
            self._drop(error)
            raise error from None

    @staticmethod
    async def _send_recv(ws: ClientConnection, payload: bytes | bytearray | memoryview, stamps: _Stamps) -> bytes | str:
        await ws.send(payload)
        frame = await ws.recv()
        stamps.received_at = time.perf_counter()
        return frame


class LoopThread:
    """An asyncio event loop running in a daemon thread, for synchronous callers.

    It never touches the caller's own loop, so it works inside Isaac Lab/Kit, Jupyter or any thread that
    already runs a loop. ``close()`` cancels what is left, stops the loop and joins the thread; it is
    idempotent and also runs at interpreter exit.
    """

    def __init__(self, name: str = "dz-gym-transport"):
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        # The thread must not reference ``self``, so a forgotten LoopThread can be collected (and stopped).
        self._thread = threading.Thread(target=_run_loop, args=(self._loop, self._ready), name=name, daemon=True)
        self._thread.start()
        self._ready.wait()
        self._finalizer = weakref.finalize(self, _stop_loop, self._loop, self._thread)

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        return self._loop

    @property
    def closed(self) -> bool:
        return not self._finalizer.alive

    def in_loop_thread(self) -> bool:
        return threading.current_thread() is self._thread

    def submit(self, coro: Coroutine[Any, Any, _T]) -> concurrent.futures.Future[_T]:
        """Schedule ``coro`` on the loop; returns at once with a thread-safe future."""
        if self.closed:
            coro.close()
            raise RuntimeError("LoopThread is closed")
        return asyncio.run_coroutine_threadsafe(coro, self._loop)

    def run(self, coro: Coroutine[Any, Any, _T], timeout: float | None) -> _T:
        """Run ``coro`` on the loop and wait for its result; past ``timeout`` it is cancelled and
        :class:`RequestTimeout` raised. Must not be called from the loop's own thread (it would deadlock)."""
        if self.in_loop_thread():
            coro.close()
            raise RuntimeError("LoopThread.run called from its own loop thread; await the coroutine instead")
        if self.closed:
            coro.close()
            raise RuntimeError("LoopThread is closed")
        finished = threading.Event()
        future = self.submit(_signal_when_done(coro, finished))
        try:
            return future.result(timeout)
        except concurrent.futures.TimeoutError:
            future.cancel()
            # Let the cancellation run its cleanup (e.g. dropping a session) before the caller goes on.
            finished.wait(_CANCEL_GRACE_S)
            raise RequestTimeout(f"operation on the transport loop did not finish within {timeout:g} s") from None

    def close(self) -> None:
        """Cancel pending tasks, stop the loop and join its thread (idempotent)."""
        if self.in_loop_thread():
            raise RuntimeError("LoopThread.close called from its own loop thread")
        self._finalizer()


_CANCEL_GRACE_S = 2.0


def _run_loop(loop: asyncio.AbstractEventLoop, ready: threading.Event) -> None:
    asyncio.set_event_loop(loop)
    loop.call_soon(ready.set)
    loop.run_forever()


async def _signal_when_done(coro: Coroutine[Any, Any, _T], finished: threading.Event) -> _T:
    try:
        return await coro
    finally:
        finished.set()


def _stop_loop(loop: asyncio.AbstractEventLoop, thread: threading.Thread) -> None:
    async def cancel_all() -> None:
        tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks, timeout=2.0)
        await loop.shutdown_asyncgens()

    if thread.is_alive() and not loop.is_closed():
        try:
            asyncio.run_coroutine_threadsafe(cancel_all(), loop).result(5.0)
        except BaseException:  # noqa: BLE001 - shutting down: best effort
            pass
        loop.call_soon_threadsafe(loop.stop)
        thread.join(5.0)
    if not thread.is_alive() and not loop.is_closed():
        loop.close()


@dataclasses.dataclass(frozen=True)
class Outcome:
    """What happened to one session's request: a reply or a typed error, with client-side timing.

    ``sent_at``/``received_at`` are ``time.perf_counter()`` stamps taken on the loop thread right before
    the send and right after the reply frame arrived (on failure, when the failure was seen);
    ``latency_s`` is their difference. ``request_bytes`` is the encoded size.
    """

    index: int
    reply: InferReply | None
    error: DzGymError | None
    sent_at: float
    received_at: float
    request_bytes: int = 0

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def latency_s(self) -> float:
        return self.received_at - self.sent_at


class PartialConnectError(DzGymError):
    """Some sessions of a pool failed to connect; the others are connected and usable.

    ``connected`` maps session index -> metadata, ``errors`` maps session index -> the typed error.
    """

    def __init__(self, connected: dict[int, ServerMetadata], errors: dict[int, DzGymError]):
        first = min(errors)
        super().__init__(
            f"{len(errors)} of {len(errors) + len(connected)} sessions failed to connect; "
            f"first: session {first}: {errors[first]}"
        )
        self.connected = connected
        self.errors = errors


class SessionPool:
    """Synchronous facade over ``num_sessions`` :class:`AsyncSession` objects on one :class:`LoopThread`.

    Session ``i`` talks to ``urls[i % len(urls)]``. Every call is bounded by the config. Methods are
    thread-safe; requests to different sessions run concurrently, requests to one session queue.
    Request dicts are encoded in the calling thread, so the loop thread only moves bytes.
    """

    def __init__(
        self,
        urls: list[str] | str,
        num_sessions: int,
        config: TransportConfig | None = None,
        *,
        loop: LoopThread | None = None,
    ):
        if isinstance(urls, str):
            urls = [urls]
        urls = list(urls)
        if not urls:
            raise ValueError("urls: expected at least one ws:// or wss:// URL, got an empty list")
        for url in urls:
            validate_url(url)
        if not isinstance(num_sessions, int) or isinstance(num_sessions, bool) or num_sessions < 1:
            raise ValueError(f"num_sessions: expected an int >= 1, got {num_sessions!r}")
        self._config = config if config is not None else TransportConfig()
        if not isinstance(self._config, TransportConfig):
            raise ValueError(f"config: expected a TransportConfig, got {type(self._config).__name__}")
        self._owns_loop = loop is None
        self._loop = loop if loop is not None else LoopThread()
        self._sessions = [AsyncSession(urls[i % len(urls)], self._config) for i in range(num_sessions)]
        self._semaphore: asyncio.Semaphore | None = None
        self._closed = False
        self._finalizer = weakref.finalize(
            self, _close_pool, self._loop, list(self._sessions), self._owns_loop, self._config.close_timeout
        )

    # -- introspection ------------------------------------------------------------------------------------
    @property
    def num_sessions(self) -> int:
        return len(self._sessions)

    def __len__(self) -> int:
        return len(self._sessions)

    @property
    def config(self) -> TransportConfig:
        return self._config

    def url(self, i: int) -> str:
        return self._session(i).url

    def metadata(self, i: int) -> ServerMetadata | None:
        """Metadata of session ``i``'s last handshake (``None`` if it never connected)."""
        return self._session(i).metadata

    def is_connected(self, i: int) -> bool:
        return self._session(i).connected

    def session(self, i: int) -> AsyncSession:
        """The underlying :class:`AsyncSession` (use it only from coroutines run on :attr:`loop`)."""
        return self._session(i)

    @property
    def loop(self) -> LoopThread:
        return self._loop

    def _session(self, i: int) -> AsyncSession:
        if self._closed:
            raise RuntimeError("SessionPool is closed")
        if not isinstance(i, int) or isinstance(i, bool) or not 0 <= i < len(self._sessions):
            raise ValueError(f"session index: expected an int in [0, {len(self._sessions)}), got {i!r}")
        return self._sessions[i]

    # -- connecting -------------------------------------------------------------------------------------
    def connect(self, indices: Iterable[int] | None = None) -> list[ServerMetadata]:
        """Connect the given sessions (default: all) concurrently, at most ``connect_concurrency`` at once.

        Returns their metadata in the order of ``indices``. If some fail, the rest stay connected and
        :class:`PartialConnectError` is raised with both the metadata and the per-session errors.
        """
        order = list(range(len(self._sessions))) if indices is None else list(indices)
        for i in order:
            self._session(i)
        futures = {i: self._loop.submit(self._bounded_connect(i)) for i in order}
        bound = self._config.connect_bound() * math.ceil(len(order) / self._config.connect_concurrency) + 5.0
        done, _ = concurrent.futures.wait(futures.values(), timeout=bound)
        connected: dict[int, ServerMetadata] = {}
        errors: dict[int, DzGymError] = {}
        for i, future in futures.items():
            if future not in done:
                future.cancel()
                errors[i] = RequestTimeout(f"session {i}: connect did not finish within {bound:g} s")
                continue
            exc = future.exception()
            if exc is None:
                connected[i] = future.result()
            elif isinstance(exc, DzGymError):
                errors[i] = exc
            else:
                raise exc
        if errors:
            raise PartialConnectError(connected, errors)
        return [connected[i] for i in order]

    async def _bounded_connect(self, i: int) -> ServerMetadata:
        if self._semaphore is None:
            self._semaphore = asyncio.Semaphore(self._config.connect_concurrency)
        async with self._semaphore:
            return await self._sessions[i].connect()

    def reconnect(self, i: int) -> ServerMetadata:
        """Close session ``i``'s connection and open a new one (bounded); returns the new metadata."""
        self._session(i)
        return self._loop.run(self._bounded_connect(i), self._config.connect_bound() + 5.0)

    # -- requests ---------------------------------------------------------------------------------------
    def _request_bound(self) -> float:
        return self._config.request_timeout + self._config.close_timeout + 5.0

    def submit(self, i: int, request: dict | bytes) -> concurrent.futures.Future[Outcome]:
        """Issue one infer request for session ``i`` without waiting; the future never raises, its
        :class:`Outcome` carries the reply or the error."""
        session = self._session(i)
        try:
            payload = _encode(request)
        except DzGymError as exc:
            done: concurrent.futures.Future[Outcome] = concurrent.futures.Future()
            now = time.perf_counter()
            done.set_result(Outcome(i, None, exc, now, now))
            return done
        return self._loop.submit(_run_outcome(session, i, payload))

    def infer_many(self, requests: Mapping[int, dict | bytes]) -> dict[int, Outcome]:
        """Issue every request concurrently (one per session) and return all outcomes.

        Request dicts are encoded in the calling thread (about 40 us for a 0.5 MB request), then the whole
        batch goes to the loop in one hand-off, so the loop thread only moves bytes. A failing session gets
        an error outcome; the others are unaffected.
        """
        if not isinstance(requests, Mapping):
            raise ValueError(f"requests: expected a mapping of session index -> request, got {type(requests).__name__}")
        for i in requests:
            self._session(i)
        outcomes: dict[int, Outcome] = {}
        jobs: list[tuple[AsyncSession, int, bytes | bytearray | memoryview]] = []
        for i, request in requests.items():
            try:
                jobs.append((self._sessions[i], i, _encode(request)))
            except DzGymError as exc:
                now = time.perf_counter()
                outcomes[i] = Outcome(i, None, exc, now, now)
        if jobs:
            bound = self._request_bound()
            future = self._loop.submit(_run_batch(jobs, bound))
            try:
                outcomes.update(future.result(bound + 5.0))
            except concurrent.futures.TimeoutError:  # the loop itself is stuck: report, never hang
                future.cancel()
                now = time.perf_counter()
                for _, i, _ in jobs:
                    error = RequestTimeout(f"session {i}: request did not finish within {bound:g} s")
                    outcomes[i] = Outcome(i, None, error, now, now)
        return {i: outcomes[i] for i in requests}

    def infer(self, i: int, request: dict | bytes) -> InferReply:
        """One blocking request on session ``i``; raises the typed error instead of returning an outcome."""
        outcome = self.submit(i, request).result(self._request_bound())
        if outcome.error is not None:
            raise outcome.error
        assert outcome.reply is not None
        return outcome.reply

    def reset(self, i: int, session_id: str | None = None) -> str:
        """Send a reset on session ``i`` and return the server's status (see :meth:`AsyncSession.reset`)."""
        return self._loop.run(self._session(i).reset(session_id), self._request_bound())

    # -- teardown ---------------------------------------------------------------------------------------
    def close(self) -> None:
        """Close every connection (and the loop thread if the pool made it); idempotent."""
        if self._closed:
            return
        self._closed = True
        self._finalizer()

    def __enter__(self) -> SessionPool:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def _encode(request: Any) -> bytes | bytearray | memoryview:
    if isinstance(request, (bytes, bytearray, memoryview)):
        return request
    if not isinstance(request, Mapping):
        raise ProtocolError(f"request: expected a dict or encoded bytes, got {type(request).__name__}")
    try:
        return packb(request)
    except DzGymError:
        raise
    except (TypeError, ValueError) as exc:
        raise ProtocolError(f"request could not be encoded: {exc}") from exc


async def _run_outcome(session: AsyncSession, index: int, payload: bytes | bytearray | memoryview) -> Outcome:
    stamps = _Stamps()
    reply: InferReply | None = None
    error: DzGymError | None = None
    try:
        reply = await session._infer(payload, stamps)
    except DzGymError as exc:
        error = exc
    except Exception as exc:  # noqa: BLE001 - an unexpected failure stays with its session
        error = DzGymError(f"session {index}: unexpected {type(exc).__name__}: {exc}")
        error.__cause__ = exc
        session._drop(error)
    now = time.perf_counter()
    sent_at = stamps.sent_at if stamps.sent_at is not None else now
    received_at = stamps.received_at if stamps.received_at is not None else now
    return Outcome(index, reply, error, sent_at, received_at, len(payload))


async def _run_batch(
    jobs: list[tuple[AsyncSession, int, bytes | bytearray | memoryview]], bound: float
) -> dict[int, Outcome]:
    """Run one request per job concurrently; a job still running after ``bound`` is cancelled and reported
    as a timeout (each request is already bounded by ``request_timeout``, this is a second fence)."""
    tasks = {asyncio.ensure_future(_run_outcome(session, i, payload)): i for session, i, payload in jobs}
    done, pending = await asyncio.wait(tasks, timeout=bound)
    outcomes = {tasks[task]: task.result() for task in done}
    for task in pending:
        task.cancel()
    if pending:  # let the cancelled requests drop their connections before the caller looks
        await asyncio.wait(pending, timeout=_CANCEL_GRACE_S)
    now = time.perf_counter()
    for task in pending:
        i = tasks[task]
        outcomes[i] = Outcome(i, None, RequestTimeout(f"session {i}: request did not finish within {bound:g} s"), now, now)
    return outcomes


def _close_pool(loop: LoopThread, sessions: list[AsyncSession], owns_loop: bool, close_timeout: float) -> None:
    if not loop.closed and not loop.in_loop_thread():

        async def close_all() -> None:
            await asyncio.gather(*(s.close() for s in sessions), return_exceptions=True)

        try:
            loop.run(close_all(), close_timeout + 2.0)
        except BaseException:  # noqa: BLE001 - closing is best effort
            logger.debug("closing sessions did not finish cleanly", exc_info=True)
    if owns_loop and not loop.in_loop_thread():
        loop.close()
