"""Pairs needed by the sequential A/B test vs a fixed-n exact McNemar test of the same power.

Model: every pair is one seed run under both arms; arm A succeeds with probability ``0.5 - delta/2`` and
arm B with ``0.5 + delta/2``, independently given the seed (the most discordant pairs a difference ``delta``
can give, so the hardest case for any paired test). For each true difference:

- fixed n: the smallest number of pairs at which the exact two-sided McNemar test at ``alpha`` (the one
  ``dz-gym-compare`` reports, :func:`dz_gym.stats.mcnemar_exact_p`) has the target power, computed exactly;
- sequential: :class:`dz_gym.stats.SequentialPairTest` (the same e-value, vectorized: ``log_e_values``) run on
  simulated sequences, stopped at the first rejection or at a cap (``max_pairs``); the cap is the smallest that
  gives the same target power, and the pairs needed are ``min(first rejection, cap)`` averaged over sequences.

Both are valid level-``alpha`` tests; the sequential one also at any earlier stopping time. Printed: the fixed
n, the cap, the average pairs of the sequential test and their ratio (< 1: fewer pairs), plus the rejection
rate of the sequential test under no difference (any time up to the cap).

    python benchmarks/bench_ab.py [--sequences 4000] [--alpha 0.05] [--seed 0]
"""

from __future__ import annotations

import argparse
import math
import time

import numpy as np

from dz_gym.stats import DEFAULT_ALTERNATIVES, log_e_values, mcnemar_exact_p

POWERS = (0.8, 0.9)
DELTAS = (0.1, 0.2, 0.3)


def _log_factorials(n: int) -> np.ndarray:
    return np.concatenate([[0.0], np.cumsum(np.log(np.arange(1, n + 1, dtype=np.float64)))])


class FixedMcNemar:
    """Exact power of the two-sided exact McNemar test with ``n`` pairs."""

    def __init__(self, alpha: float, max_n: int):
        self.alpha = alpha
        self.logf = _log_factorials(max_n)
        # low[d]: the largest k with p(k B-only of d) <= alpha on the low side (-1: none); symmetric high side.
        self.low = np.full(max_n + 1, -1, dtype=np.int64)
        for d in range(1, max_n + 1):
            ks = np.arange(d + 1)
            logpmf = self.logf[d] - self.logf[ks] - self.logf[d - ks] - d * math.log(2)
            cdf = np.cumsum(np.exp(logpmf))
            k = int(np.searchsorted(2 * cdf > alpha * (1 + 1e-12), True)) - 1
            k = min(k, (d - 1) // 2)
            # Settle the boundary with the package's exact test.
            while k >= 0 and mcnemar_exact_p(d - k, k) > alpha:
                k -= 1
            while k + 1 <= (d - 1) // 2 and mcnemar_exact_p(d - k - 1, k + 1) <= alpha:
                k += 1
            self.low[d] = k

    def _binom(self, n: int, p: float) -> np.ndarray:
        ks = np.arange(n + 1)
        with np.errstate(divide="ignore"):
            return np.exp(self.logf[n] - self.logf[ks] - self.logf[n - ks] + ks * np.log(p) + (n - ks) * np.log1p(-p))

    def power(self, n: int, p_a: float, p_b: float) -> float:
        discordant = p_a * (1 - p_b) + p_b * (1 - p_a)
        q = p_b * (1 - p_a) / discordant
        total = 0.0
        pd = self._binom(n, discordant)
        for d in range(1, n + 1):
            k = self.low[d]
            if k < 0 or pd[d] < 1e-16:
                continue
            pk = self._binom(d, q)
            total += pd[d] * (pk[: k + 1].sum() + pk[d - k :].sum())
        return total

    def n_for(self, power: float, p_a: float, p_b: float) -> int:
        n = 4
        while self.power(n, p_a, p_b) < power:
            n = int(n * 1.25) + 1
        lo = max(1, int(n / 1.25) - 1)
        return next(m for m in range(lo, n + 1) if self.power(m, p_a, p_b) >= power)


def first_rejections(p_a: float, p_b: float, cap: int, sequences: int, alpha: float, rng) -> np.ndarray:
    """1-based pair index of each sequence's first rejection (``cap + 1``: none up to ``cap``)."""
    out = np.empty(sequences, dtype=np.int64)
    threshold = math.log(1 / alpha)
    block = max(1, 2_000_000 // cap)
    for start in range(0, sequences, block):
        m = min(block, sequences - start)
        a = rng.random((m, cap)) < p_a
        b = rng.random((m, cap)) < p_b
        b_only = np.cumsum(b & ~a, axis=1, dtype=np.int32)
        discordant = b_only + np.cumsum(a & ~b, axis=1, dtype=np.int32)
        crossed = log_e_values(b_only, discordant) >= threshold
        out[start : start + m] = np.where(crossed.any(axis=1), crossed.argmax(axis=1) + 1, cap + 1)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sequences", type=int, default=4000)
    parser.add_argument("--alpha", type=float, default=0.05)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    rng = np.random.default_rng(args.seed)
    started = time.perf_counter()
    print(f"alpha {args.alpha}, {args.sequences} simulated sequences per difference, "
          f"alternatives {list(DEFAULT_ALTERNATIVES)} (and mirrored)")  # fmt: skip
    print(
        "| true diff (A -> B) | power | fixed-n McNemar pairs | sequential cap | sequential mean pairs | ratio | fewer |"
    )
    print("|---|---|---|---|---|---|---|")
    fixed = FixedMcNemar(args.alpha, 1200)
    caps = {}
    for delta in DELTAS:
        p_a, p_b = 0.5 - delta / 2, 0.5 + delta / 2
        n_fixed = {power: fixed.n_for(power, p_a, p_b) for power in POWERS}
        horizon = 3 * max(n_fixed.values())
        first = first_rejections(p_a, p_b, horizon, args.sequences, args.alpha, rng)
        ordered = np.sort(first)
        for power in POWERS:
            cap = int(ordered[math.ceil(power * len(ordered)) - 1])
            if cap > horizon:
                print(f"| {delta:.1f} | {power:.0%} | {n_fixed[power]} | > {horizon} | - | - | - |")
                continue
            caps[(delta, power)] = cap
            mean = float(np.minimum(first, cap).mean())
            ratio = mean / n_fixed[power]
            print(f"| {p_a:.2f} -> {p_b:.2f} | {power:.0%} | {n_fixed[power]} | {cap} | {mean:.1f} | {ratio:.2f} "
                  f"| {1 - ratio:.0%} |")  # fmt: skip
    # Type-I error of the sequential rule under no difference, rejecting at any time up to the largest cap.
    cap = max(caps.values())
    null = first_rejections(0.5, 0.5, cap, args.sequences, args.alpha, rng)
    rate = float((null <= cap).mean())
    se = math.sqrt(args.alpha * (1 - args.alpha) / args.sequences)
    print(f"\nno difference (0.50 -> 0.50): rejected at any time up to {cap} pairs in {rate:.2%} of sequences "
          f"(alpha {args.alpha:.0%}, Monte-Carlo SE {se:.2%})")  # fmt: skip
    print(f"({time.perf_counter() - started:.0f} s)")


if __name__ == "__main__":
    main()
