"""Scenes side by side: the scenes of a run advance in step, so a sequential A/B test can stop in any scene.

The plan numbers an A/B run's pairs with the scenes interleaved and the test folds them in that order; these
tests check that every executor also runs the scenes that way: in one process (a batch per scene, stepped in
turn). The toy runs use the toy env with a gripper (an arm that closes it solves every episode, one that
holds it open none).
"""

from __future__ import annotations

from collections import Counter

import pytest

from dz_gym.eval.config import EvalConfig
from dz_gym.eval.evaluate import evaluate
from dz_gym.eval.row import comparable
from dz_gym.eval.rundir import RunDir
from dz_gym.eval.runner import RunControl
from dz_gym.server.launch import start_server_thread
from dz_gym.server.policies import HoldPolicy
from dz_gym.testing.toy_env import GripperToyEnv

PATH = "/v1/realtime/robot/openpi"
NUM_ENVS = 4  # per scene: 2 pairs in flight in each scene's batch


def factory(scene, cfg):
    return GripperToyEnv(cfg.num_envs, scene=scene, max_episode_length=cfg.max_steps)


@pytest.fixture(scope="module")
def open_closed():
    """Arm A holds the gripper open (never succeeds), arm B closes it (always succeeds)."""
    with start_server_thread(HoldPolicy(gripper=0.0)) as a, start_server_thread(HoldPolicy(gripper=1.0)) as b:
        yield a.url + PATH, b.url + PATH


def toy_config(urls, **fields):
    fields = {"scenes": [1, 2], "num_envs": NUM_ENVS, "max_steps": 4, "video": False, "report": False, **fields}
    return EvalConfig(servers=[urls[0]], servers_b=[urls[1]], **fields)


def run(config, run_dir, **kwargs):
    return evaluate(config, run_dir, env_factory=factory, progress=False, **kwargs)


def per_scene(rows):
    return Counter(r["scene"] for r in rows)


def test_a_sequential_ab_over_two_scenes_stops_with_both_in_step(tmp_path, open_closed):
    config = toy_config(open_closed, sequential=True, max_episodes=80)  # 40 seeds per scene planned
    run_dir = RunDir.create(tmp_path, config)
    summary = run(config, run_dir)
    rows = run_dir.read_rows()
    seq = summary["sequential"]
    assert seq["stopped_by"] == "decision" and seq["better"] == "b"
    counts = per_scene(rows)
    assert set(counts) == {1, 2} and abs(counts[1] - counts[2]) <= NUM_ENVS, counts
    assert max(counts.values()) < 2 * 40 // 2  # stopped early in both scenes, not after all of scene 1
    assert seq["pairs"] <= len(rows) // 2


def test_side_by_side_rows_are_the_scenes_in_turn_rows(tmp_path, open_closed):
    """The same rows (modulo order and timing) as each scene run alone, one after the other."""
    config = toy_config(open_closed, episodes=6)
    both_dir = RunDir.create(tmp_path / "both", config)
    run(config, both_dir)
    both = both_dir.read_rows()
    in_turn = RunDir.create(tmp_path / "turn", config)
    for scene in (1, 2):
        run(config, in_turn, only_scenes=[scene])
    assert len(both) == 2 * 2 * 6
    assert comparable(both, ignore={"server"}) == comparable(in_turn.read_rows(), ignore={"server"})
    first_half = both[: len(both) // 2]
    assert set(per_scene(first_half)) == {1, 2}  # written interleaved, not scene after scene


def test_a_resumed_multi_scene_run_continues_interleaved(tmp_path, open_closed):
    config = toy_config(open_closed, sequential=True, max_episodes=80)
    run_dir = RunDir.create(tmp_path, config)
    control = RunControl()
    control.on_row = lambda row: control.stop.set() if control.rows_written >= 6 else None
    cut = run(config, run_dir, control=control)
    assert cut["interrupted"] and cut["sequential"]["stopped_by"] == "not_stopped"
    before = len(run_dir.read_rows())
    summary = run(config, run_dir)
    rows = run_dir.read_rows()
    assert summary["sequential"]["stopped_by"] == "decision" and summary["sequential"]["better"] == "b"
    counts, resumed = per_scene(rows), per_scene(rows[before:])
    assert set(resumed) == {1, 2} and abs(counts[1] - counts[2]) <= NUM_ENVS, (counts, resumed)
