"""EvalConfig's sections, its saved layout and the migration of the flat layout of version 1.

The files under ``tests/data/old_configs/`` are ``config.json`` files written by dz-gym before the sections
(``RunDir.create`` of an ``EvalConfig`` of the flat layout, version 1): a plain two-scene run, a sequential A/B
run of two embedded policies and a race of named arms against an external server.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from dz_gym.eval.config import (
    CONFIG_VERSION,
    FLAT_KEYS,
    PATHS,
    RESULT_KEYS,
    SECTIONS,
    EvalConfig,
    flat_layout,
    migrate,
    resume_conflicts,
)
from dz_gym.eval.rundir import RunDir

OLD = Path(__file__).parent / "data" / "old_configs"
OLD_FILES = sorted(OLD.glob("*.json"))


def test_every_field_sits_in_one_section_and_every_flat_key_has_a_place():
    names = [f.name for cls in SECTIONS.values() for f in dataclasses.fields(cls)]
    assert len(names) == len(set(names)) == len(FLAT_KEYS)
    assert set(FLAT_KEYS.values()) == {path for path in PATHS.values() if not path.startswith("execution.")}
    assert [f.name for f in dataclasses.fields(EvalConfig)] == [*SECTIONS, "execution", "version"]


def test_fields_are_set_by_section_dotted_path_or_name_alike():
    by_name = EvalConfig(num_envs=4, backend="mujoco", prefetch=2, transport_processes=0)
    by_path = EvalConfig(**{"plan.num_envs": 4, "plan.backend": "mujoco", "schedule.prefetch": 2,
                            "transport.processes": 0})  # fmt: skip
    by_section = EvalConfig(plan={"num_envs": 4, "backend": "mujoco"}, schedule={"prefetch": 2},
                            transport=by_name.transport)  # fmt: skip
    assert by_name == by_path == by_section
    assert by_name.get("schedule.prefetch") == by_name.get("prefetch") == by_name.schedule.prefetch == 2
    assert dataclasses.replace(by_name, num_envs=2).plan.num_envs == 2 and by_name.plan.num_envs == 4
    with pytest.raises(TypeError, match="unexpected field 'colour'"):
        EvalConfig(colour="red")


@pytest.mark.parametrize("path", OLD_FILES, ids=lambda p: p.stem)
def test_an_old_flat_config_reads_and_keeps_every_value(path):
    old = json.loads(path.read_text())
    assert old["version"] == 1 and "plan" not in old
    config = EvalConfig.from_dict(old)
    assert config.to_flat_dict() == old  # every value where it was, in the flat layout summaries keep
    nested = migrate(old)
    assert old == json.loads(path.read_text())  # pure: the input is not changed
    assert nested["version"] == CONFIG_VERSION and set(nested) <= {*SECTIONS, "version"}
    assert EvalConfig.from_dict(config.to_dict()) == config
    assert flat_layout(config.to_dict()) == old


@pytest.mark.parametrize("path", OLD_FILES, ids=lambda p: p.stem)
def test_a_run_directory_of_the_flat_layout_resumes_with_the_same_result_keys(tmp_path, path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.json").write_text(path.read_text())
    saved = RunDir.open(run).load_config()
    again = EvalConfig.from_dict(json.loads(path.read_text()))
    assert resume_conflicts(saved, again) == []
    RunDir(run).save_config(saved)  # a resume saves it again: nested now, the same values
    rewritten = json.loads((run / "config.json").read_text())
    assert rewritten["version"] == CONFIG_VERSION and RunDir(run).load_config() == saved
    changed = dataclasses.replace(saved, seed=saved.plan.seed + 1)
    assert resume_conflicts(saved, changed) == [f"seed: the run used {saved.plan.seed}, got {saved.plan.seed + 1}"]
    assert "plan.seed" in RESULT_KEYS and "plan.num_envs" not in RESULT_KEYS


def test_a_sequential_run_saved_before_budgets_were_checked_keeps_its_budget():
    old = json.loads((OLD / "sequential_ab.json").read_text())
    del old["accept_lower_power"]
    old["max_episodes"] = None
    nested = migrate(old)
    assert nested["stats"]["accept_lower_power"] is True and nested["stats"]["max_episodes"] == 200


@pytest.mark.parametrize(
    ("data", "needle"),
    [
        ({"scenes": [1], "colour": "red", "version": 1}, r"unknown keys \['colour'\]"),
        ({"plan": {"colour": "red"}, "version": CONFIG_VERSION}, r"unknown keys \['plan.colour'\]"),
        ({"plan": {}, "version": CONFIG_VERSION + 1}, f"version {CONFIG_VERSION + 1} is not supported"),
    ],
)
def test_a_config_of_a_newer_dz_gym_is_a_one_line_error(data, needle):
    with pytest.raises(ValueError, match=needle):
        migrate(data)


def test_how_this_process_runs_it_is_neither_saved_nor_compared(tmp_path):
    def factory(scene, config):
        raise AssertionError("not called")

    config = EvalConfig(num_envs=2, backend="mujoco", env_factory=factory, progress=None, serve_args=("--x",))
    assert config.execution.env_factory is factory and config.execution.serve_args == ["--x"]
    assert config == EvalConfig(num_envs=2, backend="mujoco") and "execution" not in config.to_dict()
    saved = RunDir.create(tmp_path, config).load_config()
    assert saved == config and saved.execution.env_factory is None
    with pytest.raises(ValueError, match="^process_per_scene: an env_factory cannot cross"):
        EvalConfig(backend="mujoco", env_factory=factory, process_per_scene=True)
    with pytest.raises(ValueError, match="^scene_processes: expected an integer >= 1, got 0"):
        EvalConfig(backend="mujoco", scene_processes=0)
