"""Ranking K >= 2 arms run on the same seeds: success with Wilson intervals, rank with simultaneous intervals.

Method: simultaneous paired comparisons. For every pair of arms ``(i, j)`` the exact McNemar test on their
discordant seeds gives a two-sided p-value; Holm's step-down adjustment over all ``K (K - 1) / 2`` pairs
controls the family-wise error at ``alpha`` under any dependence between the tests (they share seeds). Arm
``i`` is *surely better* than ``j`` when their adjusted p-value is at most ``alpha`` and ``i`` won more of
their discordant seeds. The rank interval of ``i`` is ``[1 + #surely better than i, K - #surely worse than
i]``; with probability at least ``1 - alpha`` every claimed order is right, so all intervals hold at once.

Why not paired Bradley-Terry: it fits one strength per arm to the pairwise wins, which assumes the wins are
transitive and consistent across seeds, and its intervals are asymptotic; the comparisons here are exact for
any number of seeds, need no model, and say directly which orders the data support.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from dz_gym.stats.exact import holm_adjust, mcnemar_exact_p
from dz_gym.stats.proportions import wilson_interval

__all__ = ["format_ranking", "outcomes_by_seed", "rank_arms"]


def rank_arms(outcomes: Mapping[str, Sequence[bool | None]], alpha: float = 0.05) -> dict[str, Any]:
    """``{"method", "alpha", "arms": [...]}`` from per-arm outcomes aligned by seed (``None``: errored/absent).

    Each arm's entry: ``arm``, ``n``, ``successes``, ``rate``, ``wilson95``, ``rank`` (by rate, 1 = best),
    ``rank_interval`` ``[best, worst]``, ``surely_better_than`` (arms). Comparisons use the seeds where both
    arms have an outcome. ``pairs``: per pair of arms its discordant counts and adjusted p-value.
    """
    if not 0.0 < float(alpha) < 1.0:
        raise ValueError(f"alpha: expected a number in (0, 1), got {alpha!r}")
    names = list(outcomes)
    if len(names) < 2:
        raise ValueError(f"arms: expected at least 2, got {len(names)}")
    length = {len(v) for v in outcomes.values()}
    if len(length) != 1:
        raise ValueError("arms: expected outcome lists of the same length (one entry per seed)")
    tests = []
    for x, i in enumerate(names):
        for j in names[x + 1 :]:
            i_only = j_only = 0
            for a, b in zip(outcomes[i], outcomes[j]):
                if a is None or b is None:
                    continue
                i_only += bool(a) and not bool(b)
                j_only += bool(b) and not bool(a)
            tests.append((i, j, i_only, j_only, mcnemar_exact_p(i_only, j_only)))
    adjusted = holm_adjust([t[4] for t in tests])
    better: dict[str, set[str]] = {n: set() for n in names}
    pairs = []
    for (i, j, i_only, j_only, p), p_holm in zip(tests, adjusted):
        pairs.append({"arms": [i, j], "only": [i_only, j_only], "p_value": p, "p_holm": p_holm})
        if p_holm is not None and p_holm <= alpha and i_only != j_only:
            winner, loser = (i, j) if i_only > j_only else (j, i)
            better[winner].add(loser)
    entries = []
    for name in names:
        seen = [bool(v) for v in outcomes[name] if v is not None]
        k, n = sum(seen), len(seen)
        interval = wilson_interval(k, n) if n else None
        above = sum(name in better[other] for other in names)
        entries.append({"arm": name, "n": n, "successes": k, "rate": k / n if n else None,
                        "wilson95": list(interval) if interval else None,
                        "rank_interval": [1 + above, len(names) - len(better[name])],
                        "surely_better_than": sorted(better[name])})  # fmt: skip
    entries.sort(key=lambda e: (-(e["rate"] if e["rate"] is not None else -1.0), names.index(e["arm"])))
    for rank, entry in enumerate(entries, start=1):
        entry["rank"] = rank
    return {
        "method": "simultaneous paired comparisons: exact McNemar per pair of arms, Holm over all pairs",
        "alpha": float(alpha),
        "arms": entries,
        "pairs": pairs,
    }


def outcomes_by_seed(runs: Mapping[str, Sequence[Mapping[str, Any]]],
                     metric: str = "success_at_end") -> dict[str, list[bool | None]]:  # fmt: skip
    """Per arm, its outcome on every (scene, seed) that any arm ran, in (scene, seed) order (``None``: the arm
    has no row there, or its episode errored). ``runs``: arm name -> episode rows."""
    tables = {}
    for arm, rows in runs.items():
        table: dict[tuple[int, int], bool | None] = {}
        for row in rows:
            key = (int(row["scene"]), int(row["seed"]))
            if key in table:
                raise ValueError(f"arm {arm}: scene {key[0]} seed {key[1]} appears twice (expected one row per seed)")
            table[key] = None if row.get("error") is not None or row.get(metric) is None else bool(row[metric])
        tables[arm] = table
    keys = sorted(set().union(*tables.values()))
    return {arm: [table.get(k) for k in keys] for arm, table in tables.items()}


def format_ranking(result: Mapping[str, Any]) -> str:
    """The leaderboard: one line per arm, best first, with its Wilson interval and rank interval."""
    header = ("rank", "arm", "success", "95% Wilson", "rank interval", "surely better than")
    lines = []
    for e in result["arms"]:
        rate = "-" if e["rate"] is None else f"{e['successes']}/{e['n']} {100 * e['rate']:.0f}%"
        ci = "-" if e["wilson95"] is None else f"[{100 * e['wilson95'][0]:.0f}, {100 * e['wilson95'][1]:.0f}]%"
        low, high = e["rank_interval"]
        lines.append((str(e["rank"]), str(e["arm"]), rate, ci, str(low) if low == high else f"{low}-{high}",
                      ", ".join(e["surely_better_than"]) or "-"))  # fmt: skip
    widths = [max(len(header[i]), *(len(line[i]) for line in lines)) for i in range(len(header))]
    out = [f"ranking of {len(lines)} arms on the same seeds (alpha {result['alpha']:g}; {result['method']})"]
    out.append("  ".join(h.ljust(w) for h, w in zip(header, widths)).rstrip())
    out.append("  ".join("-" * w for w in widths).rstrip())
    out.extend("  ".join(c.ljust(w) for c, w in zip(line, widths)).rstrip() for line in lines)
    return "\n".join(out)
