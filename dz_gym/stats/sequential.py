"""The sequential A/B rule a runner feeds pair by pair, in plan order: decide, stop for futility, or go on.

:class:`SequentialPairTest` applies a :class:`~dz_gym.stats.design.SequentialDesign` (a truncated two-sided
SPRT on discordant pairs with a futility bound, type-I error at most ``alpha`` exactly, whatever the
concordance rate and wherever the budget ends) to pairs ``(a_success, b_success)`` given **in the order of
the run plan**: the design's guarantee needs the sequence of pairs to be fixed before the outcomes are known,
so a runner must hold a pair that completed early until every pair before it is in (``dz_gym.eval.ab``).

Errored episodes (what still errored after the runner's retries) are resolved by the rule, not dropped: a
pair with an errored episode counts as a pair, and a claim counts only if it holds whatever the errored
episodes' outcomes would have been. "B better" is judged on the walk where every errored episode is imputed
the worst way for that claim (B's errors as failures, A's as successes), "A better" on the mirror walk, each at
``alpha / 2`` (the design's thresholds are symmetric and calibrated one-sided, see
:mod:`dz_gym.stats.design`); the rule stops as soon as *some* completion of the errored outcomes is in the
futility band. Whatever the errors depend on (the outcome, the seed, the arm), this keeps each claim's error at
most ``alpha / 2``; the proof is in docs/compare.md ("Errored episodes"). The stop is needed for that proof (the
design's final thresholds count the futility band as absorbing: a run that went on past it could reach them
with far more than ``alpha``), but the *claim* "no difference" is the least favourable one: it is made
(``no_difference``) only when *every* completion is in the band; when only some are, the run stops undecided
(``errors_undecided``): the errored pairs leave open whether a difference of ``min_difference`` is unlikely.
The counts per arm (``errored_a``, ``errored_b``, ``errored_both``) and the decision the rule would reach with
the errored pairs dropped (``without_errored``, for information only) are reported; ``errors_p_value`` (exact McNemar of the
pairs where only A errored against those where only B errored) says whether errors look arm-dependent.

The e-value path: after each pair, ``(LR_b + LR_a) / 2`` with ``LR_b`` the likelihood ratio of the design's
alternative ``q1`` against 1/2 on the walk imputed against B, ``LR_a`` its mirror on the walk imputed against
A. Each is at most its value on the true outcomes, a test martingale under "no difference", so
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
ERRORS_DIFFER = "errors_differ"  # older runs only: the rule no longer refuses, it bounds the errors
ERRORS_UNDECIDED = "errors_undecided"  # some completion of the errored outcomes is futile, not every one


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


def _log_lr(wins, losses, q: float) -> float:
    """log of ``(2q)^wins (2(1-q))^losses``: the evidence for the side that won ``wins`` discordant pairs."""
    return wins * math.log(2 * q) + losses * math.log(2 * (1 - q))


@dataclass(frozen=True)
class SequentialDecision:
    """Where the rule stands after the pairs seen so far.

    ``stop``: whether to stop; ``reason``: ``continue``, ``b_better`` / ``a_better``, ``no_difference``
    (futility: a difference of ``min_difference`` is unlikely, whatever the errored outcomes),
    ``errors_undecided`` (stopped in the futility band of some completion of the errored outcomes but not of
    every one: no claim), ``max_pairs`` (the cap or the budget ended without a decision); ``better``: ``"a"``,
    ``"b"`` or ``None``; ``pairs``: pairs folded (errored ones included); ``a_only`` / ``b_only``: discordant pairs among those without errors; ``worst_for_b`` /
    ``worst_for_a``: the ``[A only, B only]`` counts with the errored episodes imputed against B / against A
    (the walks the claims are judged on); ``without_errored``: the reason the rule would give with the errored
    pairs dropped (None when nothing errored); ``why``: one sentence for logs and summaries.
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
    worst_for_b: tuple[int, int]
    worst_for_a: tuple[int, int]
    without_errored: str | None
    e_value: float
    p_value: float
    errors_p_value: float
    why: str

    def to_dict(self) -> dict:
        out = asdict(self)
        out["worst_for_b"], out["worst_for_a"] = list(self.worst_for_b), list(self.worst_for_a)
        return out


