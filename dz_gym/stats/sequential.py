"""The sequential A/B rule a runner feeds pair by pair, in plan order: decide, stop for futility, or go on.

:class:`SequentialPairTest` applies a :class:`~dz_gym.stats.design.SequentialDesign` (a truncated two-sided
SPRT on discordant pairs with a futility bound, type-I error at most ``alpha`` exactly, whatever the
concordance rate and wherever the budget ends) to pairs ``(a_success, b_success)`` given **in the order of
the run plan**: the design's guarantee needs the sequence of pairs to be fixed before the outcomes are known,
so a runner must hold a pair that completed early until every pair before it is in (``dz_gym.eval.ab``).

Errored episodes: a pair with an errored episode carries no outcome and is left out of the walk, but it is
counted per arm (``errored_a``, ``errored_b``, ``errored_both``). Dropping them is harmless only if errors do
not depend on the arm: before any decision the rule compares the pairs where only A errored with those where
only B errored by an exact McNemar test at ``alpha``; if they differ, it refuses to decide (reason
``errors_differ``) and says so.

The e-value path: after each usable pair, ``(LR_b + LR_a) / 2`` with ``LR`` the likelihood ratio of the
design's alternative ``q1`` (and its mirror) against 1/2. It is a test martingale under "no difference", so
``1 / max e-value`` is an anytime-valid p-value (``p_value``); it is shown as evidence, the decision is the
design's.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass

import numpy as np

from dz_gym.stats.design import SequentialDesign
from dz_gym.stats.exact import mcnemar_exact_p

__all__ = ["DEFAULT_MIN_DIFFERENCE", "DEFAULT_POWER", "SequentialDecision", "SequentialPairTest", "log_e_values"]

DEFAULT_MIN_DIFFERENCE = 0.2
DEFAULT_POWER = 0.8

CONTINUE = "continue"
B_BETTER = "b_better"
A_BETTER = "a_better"
NO_DIFFERENCE = "no_difference"
MAX_PAIRS = "max_pairs"
ERRORS_DIFFER = "errors_differ"


def log_e_values(b_only, discordant, alternatives: Sequence[float]) -> np.ndarray:
    """log of the two-sided mixture e-value ``(mean_q LR_q + mean_q LR_{1-q}) / 2`` after ``b_only`` B-only
    pairs among ``discordant`` ones (numpy broadcasting; ``alternatives`` in (1/2, 1))."""
    qs = np.asarray([float(q) for q in alternatives], dtype=np.float64)
    if qs.size == 0 or not np.all((qs > 0.5) & (qs < 1.0)):
        raise ValueError(f"alternatives: expected probabilities in (0.5, 1), got {list(alternatives)!r}")
    k = np.asarray(b_only, dtype=np.float64)[..., None]
    d = np.asarray(discordant, dtype=np.float64)[..., None]
    up, down = np.log(2 * qs), np.log(2 * (1 - qs))
    both = np.concatenate([k * up + (d - k) * down, k * down + (d - k) * up], axis=-1)
    top = both.max(axis=-1)
    return top + np.log(np.exp(both - top[..., None]).sum(axis=-1)) - math.log(2 * qs.size)


@dataclass(frozen=True)
class SequentialDecision:
    """Where the rule stands after the pairs seen so far.

    ``stop``: whether to stop; ``reason``: ``continue``, ``b_better`` / ``a_better``, ``no_difference``
    (futility: a difference of ``min_difference`` is unlikely), ``max_pairs`` (the cap or the budget ended
    without a decision) or ``errors_differ`` (refused: errors depend on the arm); ``better``: ``"a"``,
    ``"b"`` or ``None``; ``why``: one sentence for logs and summaries.
    """

    stop: bool
    reason: str
    better: str | None
    pairs: int
    errored: int
    errored_a: int
    errored_b: int
    errored_both: int
    a_only: int
    b_only: int
    e_value: float
    p_value: float
    errors_p_value: float
    why: str

    def to_dict(self) -> dict:
        return asdict(self)


class SequentialPairTest:
    """Feed pairs in plan order with :meth:`update`; call :meth:`finish` when the budget ends undecided.

    ``design``: the calibrated rule (default: :meth:`SequentialDesign.plan` for ``min_difference`` at
    ``power`` and ``alpha``); ``max_pairs``: the run's budget of usable pairs (the design's cap when larger or
    ``None``). Once stopped the decision is final; later pairs are counted in ``ignored``.
    """

    def __init__(self, alpha: float = 0.05, max_pairs: int | None = None, *,
                 min_difference: float = DEFAULT_MIN_DIFFERENCE, power: float = DEFAULT_POWER,
                 design: SequentialDesign | None = None):  # fmt: skip
        if max_pairs is not None and (isinstance(max_pairs, bool) or not isinstance(max_pairs, int) or max_pairs < 1):
            raise ValueError(f"max_pairs: expected an integer >= 1 or None, got {max_pairs!r}")
        self.design = design or SequentialDesign.plan(min_difference, alpha=alpha, power=power)
        self.alpha = self.design.alpha
        self.budget = max_pairs
        self.max_pairs = self.design.max_pairs if max_pairs is None else min(max_pairs, self.design.max_pairs)
        self.pairs = self.a_only = self.b_only = 0
        self.errored_a = self.errored_b = self.errored_both = 0
        self.ignored = 0
        self.path: list[float] = []  # log10 e-value after each usable pair
        self.max_e_value = 1.0
        self._decision = self._state(CONTINUE, None, "no pairs yet: continue")

    @property
    def decision(self) -> SequentialDecision:
        return self._decision

    @property
    def errored(self) -> int:
        return self.errored_a + self.errored_b + self.errored_both

    def update(self, outcomes: Iterable[tuple[bool | None, bool | None]]) -> SequentialDecision:
        """Fold in pairs ``(a_success, b_success)`` in plan order (``None``: that episode errored)."""
        for a, b in outcomes:
            if self._decision.stop:
                self.ignored += 1
                continue
            if a is None or b is None:
                if a is None and b is None:
                    self.errored_both += 1
                elif a is None:
                    self.errored_a += 1
                else:
                    self.errored_b += 1
                continue
            self.pairs += 1
            self.a_only += bool(a) and not bool(b)
            self.b_only += bool(b) and not bool(a)
            self._step()
        return self._decision

    def finish(self) -> SequentialDecision:
        """The budget ended before the cap (every planned pair is in): the final look at this truncation."""
        if not self._decision.stop:
            self._final_look("the planned pairs are done")
        return self._decision

    def _e_value(self) -> float:
        d = self.a_only + self.b_only
        return math.exp(min(float(log_e_values(self.b_only, d, [self.design.q1])), 700.0))

    def _step(self) -> None:
        e_value = self._e_value()
        self.path.append(math.log10(e_value))
        self.max_e_value = max(self.max_e_value, e_value)
        d, s = self.a_only + self.b_only, self.b_only - self.a_only
        reject, futile, _ = self.design.thresholds(d)
        if abs(s) >= reject:
            self._decide(s, f"|B only - A only| = {abs(s)} >= {reject} after {d} discordant pairs")
        elif abs(s) <= futile:
            self._refuse_if_errors(NO_DIFFERENCE, f"|B only - A only| = {abs(s)} <= futility bound {futile} after "
                                   f"{d} discordant pairs: a difference of {self.design.min_difference:g} is unlikely")  # fmt: skip
        elif self.pairs >= self.max_pairs:
            self._final_look(f"reached max_pairs {self.max_pairs}")
        else:
            self._decision = self._state(CONTINUE, None, f"|B only - A only| = {abs(s)} after {d} discordant pairs "
                                         f"(decide at {reject}, futile at {futile}): continue")  # fmt: skip

    def _final_look(self, where: str) -> None:
        d, s = self.a_only + self.b_only, self.b_only - self.a_only
        _, _, final = self.design.thresholds(d)
        if abs(s) >= final:
            self._decide(s, f"{where}; final look: |B only - A only| = {abs(s)} >= {final} after {d} discordant pairs")
        else:
            self._refuse_if_errors(MAX_PAIRS, f"{where} without a decision (|B only - A only| = {abs(s)} < final "
                                   f"threshold {final} after {d} discordant pairs)")  # fmt: skip

    def errors_p_value(self) -> float:
        """Exact McNemar p-value of the pairs where only A errored against those where only B errored."""
        return mcnemar_exact_p(self.errored_a, self.errored_b)

    def _refuse_if_errors(self, reason: str, why: str, better: str | None = None) -> None:
        p = self.errors_p_value()
        if p <= self.alpha:
            why = (f"refused to decide: errors differ between arms (only A errored in {self.errored_a} pairs, only B "
                   f"in {self.errored_b}; exact McNemar p = {p:.3g} <= {self.alpha:g}); the rule said: {why}")  # fmt: skip
            self._decision = self._state(ERRORS_DIFFER, None, why, stop=True)
        else:
            self._decision = self._state(reason, better, why, stop=True)

    def _decide(self, s: int, why: str) -> None:
        better = "b" if s > 0 else "a"
        self._refuse_if_errors(B_BETTER if better == "b" else A_BETTER,
                               f"{why}: {better.upper()} is better (alpha {self.alpha:g})", better)  # fmt: skip

    def _state(self, reason: str, better: str | None, why: str, *, stop: bool = False) -> SequentialDecision:
        counts = f"{self.pairs} pairs (A only {self.a_only}, B only {self.b_only}, errored {self.errored})"
        return SequentialDecision(
            stop=stop, reason=reason, better=better, pairs=self.pairs, errored=self.errored,
            errored_a=self.errored_a, errored_b=self.errored_b, errored_both=self.errored_both,
            a_only=self.a_only, b_only=self.b_only, e_value=self._e_value(),
            p_value=min(1.0, 1.0 / self.max_e_value), errors_p_value=self.errors_p_value(),
            why=f"{why}; {counts}",
        )  # fmt: skip

    def power(self, pairs: int | None = None) -> float:
        """The exact power at the design's planned point when the run gives the test ``pairs`` pairs (default:
        :attr:`max_pairs`): the stated power when the budget reaches the design's cap, less below it."""
        return self.design.power_at(self.max_pairs if pairs is None else min(int(pairs), self.max_pairs))

    def to_dict(self) -> dict:
        """The design, the budget and the power it gives, the e-value path and the current decision, for
        ``summary.json``."""
        return {
            "method": "truncated two-sided SPRT on discordant pairs in plan order, futility bound, "
            "alpha spent exactly up to the cap",
            "design": self.design.to_dict(),
            "alpha": self.alpha,
            "max_pairs": self.max_pairs,
            "budget": self.budget,
            "power": self.power(),
            "below_cap": self.max_pairs < self.design.max_pairs,
            "ignored_after_stop": self.ignored,
            "log10_e_path": [round(v, 4) for v in self.path],
            **self._decision.to_dict(),
        }
