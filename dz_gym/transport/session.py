"""One websocket connection to one policy server, for asyncio code (:class:`AsyncSession`).

The session owns the connection's state machine (:class:`~dz_gym.transport.rules.SessionState`) and turns
every failure into a typed error from :mod:`dz_gym.errors`; the decisions (what a close means, whether a
failure may be retried or a request re-sent) come from :mod:`dz_gym.transport.rules`, the bytes' meaning
from :mod:`dz_gym.protocol`.

:meth:`AsyncSession.send` never raises a :class:`~dz_gym.errors.DzGymError`: it returns an
:class:`~dz_gym.policy_client.Outcome` with the reply or the error, and the counts of reconnects and retries
it took. It re-sends a request on a fresh connection only when the server cannot have processed it (``TransportConfig.resend_unprocessed``),
and a request that got a server error reply only when asked to (``TransportConfig.retry_server_errors``).

>>> import asyncio
>>> from dz_gym.server.launch import start_server_thread
>>> import numpy as np
>>> async def one_request(url):
...     session = AsyncSession(url)
...     await session.connect()
...     request = {"observation/joint_position": np.zeros(7), "prompt": "pick", "session_id": "episode-1"}
...     outcome = await session.send(request)
...     await session.close()
...     return outcome.ok, outcome.reply.actions.shape, outcome.reconnects, session.state.value
>>> with start_server_thread("hold") as server:
...     asyncio.run(one_request(server.url))
(True, (24, 8), 0, 'closed')
"""

from __future__ import annotations

import asyncio
import logging
import ssl
import time
from collections.abc import Callable
from typing import Any, TypeVar

from websockets.asyncio.client import ClientConnection
from websockets.asyncio.client import connect as ws_connect
from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidMessage, InvalidStatus, InvalidURI
from websockets.protocol import State

from dz_gym.errors import ConnectionLost, DzGymError, ProtocolError, RequestTimeout, ServerError, SessionRefused
from dz_gym.policy_client import Outcome
from dz_gym.protocol import (
    InferReply,
    ServerMetadata,
    build_reset_request,
    packb,
    parse_infer_response,
    parse_metadata,
    parse_reset_response,
)
from dz_gym.protocol.codec import packb_pieces
from dz_gym.transport.config import TransportConfig, validate_url
from dz_gym.transport.rules import (
    Delivery,
    SessionState,
    breaks_connection,
    classify_close,
    close_means_refusal,
    may_retry_server_error,
    open_failure_is_transient,
    request_was_unprocessed,
    transition,
)

__all__ = ["AsyncSession", "encode_request", "request_pieces"]

logger = logging.getLogger("dz_gym.transport")

_T = TypeVar("_T")
Payload = bytes | bytearray | memoryview


class _RedactAuthorization(logging.Filter):
    """Keeps the token out of websockets' debug log of the upgrade request's headers."""

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args
        if (
            isinstance(args, tuple)
            and len(args) == 2
            and str(args[0]).lower() in ("authorization", "proxy-authorization")
        ):
            record.args = (args[0], "<redacted>")
        return True


_wire_logger = logging.getLogger("dz_gym.transport.wire")
_wire_logger.addFilter(_RedactAuthorization())


class _Stamps:
    """perf_counter stamps of one exchange, filled as it goes (so failures keep them too)."""

    __slots__ = ("received_at", "sent_at")

    def __init__(self) -> None:
        self.sent_at: float | None = None
        self.received_at: float | None = None


class _Unprocessed(Exception):
    """A request failed in a way that proves the server did not process it (internal: may be re-sent)."""

    def __init__(self, error: ConnectionLost):
        super().__init__(str(error))
        self.error = error


def encode_request(request: Any) -> Payload:
    """msgpack bytes of a request dict (bytes pass through); :class:`ProtocolError` for anything else."""
    if isinstance(request, (bytes, bytearray, memoryview)):
        return request
    return _encode_dict(request, packb)


def request_pieces(request: Any) -> list[memoryview]:
    """:func:`encode_request`'s bytes as flat byte views to be written one after the other into memory of the
    caller's (:func:`dz_gym.protocol.packer.write_pieces`); same errors."""
    if isinstance(request, (bytes, bytearray, memoryview)):
        return [memoryview(request).cast("B")]
    return _encode_dict(request, packb_pieces)


