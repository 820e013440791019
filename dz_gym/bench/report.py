"""Presenting benchmark results: the console summary, the fixed-width sweep table, the JSON document, the plot.

Formatting only: everything here takes the dicts :func:`dz_gym.bench.runner.run_benchmark` returns. The JSON
document has stable top-level keys (``requests_per_s``, ``actions_per_s``, ``latency_ms``, ``goodput``,
``errors``, ``completed``, ``concurrency`` and the rest of one run's metrics; in a sweep the runs are under
``runs``) plus the command line, the servers' metadata and the software versions.
"""

from __future__ import annotations

import datetime
import json
import math
import platform
import sys
from collections.abc import Sequence
from typing import Any

__all__ = [
    "SCHEMA",
    "build_document",
    "format_run",
    "format_sweep",
    "plot_sweep",
    "versions",
    "write_json",
    "write_records",
]

SCHEMA = "dz-gym-bench/1"


def versions() -> dict[str, str]:
    """Versions of the software the numbers depend on."""
    import msgpack
    import numpy
    import websockets

    from dz_gym import __version__

    return {
        "dz_gym": __version__,
        "python": platform.python_version(),
        "numpy": numpy.__version__,
        "websockets": getattr(websockets, "__version__", "unknown"),
        "msgpack": ".".join(str(p) for p in msgpack.version),
        "platform": platform.platform(),
    }


def _num(value: Any, fmt: str = "{:.1f}", missing: str = "-") -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return missing
    return fmt.format(value)


def _latency_line(label: str, stats: dict | None) -> str:
    keys = ("mean", "p50", "p90", "p95", "p99", "max")
    cells = "".join(f"{_num(stats.get(k) if stats else None):>9}" for k in keys)
    return f"{label:<16}{cells}"


def format_run(run: dict, servers: Sequence[dict] | None = None) -> str:
    """A one-run summary in the style of ``vllm bench serve``: throughput, latency table, payload, errors."""
    if run["mode"] == "request-rate":
        shape = f"open loop, {run['request_rate']:g} req/s ({run['arrival']}), <= {run['concurrency']} outstanding"
    else:
        shape = f"closed loop, concurrency {run['concurrency']}"
    horizon = run["open_loop_horizon"]
    lines = [
        " dz-gym-bench result ".center(70, "="),
        f"{'Load:':<34}{shape}",
    ]
    for server in servers or ():
        lines.append(f"{'Server:':<34}{server['url']}")
    lines += [
        f"{'Completed / failed:':<34}{run['completed']} / {run['failed']}",
        f"{'Duration (s):':<34}{run['duration_s']:.2f}",
        f"{'Requests/s:':<34}{run['requests_per_s']:.2f}",
        f"{f'Actions/s (x{horizon}):':<34}{run['actions_per_s']:.1f}",
        f"{'Control rate per session (Hz):':<34}{run['control_hz_per_session']:.2f} "
        f"(robot {run['control_hz_target']:g} Hz: {run['realtime_factor']:.2f}x)",
        f"{'Goodput (<= {:.0f} ms):'.format(run['goodput_budget_ms']):<34}{100 * run['goodput']:.1f} % "
        f"({run['goodput_requests_per_s']:.2f} req/s)",
        " Latency (ms) ".center(70, "-"),
        f"{'':<16}" + "".join(f"{k:>9}" for k in ("mean", "p50", "p90", "p95", "p99", "max")),
        _latency_line("end to end", run["latency_ms"] if run["completed"] else None),
        _latency_line("first chunk", run["first_chunk_ms"]),
    ]
    if run["server_infer_ms"] is not None:
        lines.append(_latency_line("server infer", run["server_infer_ms"]))
        lines.append(_latency_line("queueing", run["queue_ms"]))
    if run["schedule_lag_ms"] is not None:
        lines.append(_latency_line("schedule lag", run["schedule_lag_ms"]))
    lines += [
        " Client ".center(70, "-"),
        f"{'Request size (KB):':<34}{run['request_bytes_mean'] / 1e3:.1f}",
        f"{'Sent (MB/s):':<34}{run['mb_per_s']:.2f}",
        f"{'Client CPU per request (ms):':<34}{_num(run['client_cpu_ms_per_request'], '{:.3f}')}",
        f"{'Reconnects:':<34}{run['reconnects']}",
        f"{'Sessions admitted at once (max):':<34}{run.get('admitted_sessions', 0)} of {run['concurrency']}",
    ]
    if run.get("admission_refusals"):
        lines.append(f"{'Sessions refused (waited, resent):':<34}{run['admission_refusals']}")
    if run["errors"]:
        lines.append(" Errors ".center(70, "-"))
        for kind, count in run["errors"].items():
            example = (
                (run["error_examples"].get(kind) or "").splitlines()[0][:80] if run["error_examples"].get(kind) else ""
            )
            lines.append(f"{kind + ':':<34}{count}  e.g. {example}")
    else:
        lines.append(f"{'Errors:':<34}none")
    lines.append("=" * 70)
    return "\n".join(lines)


