"""Intervals for one success rate and for the difference of two paired success rates (pure, no I/O).

- :func:`wilson_interval`: the Wilson score interval of ``k`` successes in ``n`` trials. It stays inside
  [0, 1] and behaves at ``k = 0`` and ``k = n``, where the Wald interval collapses to a point.
- :func:`paired_difference_interval`: Newcombe's hybrid score interval (Newcombe 1998, *Statistics in
  Medicine* 17:2635, method 10) for ``p_b - p_a`` when both rates come from the same ``n`` pairs (here: the
  same scene and seed run under two policies). It combines the two arms' Wilson intervals with the
  correlation of the paired outcomes, so it inherits their good behaviour near 0 and 1 and with few discordant
  pairs, where the Wald interval of the paired difference misbehaves.
- :func:`imputed_tables` and :func:`bounded_difference_interval`: the same interval when some pairs have an
  errored episode (no outcome): the union of Newcombe's intervals over every outcome the errored episodes
  could have had, whose ends are those of the two tables with the errored outcomes imputed against each arm.
- :func:`bounded_wilson_interval`: the same for one arm's rate (errored episodes as failures for the lower
  end, as successes for the upper end).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

Z95 = 1.959963984540054  # two-sided 95 % normal quantile

__all__ = [
    "Z95",
    "PairedCounts",
    "bounded_difference_interval",
    "bounded_wilson_interval",
    "imputed_tables",
    "paired_difference_interval",
    "wilson_interval",
]


def _check_count(name: str, value: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{name}: expected an integer >= 0, got {value!r}")
    return value


def wilson_interval(k: int, n: int, z: float = Z95) -> tuple[float, float] | None:
    """Wilson score interval of ``k`` successes in ``n`` trials (``None`` when ``n == 0``).

    >>> [round(x, 3) for x in wilson_interval(5, 10)]
    [0.237, 0.763]
    >>> wilson_interval(0, 10)[0], round(wilson_interval(0, 10)[1], 3)
    (0.0, 0.278)
    >>> wilson_interval(0, 0) is None
    True
    """
    k, n = int(k), int(n)
    if n < 0 or not 0 <= k <= n:
        raise ValueError(f"wilson_interval: expected 0 <= k <= n, got k={k}, n={n}")
    if n == 0:
        return None
    p = k / n
    z2 = z * z
    denom = 1.0 + z2 / n
    centre = (p + z2 / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z2 / (4 * n * n)) / denom
    # At k = 0 and k = n the bounds are exactly 0 and 1; computed, they carry rounding noise.
    lo = 0.0 if k == 0 else max(0.0, centre - half)
    hi = 1.0 if k == n else min(1.0, centre + half)
    return lo, hi


@dataclass(frozen=True)
class PairedCounts:
    """The 2x2 table of ``n`` paired outcomes: both succeeded, only A, only B, neither."""

    both: int
    a_only: int
    b_only: int
    neither: int

    def __post_init__(self) -> None:
        for name in ("both", "a_only", "b_only", "neither"):
            _check_count(name, getattr(self, name))

    @classmethod
    def from_pairs(cls, pairs) -> PairedCounts:
        """Counts of an iterable of ``(a_success, b_success)`` booleans."""
        both = a_only = b_only = neither = 0
        for a, b in pairs:
            if a and b:
                both += 1
            elif a:
                a_only += 1
            elif b:
                b_only += 1
            else:
                neither += 1
        return cls(both, a_only, b_only, neither)

    @property
    def n(self) -> int:
        return self.both + self.a_only + self.b_only + self.neither

    @property
    def a(self) -> int:
        """Successes of arm A."""
        return self.both + self.a_only

    @property
    def b(self) -> int:
        """Successes of arm B."""
        return self.both + self.b_only

    @property
    def discordant(self) -> int:
        return self.a_only + self.b_only

    @property
    def diff(self) -> float | None:
        """``p_b - p_a`` (``None`` without pairs)."""
        return (self.b_only - self.a_only) / self.n if self.n else None


def paired_difference_interval(counts: PairedCounts, z: float = Z95) -> tuple[float, float] | None:
    """Newcombe's hybrid score ("square-and-add") interval (method 10) for ``p_b - p_a`` of paired outcomes.

    With ``l_i, u_i`` the Wilson limits of each arm's rate ``p_i`` and ``d = p_b - p_a``::

        lower = d - sqrt((p_b - l_b)^2 - 2 phi (p_b - l_b)(u_a - p_a) + (u_a - p_a)^2)
        upper = d + sqrt((u_b - p_b)^2 - 2 phi (u_b - p_b)(p_a - l_a) + (p_a - l_a)^2)

    ``phi`` estimates the correlation of the two arms' outcomes with Newcombe's continuity correction: with
    ``A = both * neither - a_only * b_only`` and ``M`` the product of the four margins, ``phi = (A - n/2) / sqrt(M)``
    when ``A > n/2``, 0 when ``0 <= A <= n/2``, ``A / sqrt(M)`` when ``A < 0``, and 0 when a margin is empty.
    ``None`` when there are no pairs. The limits are truncated to [-1, 1].
    """
    n = counts.n
    if n == 0:
        return None
    p_a, p_b = counts.a / n, counts.b / n
    l_a, u_a = wilson_interval(counts.a, n, z)
    l_b, u_b = wilson_interval(counts.b, n, z)
    # Correlation of the outcomes (continuity-corrected towards 0 for positive association).
    margins = counts.b * (n - counts.b) * counts.a * (n - counts.a)
    cross = counts.both * counts.neither - counts.a_only * counts.b_only
    if margins == 0 or 0 <= cross <= n / 2:
        phi = 0.0
    elif cross > n / 2:
        phi = (cross - n / 2) / math.sqrt(margins)
    else:
        phi = cross / math.sqrt(margins)
    d = p_b - p_a
    below = (p_b - l_b) ** 2 - 2 * phi * (p_b - l_b) * (u_a - p_a) + (u_a - p_a) ** 2
    above = (u_b - p_b) ** 2 - 2 * phi * (u_b - p_b) * (p_a - l_a) + (p_a - l_a) ** 2
    lo = d - math.sqrt(max(below, 0.0))
    hi = d + math.sqrt(max(above, 0.0))
    return max(-1.0, lo), min(1.0, hi)


def imputed_tables(pairs) -> tuple[PairedCounts, PairedCounts]:
    """``(worst_for_b, worst_for_a)``: the tables of ``(a, b)`` outcomes (``None``: that episode errored) with the
    errored outcomes imputed against B (B's as failures, A's as successes) and against A (the mirror)."""
    pairs = list(pairs)
    worst_b = PairedCounts.from_pairs((True if a is None else a, False if b is None else b) for a, b in pairs)
    worst_a = PairedCounts.from_pairs((False if a is None else a, True if b is None else b) for a, b in pairs)
    return worst_b, worst_a


def bounded_difference_interval(worst_for_b: PairedCounts, worst_for_a: PairedCounts,
                                z: float = Z95) -> tuple[float, float] | None:  # fmt: skip
    """Newcombe's interval for ``p_b - p_a`` over every completion of the errored outcomes: the lower end of the
    table imputed against B, the upper end of the one imputed against A (:func:`imputed_tables`).

    Newcombe's lower end does not rise when a pair turns worse for B (B's success into a failure, A's failure
    into a success; checked exhaustively up to 30 pairs in the tests), so the lower end against B is at most the
    one of the complete outcomes, and the upper end mirrors it: the interval contains the one the complete
    outcomes would give, whatever the errors depend on. Without errored pairs it is Newcombe's interval."""
    low, high = paired_difference_interval(worst_for_b, z), paired_difference_interval(worst_for_a, z)
    if low is None or high is None:
        return None
    return low[0], high[1]


def bounded_wilson_interval(k: int, n: int, errored: int = 0, z: float = Z95) -> tuple[float, float] | None:
    """Wilson's interval of ``k`` successes in ``n`` outcomes, widened over ``errored`` episodes without one: the
    lower end with them as failures, the upper end with them as successes (Wilson's ends rise with ``k``, so this
    contains the interval of every completion). ``None`` when there are no episodes.

    >>> bounded_wilson_interval(5, 10) == wilson_interval(5, 10)
    True
    >>> [round(x, 3) for x in bounded_wilson_interval(5, 10, errored=5)]
    [0.152, 0.848]
    """
    total = int(n) + int(errored)
    if total == 0:
        return None
    return wilson_interval(k, total, z)[0], wilson_interval(int(k) + int(errored), total, z)[1]
