"""Typed records the wrapper reports per env: :class:`EpisodeStats` and the integrity-event names.

``info["chunk_stats"]`` of :class:`~dz_gym.wrapper.DreamZeroPolicyWrapper` follows Gymnasium's vector-info
convention: one ``(num_envs,)`` array per :class:`EpisodeStats` field plus a ``"_<field>"`` mask, and
``info["_chunk_stats"]`` says which envs have a record (those whose episode ended in that step).

>>> stats = {1: EpisodeStats("s1", steps=16, chunks=2, delays=(0, 0), reconnects=1)}
>>> info = {"chunk_stats": EpisodeStats.to_info(stats, num_envs=3)}
>>> info["_chunk_stats"] = info["chunk_stats"]["_chunks"]
>>> info["chunk_stats"]["chunks"].tolist(), info["_chunk_stats"].tolist()
([0, 2, 0], [False, True, False])
>>> EpisodeStats.from_info(info, 1) == stats[1], EpisodeStats.from_info(info, 0)
(True, None)
>>> from dz_gym.errors import ConnectionLost
>>> event_of(ConnectionLost("closed")), event_of(ServerError("Internal inference error"))
('connection_lost', 'server_error')
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from dz_gym.errors import ProtocolError, RequestTimeout, ServerError, SessionRefused

__all__ = [
    "CONNECTION_LOST",
    "INTEGRITY_EVENTS",
    "PROTOCOL_ERROR",
    "SERVER_ERROR",
    "SESSION_REFUSED",
    "SHARD_LOST",
    "TIMEOUT",
    "EpisodeCounters",
    "EpisodeStats",
    "StepRecord",
    "event_of",
]

# The cause of a failed policy call, as info["integrity_event"] and the evaluator's error_event name it; and the
# evaluator's own cause of an errored episode: the process running it (a Ray shard) was lost for good.
SERVER_ERROR, CONNECTION_LOST, TIMEOUT, PROTOCOL_ERROR = "server_error", "connection_lost", "timeout", "protocol_error"
# The server refused a new session (its resident-session cap is reached): nothing ran, the episode can start
# again later. The evaluator waits and re-runs it; only one refused for longer than the bound is recorded.
SESSION_REFUSED = "session_refused"
SHARD_LOST = "shard_lost"
INTEGRITY_EVENTS = (SERVER_ERROR, CONNECTION_LOST, TIMEOUT, PROTOCOL_ERROR, SESSION_REFUSED, SHARD_LOST)


def event_of(error: BaseException) -> str:
    """The :data:`INTEGRITY_EVENTS` name of a failed policy call's error."""
    if isinstance(error, SessionRefused):
        return SESSION_REFUSED
    if isinstance(error, ServerError):
        return SERVER_ERROR
    if isinstance(error, RequestTimeout):
        return TIMEOUT
    if isinstance(error, ProtocolError):
        return PROTOCOL_ERROR
    return CONNECTION_LOST  # ConnectionLost, OSError and anything a custom client lets through


@dataclasses.dataclass(frozen=True)
class EpisodeStats:
    """One env's episode as the wrapper saw it: the current one, or one that just ended.

    ``chunks``: replies applied; ``delays``: for each, the env steps between its request and its first use
    (0 when synchronous); ``wait_steps``/``stale_steps``: steps the env waited or held for a reply / ran past
    a chunk's window; ``latencies_s``: round trip of every reply or failure taken; ``reconnects``: fresh
    connections opened for this env during the episode (by the transport re-sending a request, or after a
    failed call); ``retries``: requests re-sent after a server error; ``reconnect_failures``: reconnects
    that failed; ``flagged``: a policy call of the episode failed; ``drawn_delays`` (latency-honest runs):
    every request's delay in steps once known, measured or replayed, in request order.
    """

    session_id: str
    steps: int = 0
    chunks: int = 0
    delays: tuple[int, ...] = ()
    wait_steps: int = 0
    stale_steps: int = 0
    latencies_s: tuple[float, ...] = ()
    reconnects: int = 0
    retries: int = 0
    reconnect_failures: int = 0
    flagged: bool = False
    drawn_delays: tuple[int, ...] = ()

    _OBJECT_FIELDS = ("session_id", "delays", "latencies_s", "drawn_delays")

    @staticmethod
    def to_info(stats: dict[int, EpisodeStats], num_envs: int) -> dict[str, np.ndarray]:
        """``stats`` of some envs as Gymnasium vector info: one ``(num_envs,)`` array per field, each with
        its ``"_<field>"`` mask (the envs that have a value)."""
        mask = np.zeros(num_envs, dtype=bool)
        mask[list(stats)] = True
        out: dict[str, np.ndarray] = {}
        for field in dataclasses.fields(EpisodeStats):
            name = field.name
            if name in EpisodeStats._OBJECT_FIELDS:
                column = np.empty(num_envs, dtype=object)
            else:
                column = np.zeros(num_envs, dtype=type(field.default))
            for env_id, record in stats.items():
                column[env_id] = getattr(record, name)
            out[name] = column
            out[f"_{name}"] = mask.copy()
        return out

    @classmethod
    def from_info(cls, info: dict[str, Any], env_id: int, key: str = "chunk_stats") -> EpisodeStats | None:
        """Env ``env_id``'s record from a step's ``info`` (None where its episode did not end)."""
        mask = info.get(f"_{key}")
        if mask is None or not bool(mask[env_id]):
            return None
        columns = info[key]
        values = {}
        for field in dataclasses.fields(cls):
            value = columns[field.name][env_id]
            values[field.name] = value if field.name in cls._OBJECT_FIELDS else type(field.default)(value)
        return cls(**values)


@dataclasses.dataclass
class EpisodeCounters:
    """What the wrapper itself counts for one env's episode (the chunk schedule counts the chunk side)."""

    latencies_s: list[float] = dataclasses.field(default_factory=list)
    reconnects: int = 0
    retries: int = 0
    reconnect_failures: int = 0


@dataclasses.dataclass
class StepRecord:
    """What the wrapper's policy side did in one step, per env (the ``info`` columns it fills)."""

    called: np.ndarray  # (N,) bool: a request was sent
    delivered: np.ndarray  # (N,) bool: a reply was applied to the schedule
    latency_s: np.ndarray  # (N,) round trip of the reply or failure taken; NaN otherwise
    sent_at: np.ndarray  # (N,) perf_counter stamps of that request; NaN otherwise
    received_at: np.ndarray
    errors: np.ndarray  # (N,) object: None or the failure's one-line text
    events: np.ndarray  # (N,) object: None or an INTEGRITY_EVENTS name

    def info_columns(self) -> dict[str, np.ndarray]:
        """The step's ``info`` columns this record fills, under the wrapper's names."""
        return {"policy_called": self.called, "chunk_received": self.delivered, "chunk_latency_s": self.latency_s,
                "chunk_sent_at": self.sent_at, "chunk_received_at": self.received_at, "policy_error": self.errors,
                "integrity_event": self.events}  # fmt: skip

    @classmethod
    def empty(cls, n: int) -> StepRecord:
        nan = np.full(n, np.nan)
        return cls(
            np.zeros(n, dtype=bool),
            np.zeros(n, dtype=bool),
            nan,
            nan.copy(),
            nan.copy(),
            np.full(n, None, dtype=object),
            np.full(n, None, dtype=object),
        )
