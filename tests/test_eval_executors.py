"""The three executors of one run plan write the same rows: in one process, a process per scene, Ray shards;
and which one runs a config is one choice (:func:`dz_gym.eval.executors.choose_executor`, a test per choice).

The same small run (embedded MuJoCo simulator and reference server, 2 scenes x 3 episodes on 2 envs of 12
steps) goes through ``dz-gym-eval`` three times, each in a process of its own (the Ray run starts a private
local instance). Their rows, minus the fields :mod:`dz_gym.eval.row` declares volatile and the shard and server
(each run starts its own embedded server), are identical, and every row is on the plan's slot.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("mujoco")

from dz_gym.eval.config import EvalConfig  # noqa: E402
from dz_gym.eval.executors import EXECUTORS, IN_PROCESS, RAY_SHARDS, SCENE_PROCESSES, choose_executor  # noqa: E402
from dz_gym.eval.plan import plan_of  # noqa: E402
from dz_gym.eval.row import EpisodeRow, comparable  # noqa: E402
from dz_gym.eval.shards.options import RayOptions  # noqa: E402

BASE = ["--backend", "mujoco", "--scene", "1", "--scene", "2", "--num-envs", "2", "--episodes", "3",
        "--max-steps", "12", "--no-progress", "--no-video", "--no-report"]  # fmt: skip
BOUND_S = 300  # every evaluator process is bounded by this
ENV = {"MUJOCO_GL": os.environ.get("MUJOCO_GL", "egl"), "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
       "RAY_USAGE_STATS_ENABLED": "0"}  # fmt: skip


def run_cli(root: Path, *extra: str) -> list[dict]:
    argv = [sys.executable, "-m", "dz_gym.eval.cli", *BASE, "--output-root", str(root), *extra]
    done = subprocess.run(argv, env={**os.environ, **ENV}, capture_output=True, text=True, timeout=BOUND_S)
    assert done.returncode == 0, done.stderr[-2000:]
    (run,) = [p for p in root.iterdir() if p.is_dir()]
    summary = json.loads((run / "summary.json").read_text())
    assert summary["complete"] and not summary["aborted"]
    return [json.loads(line) for line in (run / "episodes.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def in_process(tmp_path_factory):
    return run_cli(tmp_path_factory.mktemp("one"), "--no-process-per-scene")


def test_every_row_is_where_the_plan_put_it(in_process):
    config = EvalConfig(scenes=[1, 2], episodes=3, num_envs=2, max_steps=12, backend="mujoco")
    plan = plan_of(config)  # from the config alone: seeds, slots, policies
    by_key = {e.key: e for e in plan.entries}
    assert sorted(by_key) == sorted((r["scene"], r["episode"], None) for r in in_process)
    for row in in_process:
        entry = by_key[(row["scene"], row["episode"], None)]
        assert (row["seed"], row["env"]) == (entry.seed, entry.slot)
        assert (row["backend"], row["policy"]) == ("mujoco", entry.policy) == ("mujoco", "reference")
        assert EpisodeRow.from_dict(row).to_dict() == row  # the written row is exactly the declared schema


@pytest.mark.slow  # 8-17 s; runs in the first environment's pass
def test_a_process_per_scene_writes_the_same_rows(in_process, tmp_path):
    rows = run_cli(tmp_path, "--process-per-scene")
    assert comparable(rows, ignore={"server"}) == comparable(in_process, ignore={"server"})


@pytest.mark.slow  # 8-17 s; runs in the first environment's pass
def test_ray_shards_write_the_same_rows(in_process, tmp_path):
    pytest.importorskip("ray")
    rows = run_cli(tmp_path, "--ray", "local", "--shards", "2")
    assert {r["shard"] for r in rows} == {0, 1} and all(r["shard"] == r["env"] for r in rows)
    assert comparable(rows, ignore={"server", "shard"}) == comparable(in_process, ignore={"server"})


def _api_rows(root: Path, **options) -> list[dict]:
    """The same run through the Python API (dz_gym.eval.run.run_eval), in this process."""
    from dz_gym.eval.run import run_eval

    config = EvalConfig(scenes=[1, 2], episodes=3, num_envs=2, max_steps=12, backend="mujoco", video=False,
                        report=False, **options)  # fmt: skip
    result = run_eval(config, output_root=root)
    assert result.status == "complete" and result.error is None, result.error
    assert result.summary["complete"] and result.run_dir.path.parent == root
    return result.run_dir.read_rows()


@pytest.mark.slow  # 8-17 s; runs in the first environment's pass
def test_the_python_api_writes_the_same_rows_as_the_cli(in_process, tmp_path):
    rows = _api_rows(tmp_path, process_per_scene=False)  # its own embedded server, started and stopped by the API
    assert comparable(rows, ignore={"server"}) == comparable(in_process, ignore={"server"})


@pytest.mark.slow  # 8-17 s; runs in the first environment's pass
def test_the_python_api_runs_a_process_per_scene_too(in_process, tmp_path, monkeypatch):
    for key, value in ENV.items():
        monkeypatch.setenv(key, value)
    rows = _api_rows(tmp_path, process_per_scene=True)  # each scene in a dz-gym-eval child, as on Isaac Lab
    assert comparable(rows, ignore={"server"}) == comparable(in_process, ignore={"server"})


def _factory(scene, config):
    raise AssertionError("never called: the choice builds nothing")


def test_one_scene_or_a_backend_that_builds_many_scenes_runs_in_this_process():
    assert choose_executor(EvalConfig(backend="mujoco")) == IN_PROCESS
    assert choose_executor(EvalConfig(scenes=[1, 2, 3], backend="mujoco")) == IN_PROCESS
    assert choose_executor(EvalConfig(scenes=[1, 2], backend="mujoco", process_per_scene=False)) == IN_PROCESS


def test_several_scenes_on_a_one_scene_backend_or_asked_for_run_a_process_per_scene():
    assert choose_executor(EvalConfig(scenes=[1, 2], backend="mujoco", process_per_scene=True)) == SCENE_PROCESSES
    isaac = EvalConfig(scenes=[1, 2], backend="isaac", video=False)  # Isaac Lab builds one scene per process
    assert choose_executor(isaac) == SCENE_PROCESSES
    assert choose_executor(EvalConfig(scenes=[1, 2], backend="isaac", process_per_scene=False)) == IN_PROCESS


@pytest.mark.parametrize("execution", [{"only_scenes": [2]}, {"env_factory": _factory}])
def test_a_scene_s_own_process_or_an_env_factory_stays_in_this_process(execution):
    config = EvalConfig(scenes=[1, 2], backend="isaac", **execution)
    assert choose_executor(config) == IN_PROCESS


def test_ray_options_run_shards_whatever_the_backend():
    for backend in ("mujoco", "isaac"):
        assert choose_executor(EvalConfig(scenes=[1, 2], backend=backend, ray=RayOptions())) == RAY_SHARDS
    with pytest.raises(ValueError, match="^ray: a sharded run builds its envs in its shards"):
        EvalConfig(backend="mujoco", ray=RayOptions(), env_factory=_factory)
    assert len(set(EXECUTORS)) == 3
