"""The report's paired comparison: :func:`dz_gym.stats.comparison.compare_rows`, plus the discordant pairs.

Two runs with the same seeds and scenes (or the two arms of one A/B run, rows with ``arm`` ``"a"``/``"b"``)
give paired outcomes per (scene, seed). The numbers (2x2 counts, ``diff`` = B - A with Newcombe's interval,
exact McNemar ``p_value``, Holm-adjusted ``p_holm`` per scene, ``verdict``) are exactly those of
``dz-gym-compare``'s JSON, so the page and that JSON never disagree; this module only adds which pairs are
discordant, so the page can show their videos side by side (:func:`discordant_list`, also for each pair of
neighbours in a leaderboard of named arms).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from html import escape
from typing import Any

from dz_gym.stats.comparison import ARMS, compare_rows, pair_rows


def split_arms(rows: Sequence[Mapping[str, Any]]) -> tuple[list[Mapping[str, Any]], list[Mapping[str, Any]]] | None:
    """The A and B rows of an A/B run (its rows carry ``arm``), or None for a plain run or a run of other named
    arms (``--arm``: see :mod:`dz_gym.report.leaderboard`)."""
    names = {r.get("arm") for r in rows} - {None, ""}
    if not names & set(ARMS) or names - set(ARMS):
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


VideoSource = Callable[[Mapping[str, Any]], tuple[str, str]]  # row -> (relative URL, why there is none)


def discordant_list(
    pairs: Sequence[tuple[str, Mapping[str, Any], Mapping[str, Any]]],
    video_a: VideoSource,
    video_b: VideoSource,
    names: tuple[str, str] = ("A", "B"),
    list_id: str = "discordant",
) -> str:
    """The discordant pairs as a list, each with **show videos** to play its two episodes side by side
    (``names``: the two arms' captions), or a line saying there are none."""
    items = []
    for which, ra, rb in pairs:
        sa, wa = video_a(ra)
        sb, wb = video_b(rb)
        who = names[0] if which == "a_only" else names[1]
        items.append(
            f'<li class="pair" data-scene="{ra["scene"]}" data-seed="{ra["seed"]}" data-which="{which}" '
            f'data-a="{escape(sa)}" data-b="{escape(sb)}" data-novideo-a="{escape(wa)}" data-novideo-b="{escape(wb)}" '
            f'data-label-a="{escape(names[0])}" data-label-b="{escape(names[1])}">'
            f"<b>scene {ra['scene']}, seed {ra['seed']}</b>: {escape(who)} only succeeded "
            f'<button class="pairopen" type="button">show videos</button><div class="pairvids"></div></li>'
        )
    if not items:
        return f'<p class="muted" id="{escape(list_id)}-none">No discordant pairs.</p>'
    return f'<ul class="pairs" id="{escape(list_id)}">{"".join(items)}</ul>'
