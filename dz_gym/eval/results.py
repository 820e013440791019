"""Evaluation results: episode rows, summaries, Wilson intervals and the printed table (pure, no I/O).

An *episode row* is one JSON object of ``episodes.jsonl``; its schema is :class:`dz_gym.eval.row.EpisodeRow`
(:func:`check_row` is the row module's). The summary
is computed from the rows alone, so anyone can recompute ``summary.json`` from ``episodes.jsonl``; the only
inputs that rows cannot carry (wall time of the stepping loop, server metadata, versions, the command) are
passed in by the caller.

Errored episodes (a server error, a lost connection or a timeout during the episode) count in ``errored`` and
are excluded from the success denominators: their success fields are ``null`` in the rows. A success rate is
reported as ``{"k", "n", "rate", "ci95": [lo, hi]}`` with the Wilson score interval (z = 1.96), which stays
inside [0, 1] and is sensible at k = 0 and k = n. Where episodes errored, ``rate`` is over the completed ones
(descriptive) and ``ci95`` spans every outcome the errored ones could have had (Wilson's lower end with them as
failures, its upper end with them as successes), so errors that fall on failures cannot narrow it onto a
better rate than the policy has.

Milestones: where rows carry ``milestones`` (name -> first step or null), each group has a funnel
``milestones: {name: rate}``: the completed episodes that reached each milestone, over the completed episodes
whose row carries it. An A/B run's rows carry ``arm``: :func:`summarize_arms` gives the same groups per arm,
and :func:`format_table` prints one line per scene and arm, then the paired comparison.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from dz_gym.eval.failure import mode_counts
from dz_gym.eval.row import check_row
from dz_gym.stats.comparison import ARMS
from dz_gym.stats.proportions import (
    bounded_wilson_interval,
    wilson_interval,  # noqa: F401 - the interval the results report, re-exported
)

ERRORED_NOTE = ("errored episodes are excluded from the success denominators (n) and counted in 'errored'; the "
                "95% CIs span every outcome they could have had")  # fmt: skip
LATENCY_KEYS = ("mean", "p50", "p90", "p99", "max")


def rate(k: int, n: int, errored: int = 0) -> dict[str, Any]:
    """``{"k", "n", "rate", "ci95"}`` for ``k`` of ``n`` (rate and interval are ``None`` when ``n == 0``);
    ``errored``: episodes without an outcome, over which the interval is widened (see the module docstring).

    >>> r = rate(8, 8)
    >>> r["k"], r["n"], r["rate"], [round(x, 3) for x in r["ci95"]]
    (8, 8, 1.0, [0.676, 1.0])
    >>> [round(x, 3) for x in rate(8, 8, errored=2)["ci95"]]
    [0.49, 1.0]
    >>> rate(0, 0)
    {'k': 0, 'n': 0, 'rate': None, 'ci95': None}
    """
    interval = bounded_wilson_interval(k, n, errored) if n else None
    return {
        "k": int(k),
        "n": int(n),
        "rate": (k / n) if n else None,
        "ci95": None if interval is None else [interval[0], interval[1]],
    }


def linear_percentiles(ordered: Sequence[float], percents: Sequence[float]) -> list[float]:
    """The ``percents`` (0..100) of the sorted, finite ``ordered`` values by linear interpolation: the values of
    ``np.percentile(ordered, percents)`` (its default method, with its float operations in the same order),
    without its per-call overhead, which was a large part of finishing 1024 episodes that end at one step
    (benchmarks/journal/bookkeeping-and-geometry.md).

    >>> linear_percentiles([10.0, 20.0, 30.0, 40.0], [50, 90, 99])
    [25.0, 37.0, 39.699999999999996]
    """
    n = len(ordered)
    out = []
    for percent in percents:
        index = (n - 1) * (percent / 100)
        below = math.floor(index)
        if index >= n - 1:  # numpy: both neighbours are the last value, the weight past 0.5
            out.append(ordered[-1] + 0.0)
            continue
        low, high = ordered[below], ordered[below + 1]
        weight, diff = index - below, high - low
        out.append(high - diff * (1 - weight) if weight >= 0.5 else low + diff * weight)
    return out


def latency_stats(latencies_ms: Iterable[float]) -> dict[str, float] | None:
    """mean/p50/p90/p99/max and count of latencies in milliseconds (``None`` for no samples; NaN skipped).

    >>> stats = latency_stats([10.0, 20.0, 30.0, 40.0, float("nan")])
    >>> stats["mean"], stats["p50"], stats["max"], stats["count"]
    (25.0, 25.0, 40.0, 4)
    >>> latency_stats([]) is None
    True
    """
    values = [float(v) for v in latencies_ms if v is not None and math.isfinite(v)]
    if not values:
        return None
    ordered = sorted(values)
    p50, p90, p99 = linear_percentiles(ordered, (50, 90, 99))
    return {
        "mean": float(np.mean(np.asarray(values, dtype=np.float64))),
        "p50": p50,
        "p90": p90,
        "p99": p99,
        "max": ordered[-1],
        "count": len(values),
    }


def milestone_funnel(rows: Sequence[Mapping[str, Any]]) -> dict[str, dict[str, Any]] | None:
    """Per milestone (in the rows' order), the completed episodes that reached it with a Wilson interval (widened
    over the errored episodes, as a success rate's); None when no completed row carries milestones.

    >>> rows = [{"error": None, "milestones": {"reached": 3, "lifted": None}},
    ...         {"error": None, "milestones": {"reached": 5, "lifted": 9}}]
    >>> {name: (r["k"], r["n"]) for name, r in milestone_funnel(rows).items()}
    {'reached': (2, 2), 'lifted': (1, 2)}
    """
    done = [r for r in rows if r.get("error") is None and isinstance(r.get("milestones"), Mapping)]
    if not done:
        return None
    errored = sum(r.get("error") is not None for r in rows)
    names: list[str] = []
    for r in done:
        names.extend(str(n) for n in r["milestones"] if str(n) not in names)
    funnel = {}
    for name in names:
        having = [r for r in done if name in r["milestones"]]
        funnel[name] = rate(sum(r["milestones"][name] is not None for r in having), len(having), errored)
    return funnel


def _group(rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    ok = [r for r in rows if r["error"] is None]
    latencies = [v for r in rows for v in r.get("latencies_ms") or ()]
    funnel = milestone_funnel(rows)
    return ({"milestones": funnel} if funnel is not None else {}) | {
        "episodes": len(rows),
        "completed": len(ok),
        "errored": len(rows) - len(ok),
        "retried_attempts": int(sum(max(int(r.get("attempts", 1)) - 1, 0) for r in rows)),
        "success_at_end": rate(sum(bool(r["success_at_end"]) for r in ok), len(ok), len(rows) - len(ok)),
        "success_any_step": rate(sum(bool(r["success_any_step"]) for r in ok), len(ok), len(rows) - len(ok)),
        "env_steps": int(sum(r["steps"] for r in rows)),
        "server_calls": int(sum(r["server_calls"] for r in rows)),
        "server_errors": int(sum(r.get("server_errors", 0) for r in rows)),
        "latency_ms": latency_stats(latencies),
        "failure_modes": mode_counts(rows),
    }


def summarize(
    rows: Sequence[Mapping[str, Any]],
    *,
    planned: Mapping[int, int] | None = None,
    prompts: Mapping[int, str] | None = None,
    wall_s: float | None = None,
    stepped: int | None = None,
    busy_s: Mapping[str, float] | None = None,
    extra: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The ``summary.json`` dict of ``rows``.

    ``planned`` maps scene -> planned episode count (for ``complete``), ``prompts`` scene -> prompt,
    ``wall_s`` the stepping loop's wall time and ``stepped`` the env steps taken in it, including those of
    episodes cut short by an interruption (default: the rows' steps); ``busy_s`` server URL -> seconds its
    requests were in flight; ``extra`` is merged in at the top level last.

    Every rate is computed from counts the summary reports next to it: ``env_steps_per_s`` is
    ``env_steps_taken / wall_s`` (``env_steps`` counts only the rows' steps), and each server's utilization
    is ``server_busy_s[url] / wall_s``.
    """
    for row in rows:
        check_row(row)
    rows = sorted(rows, key=lambda r: (r["scene"], r["episode"]))
    scenes = sorted({r["scene"] for r in rows} | set(planned or {}))
    summary: dict[str, Any] = {"scenes": scenes}
    for scene in scenes:
        entry = _group([r for r in rows if r["scene"] == scene])
        task = next((r["task"] for r in rows if r["scene"] == scene and r.get("task")), None)
        if task is not None:
            entry["task"] = task
        if prompts and scene in prompts:
            entry["prompt"] = prompts[scene]
        if planned is not None:
            entry["planned"] = int(planned.get(scene, 0))
        summary[str(scene)] = entry
    overall = _group(rows)
    if planned is not None:
        overall["planned"] = int(sum(planned.values()))
    summary["overall"] = overall
    summary["note"] = ERRORED_NOTE
    summary["complete"] = planned is not None and all(summary[str(s)]["episodes"] >= planned.get(s, 0) for s in scenes)
    summary["env_steps"] = overall["env_steps"]
    summary["env_steps_taken"] = overall["env_steps"] if stepped is None else int(stepped)
    summary["wall_s"] = wall_s
    summary["env_steps_per_s"] = (summary["env_steps_taken"] / wall_s) if wall_s else None
    summary["server_calls"] = overall["server_calls"]
    summary["server_errors"] = overall["server_errors"]
    summary["latency_ms"] = overall["latency_ms"]
    summary["server_busy_s"] = {url: float(busy) for url, busy in (busy_s or {}).items()}
    per_server = {url: (busy / wall_s if wall_s else None) for url, busy in summary["server_busy_s"].items()}
    known = [v for v in per_server.values() if v is not None]
    summary["server_utilization"] = (sum(known) / len(known)) if known else None
    summary["server_utilization_per_server"] = per_server
    summary.update(extra or {})
    return summary


def summarize_arms(
    rows: Sequence[Mapping[str, Any]], arms: Sequence[str], *, planned: Mapping[int, int] | None = None
) -> dict[str, Any]:
    """Per arm of an A/B run: ``{"scenes", "<scene>": group, "overall": group}`` as in :func:`summarize`
    (``planned``: episodes per scene and arm)."""
    scenes = sorted({r["scene"] for r in rows} | set(planned or {}))
    out: dict[str, Any] = {}
    for arm in arms:
        mine = [r for r in rows if r.get("arm") == arm]
        entry: dict[str, Any] = {"scenes": scenes}
        for scene in scenes:
            entry[str(scene)] = _group([r for r in mine if r["scene"] == scene])
            if planned is not None:
                entry[str(scene)]["planned"] = int(planned.get(scene, 0))
        entry["overall"] = _group(mine)
        if planned is not None:
            entry["overall"]["planned"] = int(sum(planned.values()))
        out[arm] = entry
    return out


def _fmt_rate(entry: Mapping[str, Any]) -> str:
    if entry["n"] == 0:
        return "-"
    lo, hi = entry["ci95"]
    return f"{entry['k']}/{entry['n']} {100 * entry['rate']:.0f}% [{100 * lo:.0f},{100 * hi:.0f}]"


def _fmt_episodes(entry: Mapping[str, Any]) -> str:
    retried = entry.get("retried_attempts", 0)
    again = f" ({retried} errored attempts run again)" if retried else ""
    if not entry["errored"]:
        return f"{entry['episodes']}{again}"
    return f"{entry['completed']}/{entry['episodes']} completed, {entry['errored']} errored{again}"


def _arm_names(arms: Mapping[str, Any]) -> list[str]:
    """The arms of a summary's ``arms``, in order (its other keys are not arms)."""
    return [arm for arm in arms if arm != "labels"]


def _arm_label(arm: str) -> str:
    """An arm's name in the table: an A/B run's ``A``/``B``, a named arm as given."""
    return arm.upper() if arm in ARMS else arm


def power_line(sequential: Mapping[str, Any]) -> str:
    """The sequential test's design in one line, with the power its budget has (exact), never the planned one."""
    design = sequential.get("design") or {}
    budget, cap, power = sequential.get("budget_pairs"), design.get("max_pairs"), sequential.get("power")
    if not isinstance(power, (int, float)):  # a summary written before budgets were checked
        return f"design: smallest difference {design.get('min_difference')}, alpha {sequential.get('alpha')}"
    where = (f"below the design's cap {cap} pairs: --accept-lower-power" if sequential.get("below_cap")
             else f"the design's cap {cap} pairs")  # fmt: skip
    return (f"design: smallest difference {design.get('min_difference')}, alpha {sequential.get('alpha')}; budget "
            f"{budget} pairs ({where}): power {power:.3f} at that difference (exact)")  # fmt: skip


def difference_line(diff: Mapping[str, Any], scale: float = 1.0, unit: str = "") -> str:
    """The sequential test's ``B - A``: the estimate (its range over the errored outcomes when pairs errored),
    the confidence sequence (valid at the stop, bounded over them) and the estimate's bias at the stop."""
    low, high = diff["confidence_sequence"]
    rng, estimate, bias = diff.get("estimate_range"), diff.get("estimate"), diff.get("bias")
    if rng and rng[0] != rng[1]:
        shown = f"{scale * rng[0]:+.3f}..{scale * rng[1]:+.3f}{unit} over the errored outcomes"
    else:
        shown = "-" if estimate is None else f"{scale * estimate:+.3f}{unit}"
    text = (f"B - A {shown}, {diff['level']:.0%} confidence sequence [{scale * low:+.2f}, {scale * high:+.2f}]{unit} "
            "(valid at the stop)")  # fmt: skip
    return text if bias is None else f"{text}; bias of the estimate at the stop {scale * bias:+.3f}{unit}"


def format_table(summary: Mapping[str, Any]) -> str:
    """A short fixed-width table of ``summary`` for the terminal (no trailing spaces).

    The episodes column says ``k/n completed, m errored`` where some episodes errored.
    """
    header = ("scene", "episodes", "success@end [95% CI]", "success@any [95% CI]", "calls", "p50 ms")
    arms = summary.get("arms")
    groups: list[tuple[str, Mapping[str, Any]]] = []
    for key in [str(s) for s in summary.get("scenes", [])] + ["overall"]:
        task = summary.get(key, {}).get("task")
        name = f"{key} {task}" if task and key.isdigit() and int(key) > 100 else key  # MILA tasks by name
        if isinstance(arms, Mapping):
            groups.extend((f"{name} {_arm_label(arm)}", arms[arm][key]) for arm in _arm_names(arms))
        else:
            groups.append((name, summary[key]))
    lines = []
    for key, entry in groups:
        latency = entry.get("latency_ms")
        lines.append(
            (
                key,
                _fmt_episodes(entry),
                _fmt_rate(entry["success_at_end"]),
                _fmt_rate(entry["success_any_step"]),
                str(entry["server_calls"]),
                "-" if not latency else f"{latency['p50']:.0f}",
            )
        )
    widths = [max(len(header[i]), *(len(line[i]) for line in lines)) for i in range(len(header))]
    out = ["  ".join(h.ljust(w) for h, w in zip(header, widths)).rstrip()]
    out.append("  ".join("-" * w for w in widths))
    out.extend("  ".join(c.ljust(w) for c, w in zip(line, widths)).rstrip() for line in lines)
    speed = summary.get("env_steps_per_s")
    util = summary.get("server_utilization")
    tail = []
    if speed:
        tail.append(f"{speed:.1f} env-steps/s")
    if util is not None:
        tail.append(f"server utilization ~{100 * util:.0f}%")
    if summary.get("interrupted"):
        tail.append("INTERRUPTED (partial results)")
    if summary.get("aborted"):
        tail.append(f"ABORTED: {summary['aborted']}")
    if tail:
        out.append(", ".join(tail))
    if summary["overall"]["errored"]:
        out.append(f"note: {ERRORED_NOTE}")
    adaptive = summary.get("descriptive")
    if isinstance(adaptive, Mapping):
        out.append(f"DESCRIPTIVE ONLY: the rates and 95% CIs above ({adaptive.get('why')})")
    funnel = summary["overall"].get("milestones") if not isinstance(arms, Mapping) else None
    if funnel:
        out.append("milestones: " + ", ".join(f"{name} {_fmt_rate(r)}" for name, r in funnel.items()))
    modes = summary["overall"].get("failure_modes") if not isinstance(arms, Mapping) else None
    if modes:
        out.append("failure modes: " + ", ".join(f"{name} {n}" for name, n in modes.items()))
    if isinstance(arms, Mapping):
        for arm in _arm_names(arms):
            arm_modes = arms.get(arm, {}).get("overall", {}).get("failure_modes")
            if arm_modes:
                out.append(f"failure modes {_arm_label(arm)}: " + ", ".join(f"{m} {n}" for m, n in arm_modes.items()))
            arm_funnel = arms.get(arm, {}).get("overall", {}).get("milestones")
            if arm_funnel:
                steps = ", ".join(f"{n} {_fmt_rate(r)}" for n, r in arm_funnel.items())
                out.append(f"milestones {_arm_label(arm)}: {steps}")
    out.extend(_decision_lines(summary))
    return "\n".join(out)


def _decision_lines(summary: Mapping[str, Any]) -> list[str]:
    """The table's decision part: the leaderboard of named arms, the race's selection, the A/B comparison and
    the sequential test's decision."""
    out: list[str] = []
    ranking = summary.get("ranking")
    if isinstance(ranking, Mapping) and ranking.get("arms") and not isinstance(summary.get("comparison"), Mapping):
        from dz_gym.stats.ranking import format_ranking

        out.append("")
        out.append(format_ranking(ranking))  # a run of K named arms: the leaderboard
    selection = summary.get("selection")
    if isinstance(selection, Mapping):
        after = selection.get("eliminated_after_seeds") or {}
        gone = ", ".join(f"{arm} after {n} seed(s)" for arm, n in after.items()) or "none"
        out.append(f"SELECTION (--select-best): best {selection.get('best') or 'not named'}; eliminated: {gone}")
        out.append(f"  {selection.get('why')}")
        if selection.get("errored_rounds"):
            held = ", ".join(selection.get("held_by_errors") or []) or "none"
            out.append(f"  {selection['errored_rounds']} seed(s) with an errored episode, counted against each "
                       f"claimant; arms the errors kept in the race: {held}")  # fmt: skip
    comparison = summary.get("comparison")
    if isinstance(comparison, Mapping) and comparison.get("metrics"):
        from dz_gym.stats.comparison import format_comparison

        out.append("")
        shown = {k: v for k, v in comparison["metrics"].items() if k in ("success_at_end", "success_any_step")}
        sequential_run = isinstance(summary.get("sequential"), Mapping)
        out.append(format_comparison({**comparison, "metrics": shown}, descriptive=sequential_run))
    sequential = summary.get("sequential")
    if isinstance(sequential, Mapping):
        out.append("")
        out.append(
            f"DECISION (sequential test): {sequential.get('reason')} [stopped by: {sequential.get('stopped_by')}]"
        )
        out.append(f"  {sequential.get('why')}")
        out.append(f"  {power_line(sequential)}")
        errors = sequential.get("errors")
        if isinstance(errors, Mapping) and errors.get("bounded_pairs"):
            out.append(f"  {errors['bounded_pairs']} errored pair(s) bounded, not dropped (against B [A only, B only] "
                       f"= {errors.get('worst_for_b')}, against A {errors.get('worst_for_a')}); with them dropped "
                       f"the rule would say: {errors.get('without_errored')}")  # fmt: skip
        diff = sequential.get("difference")
        if isinstance(diff, Mapping) and diff.get("confidence_sequence"):
            out.append(f"  {difference_line(diff)}")
        if sequential.get("unpaired") or sequential.get("dropped"):
            unpaired, dropped = len(sequential.get("unpaired") or []), len(sequential.get("dropped") or [])
            out.append(f"left out of the comparison: {unpaired} episode(s) without a twin, "
                       f"{dropped} dropped at the stop (no row)")  # fmt: skip
    return out
