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

Then the leaderboard after the race (the same simulated runs): the fraction of runs whose leaderboard claims
at least one wrong order (``i`` surely better than ``j`` while ``i``'s rate is not higher), for the claims
of fixed-n Holm tests on the seeds the race ran (what the leaderboard showed before) and for the
anytime-valid claims it shows now (``dz_gym.stats.ranking.anytime_claims``: each pair's e-process, in plan
order, reaching ``K (K - 1) / alpha``), with how many true orders each finds.

    python benchmarks/bench_rank.py [--runs 2000] [--alpha 0.05] [--seed 0]
"""

from __future__ import annotations

import argparse
import math
import time

import numpy as np

from dz_gym.stats import holm_adjust, mcnemar_exact_p
from dz_gym.stats.select import ALTERNATIVES

# Checkpoints of a training run: one clearly best, the others spread below it (earlier checkpoints are worse).
SCENARIOS = {
    4: (0.7, 0.5, 0.35, 0.2),
    8: (0.7, 0.5, 0.45, 0.4, 0.3, 0.25, 0.2, 0.1),
}
# For the leaderboard after the race: the same best arm against equal arms, whose order is never true.
TIED = {
    4: (0.7, 0.5, 0.5, 0.5),
    8: (0.7, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5),
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


def simulate(rates, alpha: float, runs: int, rng, *, eliminate: bool = True, detail: bool = False) -> tuple:
    """Episodes used and whether arm 0 was named, per simulated run: the rule of ``BestArmSelection``
    (``eliminate=False``: every arm runs every round until one arm has beaten all others); with ``detail``
    also per run the wins matrix at the stop (``wins[r, i, j]``: seeds only ``i`` solved, both in the race) and the largest
    log e-value each ordered pair reached."""
    k = len(rates)
    p = np.asarray(rates)
    up, down = np.log(2 * np.asarray(ALTERNATIVES)), np.log(2 * (1 - np.asarray(ALTERNATIVES)))
    threshold = math.log((k - 1) / alpha)
    wins = np.zeros((runs, k, k), dtype=np.int64)
    beaten = np.zeros((runs, k), dtype=bool)
    episodes = np.zeros(runs, dtype=np.int64)
    done = np.zeros(runs, dtype=bool)
    off_diagonal = ~np.eye(k, dtype=bool)
    top_log_e = np.full((runs, k, k), -np.inf)
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
        top_log_e = np.maximum(top_log_e, log_e)
        beaten |= ~done[:, None] & ~beaten & (log_e.max(axis=1) >= threshold)
        done |= (~beaten).sum(axis=1) <= 1
    named = ~beaten[:, 0] & ((~beaten).sum(axis=1) == 1)
    return (episodes, named, wins, top_log_e) if detail else (episodes, named)


def leaderboard_errors(rates, alpha: float, wins: np.ndarray, top_log_e: np.ndarray) -> dict[str, tuple]:
    """Per claim rule, (fraction of runs with a wrong order, its SE, mean true orders claimed per run)."""
    k = len(rates)
    pairs = [(i, j) for i in range(k) for j in range(i + 1, k)]
    holm = np.zeros((len(wins), k, k), dtype=bool)
    for r in range(len(wins)):
        p = [mcnemar_exact_p(int(wins[r, i, j]), int(wins[r, j, i])) for i, j in pairs]
        for (i, j), p_holm in zip(pairs, holm_adjust(p)):
            if p_holm is not None and p_holm <= alpha and wins[r, i, j] != wins[r, j, i]:
                holm[r, i, j] = wins[r, i, j] > wins[r, j, i]
                holm[r, j, i] = wins[r, j, i] > wins[r, i, j]
    anytime = top_log_e >= math.log(k * (k - 1) / alpha)
    wrong = np.asarray(rates)[:, None] <= np.asarray(rates)[None, :]  # claim i > j is wrong
    out = {}
    for name, claims in (("holm", holm), ("anytime", anytime)):
        bad = (claims & wrong).any(axis=(1, 2))
        out[name] = (float(bad.mean()), float(bad.std(ddof=1) / math.sqrt(len(bad))),
                     float((claims & ~wrong).sum(axis=(1, 2)).mean()))  # fmt: skip
    return out


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
    boards = {}
    for k, rates in SCENARIOS.items():
        ep, ok, wins, top_log_e = simulate(rates, args.alpha, args.runs, rng, detail=True)
        boards[k] = leaderboard_errors(rates, args.alpha, wins, top_log_e)
        ep_u, ok_u = simulate(rates, args.alpha, args.runs, rng, eliminate=False)
        (mean, se), (mean_u, se_u) = _mean_se(ep), _mean_se(ep_u)
        n = uniform_n(rates, args.alpha)
        print(f"| {k} | {', '.join(f'{r:g}' for r in rates)} | {mean:.0f} +- {se:.0f} | {1 - ok.mean():.4f} "
              f"| {mean_u:.0f} +- {se_u:.0f} | {1 - mean / mean_u:.0%} | {1 - ok_u.mean():.4f} | {k * n} "
              f"| {1 - mean / (k * n):.0%} |")  # fmt: skip
    for k, rates in TIED.items():
        _, _, wins, top_log_e = simulate(rates, args.alpha, args.runs, rng, detail=True)
        boards[(k, rates)] = leaderboard_errors(rates, args.alpha, wins, top_log_e)
    print("\nThe leaderboard after --select-best: runs with at least one wrong order claimed (mean true orders "
          "claimed per run)")  # fmt: skip
    print("| K | success rates | fixed-n Holm on the raced seeds: wrong orders | true orders | anytime-valid claims: "
          "wrong orders | true orders |")  # fmt: skip
    print("|---|---|---|---|---|---|")
    for key, board in boards.items():
        k, rates = key if isinstance(key, tuple) else (key, SCENARIOS[key])
        (h, h_se, h_true), (a, a_se, a_true) = board["holm"], board["anytime"]
        print(f"| {k} | {', '.join(f'{r:g}' for r in rates)} | {h:.4f} +- {h_se:.4f} | {h_true:.2f} "
              f"| {a:.4f} +- {a_se:.4f} | {a_true:.2f} |")  # fmt: skip
    print(f"\n({time.perf_counter() - started:.0f} s)")


if __name__ == "__main__":
    main()
