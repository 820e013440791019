"""Errors that depend on outcomes, fed through the shipped decision rules: Monte-Carlo checks (pure, seeded).

An infrastructure error that falls more often on one arm's hard seeds removes exactly the outcomes that would
have spoken against that arm. These helpers simulate such runs with a known truth and feed them, in plan
order, through the classes the evaluator uses (:class:`~dz_gym.stats.sequential.SequentialPairTest`,
:class:`~dz_gym.stats.select.BestArmSelection`), counting the false decisions. The tests use them with a few
hundred replications; ``benchmarks/bench_errors.py`` with many.

:class:`ErrorModel`: an episode that would fail errors with probability ``on_failure``, one that would succeed
with probability ``on_success`` (``on_failure == on_success``: errors at random).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from dz_gym.stats.comparison import compare_rows
from dz_gym.stats.select import BestArmSelection
from dz_gym.stats.sequential import SequentialPairTest

__all__ = ["ErrorModel", "MonteCarlo", "ab_false_decisions", "fixed_n_false_decisions", "race_wrong_best"]


@dataclass(frozen=True)
class ErrorModel:
    """The chance that an arm's episode errors, given what its outcome would have been."""

    on_failure: float = 0.0
    on_success: float = 0.0

    def apply(self, outcomes: np.ndarray, rng: np.random.Generator) -> list[bool | None]:
        """``outcomes`` with the errored ones replaced by ``None``."""
        chance = np.where(outcomes, self.on_success, self.on_failure)
        errored = rng.random(outcomes.shape) < chance
        return [None if e else bool(x) for x, e in zip(outcomes, errored)]


@dataclass(frozen=True)
class MonteCarlo:
    """``hits`` of ``runs`` replications: the rate and its binomial standard error."""

    hits: int
    runs: int

    @property
    def rate(self) -> float:
        return self.hits / self.runs

    @property
    def se(self) -> float:
        p = max(self.rate, 1.0 / self.runs)
        return math.sqrt(p * (1 - p) / self.runs)


def ab_false_decisions(make_test: Callable[[], SequentialPairTest], *, runs: int, pairs: int, rate: float,
                       errors_a: ErrorModel, errors_b: ErrorModel, seed: int = 0,
                       drop_errors: bool = False) -> MonteCarlo:  # fmt: skip
    """Runs of ``pairs`` pairs with no difference (both arms succeed with ``rate``, independently given the
    seed), fed to a fresh ``make_test()`` until it stops or the pairs end; hits: runs that decided. With
    ``drop_errors`` the errored pairs are left out before the test sees them (what the rule used to do)."""
    rng = np.random.default_rng(seed)
    hits = 0
    for _ in range(runs):
        a = errors_a.apply(rng.random(pairs) < rate, rng)
        b = errors_b.apply(rng.random(pairs) < rate, rng)
        test = make_test()
        for pair in zip(a, b):
            if drop_errors and None in pair:
                continue
            if test.update([pair]).stop:
                break
        decision = test.finish()
        hits += decision.better is not None
    return MonteCarlo(hits, runs)


def _rows(outcomes: Sequence[bool | None]) -> list[dict]:
    return [{"scene": 1, "seed": k, "error": None if x is not None else "injected", "success_at_end": x,
             "success_any_step": x} for k, x in enumerate(outcomes)]  # fmt: skip


def fixed_n_false_decisions(*, runs: int, pairs: int, rate: float, errors_a: ErrorModel, errors_b: ErrorModel,
                            alpha: float = 0.05, seed: int = 0, drop_errors: bool = False) -> MonteCarlo:  # fmt: skip
    """``dz-gym-compare``'s verdict (:func:`~dz_gym.stats.comparison.compare_rows`, overall line) on runs of
    ``pairs`` pairs with no difference; hits: a verdict either way. ``drop_errors``: the verdict of the
    two-sided McNemar test with the errored pairs dropped (``p_without_errored``: what it used to be)."""
    rng = np.random.default_rng(seed)
    hits = 0
    for _ in range(runs):
        a = errors_a.apply(rng.random(pairs) < rate, rng)
        b = errors_b.apply(rng.random(pairs) < rate, rng)
        overall = compare_rows(_rows(a), _rows(b), alpha=alpha)["scenes"]["overall"]
        hits += (
            (overall["p_without_errored"] <= alpha) if drop_errors else overall["verdict"] != "no_difference_detected"
        )
    return MonteCarlo(hits, runs)


def race_wrong_best(rates: Sequence[float], errors: Sequence[ErrorModel], *, runs: int, rounds: int,
                    alpha: float = 0.05, seed: int = 0, drop_errors: bool = False) -> MonteCarlo:  # fmt: skip
    """Races of arms with success ``rates`` (outcomes independent given the seed) and per-arm error models,
    each up to ``rounds`` seeds; hits: races that named an arm that is not a best one. ``drop_errors``: the
    errored seeds are left out of the pairs (the rule as it used to be)."""
    rng = np.random.default_rng(seed)
    names = [f"arm{i}" for i in range(len(rates))]
    best = max(rates)
    hits = 0
    for _ in range(runs):
        sel = BestArmSelection(names, alpha=alpha, max_rounds=rounds, drop_errors=drop_errors)
        while not sel.stopped:
            values = {}
            for name, rate, model in zip(names, rates, errors):
                if name in sel.survivors:
                    values[name] = model.apply(np.asarray([rng.random() < rate]), rng)[0]
            sel.update(values)
        if sel.best is not None and rates[names.index(sel.best)] < best:
            hits += 1
    return MonteCarlo(hits, runs)
