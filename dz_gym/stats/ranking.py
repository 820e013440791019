"""Ranking K >= 2 arms run on the same seeds: success with Wilson intervals, rank with simultaneous intervals.

Method (a run of fixed size): simultaneous paired comparisons. For every pair of arms ``(i, j)`` the exact
McNemar test on their seeds gives a two-sided p-value; Holm's step-down adjustment over all ``K (K - 1) / 2``
pairs. Arm ``i`` is *surely better* than ``j`` when their adjusted p-value is at most ``alpha`` and the claim it
backs is ``i``. The rank interval of ``i`` is ``[1 + #surely better than i, K - #surely worse than i]``.

Errored episodes (an arm ran the seed and has no outcome: ``None``) are bounded, not dropped: "``i`` better
than ``j``" is tested one-sided with ``i``'s errored episodes as failures and ``j``'s as successes, its mirror
the other way, and the p-value is twice the smaller (:func:`dz_gym.stats.exact.bounded_mcnemar_p`): each is at
least what the complete outcomes would give, whatever the errors depend on. An arm's Wilson interval is widened
the same way (errored episodes as failures for its lower end, as successes for its upper end), and ``rate`` is
over its episodes with an outcome (descriptive when some errored). A seed an arm did not run (:data:`NOT_RUN`:
no row, e.g. after its elimination or an interrupted run) is no episode and no pair.

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

from dz_gym.stats.exact import bounded_mcnemar_p, holm_adjust, mcnemar_exact_p
from dz_gym.stats.proportions import bounded_wilson_interval, imputed_tables
from dz_gym.stats.select import ALTERNATIVES

__all__ = ["NOT_RUN", "anytime_claims", "format_ranking", "outcomes_by_seed", "rank_arms"]


class _NotRun:
    """The outcome of a seed an arm did not run (no row): no episode, no pair (not an error to bound)."""

    def __repr__(self) -> str:
        return "NOT_RUN"


NOT_RUN = _NotRun()

FIXED_N_METHOD = "simultaneous paired comparisons: exact McNemar per pair of arms, Holm over all pairs"
ANYTIME_METHOD = ("anytime-valid paired comparisons: one-sided mixture e-process per ordered pair of arms over "
                  "the seeds in plan order, an order claimed once it reaches K(K-1)/alpha")  # fmt: skip
DESCRIPTIVE_WHY = ("the run stopped adaptively: success rates, Wilson intervals and the fixed-n p-values are "
                   "descriptive only; the claims (surely better than, rank intervals) are valid at the stop")  # fmt: skip
ERRORS_NOTE = ("errored episodes are bounded, not dropped: each order is claimed only if it holds with the claimed "
               "arm's errored episodes as failures and the other's as successes; wilson95 spans every outcome they "
               "could have had; rate is over the episodes with an outcome")  # fmt: skip


def anytime_claims(rounds: Iterable[Mapping[str, bool | None]], alpha: float = 0.05,
                   alternatives: Sequence[float] = ALTERNATIVES) -> set[tuple[str, str]]:  # fmt: skip
    """``(better, worse)`` orders valid at any stop, from per-seed outcomes given in plan order.

    ``rounds``: per seed, ``{arm: outcome}`` of the arms that ran it (absent: the arm did not run that seed;
    ``None``: its episode errored). For an ordered pair ``(i, j)`` the e-process ``mean_q (2q)^W (2(1-q))^L``
    (``W``: seeds only ``i`` solved) is a nonnegative supermartingale when ``i`` is not better than ``j``; the
    order is claimed once it reaches ``K (K - 1) / alpha``. By Ville's inequality and a union bound over the
    ``K (K - 1)`` ordered pairs, every claim is right with probability at least ``1 - alpha``, whenever and
    however the run stopped (the seeds an arm skips after its elimination are decided by earlier outcomes).

    A seed where ``i`` or ``j`` errored counts against the claim "``i`` better than ``j``": ``i``'s errored
    episode as a failure, ``j``'s as a success (as the race itself does, :mod:`dz_gym.stats.select`); seed by
    seed that e-process is at most the one on the complete outcomes, so the guarantee holds whatever the errors
    depend on."""
    rounds = [dict(r) for r in rounds]
    names = list(dict.fromkeys(a for r in rounds for a in r))
    k = len(names)
    if k < 2:
        return set()
    qs = np.asarray([float(q) for q in alternatives])
    up, down = np.log(2 * qs), np.log(2 * (1 - qs))
    threshold = math.log(k * (k - 1) / float(alpha))
    index = {a: i for i, a in enumerate(names)}
    wins = np.zeros((k, k), dtype=np.int64)  # wins[i, j]: seeds i solved and j failed, both with an outcome
    losses = np.zeros((k, k), dtype=np.int64)  # losses[i, j]: i failed or errored while j solved or errored
    claims: set[tuple[str, str]] = set()
    for outcome in rounds:
        ran = {index[a]: None if v is None else bool(v) for a, v in outcome.items() if v is not NOT_RUN}
        for i, vi in ran.items():
            for j, vj in ran.items():
                if i == j:
                    continue
                if vi is True and vj is False:
                    wins[i, j] += 1
                elif vi is not True and vj is not False:
                    losses[i, j] += 1
        x = wins[..., None] * up + losses[..., None] * down
        top = x.max(axis=-1)
        log_e = top + np.log(np.exp(x - top[..., None]).sum(axis=-1)) - math.log(qs.size)
        for i, j in zip(*np.nonzero(log_e >= threshold)):
            if i != j:
                claims.add((names[i], names[j]))
    return claims


def rank_arms(outcomes: Mapping[str, Sequence[Any]], alpha: float = 0.05, *,
              claims: Iterable[tuple[str, str]] | None = None, claims_method: str = ANYTIME_METHOD) -> dict[str, Any]:  # fmt: skip
    """``{"method", "alpha", "arms": [...]}`` from per-arm outcomes aligned by seed (``None``: the episode
    errored, bounded against every claim; :data:`NOT_RUN`: the arm did not run that seed).

    Each arm's entry: ``arm``, ``n`` (episodes with an outcome), ``errored``, ``successes``, ``rate`` (over
    ``n``; descriptive when some errored), ``wilson95`` (bounded over the errored episodes), ``rank`` (by rate,
    1 = best; descriptive), ``rank_interval`` ``[best, worst]``, ``surely_better_than`` (arms). Comparisons use
    the seeds both arms ran, errored ones bounded. ``pairs``: per pair of arms its discordant counts without
    errors (``only``), its ``errored`` seeds, the bounded and the Holm-adjusted p-value, and the p-value with
    the errored seeds dropped (``p_without_errored``, information only). ``errors``: a note, when any errored.

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
            both = [(a, b) for a, b in zip(outcomes[i], outcomes[j]) if a is not NOT_RUN and b is not NOT_RUN]
            clean = [(bool(a), bool(b)) for a, b in both if a is not None and b is not None]
            i_only = sum(a and not b for a, b in clean)
            j_only = sum(b and not a for a, b in clean)
            # "j better" is judged with j's errored episodes as failures and i's as successes, and the mirror
            worst_j, worst_i = imputed_tables((None if a is None else bool(a), None if b is None else bool(b))
                                              for a, b in both)  # fmt: skip
            p, side = bounded_mcnemar_p((worst_j.a_only, worst_j.b_only), (worst_i.a_only, worst_i.b_only))
            winner = {"a": i, "b": j}.get(side)  # type: ignore[arg-type]
            tests.append((i, j, i_only, j_only, len(both) - len(clean), p, winner))
    adjusted = holm_adjust([t[5] for t in tests])
    better: dict[str, set[str]] = {n: set() for n in names}
    pairs = []
    for (i, j, i_only, j_only, errored, p, winner), p_holm in zip(tests, adjusted):
        pairs.append({"arms": [i, j], "only": [i_only, j_only], "errored": errored, "p_value": p, "p_holm": p_holm,
                      "p_without_errored": mcnemar_exact_p(i_only, j_only)})  # fmt: skip
        if claims is None and p_holm is not None and p_holm <= alpha and winner is not None:
            better[winner].add(j if winner == i else i)
    for winner, loser in claims or ():
        if winner not in better or loser not in better:
            raise ValueError(f"claims: expected orders between the arms {names}, got {(winner, loser)!r}")
        better[winner].add(loser)
    entries = []
    for name in names:
        ran = [v for v in outcomes[name] if v is not NOT_RUN]
        seen = [bool(v) for v in ran if v is not None]
        k, n, errored = sum(seen), len(seen), len(ran) - len(seen)
        interval = bounded_wilson_interval(k, n, errored)
        above = sum(name in better[other] for other in names)
        entries.append({"arm": name, "n": n, "errored": errored, "successes": k, "rate": k / n if n else None,
                        "wilson95": list(interval) if interval else None,
                        "rank_interval": [1 + above, len(names) - len(better[name])],
                        "surely_better_than": sorted(better[name])})  # fmt: skip
    entries.sort(key=lambda e: (-(e["rate"] if e["rate"] is not None else -1.0), names.index(e["arm"])))
    for rank, entry in enumerate(entries, start=1):
        entry["rank"] = rank
    out = {"method": FIXED_N_METHOD if claims is None else claims_method, "alpha": float(alpha), "arms": entries,
           "pairs": pairs}  # fmt: skip
    if any(e["errored"] for e in entries):
        out["errors"] = ERRORS_NOTE
    if claims is not None:
        out["descriptive"] = {"fields": ["rate", "wilson95", "pairs.p_value", "pairs.p_holm"], "why": DESCRIPTIVE_WHY}
    return out


