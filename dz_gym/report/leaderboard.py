"""The report's leaderboard of a run of named arms (``--arm NAME=POLICY_OR_URL``), and its neighbours' discordant
episodes.

The numbers are the summary's ``ranking`` (:func:`dz_gym.stats.ranking.rank_arms`: per arm its success with a
Wilson interval and its rank with a simultaneous interval), recomputed from the rows the same way while the run is
in progress, so the page and ``dz-gym-compare RUN`` never disagree. With ``--select-best`` the summary's
``selection`` says which arm was named best, or that none was, and which arms went out after how many seeds.

Then, for each pair of neighbours in the leaderboard's order (1st vs 2nd, 2nd vs 3rd, ...), the episodes with
the same scene and seed where exactly one of the two succeeded, side by side with their videos: the A/B page's
discordant pairs (:func:`dz_gym.report.paired.discordant_list`), for two named arms.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from html import escape
from typing import Any

from dz_gym.report.load import RunView
from dz_gym.report.paired import VideoSource, discordant_list, discordant_pairs
from dz_gym.stats.comparison import ARMS
from dz_gym.stats.ranking import outcomes_by_seed, rank_arms

__all__ = ["arm_labels", "leaderboard_block", "named_arms", "ranking_of"]


def named_arms(view: RunView) -> list[str] | None:
    """The arm names of a run of named arms, in the run's order (``--arm``), or None for a plain or A/B run."""
    specs = view.config.get("arm_specs") or []
    names = [str(spec).split("=", 1)[0] for spec in specs]
    seen = [a for a in dict.fromkeys(str(r["arm"]) for r in view.rows if r.get("arm"))]
    if not names and not set(seen) - set(ARMS):
        return None
    return names + [a for a in seen if a not in names]


def arm_labels(view: RunView, names: Sequence[str]) -> dict[str, str]:
    """Per arm what it ran: its policy spec or server URL (``NAME=VALUE`` of ``--arm``), else ``-``."""
    table = dict(str(spec).split("=", 1) for spec in view.config.get("arm_specs") or [] if "=" in str(spec))
    return {name: table.get(name, "-") for name in names}


def _by_arm(view: RunView, names: Sequence[str]) -> dict[str, list[Mapping[str, Any]]]:
    return {name: [r for r in view.rows if r.get("arm") == name] for name in names}


def ranking_of(view: RunView, names: Sequence[str]) -> dict[str, Any]:
    """The summary's ``ranking`` when it covers every row and every arm, else :func:`rank_arms` on the rows."""
    saved = view.summary.get("ranking")
    if (
        not view.summary_is_recomputed
        and isinstance(saved, Mapping)
        and {e.get("arm") for e in saved.get("arms", [])} == set(names)
    ):
        return dict(saved)
    outcomes = outcomes_by_seed(_by_arm(view, names))
    if view.config.get("select_best"):  # stopped adaptively: no fixed-n claims; the summary brings valid ones
        return rank_arms(outcomes, claims=[], claims_method="no claims until the race's summary is written (the "
                         "fixed-n tests do not hold after an adaptive stop)")  # fmt: skip
    return rank_arms(outcomes)


def _pct(x: float) -> str:
    return f"{100 * x:.1f}"


def _board(ranking: Mapping[str, Any], labels: Mapping[str, str], selection: Mapping[str, Any] | None) -> str:
    after = (selection or {}).get("eliminated_after_seeds") or {}
    by = {a: e.get("by") for a, e in ((selection or {}).get("eliminated") or {}).items() if isinstance(e, Mapping)}
    best = (selection or {}).get("best")
    head = (
        "<tr><th>rank</th><th>arm</th><th>policy / server</th><th>success at end (k/n, %, 95% Wilson"
        + ("; descriptive only" if ranking.get("descriptive") else "")
        + ")</th>"
        "<th>rank interval</th><th>surely better than</th>" + ("<th>selection</th>" if selection else "") + "</tr>"
    )
    body = []
    for e in ranking["arms"]:
        arm = str(e["arm"])
        if e.get("rate") is None or not e.get("wilson95"):
            rate = "-"
        else:
            lo, hi = e["wilson95"]
            rate = (
                f'<span class="kn">{e["successes"]}/{e["n"]}</span> <span class="pc">{_pct(e["rate"])}%</span> '
                f'<span class="iv">[{_pct(lo)}, {_pct(hi)}]</span>'
            )
        low, high = e["rank_interval"]
        interval = f"{low}" if low == high else f"{low}-{high}"
        cells = [
            f'<td data-field="rank">{e["rank"]}</td>',
            f'<th data-field="arm">{escape(arm)}</th>',
            f'<td data-field="label"><code>{escape(labels.get(arm, "-"))}</code></td>',
            f'<td class="rate" data-field="success">{rate}</td>',
            f'<td data-field="rank_interval">{interval}</td>',
            f'<td data-field="better">{escape(", ".join(e.get("surely_better_than") or []) or "-")}</td>',
        ]
        if selection:
            if arm == best:
                state = "best"
            elif arm in after:
                state = f"eliminated after {after[arm]} seed(s)" + (f" (by {by[arm]})" if by.get(arm) else "")
            else:
                state = "still in"
            cells.append(f'<td data-field="selection">{escape(state)}</td>')
        body.append(f'<tr data-arm="{escape(arm)}">{"".join(cells)}</tr>')
    table = f'<table class="leaderboard" id="leaderboard"><thead>{head}</thead><tbody>{"".join(body)}</tbody>'
    return table + "</table>"


