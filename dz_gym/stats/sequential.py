"""An anytime-valid sequential test on paired outcomes: stop as soon as the discordant pairs decide.

Only discordant pairs (one arm succeeded, the other not) tell which arm is better. Under "no difference"
each discordant pair is B-only with probability 1/2, whatever happened before. For an alternative ``q`` (the
probability that a discordant pair is B-only) the likelihood ratio after ``K`` B-only pairs among ``D``
discordant ones is ``(2q)^K (2(1-q))^(D-K)``; any average of such ratios over a fixed set of alternatives is a
nonnegative martingale with mean 1 under the null (a *test martingale*, or e-process). By Ville's inequality
it ever reaches ``1/alpha`` with probability at most ``alpha``, so the rule "reject the first time the
e-value reaches 1/alpha" keeps the type-I error at most ``alpha`` at any stopping time: after every pair,
after a data-dependent number of pairs, or when the run is cut short (Ramdas et al., "Game-theoretic
statistics and safe anytime-valid inference", 2023). Concordant pairs multiply it by 1.

The default mixture puts equal weight on q in :data:`DEFAULT_ALTERNATIVES` (B better) and on their mirror
images 1 - q (A better). The e-value is ``(E_b + E_a) / 2``, with ``E_b`` (``E_a``) the average over the
B-better (A-better) alternatives; at a rejection the better arm is the one whose half is larger. Claiming "B
better" then implies ``E_b >= 1/alpha``, and ``E_b`` is a supermartingale whenever B is not better, so the
probability of naming the wrong arm is at most ``alpha`` as well.

:class:`SequentialPairTest` is the stateful rule a runner calls with the pairs as they complete
(``update``); it records why it stopped. :func:`log_e_values` is the same e-value as a vectorized numpy
function, for simulations.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass

import numpy as np

__all__ = ["DEFAULT_ALTERNATIVES", "SequentialDecision", "SequentialPairTest", "log_e_values"]

# P(a discordant pair is B-only) under the B-better alternatives of the mixture (mirrored for A better).
# Chosen for differences in success rate of about 0.1-0.3 (benchmarks/bench_ab.py).
DEFAULT_ALTERNATIVES: tuple[float, ...] = (0.65, 0.75, 0.85)

CONTINUE = "continue"
B_BETTER = "b_better"
A_BETTER = "a_better"
MAX_PAIRS = "max_pairs"


def _check_alternatives(alternatives: Sequence[float]) -> np.ndarray:
    qs = np.asarray([float(q) for q in alternatives], dtype=np.float64)
    if qs.size == 0 or not np.all((qs > 0.5) & (qs < 1.0)):
        raise ValueError(f"alternatives: expected probabilities in (0.5, 1), got {list(alternatives)!r}")
    return qs


def _log_halves(b_only, discordant, qs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """log E_b and log E_a (averages over the B-better and the mirrored A-better alternatives)."""
    k = np.asarray(b_only, dtype=np.float64)[..., None]
    d = np.asarray(discordant, dtype=np.float64)[..., None]
    up, down = np.log(2 * qs), np.log(2 * (1 - qs))
    log_b = k * up + (d - k) * down
    log_a = k * down + (d - k) * up
    shift = math.log(qs.size)

    def lse(x: np.ndarray) -> np.ndarray:
        top = x.max(axis=-1)
        return top + np.log(np.exp(x - top[..., None]).sum(axis=-1)) - shift

    return lse(log_b), lse(log_a)


def log_e_values(b_only, discordant, alternatives: Sequence[float] = DEFAULT_ALTERNATIVES) -> np.ndarray:
    """log of the mixture e-value after ``b_only`` B-only pairs among ``discordant`` ones (broadcasting)."""
    log_b, log_a = _log_halves(b_only, discordant, _check_alternatives(alternatives))
    return np.logaddexp(log_b, log_a) - math.log(2)


@dataclass(frozen=True)
class SequentialDecision:
    """Where the sequential test stands after the pairs seen so far.

    ``stop``: whether to stop; ``reason``: ``"continue"``, ``"b_better"`` / ``"a_better"`` (the null of no
    difference was rejected) or ``"max_pairs"`` (the cap was reached without a decision); ``better``: ``"a"``,
    ``"b"`` or ``None``; ``why``: one sentence for logs and summaries.
    """

    stop: bool
    reason: str
    better: str | None
    pairs: int
    errored: int
    a_only: int
    b_only: int
    e_value: float
    threshold: float
    p_value: float  # anytime-valid p-value: min(1, 1 / largest e-value so far)
    why: str

    def to_dict(self) -> dict:
        return asdict(self)


class SequentialPairTest:
    """The sequential rule: feed completed pairs with :meth:`update`, stop when ``decision.stop``.

    ``alpha``: the type-I error bound (rejection when the e-value reaches ``1/alpha``); ``max_pairs``: stop
    without a decision after this many usable pairs (``None``: no cap); ``alternatives``: see the module
    docstring. Once stopped, the decision is final: later pairs are counted in ``ignored`` and change
    nothing, so pairs already in flight when the runner stopped cannot alter the verdict.
    """

    def __init__(self, alpha: float = 0.05, max_pairs: int | None = None,
                 alternatives: Sequence[float] = DEFAULT_ALTERNATIVES):  # fmt: skip
        if not 0.0 < float(alpha) < 1.0:
            raise ValueError(f"alpha: expected a number in (0, 1), got {alpha!r}")
        if max_pairs is not None and (isinstance(max_pairs, bool) or not isinstance(max_pairs, int) or max_pairs < 1):
            raise ValueError(f"max_pairs: expected an integer >= 1 or None, got {max_pairs!r}")
        self.alpha = float(alpha)
        self.max_pairs = max_pairs
        self.alternatives = tuple(float(q) for q in _check_alternatives(alternatives))
        self._qs = np.asarray(self.alternatives)
        self.threshold = 1.0 / self.alpha
        self.pairs = 0
        self.errored = 0
        self.a_only = 0
        self.b_only = 0
        self.ignored = 0
        self.max_e_value = 1.0
        self._decision = self._decide(1.0, 1.0)

    @property
    def decision(self) -> SequentialDecision:
        return self._decision

    def update(self, outcomes: Iterable[tuple[bool | None, bool | None]]) -> SequentialDecision:
        """Fold in completed pairs ``(a_success, b_success)`` in completion order; returns the decision.

        A pair with ``None`` on either side (an errored episode) is counted in ``errored`` and left out.
        The rule is checked after every pair, so a batch gives the same result as one pair at a time.
        """
        for a, b in outcomes:
            if self._decision.stop:
                self.ignored += 1
                continue
            if a is None or b is None:
                self.errored += 1
                self._decision = self._decide(*self._halves())
                continue
            self.pairs += 1
            if bool(a) and not bool(b):
                self.a_only += 1
            elif bool(b) and not bool(a):
                self.b_only += 1
            self._decision = self._decide(*self._halves())
        return self._decision

    def _halves(self) -> tuple[float, float]:
        log_b, log_a = _log_halves(self.b_only, self.a_only + self.b_only, self._qs)
        return math.exp(min(float(log_b), 700.0)), math.exp(min(float(log_a), 700.0))

    def _decide(self, e_b: float, e_a: float) -> SequentialDecision:
        e_value = (e_b + e_a) / 2
        self.max_e_value = max(self.max_e_value, e_value)
        counts = f"{self.pairs} pairs (A only {self.a_only}, B only {self.b_only}, errored {self.errored})"
        if e_value >= self.threshold:
            better = "b" if e_b >= e_a else "a"
            reason = B_BETTER if better == "b" else A_BETTER
            why = (f"e-value {e_value:.3g} >= 1/alpha = {self.threshold:.3g} after {counts}: "
                   f"{better.upper()} is better (anytime-valid, alpha {self.alpha:g})")  # fmt: skip
            stop = True
        elif self.max_pairs is not None and self.pairs >= self.max_pairs:
            better, reason, stop = None, MAX_PAIRS, True
            why = f"reached max_pairs {self.max_pairs} without a decision (e-value {e_value:.3g} < {self.threshold:.3g}) after {counts}"
        else:
            better, reason, stop = None, CONTINUE, False
            why = f"e-value {e_value:.3g} < {self.threshold:.3g} after {counts}: continue"
        return SequentialDecision(
            stop=stop, reason=reason, better=better, pairs=self.pairs, errored=self.errored,
            a_only=self.a_only, b_only=self.b_only, e_value=e_value, threshold=self.threshold,
            p_value=min(1.0, 1.0 / self.max_e_value), why=why,
        )  # fmt: skip

    def to_dict(self) -> dict:
        """The settings and the current decision, for ``summary.json``."""
        return {
            "method": "mixture likelihood-ratio e-process on discordant pairs (anytime-valid)",
            "alpha": self.alpha,
            "max_pairs": self.max_pairs,
            "alternatives": list(self.alternatives),
            "ignored_after_stop": self.ignored,
            **self._decision.to_dict(),
        }
