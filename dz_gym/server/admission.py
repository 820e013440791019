"""Resident-session admission of the reference server (``--max-sessions K``); bookkeeping only, no I/O.

A newer vLLM-Omni proposal caps the DreamZero sessions resident in the model (4 by default) and refuses a new
one beyond the cap with ``SessionAdmissionError`` instead of evicting a live one. :class:`ResidentSessions`
does the same for the reference server: a session id becomes resident on its first admitted request and
stays so until it is released by a ``reset`` on its connection, by its connection switching to another
session id, by an inference error (vLLM-Omni drops that session's state), or by the connection closing.

>>> sessions = ResidentSessions(max_sessions=2)
>>> sessions.admit("a", conn=1), sessions.admit("b", conn=2), sessions.admit("c", conn=3)
(True, True, False)
>>> sessions.release_connection(1)
>>> sessions.admit("c", conn=3), sessions.peak, sessions.refusals
(True, 2, 1)
"""

from __future__ import annotations

__all__ = ["ADMISSION_CODE", "ResidentSessions", "refusal_message"]

# The error reply's ``code`` for a refused session (clients also match the exception name in the message).
ADMISSION_CODE = "session_admission"


def refusal_message(resident: int, cap: int) -> str:
    """The refused request's error message."""
    return f"SessionAdmissionError: {resident} sessions resident (max_sessions={cap}); retry after one ends"


class ResidentSessions:
    """Which session ids are resident, on which connection; ``max_sessions=None`` admits every one."""

    def __init__(self, max_sessions: int | None = None):
        if max_sessions is not None and (isinstance(max_sessions, bool) or int(max_sessions) < 1):
            raise ValueError(f"max_sessions: expected an integer >= 1 or None, got {max_sessions!r}")
        self.max_sessions = None if max_sessions is None else int(max_sessions)
        self._owner: dict[str, int] = {}
        self.peak = 0  # most sessions resident at once
        self.admitted = 0  # sessions admitted in all
        self.refusals = 0

    def __len__(self) -> int:
        return len(self._owner)

    def admit(self, session_id: str, conn: int) -> bool:
        """Make ``session_id`` resident for connection ``conn``; False (a refusal) when the cap is reached."""
        if session_id in self._owner:
            self._owner[session_id] = conn
            return True
        if self.max_sessions is not None and len(self._owner) >= self.max_sessions:
            self.refusals += 1
            return False
        self._owner[session_id] = conn
        self.admitted += 1
        self.peak = max(self.peak, len(self._owner))
        return True

    def release(self, session_id: str | None) -> None:
        """Free ``session_id`` (nothing if it is not resident)."""
        if session_id is not None:
            self._owner.pop(session_id, None)

    def release_connection(self, conn: int) -> None:
        """Free every session of connection ``conn`` (a reset on it, or its close)."""
        for session_id in [s for s, owner in self._owner.items() if owner == conn]:
            del self._owner[session_id]
