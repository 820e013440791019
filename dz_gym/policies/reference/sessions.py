"""A bounded, thread-safe map from session id to per-session state, least recently used out first.

A policy server may serve many sessions (one per env and episode) from several worker threads. Each
session's state is created on first use, replaced when the server starts the session anew, dropped on a
reset, and evicted (least recently used first) beyond ``max_sessions``. Each entry carries its own lock,
so two calls for the same session never interleave while calls for different sessions run in parallel.

An evicted session that is asked for again (not as a new session) has lost its state: it starts afresh, which
for a stateful policy silently restarts its episode's plan. Such a loss is counted (``lost``) and logged once
with the cause and the fix, so a server sized below the envs it serves (e.g. 1024 envs against 64 sessions)
is never mistaken for a policy that fails.
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Generic, TypeVar

T = TypeVar("T")

logger = logging.getLogger(__name__)
DEFAULT_MAX_SESSIONS = 4096  # 1024 envs x 4 scenes side by side, each state a few kilobytes
EVICTED_IDS_KEPT = 65536  # evicted ids remembered to tell a lost session from a new one (a few MB at most)


class _Entry(Generic[T]):
    __slots__ = ("lock", "state")

    def __init__(self, state: T):
        self.lock = threading.Lock()
        self.state = state


class SessionStore(Generic[T]):
    """LRU store of per-session states (see the module docstring)."""

    def __init__(self, factory: Callable[[], T], max_sessions: int = DEFAULT_MAX_SESSIONS):
        if not isinstance(max_sessions, int) or max_sessions < 1:
            raise ValueError(f"max_sessions: expected an integer >= 1, got {max_sessions!r}")
        self._factory = factory
        self.max_sessions = max_sessions
        self._entries: OrderedDict[str, _Entry[T]] = OrderedDict()
        self._lock = threading.Lock()
        self.evictions = 0
        self.lost = 0  # sessions asked for again after their state was evicted
        self._evicted: OrderedDict[str, None] = OrderedDict()  # the ids evicted last (EVICTED_IDS_KEPT)

    @contextmanager
    def session(self, session_id: str, *, new: bool = False) -> Iterator[T]:
        """Hold session ``session_id``'s state (created, or recreated when ``new``) for the ``with`` body."""
        with self._lock:
            entry = None if new else self._entries.get(session_id)
            if entry is None:
                if self._evicted.pop(session_id, 0) is None and not new:
                    self._lose(session_id)
                entry = _Entry(self._factory())
                self._entries[session_id] = entry
            self._entries.move_to_end(session_id)
            while len(self._entries) > self.max_sessions:
                evicted, _ = self._entries.popitem(last=False)
                self.evictions += 1
                self._evicted[evicted] = None
                if len(self._evicted) > EVICTED_IDS_KEPT:
                    self._evicted.popitem(last=False)
        with entry.lock:
            yield entry.state

    def _lose(self, session_id: str) -> None:
        self.lost += 1
        if self.lost == 1:
            logger.warning("session %s: its state was evicted (more than max_sessions=%d sessions in use); it starts "
                           "afresh, and so will others: raise max_sessions to the envs served", session_id,
                           self.max_sessions)  # fmt: skip

    def drop(self, session_id: str | None = None) -> None:
        """Forget one session, or every session when ``session_id`` is ``None``."""
        with self._lock:
            if session_id is None:
                self._entries.clear()
            else:
                self._entries.pop(session_id, None)

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)

    def __contains__(self, session_id: object) -> bool:
        with self._lock:
            return session_id in self._entries
