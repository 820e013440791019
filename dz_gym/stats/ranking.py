"""Ranking K >= 2 arms run on the same seeds: success with Wilson intervals, rank with simultaneous intervals.

Method (a run of fixed size): simultaneous paired comparisons. For every pair of arms ``(i, j)`` the exact
McNemar test on their discordant seeds gives a two-sided p-value; Holm's step-down adjustment over all
``K (K - 1) / 2`` pairs. Arm ``i`` is *surely better* than ``j`` when their adjusted p-value is at most
``alpha`` and ``i`` won more of their discordant seeds. The rank interval of ``i`` is ``[1 + #surely better
than i, K - #surely worse than i]``.

What is proven, and what is not: Holm's adjustment needs only the union bound, so under any dependence between
the tests (they share seeds) the chance of putting *any two arms of equal success* in an order is at most
``alpha``. A claim between arms whose success differs can still be *reversed* (a directional, type III
error); that Holm's step-down with directional decisions keeps all errors together at ``alpha`` is proven for
independent tests (Shaffer, 1980), not for the shared-seed dependence here, and the guarantee is for a run
whose size did not depend on its outcomes. ``benchmarks/bench_rank.py`` measures the reversed orders.

After an adaptive stop (``--select-best``, ``--sequential``) the fixed-n tests lose their guarantee (the run
stopped when the data looked decisive), so :func:`rank_arms` takes the claims from a rule valid at any stop
(``claims``): :func:`anytime_claims` replays the race's e-processes in plan order, and an A/B run uses the
sequential test's decision; the rates and Wilson intervals are then marked descriptive (``descriptive``).

Why not paired Bradley-Terry: it fits one strength per arm to the pairwise wins, which assumes the wins are
transitive and consistent across seeds, and its intervals are asymptotic; the comparisons here are exact for
any number of seeds, need no model, and say directly which orders the data support.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from dz_gym.stats.exact import holm_adjust, mcnemar_exact_p
from dz_gym.stats.proportions import wilson_interval
from dz_gym.stats.select import ALTERNATIVES

__all__ = ["anytime_claims", "format_ranking", "outcomes_by_seed", "rank_arms"]

FIXED_N_METHOD = "simultaneous paired comparisons: exact McNemar per pair of arms, Holm over all pairs"
ANYTIME_METHOD = ("anytime-valid paired comparisons: one-sided mixture e-process per ordered pair of arms over "
                  "the seeds in plan order, an order claimed once it reaches K(K-1)/alpha")  # fmt: skip
DESCRIPTIVE_WHY = ("the run stopped adaptively: success rates, Wilson intervals and the fixed-n p-values are "
                   "descriptive only; the claims (surely better than, rank intervals) are valid at the stop")  # fmt: skip


def anytime_claims(rounds: Iterable[Mapping[str, bool | None]], alpha: float = 0.05,
                   alternatives: Sequence[float] = ALTERNATIVES) -> set[tuple[str, str]]:  # fmt: skip
    """``(better, worse)`` orders valid at any stop, from per-seed outcomes given in plan order.

    ``rounds``: per seed, ``{arm: outcome}`` of the arms that ran it (``None`` or absent: no outcome). For an
    ordered pair ``(i, j)`` the e-process ``mean_q (2q)^W (2(1-q))^L`` (``W``: seeds only ``i`` solved) is a
    nonnegative supermartingale when ``i`` is not better than ``j``; the order is claimed once it reaches
    ``K (K - 1) / alpha``. By Ville's inequality and a union bound over the ``K (K - 1)`` ordered pairs, every
    claim is right with probability at least ``1 - alpha``, whenever and however the run stopped (the seeds an
    arm skips after its elimination are decided by earlier outcomes)."""
    rounds = [dict(r) for r in rounds]
    names = list(dict.fromkeys(a for r in rounds for a in r))
    k = len(names)
    if k < 2:
        return set()
    qs = np.asarray([float(q) for q in alternatives])
    up, down = np.log(2 * qs), np.log(2 * (1 - qs))
    threshold = math.log(k * (k - 1) / float(alpha))
    index = {a: i for i, a in enumerate(names)}
    wins = np.zeros((k, k), dtype=np.int64)
    claims: set[tuple[str, str]] = set()
    for outcome in rounds:
        solved = [index[a] for a, v in outcome.items() if v is True]
        failed = [index[a] for a, v in outcome.items() if v is False]
        for i in solved:
            for j in failed:
                wins[i, j] += 1
        x = wins[..., None] * up + wins.T[..., None] * down
        top = x.max(axis=-1)
        log_e = top + np.log(np.exp(x - top[..., None]).sum(axis=-1)) - math.log(qs.size)
        for i, j in zip(*np.nonzero(log_e >= threshold)):
            if i != j:
                claims.add((names[i], names[j]))
    return claims


def rank_arms(outcomes: Mapping[str, Sequence[bool | None]], alpha: float = 0.05, *,
              claims: Iterable[tuple[str, str]] | None = None, claims_method: str = ANYTIME_METHOD) -> dict[str, Any]:  # fmt: skip
    """``{"method", "alpha", "arms": [...]}`` from per-arm outcomes aligned by seed (``None``: errored/absent).

    Each arm's entry: ``arm``, ``n``, ``successes``, ``rate``, ``wilson95``, ``rank`` (by rate, 1 = best),
    ``rank_interval`` ``[best, worst]``, ``surely_better_than`` (arms). Comparisons use the seeds where both
    arms have an outcome. ``pairs``: per pair of arms its discordant counts and adjusted p-value.

    ``claims``: after an adaptive stop, the ``(better, worse)`` orders of a rule valid at the stop
    (:func:`anytime_claims`, or a sequential test's decision), used instead of the Holm verdicts, named by
    ``claims_method``; the result then has ``descriptive`` (the fields that are descriptive only, and why).
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
        if claims is None and p_holm is not None and p_holm <= alpha and i_only != j_only:
            winner, loser = (i, j) if i_only > j_only else (j, i)
            better[winner].add(loser)
    for winner, loser in claims or ():
        if winner not in better or loser not in better:
            raise ValueError(f"claims: expected orders between the arms {names}, got {(winner, loser)!r}")
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
    out = {"method": FIXED_N_METHOD if claims is None else claims_method, "alpha": float(alpha), "arms": entries,
           "pairs": pairs}  # fmt: skip
    if claims is not None:
        out["descriptive"] = {"fields": ["rate", "wilson95", "pairs.p_value", "pairs.p_holm"], "why": DESCRIPTIVE_WHY}
    return out


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
    if result.get("descriptive"):
        out.append(f"DESCRIPTIVE ONLY: success and 95% Wilson ({result['descriptive'].get('why')})")
    return "\n".join(out)
