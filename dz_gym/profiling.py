"""Per-stage time of the evaluator's hot path: :class:`StageProfiler` and its table (no I/O).

The wrapper, the transport and the env hooks (:mod:`dz_gym.profile_hooks`) add the seconds each stage took;
the profiler sums them per stage (thread-safe: the transport's loop thread adds too) and counts batch steps,
request rounds (batch steps that sent at least one request) and requests. :meth:`StageProfiler.report` turns
the sums into a dict with, per stage, the total, the mean per batch step, per request round and per request,
and the share of the wall time; :func:`format_table` prints it.

Stages (:data:`STAGES`), in the order of one batch step:

- on the caller's thread: ``env_step`` (the simulator's whole step; ``physics`` and ``render`` are the parts
  of it a backend's hooks can tell apart, ``env_other`` the rest), ``gpu_to_host`` (the due envs' views and the
  proprio to host arrays), ``preprocess`` (resize with pad, where the server asks for another resolution),
  ``build`` (the request dicts), ``encode`` (msgpack), ``submit`` (the hand-off to the loop; with worker
  processes the copies into their memory and the pipe writes), ``wait`` (blocked until the replies an env
  cannot step without are in), ``scatter`` (replies into the chunk caches, the
  step's actions to the env's array type), ``wrapper_info`` (the wrapper's per-step info and episode ends),
  ``reset`` (the wrapper's resets: the first, and the caller's resets of single envs), ``bookkeeping`` (the
  caller's own work between steps: the wall time not spent in the wrapper nor in ``write_tail``),
  ``write_tail`` (the evaluator's wait, once the stepping is over, for the episode writer to put the files
  still queued on disk: at N = 1024 envs ending on the last step, 1024 trajectories; not in the run's rate);
- off that thread: ``send`` (the loop thread writing a request's frame), ``receive_decode`` (parsing a
  reply), ``server`` (the server's own ``server_timing.infer_ms``), ``network`` (each request's round trip
  less its server time: the loop's queueing, the frames on the wire, the server's decoding).

The caller's-thread stages add up to at most the wall time (the rest is ``unaccounted``); the others overlap
with them and are shown per request. ``cpu_s`` is the client process's CPU time over the same span (all its
threads), ``loop_cpu_s`` the transport's own (the loop thread's, or the worker processes' with
``--transport-processes``), where the caller measured them. ``batches_as_dicts`` counts, by reason, the
batches whose requests the worker processes could have framed from one template but that the caller packed
one dict at a time (their views outside the view memory, say): that shows as a larger ``encode``.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator, Mapping
from typing import Any

__all__ = ["CALLER_STAGES", "OFF_THREAD_STAGES", "STAGES", "StageProfiler", "format_table"]

CALLER_STAGES = ("env_step", "physics", "render", "env_other", "gpu_to_host", "preprocess", "build", "encode",
                 "submit", "wait", "scatter", "wrapper_info", "reset", "bookkeeping", "write_tail")  # fmt: skip
OFF_THREAD_STAGES = ("send", "receive_decode", "server", "network")
STAGES = CALLER_STAGES + OFF_THREAD_STAGES
_ENV_PARTS = ("physics", "render")  # inside env_step
_DERIVED = ("env_other", "bookkeeping", "network")  # computed by report(), never added
_OVERLAPPING = ("server", "network")  # per request, while other requests are in flight: their sums overlap


class StageProfiler:
    """Sums of seconds per stage, with the counts that make them per batch step, round and request."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._seconds = dict.fromkeys(STAGES, 0.0)
        self._latency_s = 0.0  # sum of the requests' round trips (client-side)
        self._timed_replies = 0  # replies that carried server_timing.infer_ms
        self._replies = 0
        self._wrapper_s = 0.0  # wall time inside the wrapper's step/reset
        self.steps = 0
        self.rounds = 0
        self.requests = 0
        self.request_bytes = 0
        self.env_split = False  # a backend hook timed physics/render
        self._as_dicts: dict[str, int] = {}  # why -> batches sent as one dict per request (not by template)

    def add(self, stage: str, seconds: float) -> None:
        """Add ``seconds`` (>= 0) to ``stage``; one-line ``ValueError`` for an unknown stage."""
        if stage not in self._seconds or stage in _DERIVED:
            raise ValueError(
                f"stage: expected one of {', '.join(s for s in STAGES if s not in _DERIVED)}, got {stage!r}"
            )
        with self._lock:
            self._seconds[stage] += max(0.0, float(seconds))
            if stage in _ENV_PARTS:
                self.env_split = True

    @contextlib.contextmanager
    def stage(self, name: str) -> Iterator[None]:
        """Time the ``with`` body as stage ``name``."""
        start = time.perf_counter()
        try:
            yield
        finally:
            self.add(name, time.perf_counter() - start)

    def total(self, stage: str) -> float:
        """The seconds added to ``stage`` so far."""
        with self._lock:
            return self._seconds[stage]

    def add_wrapper(self, seconds: float) -> None:
        """Wall time spent inside the wrapper (``bookkeeping`` is the wall time outside it)."""
        with self._lock:
            self._wrapper_s += max(0.0, float(seconds))

    def step_done(self, requests: int, request_bytes: int = 0) -> None:
        """One batch step finished that sent ``requests`` requests of ``request_bytes`` in all."""
        with self._lock:
            self.steps += 1
            self.rounds += int(requests > 0)
            self.requests += int(requests)
            self.request_bytes += int(request_bytes)

    def batch_as_dicts(self, why: str) -> None:
        """A batch that the transport's workers could have framed went as one dict per request (``why``)."""
        with self._lock:
            self._as_dicts[why] = self._as_dicts.get(why, 0) + 1

    def reply(self, latency_s: float, server_ms: float | None) -> None:
        """One reply's client-side round trip and the server's own time (None when it sent none)."""
        with self._lock:
            self._replies += 1
            self._latency_s += max(0.0, float(latency_s))
            if server_ms is not None and server_ms >= 0:
                self._timed_replies += 1
                self._seconds["server"] += float(server_ms) / 1e3

    def report(self, wall_s: float, cpu_s: float | None = None, loop_cpu_s: float | None = None) -> dict[str, Any]:
        """Totals and means per stage over a span of ``wall_s`` seconds (see the module docstring)."""
        with self._lock:
            seconds = dict(self._seconds)
            latency, timed, replies = self._latency_s, self._timed_replies, self._replies
            wrapper_s, steps, rounds, requests = self._wrapper_s, self.steps, self.rounds, self.requests
            request_bytes, split, as_dicts = self.request_bytes, self.env_split, dict(self._as_dicts)
        wall_s = max(0.0, float(wall_s))
        seconds["env_other"] = max(0.0, seconds["env_step"] - seconds["physics"] - seconds["render"])
        seconds["bookkeeping"] = max(0.0, wall_s - wrapper_s - seconds["write_tail"])
        # the round trips of the timed replies, less their server time; untimed replies count wholly
        seconds["network"] = max(0.0, latency - seconds["server"]) if timed else latency
        caller = sum(seconds[s] for s in CALLER_STAGES if s not in ("physics", "render", "env_other"))
        stages = {}
        for name in STAGES:
            total = seconds[name]
            stages[name] = {
                "total_s": total,
                "per_step_ms": 1e3 * total / steps if steps else 0.0,
                "per_round_ms": 1e3 * total / rounds if rounds else 0.0,
                "per_request_ms": 1e3 * total / requests if requests else 0.0,
                "share": total / wall_s if wall_s > 0 and name in CALLER_STAGES else None,
            }
        out = {
            "wall_s": wall_s,
            "steps": steps,
            "rounds": rounds,
            "requests": requests,
            "replies": replies,
            "replies_with_server_timing": timed,
            "request_bytes": request_bytes,
            "env_split": split,
            "caller_s": caller,
            "unaccounted_s": max(0.0, wall_s - caller),
            "stages": stages,
            "cpu_s": cpu_s,
            "cpu_ms_per_request": 1e3 * cpu_s / requests if cpu_s is not None and requests else None,
            "loop_cpu_s": loop_cpu_s,
            "loop_cpu_ms_per_request": 1e3 * loop_cpu_s / requests if loop_cpu_s is not None and requests else None,
            "batches_as_dicts": as_dicts,
        }
        return out


