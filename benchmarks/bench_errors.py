"""Errors that depend on outcomes: false decisions of the A/B tests and wrong winners of the race, bounded vs
dropped, by Monte Carlo through the shipped classes (``dz_gym.testing.error_models``).

The cases are the ones that bent the rules while errored episodes were dropped:

- A/B, no true difference (both arms at ``--rate``, independent given the seed): B's server errors on 20 % of
  B's failures, A's on 10 % of A's episodes at random, so the counts of errored episodes balance (no test
  of "errors by arm" can see it). The sequential test (``SequentialPairTest``, default design) and
  ``dz-gym-compare``'s fixed-n verdict: the fraction of runs that decided, with the errored pairs bounded
  (the shipped rules) and dropped (the rules before: the same test fed only the pairs without errors, and
  the two-sided McNemar p-value with those pairs left out);
- A/B power: B better by the design's difference (0.4 vs 0.6), without errors and with 10 % of each arm's
  episodes erroring at random (what bounding costs);
- the race: an arm at 0.5 whose server errors on 60 % of its failures against an arm at 0.6; the fraction of
  races that named the 0.5 arm best.

Every rate comes with its Monte-Carlo standard error (0 hits in R runs: below 3/R with 95 % confidence).

    python benchmarks/bench_errors.py [--runs 2000] [--quick] [--seed 0]   (about 10 min; --quick under 1 min)
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from dz_gym.stats.design import SequentialDesign
from dz_gym.stats.sequential import SequentialPairTest
from dz_gym.testing.error_models import (
    ErrorModel,
    MonteCarlo,
    ab_false_decisions,
    fixed_n_false_decisions,
    race_wrong_best,
)

ALPHA = 0.05


def _fmt(mc: MonteCarlo) -> str:
    return f"{mc.rate:.4f} +- {mc.se:.4f} ({mc.hits}/{mc.runs})"


def _power(design: SequentialDesign, runs: int, errors: ErrorModel, seed: int) -> MonteCarlo:
    """Runs where B (0.6) is named better than A (0.4), pairs fed through the shipped test."""
    rng = np.random.default_rng(seed)
    hits = 0
    for _ in range(runs):
        a = errors.apply(rng.random(design.max_pairs) < 0.4, rng)
        b = errors.apply(rng.random(design.max_pairs) < 0.6, rng)
        test = SequentialPairTest(design=design)
        for pair in zip(a, b):
            if test.update([pair]).stop:
                break
        hits += test.finish().better == "b"
    return MonteCarlo(hits, runs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=2000)
    parser.add_argument("--rate", type=float, default=0.5)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quick", action="store_true", help="200 runs per cell")
    args = parser.parse_args()
    runs = 200 if args.quick else args.runs
    started = time.perf_counter()
    design = SequentialDesign.plan(0.2, alpha=ALPHA)
    errors_a, errors_b = ErrorModel(0.1, 0.1), ErrorModel(0.2, 0.0)
    common = dict(runs=runs, pairs=design.max_pairs, rate=args.rate, errors_a=errors_a, errors_b=errors_b)
    print(f"alpha {ALPHA}; {runs} runs per cell; sequential design: difference 0.2, power 0.8, cap "
          f"{design.max_pairs} pairs; fixed n: {design.max_pairs} pairs")  # fmt: skip
    print("\n| case | errored pairs bounded (shipped) | errored pairs dropped (before) |")
    print("|---|---|---|")
    make = lambda: SequentialPairTest(design=design)  # noqa: E731 - a fresh test per run
    bound = ab_false_decisions(make, seed=args.seed, **common)
    drop = ab_false_decisions(make, seed=args.seed, drop_errors=True, **common)
    print(f"| sequential A/B: false decisions | {_fmt(bound)} | {_fmt(drop)} |")
    bound = fixed_n_false_decisions(seed=args.seed, alpha=ALPHA, **common)
    drop = fixed_n_false_decisions(seed=args.seed, alpha=ALPHA, drop_errors=True, **common)
    print(f"| fixed-n compare: false verdicts | {_fmt(bound)} | {_fmt(drop)} |")
    race = dict(runs=runs, rounds=400, alpha=ALPHA, seed=args.seed)
    errors = [ErrorModel(on_failure=0.6), ErrorModel()]
    bound = race_wrong_best([0.5, 0.6], errors, **race)
    drop = race_wrong_best([0.5, 0.6], errors, drop_errors=True, **race)
    print(f"| race (400 seeds at most): wrong best arm | {_fmt(bound)} | {_fmt(drop)} |")
    clean = _power(design, runs, ErrorModel(), args.seed)
    noisy = _power(design, runs, ErrorModel(0.1, 0.1), args.seed)
    print(f"\nsequential A/B power at B - A = 0.2 (0.4 vs 0.6): no errors {_fmt(clean)}; 10 % of each arm's "
          f"episodes errored at random, bounded: {_fmt(noisy)}")  # fmt: skip
    print(f"\n({time.perf_counter() - started:.0f} s)")


if __name__ == "__main__":
    main()
