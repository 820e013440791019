"""The sequential A/B rule: exact type-I error and power (dynamic program), the rule pair by pair, errors."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from dz_gym.stats import SequentialDesign, SequentialPairTest, log_e_values
from dz_gym.stats.design import planning_discordance
from dz_gym.stats.walk import Boundaries, binomial_pmf, pair_characteristics, walk

ALPHA = 0.05


@pytest.fixture(scope="module")
def shipped() -> SequentialDesign:
    """The design the evaluator uses by default (difference 0.2, power 0.8, alpha 0.05)."""
    return SequentialPairTest().design


def test_walk_matches_brute_force_enumeration():
    # Every sign sequence of length 10, the rule applied by hand: the DP's absorbed masses must match.
    reject = np.array([9, 4, 4, 4, 5, 5, 5, 6, 6, 6, 6])
    futile = np.array([-1, -1, -1, 0, 0, 1, 1, 1, 2, 2, 2])
    final = np.array([11, 11, 11, 3, 3, 3, 3, 4, 4, 4, 4])
    bounds = Boundaries(reject, futile, final)
    q = 0.63
    up = down = fut = fin_up = 0.0
    for signs in itertools.product((1, -1), repeat=10):
        # The whole sequence's probability: summed over the suffixes after a stop it gives the prefix's.
        prob, s = math.prod(q if step > 0 else 1 - q for step in signs), 0
        for j, step in enumerate(signs, start=1):
            s += step
            if abs(s) >= reject[j]:
                up += prob * (s > 0)
                down += prob * (s < 0)
                break
            if abs(s) <= futile[j]:
                fut += prob
                break
        else:
            fin_up += prob * (s >= final[10])
    w = walk(bounds, q)
    assert w.up.sum() == pytest.approx(up, abs=1e-12)
    assert w.down.sum() == pytest.approx(down, abs=1e-12)
    assert w.futile.sum() == pytest.approx(fut, abs=1e-12)
    assert w.final_up[10] == pytest.approx(fin_up, abs=1e-12)


def test_pair_characteristics_match_enumeration_over_pairs():
    # Pairs are discordant with probability pi; enumerate all 3^8 pair sequences (B only, A only, concordant).
    reject = np.array([9, 3, 3, 3, 4, 4, 4, 4, 5])
    futile = np.array([-1, -1, 0, 0, 0, 1, 1, 1, 1])
    final = np.array([9, 9, 2, 3, 2, 3, 2, 3, 2])
    bounds = Boundaries(reject, futile, final)
    pi, q, n = 0.6, 0.7, 8
    p = {1: pi * q, -1: pi * (1 - q), 0: 1 - pi}
    b_better = pairs_used = estimate = 0.0
    for seq in itertools.product((1, -1, 0), repeat=n):
        prob = math.prod(p[x] for x in seq)
        s = d = 0
        for i, x in enumerate(seq, start=1):
            if x:
                d += 1
                s += x
                if abs(s) >= reject[d] or abs(s) <= futile[d]:
                    b_better += prob * (s >= reject[d])
                    pairs_used += prob * i
                    estimate += prob * s / i
                    break
        else:
            b_better += prob * (s >= final[d])
            pairs_used += prob * n
            estimate += prob * s / n
    got = pair_characteristics(bounds, n, pi, q)
    assert got.b_better == pytest.approx(b_better, abs=1e-12)
    assert got.mean_pairs == pytest.approx(pairs_used, abs=1e-12)
    assert got.mean_estimate == pytest.approx(estimate, abs=1e-12)


@pytest.mark.parametrize("delta, power, alpha", [(0.2, 0.8, 0.05), (0.3, 0.9, 0.05), (0.3, 0.8, 0.01), (0.2, 0.9, 0.1)])
def test_exact_type_one_error_at_most_alpha_for_every_truncation(delta, power, alpha):
    # Under "no difference" the rule decides with probability <= alpha, exactly, at every truncation d of the
    # walk: hence for every concordance rate and every budget (no Monte-Carlo slack).
    design = SequentialDesign.plan(delta, alpha=alpha, power=power)
    w = walk(design.bounds, 0.5)
    crossed = np.cumsum(w.up + w.down)
    total = crossed + w.final_up + w.final_down
    assert total.max() <= alpha * (1 + 1e-9), total.max()
    # ...and the design spends it: at its cap with every pair discordant the type-I error is close to alpha.
    assert total[design.max_pairs] > 0.8 * alpha
    for pi in (1.0, 0.5, 0.2):
        for pairs in (design.max_pairs, design.max_pairs // 3, 5):
            null = design.characteristics(pi, 0.5, pairs)
            assert null.b_better + null.a_better <= alpha * (1 + 1e-9)
            assert null.b_better == pytest.approx(null.a_better, abs=1e-12)


def test_shipped_rule_power_and_futility(shipped):
    pi = planning_discordance(0.2)
    alt = shipped.characteristics(pi, shipped.q1)
    assert alt.b_better >= 0.8 and alt.a_better < 1e-3
    # A larger difference or a lower discordance (positively correlated outcomes) only helps.
    assert shipped.characteristics(0.3, 0.5 + 0.2 / 0.6).b_better > alt.b_better
    null = shipped.characteristics(pi, 0.5)
    assert null.futile > 0.5  # "no difference" mostly stops early for futility
    assert null.mean_pairs < shipped.max_pairs


def test_design_check_errors():
    with pytest.raises(ValueError, match="min_difference"):
        SequentialDesign.plan(0.0)
    with pytest.raises(ValueError, match="power"):
        SequentialDesign.plan(0.2, power=1.0)
    with pytest.raises(ValueError, match="alpha"):
        SequentialDesign.plan(0.2, alpha=0.7)
    with pytest.raises(ValueError, match="discordance"):
        SequentialDesign.plan(0.3, discordance=0.2)


def test_class_follows_the_boundaries_pair_by_pair(shipped):
    rng = np.random.default_rng(7)
    for _ in range(40):
        a = rng.random(400) < 0.45
        b = rng.random(400) < 0.55
        test = SequentialPairTest(design=shipped)
        s = d = 0
        for i, (x, y) in enumerate(zip(a.tolist(), b.tolist()), start=1):
            decision = test.update([(x, y)])
            d += x != y
            s += int(y) - int(x)
            reject, futile, final = shipped.thresholds(d)
            if abs(s) >= reject:
                assert decision.reason == ("b_better" if s > 0 else "a_better")
                break
            if abs(s) <= futile:
                assert decision.reason == "no_difference" and decision.better is None
                break
            if i == shipped.max_pairs:
                expected = ("b_better" if s > 0 else "a_better") if abs(s) >= final else "max_pairs"
                assert decision.reason == expected
                break
            assert not decision.stop
        assert decision.stop and decision.pairs == i
        assert test.path[-1] == pytest.approx(math.log10(decision.e_value))


def test_hand_computed_e_value():
    # 3 B-only of 4 discordant, alternative q = 0.75: e = (1.5^3 0.5 + 0.5^3 1.5) / 2.
    assert math.exp(float(log_e_values(3, 4, [0.75]))) == pytest.approx((1.5**3 * 0.5 + 0.5**3 * 1.5) / 2)


def test_all_discordant_one_way_decides_at_the_reject_threshold(shipped):
    decision = SequentialPairTest(design=shipped).update([(False, True)] * 40)
    assert decision.stop and decision.better == "b"
    first = next(d for d in range(1, 41) if d >= shipped.thresholds(d)[0])
    assert decision.pairs == first and "B is better" in decision.why


def test_no_discordant_pairs_run_to_the_budget_then_final_look():
    test = SequentialPairTest(max_pairs=30)
    decision = test.update([(True, True), (False, False)] * 15)
    assert decision.stop and decision.reason == "max_pairs" and decision.e_value == 1.0
    assert "max_pairs 30" in decision.why


def test_finish_takes_the_final_look_at_the_budget(shipped):
    # The first d at which d straight B-only pairs do not cross but the final look there would decide.
    d = next(d for d in range(1, 40) if shipped.thresholds(d)[2] <= d < shipped.thresholds(d)[0])
    test = SequentialPairTest(design=shipped)
    assert not test.update([(False, True)] * d + [(True, True)] * 3).stop
    decision = test.finish()
    assert decision.stop and decision.reason == "b_better" and "final look" in decision.why


def test_batches_equal_single_pairs_and_decision_is_final(shipped):
    pairs = [(False, True)] * 12 + [(True, False)] * 30
    one = SequentialPairTest(design=shipped)
    for pair in pairs:
        one.update([pair])
    batch = SequentialPairTest(design=shipped)
    batch.update(pairs)
    assert one.decision == batch.decision and batch.decision.better == "b"
    assert batch.ignored == len(pairs) - batch.decision.pairs
    assert batch.to_dict()["ignored_after_stop"] == batch.ignored


def test_errors_counted_by_arm_and_imbalance_refuses_to_decide(shipped):
    test = SequentialPairTest(design=shipped)
    # B's server errors on 9 seeds, A's on none; then B wins clearly on the rest.
    decision = test.update([(True, None)] * 9 + [(None, None)] + [(False, True)] * 40)
    assert (decision.errored_a, decision.errored_b, decision.errored_both) == (0, 9, 1)
    assert decision.stop and decision.reason == "errors_differ" and decision.better is None
    assert decision.errors_p_value == pytest.approx(2 / 2**9)
    assert "errors differ between arms" in decision.why
    # Balanced errors do not block the decision.
    fair = SequentialPairTest(design=shipped).update([(True, None), (None, False)] * 4 + [(False, True)] * 40)
    assert fair.reason == "b_better" and fair.errored == 8


@pytest.mark.parametrize("kwargs, message", [({"max_pairs": 0}, "max_pairs"), ({"alpha": 0}, "alpha"),
                                             ({"min_difference": 1.5}, "min_difference")])  # fmt: skip
def test_bad_settings(kwargs, message):
    with pytest.raises(ValueError, match=message):
        SequentialPairTest(**kwargs)


def test_binomial_pmf():
    assert binomial_pmf(4, 0.5).tolist() == pytest.approx([1 / 16, 4 / 16, 6 / 16, 4 / 16, 1 / 16])
    assert binomial_pmf(30, 0.3).sum() == pytest.approx(1.0)