def outcomes_by_seed(runs: Mapping[str, Sequence[Mapping[str, Any]]],
                     metric: str = "success_at_end") -> dict[str, list[Any]]:  # fmt: skip
    """Per arm, its outcome on every (scene, seed) that any arm ran, in (scene, seed) order (``None``: its
    episode errored, or its row lacks ``metric``; :data:`NOT_RUN`: the arm has no row there). ``runs``: arm
    name -> episode rows."""
    tables = {}
    for arm, rows in runs.items():
        table: dict[tuple[int, int], Any] = {}
        for row in rows:
            key = (int(row["scene"]), int(row["seed"]))
            if key in table:
                raise ValueError(f"arm {arm}: scene {key[0]} seed {key[1]} appears twice (expected one row per seed)")
            table[key] = None if row.get("error") is not None or row.get(metric) is None else bool(row[metric])
        tables[arm] = table
    keys = sorted(set().union(*tables.values()))
    return {arm: [table.get(k, NOT_RUN) for k in keys] for arm, table in tables.items()}


def format_ranking(result: Mapping[str, Any]) -> str:
    """The leaderboard: one line per arm, best first, with its Wilson interval and rank interval."""
    header = ("rank", "arm", "success", "95% Wilson", "rank interval", "surely better than")
    lines = []
    for e in result["arms"]:
        rate = "-" if e["rate"] is None else f"{e['successes']}/{e['n']} {100 * e['rate']:.0f}%"
        if e.get("errored"):
            rate += f" (+{e['errored']} errored)"
        ci = "-" if e["wilson95"] is None else f"[{100 * e['wilson95'][0]:.0f}, {100 * e['wilson95'][1]:.0f}]%"
        low, high = e["rank_interval"]
        lines.append((str(e["rank"]), str(e["arm"]), rate, ci, str(low) if low == high else f"{low}-{high}",
                      ", ".join(e["surely_better_than"]) or "-"))  # fmt: skip
    widths = [max(len(header[i]), *(len(line[i]) for line in lines)) for i in range(len(header))]
    out = [f"ranking of {len(lines)} arms on the same seeds (alpha {result['alpha']:g}; {result['method']})"]
    out.append("  ".join(h.ljust(w) for h, w in zip(header, widths)).rstrip())
    out.append("  ".join("-" * w for w in widths).rstrip())
    out.extend("  ".join(c.ljust(w) for c, w in zip(line, widths)).rstrip() for line in lines)
    if result.get("errors"):
        out.append(f"errors: {result['errors']}")
    if result.get("descriptive"):
        out.append(f"DESCRIPTIVE ONLY: success and 95% Wilson ({result['descriptive'].get('why')})")
    return "\n".join(out)
