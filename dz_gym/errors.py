"""Typed exceptions of dz-gym.

Every failure that crosses a module boundary has a type here, so callers can tell a server's own error
(the request reached the model and it failed) from a broken wire (protocol), a dead connection or a
bound that ran out. Messages are one line and name the field and what was expected. Each module that
raises one imports it from here (the names stay importable where they are raised); every class is a
:class:`DzGymError` but :class:`InvalidTransition`, a bug of the caller.
"""

from __future__ import annotations

from typing import Any


def first_line(error: BaseException | str, default: str | None = None) -> str:
    """The first line of an error's message, stripped: what a one-line error shows. An empty message gives
    ``default``, else the exception's type name.

    >>> first_line(ValueError("num_envs: expected an integer\\n  (details)")), first_line(KeyError())
    ('num_envs: expected an integer', 'KeyError')
    """
    text = str(error).strip()
    if text:
        return text.splitlines()[0].strip()
    if default is not None or isinstance(error, str):
        return default or ""
    return type(error).__name__


class DzGymError(Exception):
    """Base class of every dz-gym error."""


class ProtocolError(DzGymError):
    """A frame that does not follow the OpenPI/DreamZero protocol (bad msgpack, wrong type, bad shape)."""


class ServerError(DzGymError):
    """The server answered with an error (binary error dict, text traceback, or JSON error at handshake).

    ``message`` is the server's own text; ``fatal`` says whether the server closes the connection after it
    (openpi/DreamZero servers do, vLLM-Omni keeps it open).
    """

    def __init__(self, message: str, *, fatal: bool = False, code: str | None = None):
        first_line = message.strip().splitlines()[-1] if message.strip() else "(empty message)"
        super().__init__(f"server error: {first_line}")
        self.message = message
        self.fatal = fatal
        self.code = code


class SessionRefused(ServerError):
    """The server refused to admit a new session: its cap on resident sessions is reached.

    Nothing was computed, so the same episode can start again once a session is freed. It comes as an
    admission error reply (vLLM-Omni's proposed ``SessionAdmissionError``, the reference server's
    ``--max-sessions``) or as a close whose code or reason says the server is at capacity (then ``fatal``).
    """


class ConnectionLost(DzGymError):
    """The websocket closed or could not be opened (after the configured retries)."""

    def __init__(self, message: str, *, code: int | None = None, reason: str = ""):
        super().__init__(message)
        self.code = code
        self.reason = reason


class RequestTimeout(DzGymError, TimeoutError):
    """A bounded wait on the network ran out (open, handshake, or a request's reply)."""


class HandshakeError(DzGymError):
    """The server's metadata does not fit what the client will send (views, resolution, sessions, actions)."""


class UnknownServer(HandshakeError):
    """A server's handshake matches no declared server profile (:mod:`dz_gym.protocol.profiles`).

    A configuration error, as :class:`HorizonError`: the run stops with one line naming what the server sent
    and the ``--server-kind`` values that name it.
    """


class BackendUnavailable(DzGymError, RuntimeError):
    """A simulator backend cannot run here (a package, the scene assets or the right GPU is missing).

    The message says what is missing and how to get it.
    """


class InjectedFailure(DzGymError, RuntimeError):
    """The failure ``fail_every`` injects in place of an inference."""


class RunError(DzGymError, ValueError):
    """A run directory that cannot be read as a dz-gym-eval run (one line)."""


class InvalidRequest(ProtocolError, ValueError):
    """A request the caller asked to build does not fit the protocol (wrong shape, dtype or type)."""


class WorkerError(DzGymError, RuntimeError):
    """A worker process failed or died."""


class RenderingUnavailable(DzGymError, RuntimeError):
    """No headless OpenGL backend could create a rendering context (``detail``: the underlying failure)."""

    def __init__(self, message: str, detail: str = ""):
        super().__init__(message)
        self.detail = detail or message


class RayMissingError(DzGymError, ImportError):
    """Ray is needed (``--ray``) but not installed."""


class HorizonError(DzGymError, ValueError):
    """``open_loop_horizon`` is longer than the server's action chunk (known from its first reply).

    A configuration error, not a fault of one episode: the run should stop with this one-line message.
    ``horizon`` is the requested value, ``chunk_length`` the rows the server sent.
    """

    def __init__(self, horizon: int, chunk_length: int, where: str = ""):
        suffix = f" ({where})" if where else ""
        super().__init__(
            f"open_loop_horizon: {horizon} is longer than the server's chunk of {chunk_length} row(s); "
            f"pass at most {chunk_length}{suffix}"
        )
        self.horizon = int(horizon)
        self.chunk_length = int(chunk_length)


class PartialConnectError(DzGymError):
    """Some sessions of a pool failed to connect; the others are connected and usable.

    ``connected`` maps session index -> its :class:`~dz_gym.protocol.ServerMetadata`, ``errors`` maps session index -> the typed error.
    """

    def __init__(self, connected: dict[int, Any], errors: dict[int, DzGymError]):
        first = min(errors)
        super().__init__(
            f"{len(errors)} of {len(errors) + len(connected)} sessions failed to connect; "
            f"first: session {first}: {errors[first]}"
        )
        self.connected = connected
        self.errors = errors


class InvalidTransition(RuntimeError):
    """A state change the session's state machine does not allow (a bug in the caller, never the network).

    The one class outside :class:`DzGymError` on purpose: the transport turns every ``DzGymError`` into a
    failed request of that session, and a bug must not pass for a network failure."""


class BenchAborted(DzGymError):
    """The run cannot go on (server down, or nothing but errors); the message says why, in one line."""
