"""The sequential A/B rule: exact type-I error and power (dynamic program), the rule pair by pair, errors."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from dz_gym.stats import SequentialDesign, SequentialPairTest, log_e_values
from dz_gym.stats.design import planning_discordance
from dz_gym.stats.walk import Boundaries, binomial_pmf, pair_characteristics, walk
from dz_gym.testing.error_models import ErrorModel, ab_false_decisions

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


def test_errored_pairs_are_bounded_against_each_claim_not_dropped(shipped):
    # B's server errors exactly where B would have lost (A won those seeds), B wins the others: dropping the
    # errors reads "B better"; imputed against B (its errors as failures) the walk is flat: no claim.
    decision = SequentialPairTest(design=shipped, max_pairs=80).update([(True, None), (False, True)] * 40)
    assert decision.stop and decision.better is None, decision.why
    assert decision.errored_b == decision.errored > 0 and decision.errored_a == decision.errored_both == 0
    assert decision.worst_for_b == (decision.errored_b, decision.b_only) and decision.worst_for_a == (
        0,
        decision.b_only,
    )
    assert decision.without_errored in ("continue", "b_better")
    dropped = SequentialPairTest(design=shipped, max_pairs=80).update([(False, True)] * 40)
    assert dropped.reason == "b_better"  # what the errors would have produced had they been dropped
    # The mirror for A; and errors on both sides of a real difference: B is better whatever they hide.
    mirror = SequentialPairTest(design=shipped, max_pairs=80).update([(None, True), (True, False)] * 40)
    assert mirror.stop and mirror.better is None
    clear = SequentialPairTest(design=shipped).update([(True, None), (None, False)] * 2 + [(False, True)] * 40)
    assert clear.reason == "b_better" and clear.errored == 4 and "whatever the 4 errored pairs" in clear.why
    assert clear.worst_for_b == (4, clear.b_only) and clear.worst_for_a == (0, clear.b_only)


def test_futility_stops_when_any_completion_is_in_the_band_and_claims_only_when_every_one_is(shipped):
    # The closed form against every completion of the errored episodes, on random partial runs.
    rng = np.random.default_rng(7)
    choices = {(None, True): [(True, True), (False, True)], (None, False): [(True, False), (False, False)],
               (True, None): [(True, True), (True, False)], (False, None): [(False, True), (False, False)],
               (None, None): [(True, True), (True, False), (False, True), (False, False)]}  # fmt: skip
    seen = set()
    for _ in range(300):
        clean = [tuple(bool(x) for x in rng.random(2) < 0.5) for _ in range(rng.integers(0, 90))]
        errored = [list(choices)[i] for i in rng.integers(0, 5, rng.integers(0, 6))]
        test = SequentialPairTest(design=shipped, _shadow=False)
        test.pairs = len(clean) + len(errored)
        test.a_only = sum(a and not b for a, b in clean)
        test.b_only = sum(b and not a for a, b in clean)
        for pair in errored:
            if pair == (None, None):
                test.errored_both += 1
            elif pair[0] is None:
                test.a_err_b_won += pair[1]
                test.a_err_b_lost += not pair[1]
            else:
                test.b_err_a_won += pair[0]
                test.b_err_a_lost += not pair[0]
        some, every = False, True
        for completion in itertools.product(*(choices[p] for p in errored)):
            d = test.a_only + test.b_only + sum(a != b for a, b in completion)
            s = test.b_only - test.a_only + sum(int(b) - int(a) for a, b in completion)
            some = some or abs(s) <= shipped.thresholds(d)[1]
            every = every and abs(s) <= shipped.thresholds(d)[1]
        assert test._completions_futile() == (some, every)
        seen.add((some, every))
    assert seen == {(True, True), (True, False), (False, False)}


def test_thresholds_step_by_at_most_one_and_each_claim_spends_at_most_half_alpha(shipped):
    # What the imputation argument needs (docs/compare.md): thresholds that change by at most 1 per discordant
    # pair, and one claim's error <= alpha / 2 on the walk where only crossing up and the futility band absorb.
    bounds = shipped.bounds
    assert np.abs(np.diff(bounds.reject)).max() <= 1 and np.abs(np.diff(bounds.final)).max() <= 1
    cap = bounds.cap
    mass = {0: 1.0}
    crossed = worst = 0.0
    for d in range(cap + 1):
        if d:
            nxt: dict[int, float] = {}
            for s, m in mass.items():
                nxt[s + 1] = nxt.get(s + 1, 0.0) + m / 2
                nxt[s - 1] = nxt.get(s - 1, 0.0) + m / 2
            mass = nxt
        crossed += sum(m for s, m in mass.items() if s >= bounds.reject[d])
        mass = {s: m for s, m in mass.items() if s < bounds.reject[d] and abs(s) > bounds.futile[d]}
        worst = max(worst, crossed + sum(m for s, m in mass.items() if s >= bounds.final[d]))
    assert worst <= ALPHA / 2 * (1 + 1e-9)


def test_outcome_dependent_errors_make_no_false_decision_beyond_alpha():
    # No true difference; B's server errors on half of B's failures, A's on a quarter of A's episodes at
    # random (so the counts of errored episodes balance). Fed in plan order through the shipped class.
    design = SequentialDesign.plan(0.3, alpha=ALPHA)
    kwargs = dict(runs=200, pairs=design.max_pairs, rate=0.5, errors_a=ErrorModel(0.25, 0.25),
                  errors_b=ErrorModel(0.5, 0.0), seed=3)  # fmt: skip
    bounded = ab_false_decisions(lambda: SequentialPairTest(design=design), **kwargs)
    dropped = ab_false_decisions(lambda: SequentialPairTest(design=design), drop_errors=True, **kwargs)
    limit = ALPHA + 3 * math.sqrt(ALPHA * (1 - ALPHA) / 200)
    assert bounded.rate <= limit, bounded
    assert dropped.rate > limit, dropped  # the rule as it was (errored pairs dropped) fails this check


@pytest.mark.parametrize("kwargs, message", [({"max_pairs": 0}, "max_pairs"), ({"alpha": 0}, "alpha"),
                                             ({"min_difference": 1.5}, "min_difference")])  # fmt: skip
def test_bad_settings(kwargs, message):
    with pytest.raises(ValueError, match=message):
        SequentialPairTest(**kwargs)


def test_binomial_pmf():
    assert binomial_pmf(4, 0.5).tolist() == pytest.approx([1 / 16, 4 / 16, 6 / 16, 4 / 16, 1 / 16])
    assert binomial_pmf(30, 0.3).sum() == pytest.approx(1.0)


def test_no_difference_is_claimed_only_when_every_completion_is_futile(shipped):
    # B errors on the seeds where A wins, wins the others: with B's errored episodes as failures the walk is in
    # the futility band, with them as successes it is far from it. The rule before claimed "no difference" here
    # (the most favourable completion for stopping); now the band ends the test without a claim.
    skewed = SequentialPairTest(design=shipped).update([(True, None), (False, True)] * 10 + [(False, True)] * 30)
    assert skewed.stop and skewed.reason == "errors_undecided" and skewed.better is None
    assert skewed.pairs == 16 and skewed.errored_b == 8 and "no claim" in skewed.why
    # One errored pair whose every completion is in the band: "no difference" is claimed (an exact sequence).
    pairs = [(False, False), (True, False), (False, True), (True, False), (True, True), (True, False),
             (True, False), (False, False), (True, True), (False, None), (False, True), (True, True),
             (True, True), (False, True), (True, True), (False, True), (False, False), (False, True),
             (False, True), (True, False), (True, False), (False, True), (True, True), (True, True),
             (False, True), (False, False), (True, True), (True, True), (True, False), (False, True),
             (True, True), (True, False), (True, True), (False, False), (False, True), (True, False),
             (True, False)]  # fmt: skip
    test = SequentialPairTest(design=shipped)
    decision = test.update(pairs)
    assert decision.reason == "no_difference" and decision.pairs == len(pairs) and decision.errored == 1
    assert test._completions_futile() == (True, True) and "every outcome of the errored episodes" in decision.why
