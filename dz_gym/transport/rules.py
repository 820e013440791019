"""The transport's rules, free of I/O: session states, close-code classification, retry and re-send rules.

Everything here is a pure function of its arguments, so the decisions the transport takes on a failure can be
read, and tested, without a socket:

- :class:`SessionState` and :func:`transition` -- the life of one session's connection;
- :func:`classify_close` -- what a websocket close means (a lost connection or a protocol failure, and who
  closed it);
- :func:`open_failure_is_transient` -- whether a failed websocket open is worth another attempt;
- :func:`backoff_delay` / :func:`backoff_schedule` -- the waits between those attempts;
- :func:`request_was_unprocessed` -- whether a failed request cannot have reached the server's model, so it
  may be re-sent on a fresh connection; and :func:`may_retry_server_error`;
- :func:`breaks_connection` -- whether a failed request leaves its connection unusable (the one reconnect
  rule: the session drops such a connection, the wrapper reopens it);
- :func:`close_means_refusal` -- whether a close says the server has no room for another session, and
  :func:`admission_retry_delay` -- how long a refused session waits before it asks again, within a bound.

>>> backoff_schedule(5, base=0.5, cap=3.0)
[0.5, 1.0, 2.0, 3.0, 3.0]
>>> transition(SessionState.OPEN, SessionState.BROKEN)
<SessionState.BROKEN: 'broken'>
>>> request_was_unprocessed(Delivery.CLOSED_BEFORE_SEND, close_code=None, closed_by_server=False)
True
>>> request_was_unprocessed(Delivery.SENT, close_code=1000, closed_by_server=True)
True
>>> request_was_unprocessed(Delivery.SENT, close_code=1006, closed_by_server=False)
False
"""

from __future__ import annotations

import dataclasses
import enum
from asyncio import IncompleteReadError

from websockets.exceptions import InvalidMessage, InvalidStatus

from dz_gym.errors import InvalidTransition, ServerError

__all__ = [
    "LOCAL_PROTOCOL_CLOSE_CODES",
    "CloseVerdict",
    "Delivery",
    "InvalidTransition",
    "SessionState",
    "admission_retry_delay",
    "backoff_delay",
    "backoff_schedule",
    "breaks_connection",
    "classify_close",
    "close_means_refusal",
    "may_retry_server_error",
    "open_failure_is_transient",
    "request_was_unprocessed",
    "transition",
]

# Close codes this client sends when the *server's* frames break the rules: the failure is a protocol error,
# not a lost connection (1002 protocol error, 1007 invalid payload, 1009 message too big).
LOCAL_PROTOCOL_CLOSE_CODES = {1002: "broke the websocket protocol", 1007: "sent invalid data", 1009: "too big"}

# A close the server starts with this code before any reply means it stopped reading: vLLM-Omni's idle
# timeout closes with 1000 and its handler reads nothing afterwards. 1001 (going away) is not in the set: a
# server shutting down may still finish the request it holds.
CLEAN_SERVER_CLOSE_CODES = frozenset({1000})

# 1013 "Try Again Later" (RFC 6455's registry): the server is at capacity. A close reason that names the
# capacity or the admission says the same whatever the code.
CAPACITY_CLOSE_CODES = frozenset({1013})
_CAPACITY_WORDS = ("capacity", "admission", "too many sessions", "max_sessions", "max sessions")


class SessionState(enum.Enum):
    """Where one session's connection is.

    ``IDLE`` never connected; ``CONNECTING`` in a handshake; ``OPEN`` usable; ``BROKEN`` dropped after a
    failure (the session remembers why) and waiting for the caller to reconnect; ``CLOSED`` closed by the
    caller.
    """

    IDLE = "idle"
    CONNECTING = "connecting"
    OPEN = "open"
    BROKEN = "broken"
    CLOSED = "closed"


_TRANSITIONS: dict[SessionState, frozenset[SessionState]] = {
    SessionState.IDLE: frozenset({SessionState.CONNECTING, SessionState.CLOSED}),
    SessionState.CONNECTING: frozenset({SessionState.OPEN, SessionState.BROKEN, SessionState.CLOSED}),
    SessionState.OPEN: frozenset({SessionState.CONNECTING, SessionState.BROKEN, SessionState.CLOSED}),
    SessionState.BROKEN: frozenset({SessionState.CONNECTING, SessionState.BROKEN, SessionState.CLOSED}),
    SessionState.CLOSED: frozenset({SessionState.CONNECTING, SessionState.CLOSED}),
}


def transition(current: SessionState, new: SessionState) -> SessionState:
    """``new`` if a session may go from ``current`` to ``new``; :class:`InvalidTransition` otherwise.

    >>> transition(SessionState.CLOSED, SessionState.OPEN)
    Traceback (most recent call last):
    ...
    dz_gym.errors.InvalidTransition: session state: closed -> open is not allowed
    """
    if new not in _TRANSITIONS[current]:
        raise InvalidTransition(f"session state: {current.value} -> {new.value} is not allowed")
    return new


@dataclasses.dataclass(frozen=True)
class CloseVerdict:
    """What a websocket close means: ``protocol`` (we closed over a bad frame) or a lost connection,
    with the close code and reason that describe it and the side that closed (server, client, network)."""

    protocol: bool
    code: int
    reason: str
    side: str

    def describe(self, url: str, during: str) -> str:
        """One line for the error message."""
        if self.protocol:
            detail = f": {self.reason}" if self.reason else ""
            return f"reply from {url} during {during}: frame {LOCAL_PROTOCOL_CLOSE_CODES[self.code]}{detail}"
        text = f"connection to {url} closed during {during} (code {self.code}, by {self.side}"
        return text + (f": {self.reason})" if self.reason else ")")