_SWEEP_COLUMNS = (
    ("C", "{:d}", 5),
    ("req/s", "{:.2f}", 9),
    ("actions/s", "{:.1f}", 10),
    ("Hz/sess", "{:.2f}", 8),
    ("speedup", "{:.2f}", 8),
    ("p50 ms", "{:.1f}", 9),
    ("p90 ms", "{:.1f}", 9),
    ("p99 ms", "{:.1f}", 9),
    ("goodput", "{:.1%}", 8),
    ("errors", "{:d}", 7),
)


def format_sweep(runs: Sequence[dict]) -> str:
    """The scaling table of a concurrency sweep, fixed width; speedup is req/s against the first run."""
    base = runs[0]["requests_per_s"] if runs else 0.0
    header = "".join(f"{name:>{width}}" for name, _, width in _SWEEP_COLUMNS)
    lines = [header, "-" * len(header)]
    for run in runs:
        latency = run["latency_ms"] or {}
        values = (
            run["concurrency"],
            run["requests_per_s"],
            run["actions_per_s"],
            run["control_hz_per_session"],
            run["requests_per_s"] / base if base > 0 else None,
            latency.get("p50"),
            latency.get("p90"),
            latency.get("p99"),
            run["goodput"],
            run["failed"],
        )
        lines.append("".join(f"{_num(v, fmt):>{width}}" for v, (_, fmt, width) in zip(values, _SWEEP_COLUMNS)))
    return "\n".join(lines)


def _jsonable(value: Any) -> Any:
    """Metadata may hold numpy values or bytes: make them JSON."""
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if hasattr(value, "tolist"):
        return _jsonable(value.tolist())
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return repr(value)


def build_document(
    result: dict, *, argv: Sequence[str], sweep: bool, config: dict | None = None, label: str | None = None
) -> dict:
    """The ``--json`` document: one run's keys at the top level, or ``runs`` for a sweep, plus common fields."""
    common = {
        "schema": SCHEMA,
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": ["dz-gym-bench", *argv],
        "label": label,
        "servers": result["servers"],
        "payload": result["payload"],
        "config": config or {},
        "versions": versions(),
    }
    if sweep:
        body = {"runs": result["runs"]}
    else:
        body = dict(result["runs"][0])
    return _jsonable({**body, **common})


def write_json(path: str, document: dict) -> None:
    """Write ``document`` to ``path`` (``-`` for stdout)."""
    text = json.dumps(document, indent=2, allow_nan=False) + "\n"
    if path == "-":
        sys.stdout.write(text)
        return
    with open(path, "w", encoding="utf-8") as handle:
        handle.write(text)


def write_records(path: str, rows: Sequence[dict]) -> None:
    """Write per-request rows as JSON lines to ``path``."""
    with open(path, "w", encoding="utf-8") as handle:
        for row in rows:
            handle.write(json.dumps(_jsonable(row), allow_nan=False) + "\n")


def plot_sweep(runs: Sequence[dict], path: str, title: str = "dz-gym-bench concurrency sweep") -> None:
    """A PNG with requests/s and latency percentiles against concurrency.

    matplotlib is optional (``pip install dz-gym[plot]``); without it this raises ``RuntimeError`` with that hint.
    """
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise RuntimeError("--plot needs matplotlib: pip install 'dz-gym[plot]' (or pip install matplotlib)") from None
    xs = [run["concurrency"] for run in runs]
    fig, (ax_rate, ax_lat) = plt.subplots(1, 2, figsize=(10, 4), constrained_layout=True)
    ax_rate.plot(xs, [run["requests_per_s"] for run in runs], "o-", label="measured")
    if runs and runs[0]["requests_per_s"] > 0:
        ideal = [runs[0]["requests_per_s"] * x / xs[0] for x in xs]
        ax_rate.plot(xs, ideal, "--", color="grey", label="linear from first")
    ax_rate.set_xlabel("concurrency (sessions)")
    ax_rate.set_ylabel("requests/s")
    ax_rate.set_xscale("log", base=2)
    ax_rate.legend()
    ax_rate.grid(alpha=0.3)
    for key in ("p50", "p90", "p99"):
        ys = [(run["latency_ms"] or {}).get(key) for run in runs]
        ax_lat.plot(xs, [math.nan if y is None else y for y in ys], "o-", label=key)
    if runs:
        ax_lat.axhline(runs[0]["goodput_budget_ms"], color="red", ls=":", label="control budget")
    ax_lat.set_xlabel("concurrency (sessions)")
    ax_lat.set_ylabel("latency (ms)")
    ax_lat.set_xscale("log", base=2)
    ax_lat.legend()
    ax_lat.grid(alpha=0.3)
    fig.suptitle(title)
    fig.savefig(path, dpi=100)
    plt.close(fig)
