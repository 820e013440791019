"""Exact McNemar test and Holm's multiplicity adjustment (pure, no I/O).

McNemar's exact test compares two arms on paired outcomes using only the discordant pairs: under "no
difference" the number of B-only pairs among the ``d`` discordant pairs is Binomial(d, 1/2), and the two-sided
p-value is that binomial test's (twice the smaller tail, capped at 1; 1 when ``d = 0``). The tails are summed
in exact integer arithmetic, so the p-value is exact for any ``d``.

Holm's step-down adjustment controls the family-wise error rate under any dependence between the tests
(here: the scenes of one comparison), and is uniformly more powerful than Bonferroni.
"""

from __future__ import annotations

from collections.abc import Sequence
from fractions import Fraction

__all__ = [
    "binomial_half_two_sided_p",
    "binomial_half_upper_p",
    "bounded_mcnemar_p",
    "holm_adjust",
    "mcnemar_exact_p",
]


def binomial_half_two_sided_p(k: int, n: int) -> float:
    """Two-sided p-value of ``k`` successes in ``n`` Binomial(n, 1/2) trials (1 when ``n == 0``).

    For p = 1/2 the distribution is symmetric, so the outcomes at least as unlikely as ``k`` are the two tails
    beyond ``min(k, n - k)``: p = min(1, 2 * P(X <= min(k, n - k))).
    """
    if isinstance(k, bool) or isinstance(n, bool) or not isinstance(k, int) or not isinstance(n, int):
        raise ValueError(f"binomial test: expected integers, got k={k!r}, n={n!r}")
    if n < 0 or not 0 <= k <= n:
        raise ValueError(f"binomial test: expected 0 <= k <= n, got k={k}, n={n}")
    if n == 0:
        return 1.0
    low = min(k, n - k)
    if 2 * low == n:
        return 1.0
    total = 0
    term = 1  # C(n, 0)
    for i in range(low + 1):
        total += term
        term = term * (n - i) // (i + 1)
    return float(min(Fraction(1), Fraction(2 * total, 2**n)))


def binomial_half_upper_p(k: int, n: int) -> float:
    """One-sided p-value P(X >= k) for X ~ Binomial(n, 1/2), exact (1 when ``k <= 0``)."""
    if isinstance(k, bool) or isinstance(n, bool) or not isinstance(k, int) or not isinstance(n, int) or n < 0:
        raise ValueError(f"binomial test: expected integers with n >= 0, got k={k!r}, n={n!r}")
    if k <= 0:
        return 1.0
    total, term = 0, 1  # C(n, i)
    for i in range(n + 1):
        if i >= k:
            total += term
        term = term * (n - i) // (i + 1)
    return float(Fraction(total, 2**n))


def mcnemar_exact_p(a_only: int, b_only: int) -> float:
    """Exact two-sided McNemar p-value from the discordant counts (A only, B only)."""
    return binomial_half_two_sided_p(int(b_only), int(a_only) + int(b_only))


def bounded_mcnemar_p(worst_for_b: tuple[int, int], worst_for_a: tuple[int, int]) -> tuple[float, str | None]:
    """The two-sided McNemar p-value bounded over errored pairs, and the claim it backs (``"b"``, ``"a"``, None).

    ``worst_for_b`` / ``worst_for_a``: ``(A only, B only)`` with the errored episodes imputed against B (B's as
    failures, A's as successes) / against A. "B better" is tested one-sided on the first, "A better" on the
    second, and ``p = min(1, 2 min(p_B, p_A))``. Imputing against a claim can only turn its wins into ties and
    its ties into losses, each of which raises its exact one-sided p-value, so each is at least the p-value the
    complete outcomes would give, whatever the errors depend on. Without errored pairs: the exact McNemar test.

    >>> bounded_mcnemar_p((2, 12), (2, 12))  # no errored pairs: exact McNemar, B better
    (0.012939453125, 'b')
    >>> bounded_mcnemar_p((7, 12), (2, 17))  # 5 errored pairs: against B they leave 7 A-only to 12 B-only
    (0.359283447265625, 'b')
    """
    (a_b, b_b), (a_a, b_a) = worst_for_b, worst_for_a
    p_b = binomial_half_upper_p(int(b_b), int(a_b) + int(b_b))
    p_a = binomial_half_upper_p(int(a_a), int(a_a) + int(b_a))
    if p_b == p_a:
        return 1.0, None
    return min(1.0, 2 * min(p_b, p_a)), ("b" if p_b < p_a else "a")


def holm_adjust(p_values: Sequence[float | None]) -> list[float | None]:
    """Holm step-down adjusted p-values, in the input order; ``None`` entries (no test) stay ``None``.

    With the m available p-values sorted ascending, ``p_(i)`` becomes ``max_{j <= i} min(1, (m - j + 1) p_(j))``.
    """
    indexed = []
    for i, p in enumerate(p_values):
        if p is None:
            continue
        p = float(p)
        if not 0.0 <= p <= 1.0:
            raise ValueError(f"holm_adjust: expected p-values in [0, 1], got {p!r} at position {i}")
        indexed.append((p, i))
    indexed.sort()
    m = len(indexed)
    out: list[float | None] = [None] * len(p_values)
    running = 0.0
    for rank, (p, i) in enumerate(indexed):
        running = max(running, min(1.0, (m - rank) * p))
        out[i] = running
    return out
