"""Exact operating characteristics of the sequential A/B rule vs a fixed-n exact McNemar test (no Monte-Carlo).

A cell is a true difference ``delta`` (B - A), a base rate (the mean of the arms' success rates) and the
correlation of the two arms' outcomes on the same seed (phi coefficient). From it: the discordance ``pi``
(a pair has one success and one failure) and ``q`` (a discordant pair is B-only). Every number is computed by
dynamic programming (``dz_gym.stats.walk``, or over the pairs themselves) or exact binomial sums:

- sequential: the shipped rule, ``SequentialDesign.plan(min_difference)``, whose cap is chosen from what a
  user knows: the smallest difference they care about, the power and alpha (planned for the worst case
  without negative correlation, ``pi = (1 + delta^2) / 2``); the user's difference is the cell's ``delta``;
- fixed n: the exact two-sided McNemar test at alpha at the **stated** power: planned from the same knowledge
  (the difference; the n a user would run), and the smallest n that reaches the stated power in that cell
  knowing its ``pi`` (the most favourable baseline);
- previous: the rule this one replaces (mixture e-process over q in {0.65, 0.75, 0.85}, reject at 1/alpha,
  no futility), capped at the smallest n with the target power at the planned point.

Printed: pairs used (expected), ratio to the fixed n, power, type-I error (the rule's, exact, at every
truncation: its maximum over budgets and concordance rates), pairs used when there is no difference, and the
bias of the naive estimate at the stop. Then the multi-scene rows: the pairs of 1-4 scenes with different base
rates reach the test round-robin by scene (``dz_gym.eval.plan.pair_order(..., interleave=True)``); the rule's
law is computed exactly in pair time (each pair's discordance and B-only share are its scene's), with the
pairs run when the scenes are executed interleaved (as the test takes them) and one after another.

    python benchmarks/bench_ab.py [--alpha 0.05] [--quick]
"""

from __future__ import annotations

import argparse
import math
import time

import numpy as np

from dz_gym.eval.plan import pair_order
from dz_gym.stats import SequentialDesign, log_e_values, mcnemar_exact_p
from dz_gym.stats.design import planning_discordance
from dz_gym.stats.walk import Boundaries, pair_characteristics, walk

POWERS = (0.8, 0.9)
DELTAS = (0.1, 0.2, 0.3)
BASES = (0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8)
CORRELATIONS = (0.0, 0.3, 0.6)
PREVIOUS_ALTERNATIVES = (0.65, 0.75, 0.85)
MAX_N = 2000
LOGF = np.concatenate([[0.0], np.cumsum(np.log(np.arange(1, MAX_N + 1, dtype=np.float64)))])


def binom(n: int, p: float) -> np.ndarray:
    k = np.arange(n + 1)
    if p <= 0.0 or p >= 1.0:
        out = np.zeros(n + 1)
        out[0 if p <= 0.0 else n] = 1.0
        return out
    return np.exp(LOGF[n] - LOGF[k] - LOGF[n - k] + k * math.log(p) + (n - k) * math.log1p(-p))


def cell(delta: float, base: float, rho: float) -> tuple[float, float] | None:
    """``(pi, q)`` of a cell, or None when no joint law has these margins and correlation."""
    p_a, p_b = base - delta / 2, base + delta / 2
    if not (0.0 < p_a < 1.0 and 0.0 < p_b < 1.0):
        return None
    both = p_a * p_b + rho * math.sqrt(p_a * (1 - p_a) * p_b * (1 - p_b))
    if both > min(p_a, p_b) + 1e-12 or both < max(0.0, p_a + p_b - 1) - 1e-12:
        return None
    pi = p_a + p_b - 2 * both
    return pi, (p_b - both) / pi


