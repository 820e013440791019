"""The Isaac Lab 3.0 kit-less DROID task, on a machine without Isaac Lab 3.0: what runs without it.

The env itself needs Isaac Lab 3.0 on Python 3.12 (``examples/isaac3_smoke.py`` checks it, on the CPU or a
GPU); here: the gym registrations, the task table, the MJCF the USD assets are converted from (compiled
with MuJoCo), and the clear error when the kit-less stack is missing.
"""

from __future__ import annotations

import ast
from pathlib import Path

import gymnasium as gym
import mujoco
import pytest

from dz_gym.envs import droid, scenes
from dz_gym.errors import BackendUnavailable

KITLESS_STACK = ("isaaclab_newton", "newton", "warp", "mujoco_warp")
CFG_MODULE = Path(__file__).resolve().parents[1] / "dz_gym" / "envs" / "isaac_droid3" / "env_cfg.py"


def test_gym_ids_registered_with_an_isaac_lab_cfg_entry_point():
    import dz_gym.envs.isaac_droid3 as task

    classes = {node.name for node in ast.walk(ast.parse(CFG_MODULE.read_text())) if isinstance(node, ast.ClassDef)}
    for scene_id, gym_id in task.GYM_IDS.items():
        spec = gym.registry[gym_id]
        assert spec.entry_point == "isaaclab.envs:ManagerBasedRLEnv"
        module, _, name = spec.kwargs["env_cfg_entry_point"].partition(":")
        assert module == "dz_gym.envs.isaac_droid3.env_cfg" and name == f"DroidScene{scene_id}EnvCfg"
        assert name in classes
    task.register()  # idempotent
    assert len([i for i in gym.registry if i.startswith("DZ-DROID-")]) == 3


def test_task_table_has_the_kitless_scenes_with_the_droid_prompts():
    for scene_id in (1, 2, 3):
        task = scenes.task_for(scenes.NEWTON_KEY_BASE + scene_id)
        assert task.kitless and not task.is_mila and task.scene == scene_id
        assert task.gym_id.startswith("DZ-DROID-") and task.gym_id == task.name
        assert task.prompt == droid.scene_spec(scene_id).prompt
        assert scenes.scene_key(task.name) == task.key == 200 + scene_id
        spec = task.scene_spec()
        assert (spec.isaac_object, spec.isaac_container) == ("object", "container")
        assert spec.success == droid.scene_spec(scene_id).success
    assert not scenes.task_for("DROID-CubeInBowl").kitless
    assert [t.key for t in scenes.tasks_from_names(["DZ-DROID-BananaInBin-Newton-v0"])] == [203]


@pytest.mark.parametrize("scene_id", [1, 2, 3])
def test_asset_sources_compile_in_mujoco(scene_id):
    from dz_gym.envs.isaac_droid3 import assets

    sources = assets._sources(scene_id)
    robot = mujoco.MjModel.from_xml_string(sources["robot"])
    actuators = [robot.actuator(i).name for i in range(robot.nu)]
    assert actuators == [assets.GRIPPER_ACTUATOR]  # the arm's PD is Isaac Lab's
    assert robot.tendon(assets.GRIPPER_TENDON).id == 0 and robot.ncam == 0 and robot.nsite == 0
    table = mujoco.MjModel.from_xml_string(sources["table"])
    visual = {table.geom(i).name for i in range(table.ngeom) if table.geom_contype[i] == 0}
    assert {"floor_visual", "table_top_visual"} <= visual
    for part in ("object", "container"):
        body = mujoco.MjModel.from_xml_string(sources[f"scene{scene_id}_{part}"])
        assert body.nbody == 2 and body.body(1).name == part and body.njnt == 1  # one free body at the origin
        assert body.body_pos[1].tolist() == [0.0, 0.0, 0.0]


def test_missing_kitless_stack_is_a_clear_error(monkeypatch):
    from dz_gym.envs.isaac import kitless

    monkeypatch.setattr(kitless, "_find", lambda name: None if name in ("isaaclab_newton", "newton") else object())
    with pytest.raises(
        BackendUnavailable, match=r"missing modules: isaaclab_newton, newton\); run scripts/setup_isaac3"
    ):
        kitless.check_packages()


def test_make_env_fails_fast_without_isaac_lab_3():
    from dz_gym.envs.isaac import kitless, make_env

    if all(kitless._find(name) is not None for name in kitless.REQUIRED):
        pytest.skip("Isaac Lab 3.0 kit-less is installed here: examples/isaac3_smoke.py runs the env")
    with pytest.raises(BackendUnavailable, match="kit-less"):
        make_env("DZ-DROID-CubeInBowl-Newton-v0", num_envs=2, device="cpu")


@pytest.mark.parametrize(
    ("installed", "expected"),
    [
        ({"isaacsim"}, True),  # Isaac Sim: sim-evals' scenes
        (set(KITLESS_STACK), True),  # kit-less: our tasks
        ({"isaaclab_newton"}, False),  # the 3.0 wheel alone (it holds isaaclab_newton, not Newton itself)
        (set(), False),
    ],
)
def test_isaac_can_start_with_isaac_sim_or_the_kitless_stack(monkeypatch, installed, expected):
    from dz_gym.envs.isaac import checks

    assert checks.KITLESS_STACK == KITLESS_STACK
    monkeypatch.setattr(checks, "isaaclab_folder", lambda: Path("isaaclab"))
    monkeypatch.setattr(checks, "_find", lambda name: object() if name in installed else None)
    assert checks.isaac_can_start() is expected
