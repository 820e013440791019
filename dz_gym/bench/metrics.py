"""Per-request records of a benchmark run and their summary (pure: no I/O, no clocks).

The load generators append one :class:`RequestRecord` per timed request; :func:`summarize` turns the list
into the numbers a serving benchmark reports (vLLM's ``bench serve`` conventions plus the robot-specific ones):

- throughput: requests/s and actions/s (= requests/s x open-loop horizon, the actions a client executes
  from each chunk; ``chunk_rows`` shows whether the chunks are that long), and the effective control rate
  of one session compared with the 15 Hz robot rate;
- latency (end-to-end, send to reply) mean/std/min/p50/p90/p95/p99/max, the same for the first chunk of
  each episode (a new session id, where servers reset their per-session state), and, when the server
  reports its own ``server_timing.infer_ms`` (openpi), the model time and the queueing time (e2e - infer);
- goodput: the share of requests whose chunk arrived within the control budget (open-loop horizon / 15 s,
  533 ms at the default 8): a chunk that arrives later than the actions it replaces stalls the robot;
- errors by kind (the class name of the typed exception of :mod:`dz_gym.errors`), with one example each;
- payload bytes and MB/s sent, and the client's own CPU time per request (passed in by the caller).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import numpy as np

from dz_gym.envs.droid import CONTROL_HZ

__all__ = ["LATENCY_KEYS", "RequestRecord", "control_budget_s", "latency_stats", "summarize"]

# Keys of every latency statistics block, in report order.
LATENCY_KEYS = ("mean", "std", "min", "p50", "p90", "p95", "p99", "max")


@dataclasses.dataclass(frozen=True)
class RequestRecord:
    """One timed request as the client saw it.

    Times are seconds on one monotonic clock (``time.perf_counter``). ``scheduled_at`` is when an open-loop
    schedule wanted the request sent (``None`` in closed loop); ``sent_at`` - ``scheduled_at`` is the time it
    waited for a free connection. ``error_kind`` is ``None`` for a good reply, else the exception's class name.
    ``first_of_episode`` marks the first request under a new session id. ``infer_ms`` is the server's own
    model time when it sends one; ``chunk_rows`` the number of actions in the reply.
    """

    session: int
    server: int
    sent_at: float
    received_at: float
    request_bytes: int
    error_kind: str | None = None
    error_message: str | None = None
    first_of_episode: bool = False
    infer_ms: float | None = None
    scheduled_at: float | None = None
    chunk_rows: int | None = None

    @property
    def ok(self) -> bool:
        return self.error_kind is None

    @property
    def latency_s(self) -> float:
        return self.received_at - self.sent_at


def control_budget_s(open_loop_horizon: int, control_hz: float = CONTROL_HZ) -> float:
    """Seconds of robot motion one chunk covers: the latest a chunk may arrive without stalling the robot."""
    return open_loop_horizon / control_hz


def latency_stats(values_ms: Sequence[float] | np.ndarray) -> dict[str, float] | None:
    """``mean, std, min, p50, p90, p95, p99, max`` of millisecond values (``None`` for no values).

    Percentiles interpolate linearly between order statistics (numpy's default), as vLLM's benchmark does.
    """
    values = np.asarray(values_ms, dtype=np.float64).reshape(-1)
    if values.size == 0:
        return None
    p50, p90, p95, p99 = np.percentile(values, [50, 90, 95, 99])
    stats = {
        "mean": float(values.mean()),
        "std": float(values.std()),
        "min": float(values.min()),
        "p50": float(p50),
        "p90": float(p90),
        "p95": float(p95),
        "p99": float(p99),
        "max": float(values.max()),
    }
    return {key: stats[key] for key in LATENCY_KEYS}


def _rate(count: float, seconds: float) -> float:
    return count / seconds if seconds > 0 else 0.0


def summarize(
    records: Sequence[RequestRecord],
    *,
    duration_s: float,
    open_loop_horizon: int,
    sessions: int,
    client_cpu_s: float | None = None,
    control_hz: float = CONTROL_HZ,
    budget_s: float | None = None,
) -> dict:
    """The metrics of one run from its records.

    ``duration_s`` is the measurement window (start of the timed phase to the last reply); ``sessions`` the
    number of simulated sessions (connections) that shared it; ``client_cpu_s`` the CPU time the client
    spent in that window, if measured. ``budget_s`` overrides the goodput budget (default: the control
    budget of ``open_loop_horizon``). Rates are 0 for an empty window.
    """
    if not isinstance(open_loop_horizon, int) or open_loop_horizon < 1:
        raise ValueError(f"open_loop_horizon: expected an int >= 1, got {open_loop_horizon!r}")
    if not isinstance(sessions, int) or sessions < 1:
        raise ValueError(f"sessions: expected an int >= 1, got {sessions!r}")
    if not (isinstance(duration_s, (int, float)) and math.isfinite(duration_s) and duration_s >= 0):
        raise ValueError(f"duration_s: expected a finite number >= 0, got {duration_s!r}")
    budget = control_budget_s(open_loop_horizon, control_hz) if budget_s is None else float(budget_s)

    good = [r for r in records if r.ok]
    completed = len(good)
    failed = len(records) - completed
    latencies_ms = np.array([r.latency_s * 1e3 for r in good], dtype=np.float64)
    within = int(np.count_nonzero(latencies_ms <= budget * 1e3))

    errors: dict[str, int] = {}
    examples: dict[str, str] = {}
    for r in records:
        if r.error_kind is not None:
            errors[r.error_kind] = errors.get(r.error_kind, 0) + 1
            examples.setdefault(r.error_kind, r.error_message or "")

    timed = [r for r in good if r.infer_ms is not None]
    infer_ms = [float(r.infer_ms) for r in timed]  # type: ignore[arg-type]
    queue_ms = [r.latency_s * 1e3 - float(r.infer_ms) for r in timed]  # type: ignore[arg-type]
    lags_ms = [(r.sent_at - r.scheduled_at) * 1e3 for r in records if r.scheduled_at is not None]
    sent_bytes = sum(r.request_bytes for r in records)
    rows = [r.chunk_rows for r in good if r.chunk_rows is not None]

    requests_per_s = _rate(completed, duration_s)
    actions_per_s = requests_per_s * open_loop_horizon
    control_hz_per_session = actions_per_s / sessions
    return {
        "completed": completed,
        "failed": failed,
        "duration_s": float(duration_s),
        "sessions": sessions,
        "requests_per_s": requests_per_s,
        "actions_per_s": actions_per_s,
        "open_loop_horizon": open_loop_horizon,
        "chunk_rows": {"min": min(rows), "max": max(rows)} if rows else None,
        "control_hz_per_session": control_hz_per_session,
        "control_hz_target": float(control_hz),
        "realtime_factor": control_hz_per_session / control_hz,
        "latency_ms": latency_stats(latencies_ms),
        "first_chunk_ms": latency_stats([r.latency_s * 1e3 for r in good if r.first_of_episode]),
        "goodput": within / len(records) if records else 0.0,
        "goodput_requests_per_s": _rate(within, duration_s),
        "goodput_budget_ms": budget * 1e3,
        "errors": dict(sorted(errors.items())),
        "error_examples": dict(sorted(examples.items())),
        "server_infer_ms": latency_stats(infer_ms),
        "queue_ms": latency_stats(queue_ms),
        "schedule_lag_ms": latency_stats(lags_ms),
        "request_bytes_mean": sent_bytes / len(records) if records else 0.0,
        "mb_sent": sent_bytes / 1e6,
        "mb_per_s": _rate(sent_bytes / 1e6, duration_s),
        "client_cpu_ms_per_request": (
            client_cpu_s * 1e3 / len(records) if client_cpu_s is not None and records else None
        ),
    }
