"""The Python API of a run (dz_gym.eval.run.run_eval): what it refuses before writing anything, and a run on a
scripted env against a real server, with its trackers and its result."""

from __future__ import annotations

import pytest

from dz_gym.eval.config import EvalConfig
from dz_gym.eval.control import RunControl
from dz_gym.eval.run import run_eval
from dz_gym.server.launch import start_server_thread
from dz_gym.testing.toy_env import STAGED_LENGTH, StagedToyEnv

PATH = "/v1/realtime/robot/openpi"


def _config(**fields):
    base = {"scenes": [1], "episodes": 4, "num_envs": 2, "max_steps": STAGED_LENGTH, "video": False, "report": False,
            "backend": "mujoco"}  # fmt: skip
    return EvalConfig(**{**base, **fields})


def _toy(scene, cfg):
    return StagedToyEnv(cfg.plan.num_envs, scene)


def test_a_server_that_does_not_answer_is_refused_before_anything_is_written(tmp_path):
    result = run_eval(_config(servers=["ws://127.0.0.1:1/v1/realtime/robot/openpi"], env_factory=_toy),
                      output_root=tmp_path)  # fmt: skip
    assert result.status == "aborted" and result.run_dir is None and result.error.startswith("--server")
    assert not any(tmp_path.iterdir())


def test_a_stop_before_the_start_writes_nothing(tmp_path):
    with start_server_thread("hold") as server:
        control = RunControl()
        control.stop.set()
        result = run_eval(_config(servers=[server.url + PATH], control=control, env_factory=_toy),
                          output_root=tmp_path)  # fmt: skip
    assert result.status == "interrupted" and result.run_dir is None and not any(tmp_path.iterdir())


def test_an_env_factory_cannot_cross_into_scene_processes(tmp_path):
    with pytest.raises(ValueError, match="^process_per_scene: an env_factory cannot cross"):
        run_eval(_config(scenes=[1, 2], env_factory=_toy, process_per_scene=True), output_root=tmp_path)


def test_a_run_on_a_scripted_env_with_its_trackers(tmp_path):
    pytest.importorskip("tensorboard")
    with start_server_thread("hold") as server:
        result = run_eval(_config(scenes=[1, 2], servers=[server.url + PATH], log=["tensorboard"], env_factory=_toy,
                                  command="test"), output_root=tmp_path)  # fmt: skip
    assert result.status == "complete" and result.error is None and result.exception is None
    rows = result.run_dir.read_rows()
    assert len(rows) == 8 and {r["scene"] for r in rows} == {1, 2}
    assert result.summary["overall"]["failure_modes"] == {"success": 2, "undone": 2, "never_reached": 2,
                                                          "grasp_failed": 2}  # fmt: skip
    assert result.summary["command"] == "test"
    assert list((result.run_dir.path / "tensorboard").iterdir())  # the event file of --log tensorboard


def test_a_run_with_retries_says_once_and_in_its_summary_what_they_assume(tmp_path):
    said: list[str] = []
    with start_server_thread("hold") as server:
        result = run_eval(_config(servers=[server.url + PATH], env_factory=_toy), output_root=tmp_path,
                          on_line=said.append)  # fmt: skip
    assert result.status == "complete"
    retries = result.summary["retries"]
    assert retries["episode_retries"] == 2 and retries["policy_seed"] is False
    assert "reproduces the attempt it replaces" in retries["assumes"] and "fresh noise" in retries["assumes"]
    assert [line for line in said if line.startswith("--episode-retries 2 assumes ")] == [
        f"--episode-retries 2 assumes {retries['assumes']}"
    ]
    assert EvalConfig(backend="mujoco", episode_retries=0).retries_assumption() is None
    seeded = EvalConfig(backend="mujoco", policy_seed=True).retries_assumption()
    assert seeded["policy_seed"] is True and "a server that ignores it draws fresh noise" in seeded["assumes"]


def test_the_help_states_what_retries_assume():
    from dz_gym.eval import cli

    text = " ".join(cli.build_parser(isaac_args=False).format_help().split())
    assert "a retry assumes the episode is reproducible from its seed" in text
