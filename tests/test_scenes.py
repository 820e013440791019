"""The scene/task registry (dz_gym.envs.scenes): scene ids, task names and prompts for every backend."""

from __future__ import annotations

import subprocess
import sys

import pytest

from dz_gym.envs import droid, scenes


def test_task_table_and_scene_keys():
    assert scenes.scene_key(1) == 1 and scenes.scene_key("place_spoon_in_sink") == 101
    assert scenes.scene_key("3") == 3 and scenes.scene_key("DROID-BananaInBin") == 3
    assert scenes.scene_prompt(103) == "Pick up the red bowl and place it in the grey bowl."
    assert scenes.scene_prompt(2) == droid.scene_spec(2).prompt
    with pytest.raises(ValueError, match="expected one of"):
        scenes.scene_key(7)
    with pytest.raises(ValueError, match="expected one of"):
        scenes.scene_key(True)
    named = scenes.tasks_from_names(["place_spoon_in_sink", "DROID-CanInMug", "place_spoon_in_sink"])
    assert [t.key for t in named] == [101, 2]
    with pytest.raises(ValueError, match="--task: expected one of"):
        scenes.tasks_from_names(["no_such_task"])


def test_task_for_accepts_keys_names_and_scene_numbers():
    assert scenes.task_for(101).name == "place_spoon_in_sink"
    assert scenes.task_for("DROID-CubeInBowl").key == 1 and scenes.task_for("2").name == "DROID-CanInMug"
    with pytest.raises(ValueError, match="task: expected one of"):
        scenes.task_for("stack_the_blocks")
    spec = scenes.task_for(101).scene_spec()
    assert spec.scene_id == 101 and spec.prompt.startswith("Pick up the spoon")


def test_importing_the_registry_imports_no_backend():
    """``import dz_gym`` (first) registers the gym ids: the registration and the kit-less task's id table, no
    simulator, no Isaac Lab, no torch."""
    code = (
        "import sys, dz_gym.envs.scenes; "
        "print(sorted(m for m in sys.modules if m.startswith(('dz_gym.envs.', 'mujoco', 'isaaclab', 'torch'))))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    assert out.stdout.strip() == (
        "['dz_gym.envs.droid', 'dz_gym.envs.isaac_droid3', 'dz_gym.envs.registration', 'dz_gym.envs.scenes']"
    )
