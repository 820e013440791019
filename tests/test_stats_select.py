"""K arms on the same seeds: simultaneous rank intervals, and the anytime-valid selection of the best."""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path

import numpy as np
import pytest

from dz_gym.stats.ranking import rank_arms
from dz_gym.stats.select import BestArmSelection
from dz_gym.stats.walk import Boundaries, walk

BENCH = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_rank.py"


def _bench():
    spec = importlib.util.spec_from_file_location("bench_rank", BENCH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_rank_intervals_from_simultaneous_paired_comparisons():
    # a solves 30 of 30 seeds, b the first 15, c none: a > b > c by exact McNemar with Holm over 3 pairs.
    out = rank_arms({"c": [False] * 30, "b": [True] * 15 + [False] * 15, "a": [True] * 30})
    by = {e["arm"]: e for e in out["arms"]}
    assert [e["arm"] for e in out["arms"]] == ["a", "b", "c"] and by["a"]["rank"] == 1
    assert (
        by["a"]["rank_interval"] == [1, 1] and by["b"]["rank_interval"] == [2, 2] and by["c"]["rank_interval"] == [3, 3]
    )
    assert by["a"]["surely_better_than"] == ["b", "c"] and by["b"]["wilson95"][0] < 0.5 < by["b"]["wilson95"][1]
    # Two arms that differ on 3 seeds only: not separable, both intervals [1, 2].
    close = rank_arms({"x": [True] * 3 + [False] * 7, "y": [False] * 10})
    assert all(e["rank_interval"] == [1, 2] for e in close["arms"])
    p = next(q for q in close["pairs"])
    assert p["only"] == [3, 0] and p["p_value"] == pytest.approx(0.25)
    # Errored outcomes (None) leave the seed out of that arm's comparisons and its rate.
    errored = rank_arms({"x": [True, None, False], "y": [False, True, None]})
    assert errored["arms"][0]["n"] == 2 and errored["pairs"][0]["only"] == [1, 0]


def test_rank_arms_bad_input():
    with pytest.raises(ValueError, match="at least 2"):
        rank_arms({"a": [True]})
    with pytest.raises(ValueError, match="same length"):
        rank_arms({"a": [True], "b": [True, False]})


def test_two_arm_elimination_type_one_error_is_exact_and_at_most_alpha():
    # K = 2 equal arms: the better-named arm eliminates the other when its e-process reaches 1/alpha. The
    # crossing probability over 3000 discordant seeds, by dynamic programming over the walk: <= alpha.
    sel = BestArmSelection(["a", "b"], alpha=0.05)
    cap = 3000
    reject = np.full(cap + 1, cap + 1)
    for d in range(1, cap + 1):
        for k in range((d + 1) // 2, d + 1):
            sel.wins[0, 1], sel.wins[1, 0] = k, d - k
            if sel.log_e(0, 1) >= sel.log_threshold:
                reject[d] = 2 * k - d
                break
    none = np.full(cap + 1, -1)
    up_only = Boundaries(reject, none, np.full(cap + 1, cap + 1))
    w = walk(up_only, 0.5)
    assert 0.01 < w.up.sum() <= 0.05  # Ville's bound, and not vacuous


def test_class_matches_the_vectorized_benchmark_rule():
    bench = _bench()
    rates = (0.7, 0.5, 0.3)
    runs = 30
    rng = np.random.default_rng(11)
    outcomes = rng.random((2000, runs, 3)) < np.asarray(rates)

    class Replay:
        def __init__(self):
            self.t = 0

        def random(self, shape):
            out = np.where(outcomes[self.t], 0.0, 1.0)  # < p exactly where the outcome is True
            self.t += 1
            return out

    episodes, correct = bench.simulate(rates, 0.05, runs, Replay())
    for r in range(runs):
        sel = BestArmSelection(["a", "b", "c"])
        t = 0
        while not sel.stopped:
            sel.update({arm: bool(outcomes[t, r, i]) for i, arm in enumerate("abc") if arm in sel.survivors})
            t += 1
        assert sel.episodes == episodes[r] and (sel.best == "a") == bool(correct[r])


def test_selection_finds_the_clear_best_and_never_names_one_among_equal_failures():
    rng = np.random.default_rng(2)
    sel = BestArmSelection(["a", "b", "c", "d"], alpha=0.05)
    while not sel.stopped:
        draw = rng.random(4) < np.array([0.9, 0.4, 0.3, 0.2])
        sel.update({arm: bool(x) for arm, x in zip("abcd", draw) if arm in sel.survivors})
    assert sel.best == "a" and set(sel.eliminated) == {"b", "c", "d"}
    assert "best with probability >= 0.95" in sel.to_dict()["why"]
    hold = BestArmSelection(["a", "b", "c"], max_rounds=200)
    while not hold.stopped:
        hold.update(dict.fromkeys(hold.survivors, False))
    assert hold.best is None and hold.survivors == ["a", "b", "c"] and "no winner" in hold.to_dict()["why"]


def test_selection_errors_and_bad_input():
    sel = BestArmSelection(["a", "b"])
    sel.update({"a": None, "b": True})
    assert sel.errored == 1 and sel.wins.sum() == 0
    with pytest.raises(ValueError, match="no outcome"):
        sel.update({"a": True})
    with pytest.raises(ValueError, match="distinct"):
        BestArmSelection(["a", "a"])
    with pytest.raises(ValueError, match="alpha"):
        BestArmSelection(["a", "b"], alpha=2)
    assert math.isclose(sel.log_e(0, 1), 0.0)
