"""The anytime-valid sequential test: type-I error at any stopping time, decisions, bookkeeping."""

from __future__ import annotations

import math

import numpy as np
import pytest

from dz_gym.stats import DEFAULT_ALTERNATIVES, SequentialPairTest, log_e_values

ALPHA = 0.05


def _first_crossings(a: np.ndarray, b: np.ndarray, alpha: float = ALPHA) -> np.ndarray:
    """Index (1-based) of the first pair at which the e-value reaches 1/alpha per sequence (0: never)."""
    b_only = np.cumsum(b & ~a, axis=1, dtype=np.int64)
    discordant = b_only + np.cumsum(a & ~b, axis=1, dtype=np.int64)
    crossed = log_e_values(b_only, discordant) >= math.log(1 / alpha)
    return np.where(crossed.any(axis=1), crossed.argmax(axis=1) + 1, 0)


@pytest.mark.parametrize("p", [0.2, 0.5])
def test_type_one_error_holds_at_any_stopping_time(p):
    # 2000 null sequences of 300 pairs (equal arms, independent outcomes with success rate p). A rejection
    # at ANY point of the sequence counts, i.e. the worst stopping time: the rate must stay <= alpha (+3 MC SE).
    rng = np.random.default_rng(12345 + int(100 * p))
    sequences, pairs = 2000, 300
    a = rng.random((sequences, pairs)) < p
    b = rng.random((sequences, pairs)) < p
    rate = float((_first_crossings(a, b) > 0).mean())
    se = math.sqrt(ALPHA * (1 - ALPHA) / sequences)
    assert rate <= ALPHA + 3 * se, rate


def test_type_one_error_with_only_discordant_pairs():
    # The hardest null for a discordant-pair test: every pair discordant, 2000 sequences of 600 pairs.
    rng = np.random.default_rng(99)
    b = rng.random((2000, 600)) < 0.5
    rate = float((_first_crossings(~b, b) > 0).mean())
    assert rate <= ALPHA + 3 * math.sqrt(ALPHA * (1 - ALPHA) / 2000), rate


def test_detects_a_real_difference_and_names_the_arm():
    rng = np.random.default_rng(5)
    a = rng.random((500, 400)) < 0.35
    b = rng.random((500, 400)) < 0.65
    first = _first_crossings(a, b)
    assert (first > 0).mean() > 0.95
    # The class on one of these sequences: same stopping pair, B named better.
    test = SequentialPairTest(alpha=ALPHA)
    decision = test.update(zip(a[0].tolist(), b[0].tolist()))
    assert decision.stop and decision.reason == "b_better" and decision.better == "b"
    assert decision.pairs == first[0]
    flipped = SequentialPairTest(alpha=ALPHA).update(zip(b[0].tolist(), a[0].tolist()))
    assert flipped.reason == "a_better" and flipped.better == "a" and flipped.pairs == first[0]


def test_class_matches_vectorized_e_values_pair_by_pair():
    rng = np.random.default_rng(1)
    a = (rng.random(200) < 0.4).tolist()
    b = (rng.random(200) < 0.5).tolist()
    test = SequentialPairTest(alpha=1e-9)  # never stops, so every e-value is observed
    k = d = 0
    for x, y in zip(a, b):
        k += y and not x
        d += x != y
        decision = test.update([(x, y)])
        assert decision.e_value == pytest.approx(math.exp(float(log_e_values(k, d))), rel=1e-9)


def test_hand_computed_e_value():
    # 3 B-only of 4 discordant, one alternative q = 0.75: E_b = 1.5^3 0.5, E_a = 0.5^3 1.5; e = mean.
    test = SequentialPairTest(alternatives=[0.75])
    decision = test.update([(False, True)] * 3 + [(True, False)] + [(True, True), (False, False)])
    assert decision.e_value == pytest.approx((1.5**3 * 0.5 + 0.5**3 * 1.5) / 2)
    assert (decision.pairs, decision.a_only, decision.b_only) == (6, 1, 3)


def test_no_discordant_pairs_never_rejects():
    test = SequentialPairTest()
    decision = test.update([(True, True)] * 500 + [(False, False)] * 500)
    assert not decision.stop and decision.e_value == 1.0 and decision.p_value == 1.0


def test_all_discordant_rejects_after_few_pairs():
    decision = SequentialPairTest().update([(False, True)] * 20)
    assert decision.stop and decision.better == "b"
    # With the default alternatives the e-value after k straight B-only pairs is mean((2q)^k) / 2.
    expected = min(k for k in range(1, 21) if np.mean([(2 * q) ** k for q in DEFAULT_ALTERNATIVES]) / 2 >= 20)
    assert decision.pairs == expected
    assert "B is better" in decision.why


def test_one_pair():
    decision = SequentialPairTest().update([(True, False)])
    assert not decision.stop and decision.pairs == 1 and decision.a_only == 1
    assert decision.e_value == pytest.approx(
        np.mean([2 * q for q in DEFAULT_ALTERNATIVES]) / 2 + np.mean([2 * (1 - q) for q in DEFAULT_ALTERNATIVES]) / 2
    )


def test_batches_equal_single_pairs_and_decision_is_final():
    pairs = [(False, True)] * 12 + [(True, False)] * 30
    one = SequentialPairTest()
    for pair in pairs:
        one.update([pair])
    batch = SequentialPairTest()
    batch.update(pairs)
    assert one.decision == batch.decision
    assert batch.decision.stop and batch.decision.better == "b"
    # Pairs after the stop (in flight when the runner stopped) change nothing and are counted.
    assert batch.ignored == len(pairs) - batch.decision.pairs
    assert batch.to_dict()["ignored_after_stop"] == batch.ignored


def test_max_pairs_and_errored_pairs():
    test = SequentialPairTest(max_pairs=5)
    decision = test.update([(None, True), (True, None), (True, True), (False, False), (True, False)])
    assert not decision.stop and decision.errored == 2 and decision.pairs == 3
    decision = test.update([(True, True), (False, False)])
    assert decision.stop and decision.reason == "max_pairs" and decision.better is None
    assert "max_pairs 5" in decision.why


def test_anytime_p_value_is_one_over_the_largest_e_value():
    test = SequentialPairTest(alpha=1e-6)
    test.update([(False, True)] * 6)
    peak = test.decision.e_value
    decision = test.update([(True, False)] * 6)
    assert decision.e_value < peak
    assert decision.p_value == pytest.approx(1 / peak)


@pytest.mark.parametrize("kwargs, message", [
    ({"alpha": 0}, "alpha"), ({"alpha": 1.5}, "alpha"), ({"max_pairs": 0}, "max_pairs"),
    ({"alternatives": [0.5]}, "alternatives"), ({"alternatives": []}, "alternatives"),
])  # fmt: skip
def test_bad_settings(kwargs, message):
    with pytest.raises(ValueError, match=message):
        SequentialPairTest(**kwargs)