def classify_close(
    sent: tuple[int, str] | None, rcvd: tuple[int, str] | None, rcvd_then_sent: bool | None
) -> CloseVerdict:
    """Classify a close from its frames: ``sent``/``rcvd`` are ``(code, reason)`` of the close frames this
    client sent and received (``None`` when there was none), ``rcvd_then_sent`` whether the received one
    came first.

    >>> classify_close(None, (1000, "idle timeout"), None)
    CloseVerdict(protocol=False, code=1000, reason='idle timeout', side='server')
    >>> classify_close((1009, "over size limit"), None, None).protocol
    True
    >>> classify_close(None, None, None).code  # the TCP connection broke without a close frame
    1006
    """
    if sent is not None and rcvd is None and sent[0] in LOCAL_PROTOCOL_CLOSE_CODES:
        return CloseVerdict(True, sent[0], sent[1], "client")
    close = rcvd if rcvd is not None else sent
    code, reason = close if close is not None else (1006, "")
    if rcvd is not None and (sent is None or rcvd_then_sent):
        side = "server"
    else:
        side = "client" if sent is not None else "network"
    return CloseVerdict(False, code, reason, side)


def open_failure_is_transient(exc: BaseException) -> bool:
    """Whether a failed websocket open is worth retrying: network errors, a connection closed during the
    upgrade (a server restarting), HTTP 5xx. Not: HTTP 4xx, garbage answers, TLS failures.

    >>> open_failure_is_transient(ConnectionRefusedError(111, "refused"))
    True
    >>> open_failure_is_transient(ValueError("garbage"))
    False
    """
    if isinstance(exc, InvalidStatus):
        return exc.response.status_code >= 500
    if isinstance(exc, InvalidMessage):
        return isinstance(exc.__cause__, (EOFError, IncompleteReadError))
    if isinstance(exc, TimeoutError):  # a bound ran out: the caller chose it, a retry would double it
        return False
    return isinstance(exc, (OSError, EOFError))


def backoff_delay(attempt: int, *, base: float, cap: float) -> float:
    """The wait before retry number ``attempt + 1`` (0-based): doubles from ``base``, capped at ``cap``."""
    if attempt < 0:
        raise ValueError(f"attempt: expected >= 0, got {attempt}")
    return min(base * (2**attempt), cap)


def backoff_schedule(retries: int, *, base: float, cap: float) -> list[float]:
    """Every wait of ``retries`` retries, in order."""
    return [backoff_delay(k, base=base, cap=cap) for k in range(retries)]


class Delivery(enum.Enum):
    """How far a failed request got: the connection was found closed before the send (``CLOSED_BEFORE_SEND``),
    or the bytes were handed to the socket (``SENT``)."""

    CLOSED_BEFORE_SEND = "closed_before_send"
    SENT = "sent"


def request_was_unprocessed(
    delivery: Delivery, *, close_code: int | None, closed_by_server: bool, reply_seen: bool = False
) -> bool:
    """Whether the server cannot have processed a request that failed on a closed connection.

    True when the connection was already closed when sending, or when the server closed it cleanly (code
    1000) before any reply frame: a server that closes that way has stopped reading (vLLM-Omni's idle
    timeout). Everything else -- an abrupt drop (1006), an error close (1011), a shutdown (1001), a timeout --
    may have left the request computing or computed, so it must not be re-sent.
    """
    if reply_seen:
        return False
    if delivery is Delivery.CLOSED_BEFORE_SEND:
        return True
    return closed_by_server and close_code in CLEAN_SERVER_CLOSE_CODES


def breaks_connection(error: BaseException) -> bool:
    """Whether a request's failure leaves its connection unusable, so it must be reopened: everything but a
    server error reply after which the server keeps the connection open (vLLM-Omni's binary error).

    >>> breaks_connection(ServerError("Internal inference error")), breaks_connection(TimeoutError())
    (False, True)
    """
    return not (isinstance(error, ServerError) and not error.fatal)


def may_retry_server_error(retries_done: int, limit: int) -> bool:
    """Whether a request that got a server error reply may be sent again (``limit`` from the config)."""
    return retries_done < limit


def close_means_refusal(code: int | None, reason: str) -> bool:
    """Whether a close (``code``, ``reason``) says the server refused a new session for lack of room.

    >>> close_means_refusal(1013, ""), close_means_refusal(1008, "session capacity reached (4)")
    (True, True)
    >>> close_means_refusal(1011, "Internal server error")
    False
    """
    text = (reason or "").lower()
    return code in CAPACITY_CLOSE_CODES or any(word in text for word in _CAPACITY_WORDS)


def admission_retry_delay(refusals: int, waited_s: float, *, base: float, cap: float, bound: float) -> float | None:
    """The wait before a refused session asks again, after ``refusals`` refusals in a row (>= 1) and
    ``waited_s`` seconds since the first of them; None once that wait would pass ``bound`` (give up).

    >>> [admission_retry_delay(k, 0.0, base=0.5, cap=4.0, bound=60.0) for k in (1, 2, 3, 4, 5)]
    [0.5, 1.0, 2.0, 4.0, 4.0]
    >>> admission_retry_delay(9, 58.0, base=0.5, cap=4.0, bound=60.0) is None
    True
    """
    if refusals < 1:
        raise ValueError(f"refusals: expected >= 1, got {refusals}")
    delay = backoff_delay(refusals - 1, base=base, cap=cap)
    return None if waited_s + delay > bound else delay