class FixedMcNemar:
    """Exact power of the fixed-n two-sided exact McNemar test; ``crit[d]``: the smallest |B only - A only|
    that the test rejects with ``d`` discordant pairs (checked against ``dz_gym.stats.mcnemar_exact_p``)."""

    def __init__(self, alpha: float, max_d: int = MAX_N):
        self.crit = np.empty(max_d + 1, dtype=np.int64)
        for d in range(max_d + 1):
            cdf = np.cumsum(binom(d, 0.5))
            low = np.nonzero(2 * cdf <= alpha * (1 + 1e-9))[0]
            k = int(low[-1]) if low.size else -1
            while k >= 0 and mcnemar_exact_p(d - k, k) > alpha:
                k -= 1
            while k + 1 < d / 2 and mcnemar_exact_p(d - k - 1, k + 1) <= alpha:
                k += 1
            self.crit[d] = d - 2 * k if k >= 0 else d + 2
        self._given_d: dict[float, np.ndarray] = {}

    def _reject_given_d(self, q: float) -> np.ndarray:
        if q not in self._given_d:
            out = np.zeros(len(self.crit))
            for d in range(1, len(self.crit)):
                s = 2 * np.arange(d + 1) - d
                out[d] = binom(d, q)[np.abs(s) >= self.crit[d]].sum()
            self._given_d[q] = out
        return self._given_d[q]

    def power(self, n: int, pi: float, q: float) -> float:
        return float(binom(n, pi) @ self._reject_given_d(q)[: n + 1])

    def n_for(self, power: float, pi: float, q: float) -> int:
        n = 2
        while self.power(n, pi, q) < power:
            n *= 2
            if n > MAX_N:
                raise ValueError(f"fixed n beyond {MAX_N} pairs (pi {pi:.3f}, q {q:.3f})")
        lo = n // 2
        return next(m for m in range(lo, n + 1) if self.power(m, pi, q) >= power)