class SequentialPairTest:
    """Feed pairs in plan order with :meth:`update`; call :meth:`finish` when the budget ends undecided.

    ``design``: the calibrated rule (default: :meth:`SequentialDesign.plan` for ``min_difference`` at
    ``power`` and ``alpha``); ``max_pairs``: the run's budget of pairs, errored ones included (the design's
    cap when larger or ``None``). Once stopped the decision is final; later pairs are counted in ``ignored``.
    """

    def __init__(self, alpha: float = 0.05, max_pairs: int | None = None, *,
                 min_difference: float = DEFAULT_MIN_DIFFERENCE, power: float = DEFAULT_POWER,
                 design: SequentialDesign | None = None, _shadow: bool = True):  # fmt: skip
        if max_pairs is not None and (isinstance(max_pairs, bool) or not isinstance(max_pairs, int) or max_pairs < 1):
            raise ValueError(f"max_pairs: expected an integer >= 1 or None, got {max_pairs!r}")
        self.design = design or SequentialDesign.plan(min_difference, alpha=alpha, power=power)
        self.alpha = self.design.alpha
        self.budget = max_pairs
        self.max_pairs = self.design.max_pairs if max_pairs is None else min(max_pairs, self.design.max_pairs)
        self.pairs = self.a_only = self.b_only = 0
        # errored pairs by what the other arm did: A errored while B succeeded / failed, and the mirror
        self.a_err_b_won = self.a_err_b_lost = self.b_err_a_won = self.b_err_a_lost = 0
        self.errored_both = 0
        self.ignored = 0
        self.path: list[float] = []  # log10 e-value after each pair
        self.max_e_value = 1.0
        # the same rule on the pairs without errors, for the summary's "without the errored pairs"
        self.shadow = SequentialPairTest(design=self.design, max_pairs=max_pairs, _shadow=False) if _shadow else None
        self._decision = self._state(CONTINUE, None, "no pairs yet: continue")

    @property
    def decision(self) -> SequentialDecision:
        return self._decision

    @property
    def errored_a(self) -> int:
        return self.a_err_b_won + self.a_err_b_lost

    @property
    def errored_b(self) -> int:
        return self.b_err_a_won + self.b_err_a_lost

    @property
    def errored(self) -> int:
        return self.errored_a + self.errored_b + self.errored_both

    def worst_for_b(self) -> tuple[int, int]:
        """``(A only, B only)`` with B's errors as failures and A's as successes."""
        return self.a_only + self.a_err_b_lost + self.b_err_a_won + self.errored_both, self.b_only

    def worst_for_a(self) -> tuple[int, int]:
        """``(A only, B only)`` with A's errors as failures and B's as successes."""
        return self.a_only, self.b_only + self.a_err_b_won + self.b_err_a_lost + self.errored_both

    def update(self, outcomes: Iterable[tuple[bool | None, bool | None]]) -> SequentialDecision:
        """Fold in pairs ``(a_success, b_success)`` in plan order (``None``: that episode errored)."""
        for a, b in outcomes:
            if self._decision.stop:
                self.ignored += 1
                if self.shadow is not None and a is not None and b is not None:
                    self.shadow.update([(a, b)])  # the rule with errors dropped still sees what comes in
                continue
            self.pairs += 1
            if a is None and b is None:
                self.errored_both += 1
            elif a is None:
                self.a_err_b_won += bool(b)
                self.a_err_b_lost += not bool(b)
            elif b is None:
                self.b_err_a_won += bool(a)
                self.b_err_a_lost += not bool(a)
            else:
                self.a_only += bool(a) and not bool(b)
                self.b_only += bool(b) and not bool(a)
                if self.shadow is not None:
                    self.shadow.update([(a, b)])
            self._step()
        return self._decision

    def finish(self) -> SequentialDecision:
        """The budget ended before the cap (every planned pair is in): the final look at this truncation."""
        if self.shadow is not None:
            self.shadow.finish()
        if not self._decision.stop:
            self._final_look("the planned pairs are done")
        return self._decision

    def _log_e_value(self) -> float:
        (a_up, b_up), (a_dn, b_dn) = self.worst_for_b(), self.worst_for_a()
        q = self.design.q1
        up, down = _log_lr(b_up, a_up, q), _log_lr(a_dn, b_dn, q)
        top = max(up, down)
        return top + math.log(math.exp(up - top) + math.exp(down - top)) - math.log(2)

    def _e_value(self) -> float:
        return math.exp(min(self._log_e_value(), 700.0))

    def _claim(self, look: int) -> tuple[str | None, str]:
        """Which claim holds on its worst-case walk at this look (``look``: 0 reject, 2 final), and why."""
        (a_up, b_up), (a_dn, b_dn) = self.worst_for_b(), self.worst_for_a()
        up = self.design.thresholds(a_up + b_up)[look]
        if b_up - a_up >= up:
            return "b", f"B only - A only = {b_up - a_up} >= {up} after {a_up + b_up} discordant pairs"
        down = self.design.thresholds(a_dn + b_dn)[look]
        if a_dn - b_dn >= down:
            return "a", f"A only - B only = {a_dn - b_dn} >= {down} after {a_dn + b_dn} discordant pairs"
        return None, ""

    def _completions_futile(self) -> tuple[bool, bool]:
        """Whether some, and whether every, outcome of the errored episodes puts the walk in the futility band.

        ``plus`` errored pairs can add a B-only pair or nothing, ``minus`` an A-only pair or nothing, ``both``
        (both errored) either or nothing; with ``k`` of them discordant, ``p`` of those B-only, the walk is at
        ``(d0 + k, s0 + 2p - k)``, and ``p`` ranges over ``[max(0, k - minus - both), min(k, plus + both)]``."""
        plus, minus, both = (
            self.a_err_b_won + self.b_err_a_lost,
            self.a_err_b_lost + self.b_err_a_won,
            self.errored_both,
        )
        d0, s0 = self.a_only + self.b_only, self.b_only - self.a_only
        some, every = False, True
        for k in range(plus + minus + both + 1):
            low, high = max(0, k - minus - both), min(k, plus + both)
            futile = self.design.thresholds(d0 + k)[1]
            if futile < 0:
                every = False
                continue
            band = max(low, math.ceil((k - s0 - futile) / 2)), min(high, math.floor((k - s0 + futile) / 2))
            some = some or band[0] <= band[1]
            every = every and band == (low, high)
        return some, every

    def _step(self) -> None:
        e_value = self._e_value()
        self.path.append(math.log10(e_value))
        self.max_e_value = max(self.max_e_value, e_value)
        better, why = self._claim(0)
        if better is not None:
            self._decide(better, why)
        elif (futile := self._completions_futile())[0]:
            d, s = self.a_only + self.b_only, self.b_only - self.a_only
            where = f"|B only - A only| = {abs(s)} after {d} discordant pairs"
            if not futile[1]:
                self._decision = self._state(ERRORS_UNDECIDED, None, "some outcomes of the errored episodes put the "
                                             "walk in the futility band, others not: no claim (the band ends the "
                                             "test; the errored pairs leave a difference of "
                                             f"{self.design.min_difference:g} open)", stop=True)  # fmt: skip
                return
            if self.errored:
                where = "every outcome of the errored episodes puts the walk in the futility band"
            self._decision = self._state(NO_DIFFERENCE, None, f"{where}: a difference of "
                                         f"{self.design.min_difference:g} is unlikely", stop=True)  # fmt: skip
        elif self.pairs >= self.max_pairs:
            self._final_look(f"reached max_pairs {self.max_pairs}")
        else:
            (a_up, b_up), (a_dn, b_dn) = self.worst_for_b(), self.worst_for_a()
            self._decision = self._state(CONTINUE, None, f"B only - A only = {b_up - a_up} against B, "
                                         f"{b_dn - a_dn} against A: continue")  # fmt: skip

    def _final_look(self, where: str) -> None:
        better, why = self._claim(2)
        if better is not None:
            self._decide(better, f"{where}; final look: {why}")
        else:
            self._decision = self._state(MAX_PAIRS, None, f"{where} without a decision", stop=True)

    def errors_p_value(self) -> float:
        """Exact McNemar p-value of the pairs where only A errored against those where only B errored."""
        return mcnemar_exact_p(self.errored_a, self.errored_b)

    def _decide(self, better: str, why: str) -> None:
        bounded = (f", whatever the {self.errored} errored pairs' outcomes (imputed against {better.upper()})"
                   if self.errored else "")  # fmt: skip
        self._decision = self._state(B_BETTER if better == "b" else A_BETTER, better,
                                     f"{why}: {better.upper()} is better (alpha {self.alpha:g}){bounded}", stop=True)  # fmt: skip

    def _state(self, reason: str, better: str | None, why: str, *, stop: bool = False) -> SequentialDecision:
        counts = f"{self.pairs} pairs (A only {self.a_only}, B only {self.b_only}, errored {self.errored})"
        without = None
        if self.shadow is not None and self.errored:
            without = self.shadow.decision.reason
        return SequentialDecision(
            stop=stop, reason=reason, better=better, pairs=self.pairs, errored=self.errored,
            errored_a=self.errored_a, errored_b=self.errored_b, errored_both=self.errored_both,
            a_only=self.a_only, b_only=self.b_only, worst_for_b=self.worst_for_b(), worst_for_a=self.worst_for_a(),
            without_errored=without, e_value=self._e_value(), p_value=min(1.0, 1.0 / self.max_e_value),
            errors_p_value=self.errors_p_value(), why=f"{why}; {counts}",
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
            "alpha spent exactly up to the cap; each claim judged with the errored episodes imputed against it",
            "design": self.design.to_dict(),
            "alpha": self.alpha,
            "max_pairs": self.max_pairs,
            "budget": self.budget,
            "power": self.power(),
            "below_cap": self.max_pairs < self.design.max_pairs,
            "ignored_after_stop": self.ignored,
            "log10_e_path": [round(v, 4) for v in self.path],
            **self._decision.to_dict(),
            "without_errored": self.without_errored(),
        }

    def without_errored(self) -> str | None:
        """The reason the rule gives on the pairs without errors, every such pair seen included (None when
        nothing errored): information only, the decision is the bounded one."""
        return None if self.shadow is None or not self.errored else self.shadow.decision.reason
