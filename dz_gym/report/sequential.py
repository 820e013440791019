"""The report's sequential status of an A/B run: the decision, why it stopped, the e-value path (pure).

After a sequential run the decision to read is the sequential test's (``summary.json``'s ``sequential``), not
the fixed-n verdicts of the paired table: this block says what it decided, why the run stopped, the design it
used with the power its budget has (exact; below the design's cap it is less than the power asked for), the difference with its confidence sequence (valid at the stop) and the estimate's bias, and plots the
e-value path (log10 of the e-value after each pair the test used, in plan order).
"""

from __future__ import annotations

from collections.abc import Mapping
from html import escape
from typing import Any

from dz_gym.eval.results import difference_line, power_line
from dz_gym.report.svg import Axes, empty_plot

__all__ = ["sequential_block"]

DECISIONS = {
    "b_better": "B is better",
    "a_better": "A is better",
    "no_difference": "no difference of the size planned for (stopped for futility)",
    "errors_undecided": "no decision: the errored pairs leave open whether the difference planned for is unlikely",
    "max_pairs": "no decision within the budget",
    "errors_differ": "refused to decide: errors differ between arms",
    "continue": "not decided yet (interrupted run: --resume continues the test)",
}


def _path_plot(entry: Mapping[str, Any]) -> str:
    title = "Sequential test: e-value after each pair (plan order)"
    path = [float(v) for v in entry.get("log10_e_path") or []]
    if not path:
        return empty_plot(title, "no usable pairs yet", "plot-evalue")
    xs = list(range(1, len(path) + 1))
    low, high = min(0.0, *path), max(1.5, *path)
    ax = Axes((0.0, float(max(len(xs), 2))), (low, high + 0.2))
    ax.frame("pairs the test used (plan order)", "log10 e-value")
    ax.hline(0.0, "e = 1")
    ax.line(xs, path, "s0", step=True)
    return ax.svg(title, "plot-evalue")


def sequential_block(summary: Mapping[str, Any]) -> str:
    """HTML for the summary's ``sequential`` entry ('' when the run had no sequential test)."""
    entry = summary.get("sequential")
    if not isinstance(entry, Mapping):
        return ""
    reason = str(entry.get("reason"))
    decision = DECISIONS.get(reason, reason)
    design = entry.get("design") or {}
    rows = [
        ("decision", f"<b>{escape(decision)}</b>"),
        ("stopped by", escape(str(entry.get("stopped_by")))),
        ("why", escape(str(entry.get("why")))),
        ("pairs used", f"{entry.get('pairs')} (A only {entry.get('a_only')}, B only {entry.get('b_only')}; errored: "
                       f"A {entry.get('errored_a')}, B {entry.get('errored_b')}, both {entry.get('errored_both')}; "
                       f"errors by arm, exact McNemar p = {float(entry.get('errors_p_value', 1.0)):.3g})"),
        ("power", f'<span id="sequential-power" data-below-cap="{str(bool(entry.get("below_cap"))).lower()}">'
                  f"{escape(power_line(entry))}</span>"),
        ("design", escape(f"{design.get('rule', '')}; decide if {design.get('decide_if')}; futile if "
                          f"{design.get('futile_if')}")),
        ("anytime-valid p", f"{float(entry.get('p_value', 1.0)):.3g} (1 / largest e-value)"),
    ]  # fmt: skip
    errors = entry.get("errors")
    if isinstance(errors, Mapping) and errors.get("bounded_pairs"):
        rows.append(("errored pairs", escape(
            f"{errors['bounded_pairs']} bounded, not dropped: against B [A only, B only] = {errors.get('worst_for_b')}, "
            f"against A {errors.get('worst_for_a')}; with them dropped the rule would say "
            f"{errors.get('without_errored')}")))  # fmt: skip
    diff = entry.get("difference")
    if isinstance(diff, Mapping) and diff.get("confidence_sequence"):
        rows.append(("B - A", escape(difference_line(diff, 100.0, " pts").removeprefix("B - A "))))
    table = "".join(f"<tr><th>{k}</th><td>{v}</td></tr>" for k, v in rows)
    return (
        f'<section id="sequential"><h2>Sequential test: the decision</h2>'
        f'<table class="sequential" id="sequential-status" data-reason="{escape(reason)}"><tbody>{table}</tbody></table>'
        '<p class="muted">This is the decision to read. The paired table below uses fixed-n statistics: after a run '
        "that stopped when the evidence looked strong, its p-values and verdicts are descriptive only.</p>"
        f"{_path_plot(entry)}</section>"
    )
