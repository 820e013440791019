"""The run-level plots of the report, as inline SVG strings (see :mod:`dz_gym.report.svg` for why SVG).

- chunk latency histogram with the summary's p50/p90/p99 marked;
- env-steps/s over the run: each episode's steps spread evenly over its [start, end] interval, binned in time;
- success rate as episodes accumulate (in the order they finished), with its Wilson 95% interval;
- server load over the run: chunk-request seconds per second of wall time (the mean number of requests in
  flight), estimated the same way from each episode's latencies, next to the summary's utilization.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from dz_gym.report.load import finish_times, start_times
from dz_gym.report.svg import Axes, empty_plot, fmt
from dz_gym.stats.proportions import wilson_interval

TIME_BINS = 40


def latency_histogram(
    rows: Sequence[Mapping[str, Any]], stats: Mapping[str, Any] | None, plot_id: str = "plot-latency"
) -> str:
    title = "Chunk latency (ms)"
    values = np.asarray([v for r in rows for v in (r.get("latencies_ms") or ()) if v is not None], dtype=np.float64)
    values = values[np.isfinite(values)]
    if values.size == 0:
        return empty_plot(title, "no chunk latencies recorded", plot_id)
    hi = float(np.percentile(values, 99.5)) if values.size > 20 else float(values.max())
    hi = max(hi, float(stats["p99"]) if stats else 0.0) * 1.05 or 1.0
    lo = 0.0
    edges = np.linspace(lo, hi, 31)
    counts, _ = np.histogram(np.clip(values, lo, hi), bins=edges)
    ax = Axes((lo, hi), (0, max(1, int(counts.max())) * 1.15))
    ax.frame("latency (ms), clipped at the 99.5th percentile", "chunks")
    ax.bars(edges.tolist(), counts.tolist())
    if stats:
        for row, key in enumerate(("p50", "p90", "p99")):
            ax.vline(float(stats[key]), f"{key} {stats[key]:.0f}", cls=f"mark {key}", row=row)
    return ax.svg(title, plot_id)


def _time_bins(
    rows: Sequence[Mapping[str, Any]],
) -> tuple[np.ndarray, list[tuple[float, float, Mapping[str, Any]]]] | None:
    """Bin edges (seconds from the first start) and each row's (start, end) in those seconds."""
    starts, ends = start_times(list(rows)), finish_times(list(rows))
    spans = [(s, e, r) for s, e, r in zip(starts, ends, rows) if s is not None and e is not None]
    if not spans:
        return None
    t0 = min(s for s, _, _ in spans)
    t1 = max(e for _, e, _ in spans)
    if t1 - t0 <= 0:
        return None
    edges = np.linspace(0.0, t1 - t0, TIME_BINS + 1)
    return edges, [(s - t0, e - t0, r) for s, e, r in spans]


def _spread(edges: np.ndarray, spans: list[tuple[float, float, Mapping[str, Any]]], amount) -> np.ndarray:
    """Per time bin, the sum of ``amount(row)`` spread evenly over each row's interval."""
    totals = np.zeros(len(edges) - 1)
    for start, end, row in spans:
        value = float(amount(row))
        if value == 0:
            continue
        if end <= start:
            k = min(len(totals) - 1, int(np.searchsorted(edges, start, side="right")) - 1)
            totals[max(0, k)] += value
            continue
        overlap = np.clip(np.minimum(edges[1:], end) - np.maximum(edges[:-1], start), 0.0, None)
        totals += value * overlap / (end - start)
    return totals


def steps_rate(rows: Sequence[Mapping[str, Any]], summary_rate: float | None, plot_id: str = "plot-steps") -> str:
    title = "Env-steps/s over the run"
    binned = _time_bins(rows)
    if binned is None:
        return empty_plot(title, "no episode timing recorded", plot_id)
    edges, spans = binned
    width = edges[1] - edges[0]
    rate = _spread(edges, spans, lambda r: r.get("steps", 0)) / width
    centres = ((edges[:-1] + edges[1:]) / 2).tolist()
    ax = Axes((0.0, float(edges[-1])), (0.0, max(1e-9, float(rate.max())) * 1.2))
    ax.frame("time since the first episode started (s)", "env-steps/s")
    ax.line(centres, rate.tolist(), "s0")
    if summary_rate:
        ax.hline(float(summary_rate), f"run mean {summary_rate:.1f}/s")
    return ax.svg(title, plot_id)


def server_load(rows: Sequence[Mapping[str, Any]], utilization: float | None, plot_id: str = "plot-server") -> str:
    title = "Server load over the run"
    binned = _time_bins(rows)
    if binned is None:
        return empty_plot(title, "no episode timing recorded", plot_id)
    edges, spans = binned
    width = edges[1] - edges[0]
    load = (
        _spread(edges, spans, lambda r: sum(v for v in (r.get("latencies_ms") or ()) if v is not None) / 1000.0) / width
    )
    if not load.any():
        return empty_plot(title, "no chunk latencies recorded", plot_id)
    centres = ((edges[:-1] + edges[1:]) / 2).tolist()
    ax = Axes((0.0, float(edges[-1])), (0.0, max(1.0, float(load.max())) * 1.2))
    ax.frame("time since the first episode started (s)", "requests in flight (mean)")
    ax.line(centres, load.tolist(), "s1")
    ax.hline(1.0, "1 request always in flight")
    if utilization is not None:
        ax.text(ax.left + 6, ax.top + 10, f"busy fraction (summary): {100 * utilization:.0f}%")
    return ax.svg(title, plot_id)


def success_curve(rows: Sequence[Mapping[str, Any]], key: str = "success_at_end", plot_id: str = "plot-success") -> str:
    title = "Success rate as episodes accumulate"
    ends = finish_times(list(rows))
    order = sorted(
        (i for i, r in enumerate(rows) if r.get("error") is None),
        key=lambda i: (ends[i] is None, ends[i] or 0.0, rows[i]["scene"], rows[i]["episode"]),
    )
    if not order:
        return empty_plot(title, "no completed episodes yet", plot_id)
    xs, ys, lo, hi = [], [], [], []
    k = 0
    for n, i in enumerate(order, 1):
        k += bool(rows[i].get(key))
        low, high = wilson_interval(k, n)
        xs.append(n)
        ys.append(k / n)
        lo.append(low)
        hi.append(high)
    ax = Axes((0.0, float(max(len(xs), 2))), (0.0, 1.0))
    ax.frame(
        "completed episodes (in the order they finished)",
        "success at end",
        yticks=[0, 0.25, 0.5, 0.75, 1.0],
        yfmt=lambda v: f"{100 * v:.0f}%",
    )
    ax.band(xs, lo, hi)
    ax.line(xs, ys, "s0")
    ax.text(
        ax.width - ax.right - 4,
        ax.top + 10,
        f"{k}/{len(xs)} = {100 * k / len(xs):.0f}%, Wilson 95% [{100 * lo[-1]:.0f}, {100 * hi[-1]:.0f}]",
        anchor="end",
    )
    return ax.svg(title, plot_id)


def format_duration(seconds: float | None) -> str:
    if seconds is None or not math.isfinite(seconds):
        return "-"
    if seconds < 120:
        return f"{seconds:.1f} s"
    minutes, sec = divmod(round(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes:02d} min" if hours else f"{minutes} min {sec:02d} s"


__all__ = ["fmt", "format_duration", "latency_histogram", "server_load", "steps_rate", "success_curve"]
