"""Adaptive selection of the best of K arms on the same seeds: anytime-valid elimination (pure, no I/O).

Seeds are run in plan order; each round runs one seed under every arm still in the race. For every ordered
pair of arms ``(i, j)`` a one-sided e-process on their discordant seeds measures the evidence that ``i`` is
better than ``j``: the average over :data:`ALTERNATIVES` of ``(2q)^W (2(1-q))^L``, with ``W`` the seeds only
``i`` solved and ``L`` those only ``j`` solved. When ``i`` is not better than ``j`` a discordant seed is
won by ``i`` with probability at most 1/2, so the e-process is a nonnegative supermartingale and, by Ville's
inequality, ever reaches ``(K - 1) / alpha`` with probability at most ``alpha / (K - 1)``.

Errored episodes (what still errored after the runner's retries) are resolved, not dropped: the evidence that
``i`` beats ``j`` counts every seed where either errored the worst way for that claim, ``i``'s errors as
failures and ``j``'s as successes. Seed by seed the imputed outcomes are then at most ``i``'s true ones and at
least ``j``'s, so the imputed e-process is at most the one on the true outcomes, whatever the errors depend on
(outcomes included), and the guarantee below holds as it does without errors. The summary says per arm
whether the errors kept it in the race (``held_by_errors``: arms that the rule would have eliminated with the
errored seeds dropped).

Arm ``j`` is eliminated the first time some arm's e-process against it reaches ``(K - 1) / alpha`` (evidence
gathered before the other arm was itself eliminated still counts: a stopped supermartingale is one too). A
best arm (one that no other arm beats) is eliminated only if one of the ``K - 1`` others reaches the threshold
against it, which has probability at most ``alpha`` at any time: so when one arm is left it is a best arm with
probability at least ``1 - alpha``, however the run stopped. When the budget ends with several arms left, no
winner is named; the survivors are reported.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

__all__ = ["ALTERNATIVES", "BestArmSelection"]

ALTERNATIVES: tuple[float, ...] = (0.6, 0.7, 0.8, 0.9)


class BestArmSelection:
    """The race (see the module docstring): :meth:`update` with one round's outcomes per active arm.

    ``drop_errors``: leave errored seeds out instead of bounding them (the rule before errors were bounded;
    not valid when errors depend on outcomes; kept for comparisons such as ``benchmarks/bench_errors.py``)."""

    def __init__(self, arms: Sequence[str], alpha: float = 0.05, max_rounds: int | None = None,
                 alternatives: Sequence[float] = ALTERNATIVES, *, drop_errors: bool = False):  # fmt: skip
        arms = [str(a) for a in arms]
        if len(arms) < 2 or len(set(arms)) != len(arms):
            raise ValueError(f"arms: expected at least 2 distinct names, got {arms!r}")
        if not 0.0 < float(alpha) < 1.0:
            raise ValueError(f"alpha: expected a number in (0, 1), got {alpha!r}")
        qs = np.asarray([float(q) for q in alternatives])
        if qs.size == 0 or not np.all((qs > 0.5) & (qs < 1.0)):
            raise ValueError(f"alternatives: expected probabilities in (0.5, 1), got {list(alternatives)!r}")
        self.arms, self.alpha, self.max_rounds = arms, float(alpha), max_rounds
        self.drop_errors = bool(drop_errors)
        self._up, self._down = np.log(2 * qs), np.log(2 * (1 - qs))
        self._shift = math.log(qs.size)
        self.log_threshold = math.log((len(arms) - 1) / self.alpha)
        k = len(arms)
        self.wins = np.zeros((k, k), dtype=np.int64)  # wins[i, j]: seeds only i solved (both arms active)
        # bounded[i, j]: seeds with an errored episode of i or j that count against i when judging "i beats j"
        # (i errored or failed, j errored or succeeded, one of them errored)
        self.bounded = np.zeros((k, k), dtype=np.int64)
        self.active = [True] * k
        self.eliminated: dict[str, dict[str, Any]] = {}
        self.rounds = 0
        self.episodes = 0
        self.errored = 0
        self.errored_rounds = 0  # rounds with an errored episode: bounded, not dropped

    def log_e(self, i: int, j: int, *, drop_errors: bool = False) -> float:
        """log of the evidence that arm ``i`` is better than arm ``j`` (errored seeds imputed against ``i``;
        ``drop_errors``: left out instead, for the summary only)."""
        w, lost = self.wins[i, j], self.wins[j, i] + (0 if drop_errors else self.bounded[i, j])
        x = w * self._up + lost * self._down
        top = float(x.max())
        return top + math.log(float(np.exp(x - top).sum())) - self._shift

    @property
    def survivors(self) -> list[str]:
        return [a for a, on in zip(self.arms, self.active) if on]

    @property
    def stopped(self) -> bool:
        done = self.max_rounds is not None and self.rounds >= self.max_rounds
        return len(self.survivors) == 1 or done

    @property
    def best(self) -> str | None:
        """The winner: the one arm left (None while several are)."""
        left = self.survivors
        return left[0] if len(left) == 1 else None

    def update(self, outcomes: Mapping[str, bool | None]) -> bool:
        """One round: ``outcomes[arm]`` for every active arm (``None``: errored, imputed against each claim).

        Returns :attr:`stopped`. Rounds after the stop change nothing."""
        if self.stopped:
            return True
        idx = [i for i, on in enumerate(self.active) if on]
        missing = [self.arms[i] for i in idx if self.arms[i] not in outcomes]
        if missing:
            raise ValueError(f"round {self.rounds}: no outcome for active arm(s) {missing}")
        self.rounds += 1
        self.episodes += len(idx)
        values = {i: outcomes[self.arms[i]] for i in idx}
        self.errored += sum(v is None for v in values.values())
        self.errored_rounds += any(v is None for v in values.values())
        for i in idx:
            for j in idx:
                if i == j:
                    continue
                vi, vj = values[i], values[j]
                if vi is not None and vj is not None:
                    self.wins[i, j] += bool(vi) and not bool(vj)
                elif (
                    not self.drop_errors and not vi and (vj is None or vj)
                ):  # one errored; i's outcome counts as a failure, j's as a success
                    self.bounded[i, j] += 1
        for j in idx:
            strongest = max((i for i in range(len(self.arms)) if i != j), key=lambda i: self.log_e(i, j))
            log_e = self.log_e(strongest, j)
            if log_e >= self.log_threshold:
                self.eliminated[self.arms[j]] = {"round": self.rounds, "by": self.arms[strongest],
                                                 "log10_e": log_e / math.log(10)}  # fmt: skip
        for j in idx:
            if self.arms[j] in self.eliminated:
                self.active[j] = False
        if not any(self.active):  # cannot happen with a consistent order; keep the last round's best
            best = max(idx, key=lambda j: sum(self.wins[j]))
            self.active[best] = True
            del self.eliminated[self.arms[best]]
        return self.stopped

    def held_by_errors(self) -> list[str]:
        """Active arms that some active arm would have eliminated with the errored seeds dropped."""
        idx = [i for i, on in enumerate(self.active) if on]
        return [self.arms[j] for j in idx
                if any(self.log_e(i, j, drop_errors=True) >= self.log_threshold for i in idx if i != j)]  # fmt: skip

    def to_dict(self) -> dict[str, Any]:
        best = self.best
        if best is not None:
            why = (f"{best} is the one arm left after {self.rounds} rounds: every other arm was beaten with "
                   f"e-value >= (K - 1)/alpha = {math.exp(self.log_threshold):.3g}; best with probability >= "
                   f"{1 - self.alpha:g}")  # fmt: skip
        elif self.stopped:
            why = f"budget of {self.max_rounds} rounds ended with {len(self.survivors)} arms left: no winner named"
        else:
            why = f"{len(self.survivors)} arms left after {self.rounds} rounds: continue"
        return {
            "method": "anytime-valid elimination: one-sided mixture e-process per pair of arms, threshold (K-1)/alpha",
            "alpha": self.alpha,
            "alternatives": [float(q) for q in (0.5 * np.exp(self._up))],
            "rounds": self.rounds,
            "episodes": self.episodes,
            "errored": self.errored,
            "errored_rounds": self.errored_rounds,
            "held_by_errors": self.held_by_errors(),
            "best": best,
            "survivors": self.survivors,
            "eliminated": self.eliminated,
            "stopped": self.stopped,
            "why": why,
        }