def _selection_note(selection: Mapping[str, Any]) -> str:
    best = selection.get("best")
    outcome = f"best arm: <b>{escape(str(best))}</b>" if best is not None else "no winner named"
    after = selection.get("eliminated_after_seeds") or {}
    out = ", ".join(f"{escape(str(a))} after {n} seed(s)" for a, n in after.items()) or "none"
    return (
        f'<p id="selection" data-best="{escape(str(best or ""))}">--select-best: {outcome}; eliminated: {out}; '
        f"{selection.get('rounds', '-')} of {selection.get('planned_seeds', '-')} seeds raced. "
        f'<span class="muted">{escape(str(selection.get("why", "")))} ({escape(str(selection.get("method", "")))}, '
        f"alpha {selection.get('alpha', '-')}).</span></p>"
    )


def _claims_note(ranking: Mapping[str, Any]) -> str:
    """What the leaderboard's claims guarantee (as proven), and which of its numbers are descriptive only."""
    level, method = 1 - float(ranking.get("alpha", 0.05)), escape(str(ranking.get("method", "")))
    if ranking.get("descriptive"):
        return (
            '<b class="descriptive">Descriptive only: success and the Wilson intervals</b> (the run stopped '
            f"adaptively). Every claimed order (surely better than, rank intervals) is right with probability at "
            f"least {level:g}, however the run stopped ({method})."
        )
    return (
        f"Ranked by success at the end ({method}): with probability at least {level:g} no two arms of equal "
        "success are put in an order (any dependence between the pairs); that no order between arms that differ "
        "is reversed is proven only for independent tests."
    )


def leaderboard_block(view: RunView, names: Sequence[str], video: VideoSource) -> str:
    """The leaderboard section of a run of named arms: the table, the selection, the neighbours' discordant
    episodes (``video``: a row's relative video URL and why it has none)."""
    ranking = ranking_of(view, names)
    labels = arm_labels(view, names)
    selection = view.summary.get("selection") if isinstance(view.summary.get("selection"), Mapping) else None
    parts = [
        '<section id="leaderboard-section"><h2>Leaderboard (arms on the same seeds)</h2>',
        _board(ranking, labels, selection),
        f'<p class="muted" id="leaderboard-note">{_claims_note(ranking)} Errored episodes are not in n (nor in '
        "the rate); they count against every claimed order and widen the Wilson interval over the outcomes they "
        "could have had.</p>",
    ]
    if selection:
        parts.append(_selection_note(selection))
    by_arm = _by_arm(view, names)
    order = [str(e["arm"]) for e in ranking["arms"]]
    for upper, lower in zip(order, order[1:]):
        pairs = discordant_pairs(by_arm[upper], by_arm[lower])
        only = sum(w == "a_only" for w, _, _ in pairs)
        parts.append(
            f'<div class="neighbours" data-arms="{escape(upper)} {escape(lower)}"><h3>{escape(upper)} vs '
            f"{escape(lower)}: {len(pairs)} discordant episode(s) ({only} {escape(upper)} only, "
            f"{len(pairs) - only} {escape(lower)} only)</h3>"
            + discordant_list(pairs, video, video, (upper, lower), f"discordant-{upper}-{lower}")
            + "</div>"
        )
    parts.append("</section>")
    return "".join(parts)
