"""Every printed claim under errors that depend on outcomes: false-claim rates, errored episodes bounded (the
shipped rules) vs dropped (the rules before), by Monte Carlo through the public classes, in one run.

One arm's server errors on a share of that arm's *failures* (5-40 %): dropping those episodes removes exactly the
outcomes that speak against it. Each case has a known truth, so a claim is false when the truth contradicts it:

- leaderboard of a plain run of K arms (``rank_arms``: "i surely better than j", Holm over exact McNemar): the
  erroring arm at 0.45, the others at 0.5, 400 seeds; false: any claimed order whose better arm is not better.
  Before: the same Holm procedure on the McNemar p-values with the errored seeds dropped (``p_without_errored``);
- leaderboard after a race (``BestArmSelection`` up to 400 seeds, then ``anytime_claims`` on the seeds it
  raced): the same arms; before: the errored seeds left out of the rounds;
- A/B effect size (``compare_rows``' ``ci95``, B - A with its 95 % interval): A at 0.5, B at 0.25 erroring on its
  failures, 100 pairs; false: the interval misses the true -0.25. Before: Newcombe's interval on the pairs
  without errors (``ci95_without_errored``);
- "no difference" of the sequential test (``SequentialPairTest``, difference 0.2, power 0.8): A at 0.4 erroring
  on its failures, B at 0.6 (a true difference of 0.2); false: the ``no_difference`` claim. Before: the rule
  stopped for futility when *some* completion of the errored pairs was in the band and called it "no
  difference"; it stops in the same states now, so "before" is ``no_difference`` or ``errors_undecided``;
- the sequential test's confidence sequence for B - A at its stop (``difference_confidence_sequence`` on the
  pairs the test used): the same runs; false: the interval misses 0.2. Before: the pairs without errors.

Rates are fractions of runs with a false claim, +- their Monte-Carlo standard error (0 in R runs: below 3/R
with 95 % confidence).

    python benchmarks/bench_claims.py [--reps 200] [--seed 0]
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable, Sequence

import numpy as np

from dz_gym.stats import compare_rows, difference_confidence_sequence, holm_adjust, rank_arms
from dz_gym.stats.design import SequentialDesign
from dz_gym.stats.ranking import anytime_claims
from dz_gym.stats.select import BestArmSelection
from dz_gym.stats.sequential import SequentialPairTest
from dz_gym.testing.error_models import ErrorModel, MonteCarlo

ALPHA = 0.05
SEEDS = 400
KS = (2, 4, 8)
ERRORS = (0.05, 0.1, 0.2, 0.4)
BAD, GOOD = 0.45, 0.5  # leaderboards: the erroring arm (5 points worse), the others
PAIRS = 100  # effect size
A_RATE, B_RATE = 0.5, 0.25  # effect size: B is 25 points worse and errors on its failures
SEQ_A, SEQ_B = 0.4, 0.6  # sequential: a true difference of 0.2, A errors on its failures


def _rates(k: int) -> list[float]:
    return [BAD] + [GOOD] * (k - 1)


def _false_order(orders, rates: dict[str, float]) -> bool:
    return any(rates[i] <= rates[j] for i, j in orders)


def _draw(rng: np.random.Generator, rates: Sequence[float], errors: Sequence[ErrorModel], n: int) -> list[list]:
    return [model.apply(rng.random(n) < rate, rng) for rate, model in zip(rates, errors)]


def _models(k: int, share: float) -> list[ErrorModel]:
    return [ErrorModel(on_failure=share)] + [ErrorModel()] * (k - 1)


def leaderboard(k: int, share: float, reps: int, rng: np.random.Generator) -> tuple[MonteCarlo, MonteCarlo]:
    """rank_arms on a plain run: runs with a false order, bounded and with the errored seeds dropped."""
    names = [f"arm{i}" for i in range(k)]
    rates = dict(zip(names, _rates(k)))
    bounded = dropped = 0
    for _ in range(reps):
        out = rank_arms(dict(zip(names, _draw(rng, _rates(k), _models(k, share), SEEDS))), ALPHA)
        bounded += _false_order([(e["arm"], o) for e in out["arms"] for o in e["surely_better_than"]], rates)
        before = []
        for pair, p_holm in zip(out["pairs"], holm_adjust([p["p_without_errored"] for p in out["pairs"]])):
            (i, j), (i_only, j_only) = pair["arms"], pair["only"]
            if p_holm <= ALPHA and i_only != j_only:
                before.append((i, j) if i_only > j_only else (j, i))
        dropped += _false_order(before, rates)
    return MonteCarlo(bounded, reps), MonteCarlo(dropped, reps)


def race_leaderboard(k: int, share: float, reps: int, rng: np.random.Generator) -> tuple[MonteCarlo, MonteCarlo]:
    """anytime_claims on the seeds a race ran: runs with a false order, bounded and dropped."""
    names = [f"arm{i}" for i in range(k)]
    rates = dict(zip(names, _rates(k)))
    bounded = dropped = 0
    for _ in range(reps):
        outcomes = dict(zip(names, _draw(rng, _rates(k), _models(k, share), SEEDS)))
        race = BestArmSelection(names, alpha=ALPHA, max_rounds=SEEDS)
        rounds = []
        for seed in range(SEEDS):
            if race.stopped:
                break
            values = {name: outcomes[name][seed] for name in race.survivors}
            rounds.append(values)
            race.update(values)
        bounded += _false_order(anytime_claims(rounds, ALPHA), rates)
        kept = [{a: v for a, v in r.items() if v is not None} for r in rounds]
        dropped += _false_order(anytime_claims(kept, ALPHA), rates)
    return MonteCarlo(bounded, reps), MonteCarlo(dropped, reps)


def _rows(outcomes: Sequence[bool | None]) -> list[dict]:
    return [{"scene": 1, "seed": s, "error": None if x is not None else "injected", "success_at_end": x,
             "success_any_step": x} for s, x in enumerate(outcomes)]  # fmt: skip


def effect(share: float, reps: int, rng: np.random.Generator) -> tuple[MonteCarlo, MonteCarlo]:
    """compare_rows: runs whose 95 % interval of B - A misses the truth, bounded and dropped."""
    truth = B_RATE - A_RATE
    misses = [0, 0]
    for _ in range(reps):
        a, b = _draw(rng, (A_RATE, B_RATE), (ErrorModel(), ErrorModel(on_failure=share)), PAIRS)
        entry = compare_rows(_rows(a), _rows(b), alpha=ALPHA)["scenes"]["overall"]
        for i, interval in enumerate((entry["ci95"], entry["ci95_without_errored"])):
            misses[i] += interval is None or not interval[0] <= truth <= interval[1]
    return MonteCarlo(misses[0], reps), MonteCarlo(misses[1], reps)


def sequential(share: float, reps: int, rng: np.random.Generator,
               design: SequentialDesign) -> dict[str, tuple[MonteCarlo, MonteCarlo]]:  # fmt: skip
    """SequentialPairTest: "no difference" with a true difference of 0.2, and the confidence sequence at the stop."""
    truth = SEQ_B - SEQ_A
    counts = {"futility": [0, 0], "cs": [0, 0]}
    for _ in range(reps):
        a, b = _draw(rng, (SEQ_A, SEQ_B), (ErrorModel(on_failure=share), ErrorModel()), design.max_pairs)
        test = SequentialPairTest(design=design)
        used = []
        for pair in zip(a, b):
            used.append(pair)
            if test.update([pair]).stop:
                break
        reason = test.finish().reason
        counts["futility"][0] += reason == "no_difference"
        counts["futility"][1] += reason in ("no_difference", "errors_undecided")
        clean = [(x, y) for x, y in used if x is not None and y is not None]
        for i, pairs in enumerate((used, clean)):
            interval = difference_confidence_sequence(pairs, ALPHA)
            counts["cs"][i] += interval is not None and not interval[0] <= truth <= interval[1]
    return {name: (MonteCarlo(c[0], reps), MonteCarlo(c[1], reps)) for name, c in counts.items()}


def _fmt(mc: MonteCarlo) -> str:
    return f"{mc.rate:.3f} +- {mc.se:.3f}"


def _row(claim: str, k: int | str, share: float, cells: tuple[MonteCarlo, MonteCarlo]) -> None:
    print(f"| {claim} | {k} | {share:.0%} | {_fmt(cells[0])} | {_fmt(cells[1])} |", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=200, help="runs per cell")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    rng = np.random.default_rng(args.seed)
    design = SequentialDesign.plan(0.2, alpha=ALPHA)
    started = time.perf_counter()
    print(f"alpha {ALPHA}; {args.reps} runs per cell; leaderboards: the erroring arm at {BAD}, the others at {GOOD}, "
          f"{SEEDS} seeds; effect: A {A_RATE}, B {B_RATE} erroring, {PAIRS} pairs; sequential: A {SEQ_A} erroring, "
          f"B {SEQ_B}, design 0.2 / 0.8 (cap {design.max_pairs} pairs)")  # fmt: skip
    print("\n| claim (false when) | K | errored share of one arm's failures | bounded (shipped) | dropped (before) |")
    print("|---|---|---|---|---|")
    cases: list[tuple[str, Callable[[int, float], tuple[MonteCarlo, MonteCarlo]]]] = [
        ("rank_arms: surely better (order wrong)", lambda k, e: leaderboard(k, e, args.reps, rng)),
        ("anytime_claims after the race (order wrong)", lambda k, e: race_leaderboard(k, e, args.reps, rng)),
    ]
    for claim, run in cases:
        for k in KS:
            for share in ERRORS:
                _row(claim, k, share, run(k, share))
    for share in ERRORS:
        _row("compare: B - A 95% CI (misses the truth)", 2, share, effect(share, args.reps, rng))
    for share in ERRORS:
        out = sequential(share, args.reps, rng, design)
        _row("sequential: no difference (true difference 0.2)", 2, share, out["futility"])
        _row("sequential: confidence sequence at the stop (misses 0.2)", 2, share, out["cs"])
    print(f"\n{time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()
