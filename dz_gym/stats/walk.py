"""Exact operating characteristics of a sequential paired test, by dynamic programming over the discordant walk.

Only discordant pairs (one arm succeeds, the other fails) carry information about which arm is better. Call
``S`` the number of B-only minus A-only pairs after ``d`` discordant pairs: ``S`` is a random walk that steps
+1 with probability ``q`` (a discordant pair is B-only) and -1 otherwise. "No difference" is ``q = 1/2``,
whatever the concordance rate. A stopping rule that looks only at ``(d, S)`` is described by two integer
sequences per ``d`` (:class:`Boundaries`): stop with a decision when ``|S| >= reject[d]`` (the sign of ``S``
names the better arm), stop with "no difference" (futility) when ``|S| <= futile[d]``. The walk is truncated
at ``cap`` discordant pairs; at truncation a final look decides when ``|S| >= final[d]``.

:func:`walk` pushes the probability mass through the continuation region step by step (no sampling) and
returns, per step, the mass absorbed by each boundary and, for a truncation at that step, what the final look
decides. In pair time, the discordant pairs arrive as a Bernoulli(``pi``) thinning independent of the signs,
so a run capped at ``n`` pairs truncates the walk at ``D ~ Binomial(n, pi)``: :func:`pair_characteristics`
mixes the walk's step arrays over that law and over the position of the ``j``-th discordant pair
(negative binomial), which gives the exact rejection rates, expected pairs and the expected estimate at stop.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["Boundaries", "PairCharacteristics", "WalkResult", "binomial_pmf", "pair_characteristics", "walk"]


@dataclass(frozen=True)
class Boundaries:
    """Integer stopping thresholds on ``|S|`` per discordant count ``d`` (index 0..cap).

    ``reject[d]``: decide when ``|S| >= reject[d]``; ``futile[d]``: stop for futility when ``|S| <= futile[d]``
    (-1: never); ``final[d]``: at a truncation after ``d`` discordant pairs, decide when ``|S| >= final[d]``.
    """

    reject: np.ndarray
    futile: np.ndarray
    final: np.ndarray

    @property
    def cap(self) -> int:
        return len(self.reject) - 1


@dataclass(frozen=True)
class WalkResult:
    """Per step ``j`` (0..cap) of the walk with success probability ``q``.

    ``up[j]`` / ``down[j]``: mass that stops at step ``j`` deciding B better / A better; ``futile[j]``: mass
    that stops there for futility; ``alive[j]``: mass still running after step ``j``; ``final_up[j]`` /
    ``final_down[j]``: mass that the final look at a truncation at step ``j`` would decide (part of
    ``alive[j]``); ``s_stop[j]``: sum of ``S`` weighted by the mass stopping at ``j``; ``s_alive[j]``: the
    same for the mass alive at ``j``.
    """

    up: np.ndarray
    down: np.ndarray
    futile: np.ndarray
    alive: np.ndarray
    final_up: np.ndarray
    final_down: np.ndarray
    s_stop: np.ndarray
    s_alive: np.ndarray


def walk(bounds: Boundaries, q: float) -> WalkResult:
    """The walk's step arrays under ``P(step +1) = q`` (see :class:`WalkResult`).

    The mass still running has ``|S| < reject``, so the walk is kept on the window ``|S| <= max(reject)``."""
    cap = bounds.cap
    width = int(min(cap, int(bounds.reject.max()))) + 1
    s = np.arange(-width, width + 1)
    mass = np.zeros(2 * width + 1)
    mass[width] = 1.0
    out = {name: np.zeros(cap + 1) for name in WalkResult.__dataclass_fields__}
    for j in range(cap + 1):
        if j:
            new = np.zeros_like(mass)
            new[1:] += q * mass[:-1]
            new[:-1] += (1 - q) * mass[1:]
            mass = new
        up = s >= bounds.reject[j]
        down = s <= -bounds.reject[j]
        fut = (np.abs(s) <= bounds.futile[j]) & ~up & ~down
        stop = up | down | fut
        out["up"][j] = mass[up].sum()
        out["down"][j] = mass[down].sum()
        out["futile"][j] = mass[fut].sum()
        out["s_stop"][j] = mass[stop] @ s[stop]
        mass[stop] = 0.0
        out["alive"][j] = mass.sum()
        out["s_alive"][j] = mass @ s
        out["final_up"][j] = mass[s >= bounds.final[j]].sum()
        out["final_down"][j] = mass[s <= -bounds.final[j]].sum()
    return WalkResult(**out)


def binomial_pmf(n: int, p: float) -> np.ndarray:
    """P(Binomial(n, p) = k) for k = 0..n, by the recurrence (exact to rounding; no special functions)."""
    row = np.zeros(n + 1)
    row[0] = 1.0
    for i in range(n):
        row[1 : i + 2] = row[1 : i + 2] * (1 - p) + row[: i + 1] * p
        row[0] *= 1 - p
    return row


def _arrival_moments(pairs: int, pi: float, cap: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """For j = 0..cap: E[min(G_j, pairs)], E[1 / G_j ; G_j <= pairs] and P(G_j <= pairs), where G_j is the
    position (1-based) of the j-th discordant pair among pairs that are discordant with probability ``pi``."""
    mean_min = np.zeros(cap + 1)
    inv = np.zeros(cap + 1)
    reached = np.zeros(cap + 1)
    row = np.zeros(cap + 2)  # P(D_n = k), k = 0..cap+1 (the last entry: >= cap + 1)
    row[0] = 1.0
    for n in range(pairs):
        # P(G_j > n) = P(D_n <= j - 1)
        below = np.cumsum(row[: cap + 1])  # P(D_n <= k) for k = 0..cap
        mean_min[1:] += below[:cap]
        # G_j = n + 1 exactly: D_n = j - 1 and pair n + 1 discordant
        inv[1:] += row[:cap] * pi / (n + 1)
        reached[1:] += row[:cap] * pi
        nxt = row * (1 - pi)
        nxt[1:] += row[:-1] * pi
        nxt[-1] += row[-1] * pi
        row = nxt
    reached[0] = 1.0
    return mean_min, inv, reached


@dataclass(frozen=True)
class PairCharacteristics:
    """Exact operating characteristics of the rule on a run capped at ``pairs`` pairs.

    ``b_better`` / ``a_better``: probability of each decision; ``futile``: stopped early for "no
    difference"; ``mean_pairs``: expected pairs used; ``mean_estimate``: expected ``S / pairs`` at the stop
    (the naive difference estimate, B - A).
    """

    b_better: float
    a_better: float
    futile: float
    mean_pairs: float
    mean_estimate: float


def pair_characteristics(bounds: Boundaries, pairs: int, pi: float, q: float,
                         walked: WalkResult | None = None) -> PairCharacteristics:  # fmt: skip
    """The rule's characteristics when each pair is discordant with probability ``pi`` and a discordant pair
    is B-only with probability ``q``, the run capped at ``pairs`` pairs (the walk truncated at ``D_pairs``).
    ``walked``: ``walk(bounds, q)`` when already computed (it does not depend on ``pairs`` or ``pi``)."""
    cap = bounds.cap
    if pairs > cap:
        raise ValueError(f"pairs: expected at most the walk's cap {cap}, got {pairs}")
    w = walk(bounds, q) if walked is None else walked
    mean_min, inv, reached = _arrival_moments(pairs, pi, cap)
    trunc = binomial_pmf(pairs, pi)  # P(D_pairs = j), j = 0..pairs
    trunc = np.concatenate([trunc, np.zeros(cap - pairs)])
    stopped = w.up + w.down + w.futile
    b_better = float((w.up * reached).sum() + (trunc * w.final_up).sum())
    a_better = float((w.down * reached).sum() + (trunc * w.final_down).sum())
    futile = float((w.futile * reached).sum())
    mean_pairs = float((stopped * mean_min).sum() + pairs * w.alive[cap])
    mean_estimate = float((w.s_stop * inv).sum() + (trunc * w.s_alive).sum() / max(pairs, 1))
    return PairCharacteristics(b_better, a_better, futile, mean_pairs, mean_estimate)
