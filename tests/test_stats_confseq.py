"""The confidence sequence for the paired difference: coverage at every pair, shrinking, edge cases."""

from __future__ import annotations

import numpy as np
import pytest

from dz_gym.stats import difference_confidence_sequence


def _sequence(rng, n, p_a, p_b):
    return list(zip((rng.random(n) < p_a).tolist(), (rng.random(n) < p_b).tolist()))


def test_covers_the_true_difference_at_every_prefix():
    # 200 runs of 150 pairs with a true difference of 0.2: the interval must hold the truth at all prefixes in
    # at least 1 - alpha of the runs (a time-uniform guarantee; a pointwise 95% interval would fail it).
    rng = np.random.default_rng(3)
    misses = 0
    for _ in range(200):
        pairs = _sequence(rng, 150, 0.4, 0.6)
        for n in (10, 25, 50, 100, 150):
            low, high = difference_confidence_sequence(pairs[:n])
            if not low <= 0.2 <= high:
                misses += 1
                break
    assert misses <= 10, misses


def test_shrinks_with_pairs_and_holds_the_estimate():
    rng = np.random.default_rng(4)
    pairs = _sequence(rng, 400, 0.3, 0.6)
    widths = []
    for n in (20, 100, 400):
        low, high = difference_confidence_sequence(pairs[:n])
        estimate = np.mean([int(b) - int(a) for a, b in pairs[:n]])
        assert low <= estimate <= high
        widths.append(high - low)
    assert widths[0] > widths[1] > widths[2]
    low, _ = difference_confidence_sequence(pairs)
    assert low > 0  # 400 pairs with a difference of 0.3 exclude 0


def test_edge_cases():
    assert difference_confidence_sequence([]) is None
    low, high = difference_confidence_sequence([(True, True)] * 200)
    assert low < 0 < high and high - low < 0.2  # no discordant pair: a narrow interval around 0
    low, high = difference_confidence_sequence([(False, True)] * 50)
    assert high == 1.0 and low > 0.5
    with pytest.raises(ValueError, match="alpha"):
        difference_confidence_sequence([(True, False)], alpha=1.0)


def test_errored_pairs_are_bounded_not_dropped():
    # B solves the 10 seeds A fails and errors on the 30 that A solves (where B would have failed: the true
    # difference is -0.5). Dropped, the errored pairs leave 10 B-only pairs: an interval above 0 and the truth.
    clean = [(False, True)] * 10
    pairs = [(True, None), (True, None), (True, None), (False, True)] * 10
    low, _ = difference_confidence_sequence(clean)
    assert low > 0.0
    low, high = difference_confidence_sequence(pairs)
    assert low <= -0.5 and high >= 0.25  # every completion's difference lies in [-0.5, +0.25]
    # Without errors both imputed sequences are the data: the interval is the one of the complete pairs.
    rng = np.random.default_rng(5)
    plain = _sequence(rng, 120, 0.4, 0.6)
    assert difference_confidence_sequence(plain) == difference_confidence_sequence([(a, b) for a, b in plain])


def test_bounded_interval_covers_when_errors_hide_one_arms_failures():
    # 200 runs of 150 pairs, both arms at 0.5, B's server errors on 30% of B's failures: the bounded interval
    # must hold 0 at the end in at least 1 - alpha of the runs.
    rng = np.random.default_rng(11)
    misses = 0
    for _ in range(200):
        a, b = rng.random(150) < 0.5, rng.random(150) < 0.5
        hidden = ~b & (rng.random(150) < 0.3)
        pairs = [(bool(x), None if h else bool(y)) for x, y, h in zip(a, b, hidden)]
        low, high = difference_confidence_sequence(pairs)
        misses += not low <= 0.0 <= high
    assert misses <= 10