def format_table(report: Mapping[str, Any], title: str = "profile") -> str:
    """The report as a text table: per stage ms per batch step, per request round, per request, share."""
    lines = [
        f"{title}: {report['steps']} batch steps, {report['rounds']} request rounds, {report['requests']} requests "
        f"({report['request_bytes'] / 2**20:.1f} MiB), wall {report['wall_s']:.2f} s",
        f"{'stage':<15} {'total s':>9} {'ms/step':>9} {'ms/round':>9} {'ms/request':>10} {'of wall':>8}",
    ]
    for name in STAGES:
        row = report["stages"][name]
        if name in _ENV_PARTS + ("env_other",) and not report["env_split"]:
            continue  # the backend did not tell physics and rendering apart: env_step holds them
        share = "" if row["share"] is None else f"{100 * row['share']:.1f}%"
        indent = "  " if name in _ENV_PARTS + ("env_other",) else ""
        if name in _OVERLAPPING:  # summed over requests in flight at once: only the mean per request says much
            sums = f"{'-':>9} {'-':>9} {'-':>9}"
        else:
            sums = f"{row['total_s']:>9.3f} {row['per_step_ms']:>9.2f} {row['per_round_ms']:>9.2f}"
        lines.append(f"{indent + name:<15} {sums} {row['per_request_ms']:>10.3f} {share:>8}")
    lines.append(f"{'unaccounted':<15} {report['unaccounted_s']:>9.3f}")
    for key, label in (("cpu_ms_per_request", "client CPU"), ("loop_cpu_ms_per_request", "transport CPU")):
        if report.get(key) is not None:
            lines.append(f"{label}: {report[key]:.3f} ms per request")
    for why, count in (report.get("batches_as_dicts") or {}).items():
        lines.append(f"batches sent as dicts ({why}): {count}")
    if report.get("collector"):
        passes, seconds = report["collector"]["passes"], report["collector"]["seconds"]
        lines.append(f"collector pauses: {passes[2]} full ({1e3 * seconds[2]:.1f} ms), "
                     f"{passes[0] + passes[1]} young ({1e3 * (seconds[0] + seconds[1]):.1f} ms)")  # fmt: skip
    return "\n".join(lines)
