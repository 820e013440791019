"""bench_isaac3's bound and raw: per T-step episode, T steps of physics and ceil(T/8) - 1 renders (the first
request's views are the reset's; none is rendered for a request after the episode's end), from the two
measured step times s_N (views one step in 8) and s_N all (every step)."""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_isaac3.py"


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("bench_isaac3_under_test", BENCH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_step_splits_into_physics_and_one_render(bench):
    phys, render = bench.split_step(step_s=0.0636, step_all_s=0.1787)
    assert phys + render == pytest.approx(0.1787)
    assert phys + render / 8 == pytest.approx(0.0636)
    assert bench.split_step(0.05, 0.04) == (0.05, 0.0), "a render faster than nothing (noise) counts as none"


@pytest.mark.parametrize("steps", [16, 64, 200])
def test_the_bound_counts_a_round_of_latency_per_request_and_a_render_per_request_but_the_first(bench, steps):
    n, workers, latency, s_n, s_all = 1024, 512, 0.2, 0.0636, 0.1787
    phys, render = bench.split_step(s_n, s_all)
    requests = math.ceil(steps / 8)
    by_hand = n * steps / (requests * 2 * latency + steps * phys + (requests - 1) * render)
    assert bench.bound(n, workers, latency, s_n, s_all, steps) == pytest.approx(by_hand)
    assert bench.raw_rate(n, s_n, s_all, steps) == pytest.approx(n * steps / (steps * phys + (requests - 1) * render))
    old = 8 * n / (math.ceil(n / workers) * latency + 8 * s_n)  # a render for every request: more work, a lower bound
    assert bench.bound(n, workers, latency, s_n, s_all, steps) > old


def test_the_bound_approaches_the_per_round_formula_for_long_episodes(bench):
    n, latency, s_n, s_all = 256, 0.2, 0.0406, 0.0702
    old = 8 * n / (latency + 8 * s_n)
    gaps = [bench.bound(n, n, latency, s_n, s_all, steps) / old - 1 for steps in (64, 640, 6400)]
    assert gaps[0] > gaps[1] > gaps[2] > 0 and gaps[2] < 1e-3


def test_the_simulators_reset_counts_once_per_episode_in_both_bound_and_raw(bench):
    n, latency, s_n, s_all, steps, reset_s = 1024, 0.2, 0.0636, 0.1787, 64, 0.35
    phys, render = bench.split_step(s_n, s_all)
    sim = steps * phys + 7 * render
    assert bench.bound(n, n, latency, s_n, s_all, steps, reset_s) == pytest.approx(
        n * steps / (reset_s + 8 * latency + sim)
    )
    assert bench.raw_rate(n, s_n, s_all, steps, reset_s) == pytest.approx(n * steps / (reset_s + sim))
    assert bench.bound(n, n, latency, s_n, s_all, steps) == pytest.approx(n * steps / (8 * latency + sim))


def test_the_reset_is_timed_on_the_embedded_simulator_with_every_view_rendered(bench):
    env = bench.bench_eval.make_env(2, 16, 1)
    try:
        resets = []
        real = env.reset

        def counted(*args, **kwargs):
            resets.append(env.unwrapped._render_mask)
            return real(*args, **kwargs)

        env.reset = counted
        reset_s = bench.measure_reset(env, repeats=3)
        assert reset_s > 0 and len(resets) == 3
        assert all(mask is None for mask in resets)  # every view rendered, as at the evaluator's first reset
    finally:
        env.close()
