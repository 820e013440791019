"""Episodes needed to find the best of K arms: adaptive elimination (``--select-best``) vs uniform allocation.

Arms have known success rates, one clearly best, outcomes independent given the seed. The adaptive rule is
``dz_gym.stats.BestArmSelection`` (anytime-valid elimination: each round one seed under every arm still in),
simulated ``--runs`` times with the same rule vectorized (checked against the class in
tests/test_stats_select.py). Two baselines:

- uniform, same guarantee: every arm on every seed until the same anytime-valid stopping rule names one
  (no elimination): the same error guarantee, the same simulation (its episodes are K x rounds);
- uniform, fixed n: every arm on the same ``n`` seeds, the arm with the most successes named best (ties at
  random), ``n`` the smallest with P(wrong arm) <= alpha, computed exactly: the most favourable baseline, which
  knows the rates and has no guarantee at an earlier or later stop.

Episodes are means with their Monte-Carlo standard error; the error rate (naming a wrong arm) is the fraction
of runs, with its SE (0 errors in R runs: below 3/R with 95% confidence).

    python benchmarks/bench_rank.py [--runs 2000] [--alpha 0.05] [--seed 0]
"""

from __future__ import annotations

import argparse
import math
import time

import numpy as np

from dz_gym.stats.select import ALTERNATIVES

# Checkpoints of a training run: one clearly best, the others spread below it (earlier checkpoints are worse).
SCENARIOS = {
    4: (0.7, 0.5, 0.35, 0.2),
    8: (0.7, 0.5, 0.45, 0.4, 0.3, 0.25, 0.2, 0.1),
}
MAX_ROUNDS = 5000


def _binom(n: int, p: float) -> np.ndarray:
    k = np.arange(n + 1)
    logf = np.concatenate([[0.0], np.cumsum(np.log(np.arange(1, n + 1)))])
    return np.exp(logf[n] - logf[k] - logf[n - k] + k * math.log(p) + (n - k) * math.log1p(-p))


def uniform_error(n: int, rates) -> float:
    """Exact P(the arm with the most of n successes is not arm 0), ties broken at random."""
    best, others = _binom(n, rates[0]), [_binom(n, p) for p in rates[1:]]
    cdfs = [np.concatenate([[0.0], np.cumsum(o)]) for o in others]  # cdfs[j][k] = P(X_j < k)
    correct = 0.0
    for k in range(n + 1):
        poly = np.array([1.0])  # generating function of how many others tie at k, all others <= k
        for o, c in zip(others, cdfs):
            poly = np.convolve(poly, [c[k], o[k]])
        correct += best[k] * float((poly / np.arange(1, len(poly) + 1)).sum())
    return 1.0 - correct


def uniform_n(rates, error: float) -> int:
    n = 1
    while uniform_error(n, rates) > error:
        n *= 2
    lo = n // 2
    return next(m for m in range(max(1, lo), n + 1) if uniform_error(m, rates) <= error)


def simulate(rates, alpha: float, runs: int, rng, *, eliminate: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """Episodes used and whether arm 0 was named, per simulated run: the rule of ``BestArmSelection``
    (``eliminate=False``: every arm runs every round until one arm has beaten all others)."""
    k = len(rates)
    p = np.asarray(rates)
    up, down = np.log(2 * np.asarray(ALTERNATIVES)), np.log(2 * (1 - np.asarray(ALTERNATIVES)))
    threshold = math.log((k - 1) / alpha)
    wins = np.zeros((runs, k, k), dtype=np.int64)
    beaten = np.zeros((runs, k), dtype=bool)
    episodes = np.zeros(runs, dtype=np.int64)
    done = np.zeros(runs, dtype=bool)
    off_diagonal = ~np.eye(k, dtype=bool)
    for _ in range(MAX_ROUNDS):
        if done.all():
            break
        act = ~done[:, None] & (~beaten if eliminate else np.ones_like(beaten))
        out = rng.random((runs, k)) < p
        wins += act[:, :, None] & act[:, None, :] & out[:, :, None] & ~out[:, None, :]
        episodes += act.sum(axis=1)
        x = wins[..., None] * up + wins.transpose(0, 2, 1)[..., None] * down
        top = x.max(axis=-1)
        log_e = top + np.log(np.exp(x - top[..., None]).sum(axis=-1)) - math.log(len(ALTERNATIVES))
        log_e = np.where(off_diagonal, log_e, -np.inf)  # log_e[:, i, j]: i better than j
        beaten |= ~done[:, None] & ~beaten & (log_e.max(axis=1) >= threshold)
        done |= (~beaten).sum(axis=1) <= 1
    return episodes, ~beaten[:, 0] & ((~beaten).sum(axis=1) == 1)


def _mean_se(x: np.ndarray) -> tuple[float, float]:
    return float(x.mean()), float(x.std(ddof=1) / math.sqrt(len(x)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=2000)
    parser.add_argument("--alpha", type=float, default=0.05)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    rng = np.random.default_rng(args.seed)
    started = time.perf_counter()
    print(f"alpha {args.alpha}; adaptive: {args.runs} simulated runs per K; uniform: exact")
    print("| K | success rates | adaptive episodes | adaptive error | uniform, same guarantee: episodes | fewer "
          "| uniform error | uniform, fixed n (exact, error <= alpha): episodes | fewer |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|")
    for k, rates in SCENARIOS.items():
        ep, ok = simulate(rates, args.alpha, args.runs, rng)
        ep_u, ok_u = simulate(rates, args.alpha, args.runs, rng, eliminate=False)
        (mean, se), (mean_u, se_u) = _mean_se(ep), _mean_se(ep_u)
        n = uniform_n(rates, args.alpha)
        print(f"| {k} | {', '.join(f'{r:g}' for r in rates)} | {mean:.0f} +- {se:.0f} | {1 - ok.mean():.4f} "
              f"| {mean_u:.0f} +- {se_u:.0f} | {1 - mean / mean_u:.0%} | {1 - ok_u.mean():.4f} | {k * n} "
              f"| {1 - mean / (k * n):.0%} |")  # fmt: skip
    print(f"\n({time.perf_counter() - started:.0f} s)")


if __name__ == "__main__":
    main()
