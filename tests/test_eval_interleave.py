"""Scenes side by side: the scenes of a run advance in step, so a sequential A/B test can stop in any scene.

The plan numbers an A/B run's pairs with the scenes interleaved and the test folds them in that order; these
tests check that every executor also runs the scenes that way: in one process (a batch per scene, stepped in
turn), and a process per scene (all at once, each child reading the others' rows). The toy runs use the toy
env with a gripper (an arm that closes it solves every episode, one that holds it open none); the slow one
runs the embedded simulator with the reference policy against ``hold``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter

import pytest

from dz_gym.eval.config import EvalConfig
from dz_gym.eval.control import RunControl
from dz_gym.eval.evaluate import evaluate
from dz_gym.eval.plan import pair_order, plan_of
from dz_gym.eval.processes import merge_segments
from dz_gym.eval.row import comparable
from dz_gym.eval.rundir import RunDir
from dz_gym.eval.segment import RunSegment
from dz_gym.eval.shared import SharedTest
from dz_gym.eval.summary import pair_tracker
from dz_gym.server.launch import start_server_thread
from dz_gym.server.policies import HoldPolicy
from dz_gym.testing.toy_env import GripperToyEnv

PATH = "/v1/realtime/robot/openpi"
NUM_ENVS = 4  # per scene: 2 pairs in flight in each scene's batch


def factory(scene, cfg):
    return GripperToyEnv(cfg.plan.num_envs, scene=scene, max_episode_length=cfg.plan.max_steps)


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
    config = toy_config(
        open_closed, sequential=True, max_episodes=80, accept_lower_power=True
    )  # 40 seeds per scene planned
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


def test_a_race_over_two_scenes_stops_with_both_in_step(tmp_path, open_closed):
    """--select-best with arm y closing the gripper and x holding it open: y wins within both scenes' first
    seeds, not after every seed of scene 1."""
    specs = [f"x={open_closed[0]}", f"y={open_closed[1]}"]
    config = EvalConfig(scenes=[1, 2], num_envs=NUM_ENVS, episodes=40, max_steps=4, video=False, report=False,
                        arm_specs=specs, select_best=True)  # fmt: skip
    run_dir = RunDir.create(tmp_path, config)
    summary = run(config, run_dir)
    assert summary["selection"]["best"] == "y" and summary["selection"]["stopped"]
    counts = per_scene(run_dir.read_rows())
    assert set(counts) == {1, 2} and abs(counts[1] - counts[2]) <= NUM_ENVS, counts
    assert max(counts.values()) < 2 * 40


def test_a_resumed_multi_scene_run_continues_interleaved(tmp_path, open_closed):
    config = toy_config(open_closed, sequential=True, max_episodes=80, accept_lower_power=True)
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


def test_a_shared_test_folds_the_other_processes_rows_in_plan_order(tmp_path, open_closed):
    """Two processes' view of one run: each gives its own scene's rows to its test and reads the other's
    from episodes.jsonl; both stop at the same pair as one process fed with every row."""
    config = toy_config(open_closed, sequential=True, max_episodes=80, accept_lower_power=True)
    run_dir = RunDir.create(tmp_path, config)
    make = lambda rows: pair_tracker(config, rows)  # noqa: E731
    one, two = SharedTest(make, run_dir, [1], poll_s=0.0), SharedTest(make, run_dir, [2], poll_s=0.0)
    alone = make([])
    order = pair_order([1, 2], 40, interleave=True)
    stopped_at = None
    for index, (scene, episode) in enumerate(order):
        for arm in ("a", "b"):
            row = {"scene": scene, "episode": episode, "seed": episode, "arm": arm, "error": None,
                   "success_at_end": arm == "b"}  # fmt: skip
            run_dir.append_row(row)
            (one if scene == 1 else two).add(row)
            alone.add(row)
        if alone.stopped:
            stopped_at = index
            break
    assert stopped_at is not None and stopped_at < len(order) - 1
    assert one.stopped and two.stopped  # the other process's row that decided is read on its next look
    assert (
        one.test.pairs == two.test.pairs == alone.pairs and one.decision.reason == alone.decision.reason == "b_better"
    )


def test_merge_segments_makes_one_of_the_childrens_concurrent_loops(tmp_path, open_closed):
    config = toy_config(open_closed, episodes=2)
    run_dir = RunDir.create(tmp_path, config)
    old = {"started_at": "2026-01-01T00:00:00Z", "wall_s": 9.0, "env_steps": 90, "busy_s": {}}
    children = [{"started_at": "2026-01-02T00:00:01Z", "wall_s": 4.0, "env_steps": 40, "busy_s": {"ws://x": 1.0}},
                {"started_at": "2026-01-02T00:00:00Z", "wall_s": 5.0, "env_steps": 30, "busy_s": {"ws://y": 2.0}}]  # fmt: skip
    run_dir.write_summary({"segments": [old, *children]})
    merge_segments(run_dir, 1)
    segments = run_dir.read_summary()["segments"]
    assert segments == [old, {"started_at": "2026-01-02T00:00:00Z", "wall_s": 5.0, "env_steps": 70,
                              "busy_s": {"ws://x": 1.0, "ws://y": 2.0}}]  # fmt: skip


@pytest.mark.slow  # the embedded simulator, two scene processes: about a minute
def test_scene_processes_run_side_by_side_and_stop_together(tmp_path):
    """Reference against hold over scenes 1 and 2, a process per scene: both children run at once, read each
    other's rows, and stop at the test's decision with their scenes in step."""
    pytest.importorskip("mujoco")
    argv = ["--backend", "mujoco", "--num-envs", str(NUM_ENVS), "--scene", "1", "--scene", "2", "--episodes", "20",
            "--max-steps", "140", "--policy", "reference", "--policy-b", "hold", "--sequential", "--accept-lower-power", "--min-difference",
            "0.5", "--process-per-scene", "--no-video", "--no-report", "--no-progress", "--output-root", str(tmp_path)]  # fmt: skip
    env = {**os.environ, "MUJOCO_GL": os.environ.get("MUJOCO_GL", "egl")}
    done = subprocess.run([sys.executable, "-m", "dz_gym.eval.cli", *argv], env=env, capture_output=True, text=True,
                          timeout=280, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    (path,) = tmp_path.iterdir()
    summary = json.loads((path / "summary.json").read_text())
    seq = summary["sequential"]
    assert seq["stopped_by"] == "decision" and seq["better"] == "a", seq
    counts = per_scene(RunDir(path).read_rows())
    assert set(counts) == {1, 2} and abs(counts[1] - counts[2]) <= NUM_ENVS, counts
    assert max(counts.values()) < 2 * 20  # neither scene ran all its episodes
    assert len(summary["segments"]) == 1 and summary["segments"][0]["env_steps"] > 0


def test_the_session_warning_counts_every_scene_side_by_side(tmp_path):
    """Two scenes of 40 envs at once: 80 sessions at the one server, more than it keeps resident (64)."""
    lines = []
    for scenes, warned in (([1], False), ([1, 2], True)):
        cfg = EvalConfig(scenes=scenes, num_envs=40, episodes=1, backend="mujoco", video=False, report=False)
        RunSegment(cfg, RunDir.create(tmp_path / str(len(scenes)), cfg), plan_of(cfg).resolve(["ws://a"]),
                   servers=["ws://a"], progress=False, log=lines.append)  # fmt: skip
        assert any("80 envs share the server ws://a" in line for line in lines) == warned, lines


def test_scene_processes_at_once_is_checked(capsys):
    from dz_gym.eval import cli
    from dz_gym.eval.processes import SceneProcesses

    with pytest.raises(ValueError, match="at_once: expected an integer >= 1"):
        SceneProcesses([], "", print, at_once=0)
    with pytest.raises(SystemExit) as exc:
        cli.main(["--scene", "1", "--scene", "2", "--process-per-scene", "--scene-processes", "0"])
    assert exc.value.code == 2 and "--scene-processes: expected an integer >= 1, got 0" in capsys.readouterr().err


@pytest.mark.slow  # two scene processes one after the other: 10-25 s
def test_scene_processes_one_at_a_time_keep_a_segment_each(tmp_path):
    from dz_gym.eval import cli

    argv = ["--backend", "mujoco", "--scene", "1", "--scene", "3", "--process-per-scene", "--scene-processes", "1",
            "--num-envs", "1", "--episodes", "1", "--max-steps", "8", "--no-video", "--no-progress", "--no-report",
            "--output-root", str(tmp_path)]  # fmt: skip
    assert cli.main(argv) == 0
    (path,) = tmp_path.iterdir()
    summary = json.loads((path / "summary.json").read_text())
    assert summary["complete"] and len(summary["segments"]) == 2  # their loops did not overlap: one each
    assert sorted((r["scene"], r["episode"]) for r in RunDir(path).read_rows()) == [(1, 0), (3, 0)]
