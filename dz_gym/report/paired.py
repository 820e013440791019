"""The report's paired comparison: :func:`dz_gym.stats.comparison.compare_rows`, plus the discordant pairs.

Two runs with the same seeds and scenes (or the two arms of one A/B run, rows with ``arm`` ``"a"``/``"b"``)
give paired outcomes per (scene, seed). The numbers (2x2 counts, ``diff`` = B - A with Newcombe's interval,
exact McNemar ``p_value``, Holm-adjusted ``p_holm`` per scene, ``verdict``) are exactly those of
``dz-gym-compare``'s JSON, so the page and that JSON never disagree; this module only adds which pairs are
discordant, so the page can show their videos side by side.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from dz_gym.stats.comparison import compare_rows, pair_rows


def split_arms(rows: Sequence[Mapping[str, Any]]) -> tuple[list[Mapping[str, Any]], list[Mapping[str, Any]]] | None:
    """The A and B rows of an A/B run (its rows carry ``arm``), or None for a plain run."""
    if not any(r.get("arm") in ("a", "b") for r in rows):
        return None
    return [r for r in rows if r.get("arm") == "a"], [r for r in rows if r.get("arm") == "b"]


def discordant_pairs(
    rows_a: Sequence[Mapping[str, Any]], rows_b: Sequence[Mapping[str, Any]], metric: str = "success_at_end"
) -> list[tuple[str, Mapping[str, Any], Mapping[str, Any]]]:
    """``(which, row_a, row_b)`` for the pairs where exactly one arm succeeded (``which``: a_only / b_only),
    in (scene, seed) order; pairs with an errored episode are not pairs (as in the comparison)."""
    pairs, _ = pair_rows(rows_a, rows_b)
    out = []
    for ra, rb in pairs:
        if ra.get("error") is not None or rb.get("error") is not None:
            continue
        sa, sb = ra.get(metric), rb.get(metric)
        if sa is None or sb is None or bool(sa) == bool(sb):
            continue
        out.append(("a_only" if sa else "b_only", ra, rb))
    return out


def compare(
    rows_a: Sequence[Mapping[str, Any]], rows_b: Sequence[Mapping[str, Any]], labels: Mapping[str, str] | None = None
) -> dict[str, Any]:
    """``compare_rows``'s JSON with ``discordant`` added: the discordant pairs of the primary metric."""
    result = compare_rows(list(rows_a), list(rows_b), labels=labels)
    result["discordant"] = discordant_pairs(rows_a, rows_b, result["metric"])
    return result
