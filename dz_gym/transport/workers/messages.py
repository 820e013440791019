"""What a :class:`~dz_gym.transport.ProcessSessionPool` and its worker processes say over their pipes (pure:
no I/O): every message is msgpack (nothing is pickled), the transport config goes as its fields, an error as
its type name, message and the fields its class needs (rebuilt from :mod:`dz_gym.errors`), and an outcome is
rebuilt from a worker's report, its reply frame parsed as :class:`~dz_gym.transport.session.AsyncSession`
parses it.
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

__all__ = ["config_fields", "error_fields", "pack_message", "rebuild_error", "reply_outcome", "unpack_message"]


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
