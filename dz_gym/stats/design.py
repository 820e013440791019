"""The sequential A/B design: a truncated two-sided SPRT on discordant pairs with a futility bound, its cap
chosen from what a user knows, its alpha spent exactly up to the cap (pure, no I/O).

What the user states: the smallest difference in success rate they care about (``min_difference``, B - A in
either direction), the power wanted at that difference, and ``alpha``. The number of pairs any paired test
needs also depends on how often the two arms disagree on a seed (the discordance ``pi``), which nobody knows
in advance; among runs whose same-seed outcomes are not negatively correlated, ``pi`` is largest, and the
test slowest, at ``pi = (1 + delta^2) / 2`` (the arms' rates straddling 1/2, outcomes independent). The
design plans for that worst case: at the planned difference a discordant pair is B-only with probability
``q1 = 1/2 + delta / (2 pi)``, and every run with a difference of at least ``delta`` and non-negative
correlation has at least the stated power.

The rule, on ``S`` = B-only minus A-only after ``d`` discordant pairs (:mod:`dz_gym.stats.walk`):

- decide (the sign of ``S`` names the better arm) when ``|S| >= a + b d``;
- stop for "no difference" when ``|S| <= b d - c`` (futility);
- at the cap (``max_pairs`` pairs, or any earlier end of the budget), decide when ``|S| >= final[d]``.

``b`` is the slope of Wald's SPRT lines for ``q1`` against 1/2; ``a`` and ``c`` are Wald's offsets for the
error rates scaled by tuning factors (see :data:`REJECT_SCALE`, :data:`FUTILITY_SCALE`, measured in
``benchmarks/bench_ab.py``). Each claim ("B better", and its mirror) spends at most ``alpha / 2``, counted on
the walk where crossing towards that claim and the futility band absorb but crossing the *other* way does not:
``final[d]`` is the smallest threshold for which the probability, under "no difference", of crossing up to
``d`` discordant pairs plus deciding at a final look at ``d`` is at most ``alpha / 2`` there, raised where
needed so that it changes by at most 1 from one ``d`` to the next (as ``a + b d`` does). It is computed exactly
for every ``d``, so the type-I error is at most ``alpha`` whatever the concordance rate and wherever the budget
ends (a run that ends after ``n`` pairs has looked at a truncation ``d <= n`` that does not depend on the
signs). Those two properties are what let :mod:`dz_gym.stats.sequential` judge each claim with the errored
episodes imputed against it (docs/compare.md, "Errored episodes"); for the walk without errors they cost
nothing measurable: the thresholds differ from a two-sided calibration only where no mass is left. The cap is
the smallest number of pairs that gives the stated power at the planned point, computed exactly.

A run whose budget ends before the cap keeps the type-I guarantee but not the power: :meth:`SequentialDesign.power_at`
gives the power it actually has at the planned point, exactly (the same walk, truncated at the budget). The
evaluator refuses such a budget unless told to run it, and then reports that power, never the planned one.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from dz_gym.stats.walk import Boundaries, PairCharacteristics, pair_characteristics, walk

__all__ = ["FUTILITY_SCALE", "REJECT_SCALE", "SequentialDesign", "planning_discordance"]

# Tuning of Wald's offsets (a = REJECT_SCALE * a_Wald, c = FUTILITY_SCALE * c_Wald), chosen in
# benchmarks/bench_ab.py for the fewest expected pairs at the planned difference and under no difference.
REJECT_SCALE = 0.8
FUTILITY_SCALE = 0.7
MAX_CAP = 20_000


def planning_discordance(min_difference: float) -> float:
    """The largest discordance ``(1 + delta^2) / 2`` a difference ``delta`` has when same-seed outcomes are
    not negatively correlated: the worst case for the number of pairs."""
    return (1.0 + float(min_difference) ** 2) / 2.0


def _check(name: str, value: float, low: float, high: float) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not low < float(value) < high:
        raise ValueError(f"{name}: expected a number in ({low:g}, {high:g}), got {value!r}")
    return float(value)


def _lipschitz_above(values: np.ndarray) -> np.ndarray:
    """The smallest sequence ``>= values`` that changes by at most 1 from one ``d`` to the next."""
    out = values.copy()
    for d in range(1, len(out)):
        out[d] = max(out[d], out[d - 1] - 1)
    for d in range(len(out) - 2, -1, -1):
        out[d] = max(out[d], out[d + 1] - 1)
    return out


def _final_thresholds(reject: np.ndarray, futile: np.ndarray, alpha: float) -> tuple[np.ndarray, float]:
    """``final[d]``: under "no difference", P(cross up by d) + P(alive at d, S >= final[d]) <= alpha / 2 on the
    walk where crossing up and the futility band absorb but crossing *down* does not (the bound that makes the
    rule valid when errored pairs are imputed, see :mod:`dz_gym.stats.sequential`), raised to the smallest
    sequence that changes by at most 1 per discordant pair; and P(cross up by the cap) on that walk.

    The walk is kept on ``-cap <= S <= max(reject)`` (the rest is absorbed above, or unreachable below)."""
    cap = len(reject) - 1
    top = int(min(cap, int(reject.max()))) + 1
    s = np.arange(-cap - 1, top + 1)
    zero = cap + 1  # index of S = 0
    mass = np.zeros(len(s))
    mass[zero] = 1.0
    crossed = 0.0
    final = np.empty(cap + 1, dtype=np.int64)
    for j in range(cap + 1):
        if j:
            new = np.zeros_like(mass)
            new[1:] += 0.5 * mass[:-1]
            new[:-1] += 0.5 * mass[1:]
            mass = new
        hit = s >= reject[j]
        crossed += mass[hit].sum()
        mass[hit | (np.abs(s) <= futile[j])] = 0.0
        budget = alpha / 2 - crossed
        # tail[m] = P(alive, S >= m) for m = 0..top + 1
        tail = np.cumsum(mass[zero:][::-1])[::-1]
        tail = np.concatenate([tail, [0.0]])
        ok = np.nonzero(tail <= budget * (1 + 1e-12))[0]
        final[j] = max(int(ok[0]), 1) if ok.size else j + 1  # j + 1: never (|S| <= j)
    final = np.minimum(final, np.arange(cap + 1) + 1)  # thresholds above d are all "never"
    return _lipschitz_above(final), crossed


@lru_cache(maxsize=64)
def _bounds(q1: float, alpha: float, beta: float, cap: int, reject_scale: float, futility_scale: float):
    up, down = math.log(2 * q1), math.log(2 * (1 - q1))
    slope = -(up + down) / (up - down)
    a = reject_scale * 2 * math.log((1 - beta) / (alpha / 2)) / (up - down)
    c = futility_scale * -2 * math.log(beta / (1 - alpha)) / (up - down)
    d = np.arange(cap + 1)
    reject = np.ceil(a + slope * d - 1e-9).astype(np.int64)
    futile = np.floor(slope * d - c + 1e-9).astype(np.int64)
    futile = np.minimum(futile, reject - 1)
    futile = np.where(futile < 0, -1, futile)
    final, crossed = _final_thresholds(reject, futile, alpha)
    return Boundaries(reject, futile, final), slope, a, c, crossed


def _calibrated(q1: float, alpha: float, beta: float, cap: int, reject_scale: float, futility_scale: float):
    """:func:`_bounds`, with the reject offset raised until crossing up alone spends at most alpha / 2 by the
    cap (on the walk of :func:`_final_thresholds`)."""
    while True:
        *out, crossed = _bounds(q1, alpha, beta, cap, reject_scale, futility_scale)
        if crossed <= alpha / 2:
            return out
        reject_scale *= 1.05


@lru_cache(maxsize=32)
def _planned(cls, delta, alpha, power, pi, reject_scale, futility_scale):
    """Designs are pure functions of their settings: plan each once per process (resume, summaries)."""
    return cls._search(delta, alpha, power, pi, reject_scale, futility_scale)


@dataclass(frozen=True)
class SequentialDesign:
    """A calibrated design (see the module docstring); build it with :meth:`plan`."""

    alpha: float
    power: float
    min_difference: float
    discordance: float
    q1: float
    slope: float
    reject_offset: float
    futility_offset: float
    max_pairs: int
    bounds: Boundaries

    @classmethod
    def plan(cls, min_difference: float, *, alpha: float = 0.05, power: float = 0.8,
             discordance: float | None = None, reject_scale: float = REJECT_SCALE,
             futility_scale: float = FUTILITY_SCALE) -> SequentialDesign:  # fmt: skip
        """The design for ``min_difference`` at ``power`` and ``alpha``; ``discordance``: the planning
        discordance (default :func:`planning_discordance`: the worst case without negative correlation)."""
        delta = _check("min_difference", min_difference, 0.0, 1.0)
        alpha = _check("alpha", alpha, 0.0, 0.5)
        power = _check("power", power, alpha, 1.0)
        pi = planning_discordance(delta) if discordance is None else _check("discordance", discordance, 0.0, 1.0001)
        if delta > pi:
            raise ValueError(f"discordance: expected at least min_difference {delta:g}, got {pi:g}")
        return _planned(cls, delta, alpha, power, pi, float(reject_scale), float(futility_scale))

    @classmethod
    def _search(cls, delta: float, alpha: float, power: float, pi: float, reject_scale: float,
                futility_scale: float) -> SequentialDesign:  # fmt: skip
        """The cap search of :meth:`plan` (settings already checked)."""
        q1 = min(0.5 + delta / (2 * pi), 1 - 1e-9)
        cap, last = 64, 0.0
        while True:
            bounds, slope, a, c = _calibrated(q1, alpha, 1 - power, cap, reject_scale, futility_scale)
            reached = pair_characteristics(bounds, cap, pi, q1).b_better
            if reached >= power:
                break
            if cap >= MAX_CAP:
                raise ValueError(f"min_difference {delta:g}: the design needs more than {MAX_CAP} pairs")
            if reached - last < (power - reached) / 4:
                # A longer cap barely helps: the futility bound limits the power; loosen it.
                futility_scale *= 1.15
            last = reached
            cap = min(MAX_CAP, cap * 2)
        lo, hi = 1, cap  # power(hi) >= power; find the smallest such cap (power is close to monotone in n)
        walked = walk(bounds, q1)
        while lo < hi:
            mid = (lo + hi) // 2
            if pair_characteristics(bounds, mid, pi, q1, walked).b_better >= power:
                hi = mid
            else:
                lo = mid + 1
        return cls(alpha, power, delta, pi, q1, slope, a, c, hi, bounds)

    def characteristics(self, pi: float, q: float, pairs: int | None = None) -> PairCharacteristics:
        """Exact operating characteristics at discordance ``pi`` and B-only share ``q`` (cap: ``pairs``)."""
        return pair_characteristics(self.bounds, self.max_pairs if pairs is None else pairs, pi, q)

    def power_at(self, pairs: int) -> float:
        """The exact power at the planned point (``min_difference`` at the planning discordance) of a run whose
        budget is ``pairs`` pairs (the cap when larger): the stated power at the cap, less below it.

        >>> design = SequentialDesign.plan(0.2)
        >>> design.power_at(design.max_pairs) >= 0.8 > design.power_at(design.max_pairs // 2)
        True
        """
        if isinstance(pairs, bool) or not isinstance(pairs, int) or pairs < 1:
            raise ValueError(f"pairs: expected an integer >= 1, got {pairs!r}")
        return self.characteristics(self.discordance, self.q1, min(pairs, self.max_pairs)).b_better

    def estimate_bias(self, pi: float, difference: float, pairs: int | None = None) -> float:
        """E[naive estimate at the stop] - difference, exactly, at discordance ``pi`` (cap: ``pairs``)."""
        pi = max(float(pi), abs(float(difference)), 1e-9)
        q = min(max(0.5 + float(difference) / (2 * pi), 0.0), 1.0)
        return self.characteristics(pi, q, pairs).mean_estimate - float(difference)

    def thresholds(self, discordant: int) -> tuple[int, int, int]:
        """``(reject, futile, final)`` thresholds on ``|S|`` after ``discordant`` discordant pairs."""
        d = min(int(discordant), self.bounds.cap)
        return int(self.bounds.reject[d]), int(self.bounds.futile[d]), int(self.bounds.final[d])

    def to_dict(self) -> dict:
        return {
            "rule": "truncated two-sided SPRT on discordant pairs with a futility bound; alpha spent up to the cap",
            "alpha": self.alpha,
            "power_at_cap": self.power,
            "min_difference": self.min_difference,
            "planning_discordance": self.discordance,
            "q1": self.q1,
            "decide_if": f"|B only - A only| >= {self.reject_offset:.4g} + {self.slope:.4g} * discordant",
            "futile_if": f"|B only - A only| <= {self.slope:.4g} * discordant - {self.futility_offset:.4g}",
            "max_pairs": self.max_pairs,
        }
