"""What a :class:`~dz_gym.transport.ProcessSessionPool` and its worker processes say over their pipes (pure:
no I/O): :data:`MESSAGES`, the one table of every message kind (its direction and fields), and what goes
into the fields.

Every message is a msgpack list, ``[kind, *fields]`` (nothing is pickled); the parent writes one message per
write, a worker every message of one turn of its loop as one list. Both sides build a message with its
:class:`Kind` (``SEND(token, ...)``) and read one with :func:`read_message`, which refuses a kind that is
not declared for that direction or a wrong number of fields with :class:`MessageError`. The transport config
goes as its fields, an error as its type name, message and the fields its class needs (rebuilt from
:mod:`dz_gym.errors`), and an outcome is rebuilt from a worker's report, its reply frame parsed as
:class:`~dz_gym.transport.session.AsyncSession` parses it. ``docs/transport.md``'s table of the messages is
:func:`markdown_table` (a test keeps them equal).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import msgpack

from dz_gym import errors as _errors
from dz_gym.errors import ConnectionLost, DzGymError, ServerError
from dz_gym.policy_client import Outcome
from dz_gym.transport.config import TransportConfig
from dz_gym.transport.session import AsyncSession

__all__ = ["ARENA", "CLOSE", "CLOSED", "CONN", "CONNECT", "INIT", "MESSAGES", "OUT", "READY", "RESET", "RESET_DONE",
           "SEG", "SEND", "SENDT", "TO_PARENT", "TO_WORKER", "TOOK", "VIEWS", "VSEG", "Kind", "MessageError",
           "config_fields", "error_fields", "markdown_table", "pack_message", "read_message", "rebuild_error",
           "reply_outcome", "unpack_message"]  # fmt: skip

TO_WORKER = "parent -> worker"
TO_PARENT = "worker -> parent"

ARENA = 0
"""A ``send`` part's memory: the worker's own arena (its ``seg`` segments)."""
VIEWS = 1
"""A ``send`` part's memory: the pool's view memory (its ``vseg`` segments, every worker's)."""


class MessageError(ValueError):
    """A pipe message of a kind not declared for its direction, or with the wrong number of fields (a bug of
    the other side's: the transport's own code is on both ends)."""


@dataclasses.dataclass(frozen=True)
class Kind:
    """One kind of pipe message: its ``name`` (the first item on the wire), its ``direction``
    (:data:`TO_WORKER` or :data:`TO_PARENT`), its ``fields`` in order and what it does (``doc``).
    ``KIND(*values)`` is the message."""

    name: str
    direction: str
    fields: tuple[str, ...]
    doc: str

    def __call__(self, *values: Any) -> list[Any]:
        self.check_count(len(values))
        return [self.name, *values]

    def check_count(self, count: int) -> None:
        """:class:`MessageError` unless ``count`` values are this kind's fields."""
        if count != len(self.fields):
            raise MessageError(
                f"{self.name} message: expected {len(self.fields)} fields ({', '.join(self.fields)}), got {count}"
            )


# fmt: off
INIT = Kind("init", TO_WORKER, ("config", "sessions", "concurrency", "segments", "views"),
            "the first message: the transport config's fields, the worker's sessions `[session, url]`, how many "
            "connect at once, the arena's and the view memory's segments `[k, name]` to map")
SEND = Kind("send", TO_WORKER, ("requests",),
            "send requests, in order, each `[token, session, parts]`; its frame is its parts joined, each inline "
            "bytes (a request with no room in the arena) or `[memory, segment, offset, length]` of the worker's "
            "arena (memory 0: a request written there) or of the view memory (1: a request's large views)")
SENDT = Kind("sendt", TO_WORKER, ("token", "parts", "columns", "rows"),
             "send a batch's requests, each framed by the worker from the batch's frame template: the template's "
             "parts, its columns (`[segment, offset, row bytes]` of the view memory or `[bytes, 0, row bytes]` "
             "inline) and per request `[token, session, row, *strings]`")
SEG = Kind("seg", TO_WORKER, ("k", "name"), "map the arena's new segment `k` (before a request names it)")
VSEG = Kind("vseg", TO_WORKER, ("k", "name"), "map the view memory's new segment `k` (before a request names it)")
CONNECT = Kind("connect", TO_WORKER, ("sessions",), "(re)connect sessions, each `[token, session]`")
RESET = Kind("reset", TO_WORKER, ("token", "session", "session_id"),
             "send a `reset` naming `session_id` on the session's connection")
CLOSE = Kind("close", TO_WORKER, ("token",), "close every session, answer `closed`, exit")
READY = Kind("ready", TO_PARENT, ("pid",), "the worker has read `init` and runs")
OUT = Kind("out", TO_PARENT, ("token", "session", "frame", "stamps", "error", "send_s", "connected"),
           "a request's outcome: the raw reply frame or the error's fields, its stamps `[sent_at, received_at, "
           "request bytes, reconnects, retries]`, the worker's send seconds since its last outcome, whether the "
           "session is connected; the request's arena range is free again")
CONN = Kind("conn", TO_PARENT, ("token", "session", "metadata", "error", "connected"),
            "a connect's answer: the handshake's metadata (packed) or the error's fields")
RESET_DONE = Kind("reset_done", TO_PARENT, ("token", "session", "error", "connected"),
                  "a `reset`'s answer: None or the error's fields")
TOOK = Kind("took", TO_PARENT, ("token",),
            "the worker has joined the view memory's ranges of a `send` request (or of every request of a "
            "`sendt` batch) into frames: their blocks are free as far as it is concerned")
CLOSED = Kind("closed", TO_PARENT, ("token",), "the worker has closed its sessions and exits")

MESSAGES: tuple[Kind, ...] = (
    INIT, SEND, SENDT, SEG, VSEG, CONNECT, RESET, CLOSE,
    READY, OUT, CONN, RESET_DONE, TOOK, CLOSED,
)
# fmt: on
"""Every kind of pipe message, in both directions."""

_BY_NAME = {
    direction: {k.name: k for k in MESSAGES if k.direction == direction} for direction in (TO_WORKER, TO_PARENT)
}


def read_message(message: Any, direction: str) -> tuple[Kind, list[Any]]:
    """The kind and the fields of ``message`` (unpacked) sent in ``direction``; :class:`MessageError` for a
    kind not declared for that direction or the wrong number of fields."""
    kind = _BY_NAME[direction].get(message[0]) if isinstance(message, list) and message else None
    if kind is None:
        head = message[0] if isinstance(message, list) and message else message
        raise MessageError(f"pipe message ({direction}): expected one of {sorted(_BY_NAME[direction])}, got {head!r}")
    fields = message[1:]
    kind.check_count(len(fields))
    return kind, fields


def markdown_table() -> str:
    """The table of ``docs/transport.md``: kind | direction | fields | what it does, from :data:`MESSAGES`
    (a test keeps the docs equal to it)."""
    lines = ["| kind | direction | fields | what it does |", "|---|---|---|---|"]
    for kind in MESSAGES:
        fields = ", ".join(f"`{name}`" for name in kind.fields)
        lines.append(f"| `{kind.name}` | {kind.direction} | {fields} | {kind.doc} |")
    return "\n".join(lines)


def pack_message(message: Any) -> bytes:
    return msgpack.packb(message, use_bin_type=True)


def unpack_message(data: bytes) -> Any:
    return msgpack.unpackb(data, raw=False)


def config_fields(config: TransportConfig) -> dict[str, Any]:
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


def reply_outcome(index: int, frame: Any, stamps: list[Any], error: list[Any] | None) -> Outcome:
    """The Outcome of a worker's report: the reply parsed here as AsyncSession parses it."""
    sent_at, received_at, request_bytes, reconnects, retries = stamps
    if error is not None:
        return Outcome(index, None, rebuild_error(error), sent_at, received_at, request_bytes, reconnects, retries)
    try:
        reply = AsyncSession._parse_infer(frame)
    except DzGymError as exc:  # the worker parsed it already: only a bug gets here
        return Outcome(index, None, exc, sent_at, received_at, request_bytes, reconnects, retries)
    return Outcome(index, reply, None, sent_at, received_at, request_bytes, reconnects, retries)
