"""Typed exceptions of dz-gym.

Every failure that crosses a module boundary has a type here, so callers can tell a server's own error
(the request reached the model and it failed) from a broken wire (protocol), a dead connection or a
bound that ran out. Messages are one line and name the field and what was expected.
"""

from __future__ import annotations


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


class BackendUnavailable(DzGymError, RuntimeError):
    """A simulator backend cannot run here (a package, the scene assets or the right GPU is missing).

    The message says what is missing and how to get it.
    """