def _encode_dict(request: Any, pack: Callable[[Any], Any]) -> Any:
    """``pack(request)`` for a request dict; :class:`ProtocolError` for anything else or what cannot be encoded."""
    if not isinstance(request, dict):
        raise ProtocolError(f"request: expected a dict or encoded bytes, got {type(request).__name__}")
    try:
        return pack(request)
    except DzGymError:
        raise
    except (TypeError, ValueError) as exc:
        raise ProtocolError(f"request could not be encoded: {exc}") from exc


def _close_frames(exc: ConnectionClosed) -> tuple[tuple[int, str] | None, tuple[int, str] | None]:
    sent = None if exc.sent is None else (int(exc.sent.code), exc.sent.reason)
    rcvd = None if exc.rcvd is None else (int(exc.rcvd.code), exc.rcvd.reason)
    return sent, rcvd


def _parse_reply(frame: bytes | str) -> InferReply:
    """An infer reply of any chunk shape: what the chunk must look like is the client's to check."""
    return parse_infer_response(frame, action_dim=None)


class AsyncSession:
    """One websocket connection to one policy server (asyncio API; not thread-safe, use one loop).

    ``connect()`` opens the connection and reads the server's metadata frame; ``send()`` (and ``infer()``,
    its raising form) and ``reset()`` each send one request and read one reply. Calls are serialized by a
    lock, so concurrent callers queue instead of interleaving replies. ``state`` says where the connection
    is; after a timeout, a protocol error or a fatal server error it is ``BROKEN`` (the reply stream can no
    longer be trusted) until the caller reconnects.
    """

    # How an infer reply frame is parsed (a subclass may keep the frame too; the errors must stay the same).
    _parse_infer = staticmethod(_parse_reply)

    def __init__(self, url: str, config: TransportConfig | None = None):
        self._url = validate_url(url)
        self._config = config if config is not None else TransportConfig()
        if not isinstance(self._config, TransportConfig):
            raise ValueError(f"config: expected a TransportConfig, got {type(self._config).__name__}")
        self._state = SessionState.IDLE
        self._ws: ClientConnection | None = None
        self._metadata: ServerMetadata | None = None
        self._lock = asyncio.Lock()
        self._closing: set[asyncio.Task[None]] = set()
        self._last_error: DzGymError | None = None
        self.profiler = None  # a dz_gym.profiling.StageProfiler: sends and reply parsing are timed into it

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
    def state(self) -> SessionState:
        return self._state

    @property
    def connected(self) -> bool:
        return self._state is SessionState.OPEN

    @property
    def last_error(self) -> DzGymError | None:
        """Why the connection was last dropped (a close, timeout, protocol or fatal server error)."""
        return self._last_error

    # -- state and the one close path ---------------------------------------------------------------------
    def _enter(self, state: SessionState) -> None:
        self._state = transition(self._state, state)

    def _release(self, state: SessionState, error: DzGymError | None = None) -> None:
        """Leave the current connection for ``state`` (``BROKEN`` with the error, or ``CLOSED``); its closing
        handshake runs in the background, bounded by ``close_timeout``. A session the caller closed stays
        closed whatever failure a request still in flight reports afterwards."""
        if self._state is SessionState.CLOSED and state is SessionState.BROKEN:
            return
        ws, self._ws = self._ws, None
        self._enter(state)
        if error is not None:
            self._last_error = error
        if ws is not None:
            self._close_in_background(ws)

    def _close_in_background(self, ws: ClientConnection) -> None:
        task = asyncio.ensure_future(self._polite_close(ws))
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)

    async def _polite_close(self, ws: ClientConnection) -> None:
        try:
            await asyncio.wait_for(ws.close(), self._config.close_timeout + 1.0)
        except BaseException:  # noqa: BLE001 - closing is best effort; never let it mask the real error
            transport = ws.transport
            if transport is not None:
                transport.abort()

    async def _settle(self) -> None:
        """Wait (bounded) for background closes, so a reconnect or close leaves nothing half-open behind."""
        if self._closing:
            await asyncio.wait(list(self._closing), timeout=self._config.close_timeout + 1.0)

    async def close(self) -> None:
        """Close the connection (bounded by ``close_timeout``); idempotent.

        It does not wait for a request in flight: that request ends at once with :class:`ConnectionLost`.
        """
        self._release(SessionState.CLOSED)
        await self._settle()

    # -- connection -------------------------------------------------------------------------------------
    async def connect(self) -> ServerMetadata:
        """Open the connection and read the metadata frame (closes a previous connection first).

        Refused or unreachable connections, connections dropped during the upgrade and HTTP 5xx answers
        are retried with exponential backoff, ``connect_retries`` times, then :class:`ConnectionLost`. A
        silent server gives :class:`RequestTimeout`; a text error frame gives :class:`ServerError`; garbage
        gives :class:`ProtocolError`.
        """
        async with self._lock:
            return await self._connect_locked()

    async def _connect_locked(self) -> ServerMetadata:
        self._release(SessionState.CONNECTING)
        await self._settle()
        try:
            ws = await self._open_with_retries()
            metadata = await self._read_metadata(ws)
        except BaseException as exc:
            error = exc if isinstance(exc, DzGymError) else None
            if self._state is SessionState.CONNECTING:
                self._enter(SessionState.BROKEN)
                self._last_error = error or self._last_error
            raise
        if self._state is not SessionState.CONNECTING:  # closed by the caller meanwhile
            self._close_in_background(ws)
            raise ConnectionLost(f"session to {self._url} was closed while connecting", code=1000)
        self._ws, self._metadata, self._last_error = ws, metadata, None
        self._enter(SessionState.OPEN)
        return metadata

    async def _open_with_retries(self) -> ClientConnection:
        cfg = self._config
        headers = cfg.auth_header()
        attempt = 0
        while True:
            try:
                return await self._open(headers)
            except RequestTimeout:
                raise
            except ssl.SSLError as exc:  # certificate or TLS failure: retrying cannot help
                raise ConnectionLost(f"TLS handshake with {self._url} failed: {exc}") from exc
            except (OSError, EOFError, ValueError, LookupError, InvalidHandshake) as exc:
                if not open_failure_is_transient(exc) or attempt >= cfg.connect_retries:
                    raise self._open_error(exc, attempt + 1) from exc
                delay = cfg.backoff(attempt)
                logger.debug("connect to %s failed (%s); retry in %.2f s", self._url, type(exc).__name__, delay)
                await asyncio.sleep(delay)
                attempt += 1

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

    async def _read_metadata(self, ws: ClientConnection) -> ServerMetadata:
        timeout = self._config.open_timeout
        try:
            frame = await asyncio.wait_for(ws.recv(), timeout)
            return parse_metadata(frame)
        except BaseException as exc:
            self._close_in_background(ws)
            if isinstance(exc, (asyncio.TimeoutError, TimeoutError)):
                raise RequestTimeout(
                    f"server at {self._url} sent no metadata frame within open_timeout={timeout:g} s"
                ) from None
            if isinstance(exc, ConnectionClosed):
                sent, rcvd = _close_frames(exc)
                verdict = classify_close(sent, rcvd, exc.rcvd_then_sent)
                raise self._close_error(verdict, "handshake") from None
            raise

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

    def _close_error(self, verdict: Any, during: str) -> DzGymError:
        text = verdict.describe(self._url, during)
        if verdict.protocol:
            return ProtocolError(text)
        if verdict.side == "server" and close_means_refusal(verdict.code, verdict.reason):
            return SessionRefused(text, fatal=True, code=str(verdict.code))
        return ConnectionLost(text, code=verdict.code, reason=verdict.reason)

    # -- requests ---------------------------------------------------------------------------------------
    async def send(self, request: dict | Payload, *, index: int = 0) -> Outcome:
        """Send one infer request and return its :class:`Outcome` (never raises a :class:`DzGymError`).

        A request the server cannot have processed is re-sent on a fresh connection up to
        ``resend_unprocessed`` times; a server error reply is retried up to ``retry_server_errors`` times.
        Nothing else is re-sent: a request that may have reached the model is never sent twice.
        """
        cfg = self._config
        try:
            payload = encode_request(request)
        except DzGymError as exc:
            return Outcome.failed(index, exc)
        reconnects = retries = resends = 0
        async with self._lock:
            while True:
                stamps = _Stamps()
                try:
                    reply = await self._attempt(payload, "infer", stamps, self._parse_infer)
                    assert stamps.sent_at is not None and stamps.received_at is not None
                    return Outcome(
                        index, reply, None, stamps.sent_at, stamps.received_at, len(payload), reconnects, retries
                    )
                except _Unprocessed as exc:
                    error: DzGymError = exc.error
                    again = resends < cfg.resend_unprocessed
                    resends += again
                except ServerError as exc:
                    error = exc
                    again = may_retry_server_error(retries, cfg.retry_server_errors)
                    retries += again
                except DzGymError as exc:
                    error, again = exc, False
                except Exception as exc:  # noqa: BLE001 - an unexpected failure stays with its session
                    error = DzGymError(f"session {index}: unexpected {type(exc).__name__}: {exc}")
                    error.__cause__ = exc
                    self._release(SessionState.BROKEN, error)
                    again = False
                if not again:
                    break
                if self._state is not SessionState.OPEN:
                    logger.info("%s: re-sending a request on a fresh connection after: %s", self._url, error)
                    try:
                        await self._connect_locked()
                    except DzGymError as exc:
                        error = exc
                        break
                    reconnects += 1
        return Outcome.failed(
            index,
            error,
            sent_at=stamps.sent_at,
            received_at=stamps.received_at,
            request_bytes=len(payload),
            reconnects=reconnects,
            retries=retries,
        )

    async def infer(self, request: dict | Payload) -> InferReply:
        """:meth:`send`, raising the typed error instead of returning an outcome."""
        outcome = await self.send(request)
        if outcome.error is not None:
            raise outcome.error
        assert outcome.reply is not None
        return outcome.reply

    async def reset(self, session_id: str | None = None) -> str:
        """Send a reset request and return the server's status text (never re-sent).

        On vLLM-Omni a reset forgets every session seen on this connection and on DreamZero's own server
        it is global, so a multi-env client should rotate session ids instead of resetting.
        """
        payload = packb(build_reset_request(session_id))
        async with self._lock:
            try:
                return await self._attempt(payload, "reset", _Stamps(), parse_reset_response)
            except _Unprocessed as exc:
                raise exc.error from None

    def _not_connected(self) -> ConnectionLost:
        last = self._last_error
        why = f" (dropped after: {last})" if last is not None else ""
        code = last.code if isinstance(last, ConnectionLost) else None
        reason = last.reason if isinstance(last, ConnectionLost) else ""
        return ConnectionLost(f"session to {self._url} is not connected{why}", code=code, reason=reason)

    async def _attempt(self, payload: Payload, what: str, stamps: _Stamps, parser: Callable[..., _T]) -> _T:
        """Send ``payload``, read the next frame within ``request_timeout`` and parse it (caller holds the
        lock). A failure that breaks the stream leaves the session ``BROKEN``; :class:`_Unprocessed` wraps a
        close that proves the server never processed the request."""
        ws = self._ws
        if self._state is not SessionState.OPEN or ws is None:
            raise self._not_connected()
        delivery = Delivery.SENT if ws.protocol.state is State.OPEN else Delivery.CLOSED_BEFORE_SEND
        timeout = self._config.request_timeout
        stamps.sent_at = time.perf_counter()
        try:
            frame = await asyncio.wait_for(self._send_recv(ws, payload, stamps, self.profiler), timeout)
        except (asyncio.TimeoutError, TimeoutError):
            error: DzGymError = RequestTimeout(f"no {what} reply from {self._url} within request_timeout={timeout:g} s")
            self._release(SessionState.BROKEN, error)
            raise error from None
        except ConnectionClosed as exc:
            sent, rcvd = _close_frames(exc)
            verdict = classify_close(sent, rcvd, exc.rcvd_then_sent)
            error = self._close_error(verdict, what)
            self._release(SessionState.BROKEN, error)
            by_server = verdict.side == "server"
            if isinstance(error, ConnectionLost) and request_was_unprocessed(
                delivery, close_code=verdict.code, closed_by_server=by_server
            ):
                raise _Unprocessed(error) from None
            raise error from None
        except asyncio.CancelledError:
            self._release(SessionState.BROKEN, RequestTimeout(f"{what} request to {self._url} was cancelled"))
            raise
        except OSError as exc:
            error = ConnectionLost(f"connection to {self._url} failed during {what}: {exc}")
            self._release(SessionState.BROKEN, error)
            raise error from None
        try:
            if self.profiler is None:
                return parser(frame)
            start = time.perf_counter()
            try:
                return parser(frame)
            finally:
                self.profiler.add("receive_decode", time.perf_counter() - start)
        except ServerError as exc:
            if breaks_connection(exc):  # the server closes after a text traceback: the stream is over
                self._release(SessionState.BROKEN, exc)
            raise
        except ProtocolError as exc:  # the next frame could no longer be matched to its request
            self._release(SessionState.BROKEN, exc)
            raise

    @staticmethod
    async def _send_recv(ws: ClientConnection, payload: Payload, stamps: _Stamps, profiler=None) -> bytes | str:
        if profiler is None:
            await ws.send(payload)
        else:
            start = time.perf_counter()
            await ws.send(payload)
            profiler.add("send", time.perf_counter() - start)
        frame = await ws.recv()
        stamps.received_at = time.perf_counter()
        return frame
