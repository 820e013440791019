"""Statistics of the A/B comparison: intervals, exact McNemar, Holm (hand-computed cases and scipy)."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest

from dz_gym.stats import (
    PairedCounts,
    binomial_half_two_sided_p,
    holm_adjust,
    mcnemar_exact_p,
    paired_difference_interval,
    wilson_interval,
)

scipy_stats = pytest.importorskip("scipy.stats")


# ------------------------------------------------------------------------------------------ McNemar
def test_mcnemar_no_discordant_pairs_is_one():
    assert mcnemar_exact_p(0, 0) == 1.0


def test_mcnemar_hand_computed():
    # d = 1: P(X <= 0) = 1/2, doubled -> 1.
    assert mcnemar_exact_p(0, 1) == 1.0
    # All 6 discordant pairs one way: 2 * (1/2)^6 = 1/32.
    assert mcnemar_exact_p(0, 6) == pytest.approx(1 / 32, rel=1e-15)
    assert mcnemar_exact_p(6, 0) == pytest.approx(1 / 32, rel=1e-15)
    # 5 of 5: 2/32 = 0.0625 (not significant at 0.05: five pairs can never be).
    assert mcnemar_exact_p(5, 0) == pytest.approx(0.0625)
    # 1 vs 9: 2 * (1 + 10) / 1024.
    assert mcnemar_exact_p(1, 9) == pytest.approx(22 / 1024, rel=1e-15)
    # A balanced split is p = 1.
    assert mcnemar_exact_p(7, 7) == 1.0


def test_mcnemar_matches_scipy_binomtest():
    for d in list(range(1, 40)) + [99, 250, 1001]:
        for k in sorted({0, 1, d // 3, d // 2, d - 1, d}):
            ours = mcnemar_exact_p(d - k, k)
            theirs = scipy_stats.binomtest(k, d, 0.5, alternative="two-sided").pvalue
            assert ours == pytest.approx(theirs, rel=1e-9, abs=1e-300), (k, d)


def test_mcnemar_exact_for_large_counts():
    # 3000 of 3000: 2^-2999 underflows to 0.0 in floats, which is the correct rounding.
    assert binomial_half_two_sided_p(3000, 3000) == float(Fraction(2, 2**3000))
    assert 0.0 <= binomial_half_two_sided_p(1400, 3000) <= 1.0


@pytest.mark.parametrize("bad", [(-1, 3), (4, 3), (1.5, 3), (True, 3)])
def test_binomial_rejects_bad_counts(bad):
    with pytest.raises(ValueError, match="binomial test"):
        binomial_half_two_sided_p(*bad)


# ------------------------------------------------------------------------------------------ Holm
def test_holm_hand_computed():
    # sorted: 0.01 (x3) -> 0.03, 0.02 (x2) -> 0.04, 0.04 (x1) -> 0.04 (monotone).
    assert holm_adjust([0.04, 0.01, 0.02]) == pytest.approx([0.04, 0.03, 0.04])
    assert holm_adjust([0.5, 0.6]) == pytest.approx([1.0, 1.0])
    assert holm_adjust([0.3]) == [0.3]
    assert holm_adjust([]) == []


def test_holm_skips_missing_tests():
    assert holm_adjust([None, 0.01, None, 0.02]) == [None, pytest.approx(0.02), None, pytest.approx(0.02)]


def test_holm_monotone_and_bounded():
    rng = np.random.default_rng(3)
    for _ in range(50):
        p = rng.random(rng.integers(1, 8)).tolist()
        adj = holm_adjust(p)
        order = np.argsort(p)
        assert all(a >= b - 1e-15 for a, b in zip(adj, p))
        assert all(0 <= a <= 1 for a in adj)
        assert all(adj[order[i]] <= adj[order[i + 1]] + 1e-15 for i in range(len(p) - 1))


def test_holm_rejects_out_of_range():
    with pytest.raises(ValueError, match="holm_adjust"):
        holm_adjust([0.1, 1.5])


# ------------------------------------------------------------------------------------------ Wilson
def test_wilson_hand_computed():
    lo, hi = wilson_interval(0, 1)
    assert lo == 0.0 and hi == pytest.approx(Z2 / (1 + Z2))
    lo, hi = wilson_interval(1, 1)
    assert hi == 1.0 and lo == pytest.approx(1 / (1 + Z2))
    assert wilson_interval(0, 0) is None


Z2 = 1.959963984540054**2


def test_wilson_matches_scipy():
    for k, n in [(0, 5), (3, 10), (10, 10), (17, 40), (250, 1000)]:
        ours = wilson_interval(k, n)
        ci = scipy_stats.binomtest(k, n).proportion_ci(confidence_level=0.95, method="wilson")
        assert ours == pytest.approx((ci.low, ci.high), abs=1e-6)


# ------------------------------------------------------------------------------------------ Newcombe
def test_paired_interval_no_pairs():
    assert paired_difference_interval(PairedCounts(0, 0, 0, 0)) is None


def test_paired_interval_one_pair():
    # n = 1, B succeeded, A failed: d = 1; Wilson(1, 1) = [1/(1+z^2), 1], Wilson(0, 1) = [0, z^2/(1+z^2)].
    # The margins are empty so phi = 0: lower = 1 - sqrt((1 - 1/(1+z^2))^2 + (z^2/(1+z^2))^2), upper = 1.
    lo, hi = paired_difference_interval(PairedCounts(0, 0, 1, 0))
    w = Z2 / (1 + Z2)
    assert lo == pytest.approx(1 - math.sqrt(2) * w)
    assert hi == 1.0
    lo, hi = paired_difference_interval(PairedCounts(1, 0, 0, 0))  # both succeeded: d = 0
    assert (lo, hi) == pytest.approx((-w, w))


def test_paired_interval_no_discordant_pairs():
    # 10 pairs, 6 both and 4 neither: d = 0; A = 24 > n/2 so phi = (24 - 5) / sqrt(6 * 4 * 6 * 4) = 19/24;
    # both arms have the same Wilson limits, x = p - l below and y = u - p above.
    counts = PairedCounts(6, 0, 0, 4)
    lo, hi = paired_difference_interval(counts)
    wl, wh = wilson_interval(6, 10)
    x, y = 0.6 - wl, wh - 0.6
    phi = 19 / 24
    assert lo == pytest.approx(-math.sqrt(x * x - 2 * phi * x * y + y * y))
    assert hi == pytest.approx(math.sqrt(y * y - 2 * phi * y * x + x * x))
    assert lo < 0 < hi


def test_paired_interval_all_discordant():
    # 8 pairs, all B-only: p_b = 1, p_a = 0, d = 1, phi = 0 (empty margins).
    lo, hi = paired_difference_interval(PairedCounts(0, 0, 8, 0))
    wb, wa = wilson_interval(8, 8), wilson_interval(0, 8)
    assert hi == 1.0
    assert lo == pytest.approx(1 - math.sqrt((1 - wb[0]) ** 2 + (wa[1] - 0) ** 2))
    assert 0 < lo < 1


def test_paired_interval_matches_the_published_example():
    # Fagerland, Lydersen & Laake, "Statistical Analysis of Contingency Tables" (2017), ch. 8: complete
    # response before/after consolidation therapy (Cavo et al. 2012), table [[59, 6], [16, 80]]:
    # Newcombe square-and-add estimate -0.0621, 95% CI -0.1186 to -0.0046 (to 4 decimals).
    c = PairedCounts(both=59, a_only=16, b_only=6, neither=80)
    lo, hi = paired_difference_interval(c)
    assert round(c.diff, 4) == -0.0621
    assert (round(lo, 4), round(hi, 4)) == (-0.1186, -0.0046)


def test_paired_interval_hand_computed_general():
    # 22 pairs: both 8, A only 2, B only 7, neither 5. p_b = 15/22, p_a = 10/22; A = 40 - 14 = 26 > n/2 = 11,
    # so phi = (26 - 11) / sqrt(15 * 7 * 10 * 12).
    c = PairedCounts(8, 2, 7, 5)
    n = 22
    pb, pa = 15 / n, 10 / n
    lb, ub = wilson_interval(15, n)
    la, ua = wilson_interval(10, n)
    phi = (8 * 5 - 2 * 7 - n / 2) / math.sqrt(15 * 7 * 10 * 12)
    d = pb - pa
    lo = d - math.sqrt((pb - lb) ** 2 - 2 * phi * (pb - lb) * (ua - pa) + (ua - pa) ** 2)
    hi = d + math.sqrt((ub - pb) ** 2 - 2 * phi * (ub - pb) * (pa - la) + (pa - la) ** 2)
    assert paired_difference_interval(c) == pytest.approx((lo, hi))
    assert c.diff == pytest.approx(5 / 22)
    # Negative association is used as it is: both 1, A only 7, B only 6, neither 1 (A = 1 - 42 < 0).
    c = PairedCounts(1, 7, 6, 1)
    phi = (1 - 42) / math.sqrt(7 * 8 * 8 * 7)
    pb, pa = 7 / 15, 8 / 15
    lb, ub = wilson_interval(7, 15)
    la, ua = wilson_interval(8, 15)
    lo = (pb - pa) - math.sqrt((pb - lb) ** 2 - 2 * phi * (pb - lb) * (ua - pa) + (ua - pa) ** 2)
    assert paired_difference_interval(c)[0] == pytest.approx(lo)


def test_paired_interval_antisymmetric_under_swapping_arms():
    for counts in [(3, 1, 6, 10), (0, 4, 0, 4), (5, 2, 2, 1), (20, 0, 3, 7)]:
        both, a_only, b_only, neither = counts
        lo, hi = paired_difference_interval(PairedCounts(both, a_only, b_only, neither))
        lo2, hi2 = paired_difference_interval(PairedCounts(both, b_only, a_only, neither))
        assert (lo, hi) == pytest.approx((-hi2, -lo2))


def test_paired_interval_coverage_is_near_nominal():
    # Simulated coverage at a moderate size: within a few points of 95 % (Newcombe reports ~95 % mean).
    rng = np.random.default_rng(7)
    n, reps = 40, 1500
    probs = np.array([0.35, 0.15, 0.25, 0.25])  # both, A only, B only, neither: true diff 0.1
    tables = rng.multinomial(n, probs, size=reps)
    covered = 0
    for t in tables:
        lo, hi = paired_difference_interval(PairedCounts(*map(int, t)))
        covered += lo <= 0.1 <= hi
    assert 0.92 <= covered / reps <= 0.99


def test_paired_counts_from_pairs_and_validation():
    c = PairedCounts.from_pairs([(True, True), (True, False), (False, True), (False, True), (False, False)])
    assert (c.both, c.a_only, c.b_only, c.neither, c.n, c.a, c.b) == (1, 1, 2, 1, 5, 2, 3)
    with pytest.raises(ValueError, match="a_only"):
        PairedCounts(1, -1, 0, 0)