def previous_rule(alpha: float, cap: int) -> Boundaries:
    """The replaced rule as boundaries on |S|: reject once the mixture e-value reaches 1/alpha."""
    reject = np.empty(cap + 1, dtype=np.int64)
    for d in range(cap + 1):
        k = np.arange((d + 1) // 2, d + 1)  # B-only counts with S >= 0
        ok = np.nonzero(log_e_values(k, d, PREVIOUS_ALTERNATIVES) >= math.log(1 / alpha))[0]
        reject[d] = 2 * int(k[ok[0]]) - d if ok.size else d + 1
    none = np.full(cap + 1, -1)
    return Boundaries(reject, none, reject.copy())


def previous_cap(alpha: float, power: float, pi: float, q: float) -> tuple[Boundaries, int]:
    cap = 64
    while True:
        bounds = previous_rule(alpha, cap)
        if pair_characteristics(bounds, cap, pi, q).b_better >= power:
            break
        cap *= 2
    lo, hi = 1, cap
    while lo < hi:
        mid = (lo + hi) // 2
        if pair_characteristics(bounds, mid, pi, q).b_better >= power:
            hi = mid
        else:
            lo = mid + 1
    return bounds, hi


def max_type_one(design: SequentialDesign) -> float:
    """The largest type-I error over every truncation of the walk (all budgets and concordance rates)."""
    w = walk(design.bounds, 0.5)
    return float((np.cumsum(w.up + w.down) + w.final_up + w.final_down)[: design.max_pairs + 1].max())


def design_table(alpha: float, fixed: FixedMcNemar, deltas) -> dict:
    print("\nAt the planned point (base rate 0.5, independent outcomes: the most pairs a difference can need)")
    print(
        "| diff | power | fixed-n McNemar | previous rule | sequential cap | sequential mean pairs | fewer than fixed "
        "| no difference: pairs (vs fixed) | type I (max) | bias at stop |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    designs = {}
    for delta in deltas:
        pi = planning_discordance(delta)
        for power in POWERS:
            design = SequentialDesign.plan(delta, alpha=alpha, power=power)
            designs[(delta, power)] = design
            alt = design.characteristics(pi, design.q1)
            n_fixed = fixed.n_for(alt.b_better, pi, design.q1)
            bounds, cap = previous_cap(alpha, power, pi, design.q1)
            prev = pair_characteristics(bounds, cap, pi, design.q1).mean_pairs
            null = design.characteristics(pi, 0.5)
            print(f"| {delta:.1f} | {power:.0%} | {n_fixed} | {prev:.1f} (cap {cap}) | {design.max_pairs} "
                  f"| {alt.mean_pairs:.1f} | {1 - alt.mean_pairs / n_fixed:.0%} | {null.mean_pairs:.1f} "
                  f"({null.mean_pairs / n_fixed:.2f}) | {max_type_one(design):.4f} "
                  f"| {alt.mean_estimate - delta:+.3f} |")  # fmt: skip
    return designs


def grid_table(alpha: float, fixed: FixedMcNemar, designs: dict, deltas) -> None:
    print("\nOver base rate x correlation (the design planned from the difference alone, as above); fixed n at the "
          "stated power")  # fmt: skip
    print(
        "| diff | power | base | corr | pi | power reached | sequential mean pairs | fixed n planned (fewer) "
        "| fixed n knowing pi (fewer) | no difference: pairs (vs planned fixed n; vs fixed n knowing pi) | type I |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for delta in deltas:
        for power in POWERS:
            design = designs[(delta, power)]
            n_plan = fixed.n_for(power, planning_discordance(delta), design.q1)
            for base in BASES:
                for rho in CORRELATIONS:
                    here, null_cell = cell(delta, base, rho), cell(0.0, base, rho)
                    if null_cell is None:
                        continue
                    if here is None:  # no joint law with this difference: the no-difference columns only
                        row = f"| {delta:.1f} | {power:.0%} | {base:.1f} | {rho:.1f} | - | - | - | - | - "
                    else:
                        pi, q = here
                        alt = design.characteristics(pi, q)
                        n_cell = fixed.n_for(power, pi, q)  # the stated power in this cell, knowing pi
                        row = (f"| {delta:.1f} | {power:.0%} | {base:.1f} | {rho:.1f} | {pi:.3f} | {alt.b_better:.3f} "
                               f"| {alt.mean_pairs:.1f} | {n_plan} ({1 - alt.mean_pairs / n_plan:.0%}) "
                               f"| {n_cell} ({1 - alt.mean_pairs / n_cell:.0%}) ")  # fmt: skip
                    null = design.characteristics(null_cell[0], 0.5)
                    pi0 = max(null_cell[0], delta)
                    n_knows = fixed.n_for(power, pi0, 0.5 + delta / (2 * pi0))
                    print(f"{row}| {null.mean_pairs:.1f} ({null.mean_pairs / n_plan:.2f}; "
                          f"{null.mean_pairs / n_knows:.2f}) | {null.a_better + null.b_better:.4f} |")  # fmt: skip


def pair_time_law(bounds: Boundaries, cap: int, pis, qs) -> tuple[float, np.ndarray, float]:
    """The rule run pair by pair, pair ``n`` discordant with probability ``pis[n]`` and then B-only with
    probability ``qs[n]``: ``(P(decide B better), P(the test used exactly n pairs) for n = 0..cap, P(decide A))``
    (the final look at the cap)."""
    d = np.minimum(np.arange(cap + 1), bounds.cap)[:, None]
    signed = np.arange(-cap, cap + 1)[None, :]
    up, down = signed >= bounds.reject[d], signed <= -bounds.reject[d]
    stop = up | down | (np.abs(signed) <= bounds.futile[d])
    mass = np.zeros((cap + 1, 2 * cap + 1))  # mass[d, S + cap]: runs still going
    mass[0, cap] = 1.0
    b_better = a_better = 0.0
    used = np.zeros(cap + 1)
    for n in range(1, cap + 1):
        pi, q = pis[n - 1], qs[n - 1]
        new = (1 - pi) * mass
        new[1:, 1:] += pi * q * mass[:-1, :-1]
        new[1:, :-1] += pi * (1 - q) * mass[:-1, 1:]
        b_better, a_better = b_better + new[up].sum(), a_better + new[down].sum()
        used[n] = new[stop].sum()
        mass = np.where(stop, 0.0, new)
    final = np.abs(signed) >= bounds.final[d]
    b_better += mass[final & (signed > 0)].sum()
    a_better += mass[final & (signed < 0)].sum()
    used[cap] += mass.sum()
    return float(b_better), used, float(a_better)


def fixed_n_mixture(fixed: FixedMcNemar, power: float, pis, qs) -> int:
    """The smallest n at which the pooled exact McNemar test over the first n pairs (pair k discordant with
    probability ``pis[k]``, B-only with ``qs[k]``) has ``power``, exactly."""
    size = len(pis)
    mass = np.zeros((size + 1, 2 * size + 1))
    mass[0, size] = 1.0
    signed = np.abs(np.arange(-size, size + 1))[None, :]
    reject = signed >= fixed.crit[: size + 1][:, None]
    for n in range(1, size + 1):
        new = (1 - pis[n - 1]) * mass
        new[1:, 1:] += pis[n - 1] * qs[n - 1] * mass[:-1, :-1]
        new[1:, :-1] += pis[n - 1] * (1 - qs[n - 1]) * mass[:-1, 1:]
        mass = new
        if mass[reject].sum() >= power:
            return n
    raise ValueError(f"fixed n beyond {size} pairs")


SCENE_BASES = {1: (0.5,), 2: (0.35, 0.65), 3: (0.3, 0.5, 0.7), 4: (0.2, 0.4, 0.6, 0.8)}


def scenes_table(alpha: float, fixed: FixedMcNemar, delta: float = 0.2, power: float = 0.8) -> None:
    design = SequentialDesign.plan(delta, alpha=alpha, power=power)
    cap = design.max_pairs
    n_plan = fixed.n_for(power, planning_discordance(delta), design.q1)
    print(f"\nSeveral scenes (difference {delta:g} in every scene, independent outcomes, the design for {delta:g} "
          f"at {power:.0%}: cap {cap}); pairs reach the test round-robin by scene (plan order)")  # fmt: skip
    print(
        "| scenes | base rates | power reached | sequential mean pairs (interleaved execution) | fewer than fixed n "
        "planned | fixed n knowing the rates (fewer) | pairs run, scenes one after another (vs fixed n planned) |"
    )
    print("|---|---|---|---|---|---|---|")
    for count, bases in SCENE_BASES.items():
        scenes = list(range(1, count + 1))
        episodes = -(-cap // count)  # the evaluator's default: the cap spread over the scenes
        order = pair_order(scenes, episodes, interleave=True)[:cap]  # the test's order
        law = {s: cell(delta, b, 0.0) for s, b in zip(scenes, bases)}
        pis, qs = [law[s][0] for s, _ in order], [law[s][1] for s, _ in order]
        b_better, used, _ = pair_time_law(design.bounds, cap, pis, qs)
        mean = float(used @ np.arange(cap + 1))
        longer = pair_order(scenes, 4 * episodes, interleave=True)  # a fixed n may need more than the cap
        n_rates = fixed_n_mixture(fixed, power, [law[s][0] for s, _ in longer], [law[s][1] for s, _ in longer])
        # scenes one after another: the test's n-th pair is available once every pair before it ran
        position = {key: i for i, key in enumerate(pair_order(scenes, episodes))}
        ran = np.maximum.accumulate([position[key] + 1 for key in order])
        run_serial = float(used[1:] @ ran)
        print(f"| {count} | {', '.join(f'{b:g}' for b in bases)} | {b_better:.3f} | {mean:.1f} "
              f"| {1 - mean / n_plan:.0%} (of {n_plan}) | {n_rates} ({1 - mean / n_rates:.0%}) "
              f"| {run_serial:.1f} ({run_serial / n_plan:.2f}) |")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--alpha", type=float, default=0.05)
    parser.add_argument("--quick", action="store_true", help="differences 0.2 and 0.3 only")
    args = parser.parse_args()
    started = time.perf_counter()
    deltas = DELTAS[1:] if args.quick else DELTAS
    fixed = FixedMcNemar(args.alpha)
    print(f"alpha {args.alpha}; all numbers exact (dynamic programming over the discordant walk)")
    designs = design_table(args.alpha, fixed, deltas)
    grid_table(args.alpha, fixed, designs, [d for d in deltas if d >= 0.2])
    scenes_table(args.alpha, fixed)
    print(f"\n({time.perf_counter() - started:.0f} s)")


if __name__ == "__main__":
    main()
