"""The Isaac backend on real installs (wheel and source versions, the 3.0.0 release vs develop, in-place
termination buffers, sim-evals' per-scene layout and MILA tasks), against the stand-in modules."""

from __future__ import annotations

import argparse
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import isaac_stubs
from isaac_helpers import SMALL, hold, make
from isaac_stubs import sim_evals_layouts

import dz_gym
from dz_gym.envs import scenes
from dz_gym.envs.isaac import compat, launch
from dz_gym.envs.vector_info import entries
from dz_gym.errors import BackendUnavailable


@pytest.fixture
def install(tmp_path):
    """``install(version, **world options)`` -> the stand-in world; everything is removed afterwards."""
    worlds = []

    def make_world(version="2.2", **options):
        root = isaac_stubs.make_sim_evals_checkout(tmp_path / f"sim-evals-{len(worlds)}")
        launch._forget_app_for_tests()
        world = isaac_stubs.install(version, root, **options)
        worlds.append(world)
        return world

    yield make_world
    for world in worlds:
        for env in world.envs:
            env.close()
    isaac_stubs.uninstall()
    launch._forget_app_for_tests()


# -- bug 1: versions of wheel and source installs; the CLI leaves Isaac Lab alone ---------------------------
@pytest.mark.parametrize(
    "version, options, release",
    [
        ("2.2", {"install": "wheel"}, (2, 2)),
        ("2.2", {"install": "source"}, (2, 2)),  # extension 0.45.3 (2.2.1)
        ("2.2", {"install": "source", "release": "2.2.0"}, (2, 2)),  # extension 0.41.2
        ("3.0", {"install": "wheel"}, (3, 0)),
        ("3.0", {"install": "source"}, (3, 0)),  # extension 6.1.0
        ("3.0", {"install": "source", "release": "develop"}, (3, 0)),  # extension 3.5.3
    ],
)
def test_versions_of_wheel_and_source_installs(install, version, options, release):
    world = install(version, **options)
    import importlib.metadata

    assert importlib.metadata.version("isaaclab") == world.version_string
    api = compat.detect()
    assert api.version == release and world.version_string in api.source


def test_version_mapping_table():
    def release(dist, module=None, launcher=False):
        return compat.release_of(compat.Install(dist, module if module is not None else dist, launcher))[0]

    assert release("0.45.3") == (2, 2) and release("0.41.0") == (2, 2) and release("2.2.1") == (2, 2)
    assert release("0.40.9") < (2, 2) and release("1.4.0") < (2, 2)
    assert release("6.1.0") == (3, 0) and release("3.0.0") == (3, 0) and release("3.5.3") == (3, 0)
    assert release(None, "0.45.3") == (2, 2)
    assert release("0.45.3", launcher=True) == (3, 0)  # the 3.x launcher module wins over numbers
    assert "older than 2.2" in compat.release_of(compat.Install("0.40.1", "0.40.1", False))[1]


def test_cli_parser_leaves_isaac_lab_alone_for_the_mujoco_backend(install):
    install("2.2", install="source")  # importable, version 0.44.9 (2.2.0's extension)
    from dz_gym.eval.cli import build_parser

    assert not launch.isaac_flags_wanted(["--backend", "mujoco", "--scene", "1"])
    parser = build_parser(isaac_args=launch.isaac_flags_wanted(["--backend", "mujoco"]))
    args = parser.parse_args(["--backend", "mujoco", "--scene", "1"])
    assert args.backend == "mujoco" and "--headless" not in parser.format_help()
    assert not any(name == "isaaclab" or name.startswith("isaaclab.") for name in sys.modules)
    # auto picks isaac when it is importable, and then the launcher flags join
    assert launch.isaac_flags_wanted([]) and launch.isaac_flags_wanted(["--backend", "isaac"])
    assert "--headless" in build_parser(isaac_args=True).format_help()


@pytest.mark.slow  # a real run with the embedded server; the fast check is the parser test above
def test_dz_gym_eval_mujoco_runs_where_a_source_install_is_importable(install, tmp_path, capsys):
    install("2.2", install="source")
    from dz_gym.eval import cli

    code = cli.main(
        [
            "--backend",
            "mujoco",
            "--num-envs",
            "1",
            "--episodes",
            "1",
            "--max-steps",
            "2",
            "--no-video",
            "--output-root",
            str(tmp_path / "runs"),
            "--policy",
            "hold",
        ]
    )
    assert code == 0, capsys.readouterr().err
    assert len(list((tmp_path / "runs").iterdir())) == 1


def test_isaac_task_without_isaac_lab_is_one_line_and_writes_nothing(tmp_path, capsys):
    isaac_stubs.uninstall()
    from dz_gym.eval import cli

    code = cli.main(["--backend", "isaac", "--task", "place_spoon_in_sink", "--output-root", str(tmp_path / "runs")])
    err = capsys.readouterr().err
    assert code != 0
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and "isaac" in lines[0] and "Traceback" not in err
    assert not (tmp_path / "runs").exists()


def test_unknown_task_is_a_usage_error(capsys):
    from dz_gym.eval import cli

    with pytest.raises(SystemExit) as exit_info:
        cli.main(["--backend", "isaac", "--task", "no_such_task"])
    assert exit_info.value.code == 2 and "--task" in capsys.readouterr().err


# -- resets on 3.0 (the 3.0.0 release and develop have one signature) ---------------------------------
@pytest.mark.parametrize("release", ["3.0.0", "develop"])
def test_reset_passes_env_ids_in_the_form_both_3_0_versions_accept(install, release):
    world = install("3.0", release=release)
    env = make(num_envs=2)
    env.reset(seed=3)
    resets = [call[1] for call in world.calls if call[0] == "env.reset"]
    assert len(resets) == 2
    assert all(call["env_ids"] == ("tensor", "torch.int64", [0, 1]) and call["seed"] == 3 for call in resets)
    obs, _ = env.reset(options={"env_ids": [1]})
    assert [call[1] for call in world.calls if call[0] == "env.reset"][-1]["env_ids"] == ("tensor", "torch.int64", [1])
    assert tuple(obs["policy"]["arm_joint_pos"].shape) == (2, 7)


def test_3_0_hands_a_slice_to_sim_evals_terms_which_fail_on_it(install):
    world = install("3.0", release="3.0.0", layout="per_scene", mila=True)
    make(scene="place_spoon_in_sink", num_envs=2)
    with pytest.raises((TypeError, RuntimeError)):  # sim-evals' initial-conditions term: torch.tensor(slice)
        world.env.reset(env_ids=slice(None))


def test_3_0_reset_takes_env_ids_first_and_seed_by_keyword_only(install):
    world = install("3.0", release="3.0.0")
    make(num_envs=1)
    world.env.reset(None)  # None is normalised to slice(None), as the release does
    with pytest.raises(TypeError):
        world.env.reset(None, 3)  # seed is keyword-only


# -- bug 3: time-outs copied out of the termination manager's in-place buffers ---------------------------
def test_lock_step_time_out_survives_the_hold_step(install):
    world = install("2.2")
    env = make(num_envs=2)
    obs, _ = env.reset(seed=0)
    world.env.episode_length_buf[:] = env.max_episode_length - 2  # two steps before sim-evals' time-out
    obs, _, terminated, truncated, info = env.step(hold(obs))
    assert not truncated.any() and not info["time_outs"].any()
    obs, _, terminated, truncated, info = env.step(hold(obs))  # both time out; the hold step follows
    assert truncated.tolist() == [True, True] and info["time_outs"].tolist() == [True, True]
    assert not terminated.any() and world.env.episode_length_buf.tolist() == [0, 0]
    obs, _, _, truncated, info = env.step(hold(obs))  # the copy is ours: the next step leaves it alone
    assert not truncated.any() and info["episode_seed"].tolist() == [2, 3]


# -- bug 4: sim-evals' per-scene layout ------------------------------------------------------------------
def test_per_scene_layout_builds_the_scene_by_its_gym_id_and_reads_prims(install):
    world = install("2.2", layout="per_scene")
    env = make(scene=1, num_envs=2)
    parse = world.calls[world.index("parse_env_cfg")]
    assert parse[1] == "DROID-CubeInBowl" and ("cfg.set_scene", "DROID-CubeInBowl") in world.calls
    assert ("cfg.set_scene", 1) not in world.calls  # set_scene(int) raises ValueError in this layout
    assert any(call[0] == "usd.open" for call in world.calls)
    cube = world.env.scene["rubiks_cube"]
    assert cube.prim_path == "{ENV_REGEX_NS}/scene/rubiks_cube"
    obs, info = env.reset(seed=0)
    start = isaac_stubs.cfgs.SCENE_BODIES[1]["rubiks_cube"]
    assert np.allclose(info["object_pos"], [start, start], atol=1e-6)  # env-local, from the prim's pose
    bowl = isaac_stubs.cfgs.SCENE_BODIES[1]["_24_bowl"]
    world.env.teleport("rubiks_cube", 1, (bowl[0], bowl[1], bowl[2] + 0.01))
    obs, reward, _, _, info = env.step(hold(obs))
    assert info["success"].tolist() == [False, True] and reward.tolist() == [0.0, 1.0]
    assert np.allclose(info["object_pos"][1], (bowl[0], bowl[1], bowl[2] + 0.01), atol=1e-5)


def test_plain_prims_are_not_entities_upstream(install):
    world = install("2.2", layout="per_scene")
    make(scene=2, num_envs=1)
    scene_cfg = world.env.cfg.scene
    assert hasattr(scene_cfg, "_10_potted_meat_can")  # registered by the backend, not by sim-evals
    assert not hasattr(scene_cfg, "_11_banana")  # other rigid prims stay prims
    with pytest.raises(KeyError):
        world.env.scene["_11_banana"]


def test_per_scene_layout_with_a_run_eval_scene_number_and_3_0_quaternions(install):
    world = install("3.0", layout="per_scene")
    env = make(scene=3, num_envs=1)
    assert world.calls[world.index("parse_env_cfg")][1] == "DROID-BananaInBin"
    assert world.env.cfg.scene._11_banana.init_state.rot == (0.0, 0.0, 0.0, 1.0)  # xyzw on 3.0
    assert env.scene.prompt == "put the banana in the bin"  # the DreamZero client's prompt


# -- MILA tasks --------------------------------------------------------------------------------------
# Per task: env-local object positions for steps 1..3 and the milestone steps they give (hand-computed
# from sim-evals' terms: reach 3 cm to the object's box, lift 5 cm, above/in the target by its radius and
# heights, the grey bowl's region for the red bowl); the tool centre point stays at (0.45, 0, 0.45).
MILA_CASES = {
    "place_spoon_in_sink": (
        [(0.45, 0.0, 0.45), (0.50, -0.30, 0.10), (0.50, -0.30, -0.08)],
        {"reached": 1, "lifted": 1, "above_target": 2, "placed": 3},
    ),
    "place_spoon_in_utensil_holder": (
        [(0.45, 0.0, 0.45), (0.45, -0.25, 0.20), (0.45, -0.25, 0.10)],
        {"reached": 1, "lifted": 1, "above_target": 2, "placed": 3},
    ),
    "stack_red_bowl_into_grey_bowl": (
        [(0.45, 0.0, 0.45), (0.45, 0.0, 0.45), (0.50, -0.20, 0.04)],
        {"reached": 1, "lifted": 1, "above_target": 1, "placed": 3},  # above the grey bowl's height anywhere
    ),
}


def run_mila_case(world, env, name, num_envs):
    poses, _ = MILA_CASES[name]
    task = sim_evals_layouts.MILA_TASKS[name]
    obs, info = env.reset(seed=0)
    infos = [info]
    for pose in poses:
        for i in range(num_envs):
            world.env.teleport(task.object_name, i, pose)
        obs, _, _, _, info = env.step(hold(obs))
        infos.append(info)
    return obs, infos


@pytest.mark.parametrize("name", list(MILA_CASES))
def test_mila_task_selection_prompt_horizon_and_milestones(install, name):
    world = install("2.2", layout="per_scene", mila=True)
    task = scenes.TASKS[name]
    env = make(scene=task.key, num_envs=1)
    upstream = sim_evals_layouts.MILA_TASKS[name]
    assert world.calls[world.index("parse_env_cfg")][1] == "DROID-MILA" and ("cfg.set_task", name) in world.calls
    assert env.scene.prompt == upstream.language_instruction == task.prompt
    assert env.max_episode_length == upstream.max_timesteps == task.max_steps
    obs, infos = run_mila_case(world, env, name, 1)
    expected = MILA_CASES[name][1]
    milestones = infos[-1]["milestones"]
    assert {key: int(milestones[key][0]) for key in scenes.GENERIC_MILESTONES} == expected
    for own, generic in zip(task.milestones, scenes.GENERIC_MILESTONES):  # the task's own names too
        assert milestones[own].tolist() == milestones[generic].tolist()
    assert [bool(info["success"][0]) for info in infos] == [False, False, False, True]
    assert tuple(obs["policy"]["arm_joint_pos"].shape) == (1, 7) and tuple(obs["policy"]["gripper_pos"].shape) == (1, 1)
    assert tuple(isaac_stubs.cfgs.upstream_arm_joint_pos(world.env).shape) == (7,)  # upstream at N=1: no batch dim


@pytest.mark.parametrize("name", list(MILA_CASES))
def test_mila_task_with_several_envs_equals_one_env(install, name):
    single = {}
    for num_envs in (1, 3):
        world = install("3.0", layout="per_scene", mila=True)
        env = make(scene=scenes.TASKS[name].key, num_envs=num_envs)
        _, infos = run_mila_case(world, env, name, num_envs)
        got = [
            (info["success"].tolist(), {k: v.tolist() for k, v in entries(info["milestones"]).items()})
            for info in infos
        ]
        if num_envs == 1:
            single = got
        else:
            for (success, milestones), (one_success, one_milestones) in zip(got, single):
                assert success == one_success * 3
                assert milestones == {k: v * 3 for k, v in one_milestones.items()}
        env.close()


def test_mila_milestones_reset_with_the_episode(install):
    world = install("2.2", layout="per_scene", mila=True)
    env = make(scene="place_spoon_in_sink", num_envs=1)
    run_mila_case(world, env, "place_spoon_in_sink", 1)
    _, info = env.reset()
    assert all(v.tolist() == [-1] for v in entries(info["milestones"]).values()) and not info["success"].any()


def test_mila_task_needs_a_sim_evals_with_mila(install):
    install("2.2", layout="per_scene")
    with pytest.raises(BackendUnavailable, match="MILA"):
        make(scene="place_spoon_in_sink", num_envs=1)


# -- stand-in gaps -------------------------------------------------------------------------------------
def test_3_0_origin_grid_uses_the_float_square_root(install):
    from isaac_stubs.sim import env_origins

    assert len(set(env_origins(8, 1.0, float_sqrt=True)[:, 0].tolist())) == 3  # 3x3
    assert len(set(env_origins(8, 1.0)[:, 0].tolist())) == 4  # 2.2: 4x2


def test_missing_gripper_body_is_a_clear_error(install):
    install("2.2")
    with pytest.raises(KeyError, match="not all in the articulation"):
        make(num_envs=1, tcp_bodies=("left_inner_finger", "no_such_finger"))


def test_distant_lights_are_kept_once(install):
    world = install("2.2", scene_distant_light=True)
    env = make(num_envs=3)
    lights = {
        str(p.GetPath()): p.GetAttribute("inputs:intensity").Get()
        for p in world.env.sim.stage.prims
        if p.GetTypeName() == "DistantLight"
    }
    assert lights["/World/envs/env_0/scene/DistantLight"] > 0
    assert lights["/World/envs/env_1/scene/DistantLight"] == 0 == lights["/World/envs/env_2/scene/DistantLight"]
    assert env.patches


@pytest.mark.parametrize("release", ["3.0.0", "develop", "develop-old"])
def test_3_0_launcher_is_isaaclab_app_launch_simulation_where_it_exists(install, release):
    world = install("3.0", release=release)
    parser = argparse.ArgumentParser()
    dz_gym.envs.isaac.add_launcher_args(parser)
    assert parser.parse_args([]).visualizer is None
    assert parser.parse_args(["--viz", "kit,newton"]).visualizer == ["kit", "newton"]
    make(num_envs=1)
    args = world.calls[world.index("app.launch")][1]
    assert world.launched and ("require_kit" in args) is (release != "develop-old")
    # develop snapshots before extension 6.2.1 have no launch_simulation: AppLauncher starts them
    assert ("headless" in args) is (release == "develop-old")


def test_api_reset_of_every_env_is_an_int_tensor_on_the_device():
    """The adapter's reset in isolation, against both signatures (the real wheels' are checked in
    test_isaac_wheels.py): keywords only, every env as an int64 tensor."""

    class V22:
        num_envs, device = 4, "cpu"

        def reset(self, seed=None, env_ids=None, options=None):
            return len(range(4)) if env_ids is None else len(env_ids), seed

    class V30:
        num_envs, device = 4, "cpu"

        def reset(self, env_ids=slice(None), *, seed=None, options=None):
            return env_ids, seed

    assert compat.IsaacLabApi((2, 2)).reset(V22(), seed=5) == (4, 5)
    ids, seed = compat.IsaacLabApi((3, 0)).reset(V30(), seed=5)
    assert ids.dtype == torch.int64 and ids.tolist() == [0, 1, 2, 3] and seed == 5
    assert compat.IsaacLabApi((2, 2)).reset(V22(), env_ids=torch.tensor([1, 3])) == (2, None)


@pytest.mark.parametrize("which", [["--task", "stack_red_bowl_into_grey_bowl"], ["--scene", "2"]])
def test_check_batched_example_on_the_per_scene_layout(install, tmp_path, capsys, which):
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "examples" / "isaac_check_batched.py"
    spec = importlib.util.spec_from_file_location("isaac_check_batched", path)
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    outputs = {}
    for role in ("reference", "batched"):
        world = install("2.2", layout="per_scene", mila=True)
        args = example.build_parser().parse_args(
            [*which, "--num-envs", "3", "--steps", "12", "--device", "cpu", "--skip-gpu-check"]
        )
        outputs[role] = tmp_path / f"{role}.npz"
        example.run_role(args, role, outputs[role], image_shape=SMALL)
        built = world.calls[world.index("parse_env_cfg")][1]
        assert built == ("DROID-MILA" if which[0] == "--task" else "DROID-CanInMug")
    reference, batched = dict(np.load(outputs["reference"])), dict(np.load(outputs["batched"]))
    assert batched["milestones"].shape == (12, 3, 4) and reference["milestones"].shape == (12, 1, 4)
    assert example.report(example.compare(reference, batched), 3)
    assert capsys.readouterr().out.strip().endswith("PASS")


def test_mila_task_on_the_embedded_simulator_is_a_usage_error(capsys):
    from dz_gym.eval import cli

    with pytest.raises(SystemExit) as exit_info:
        cli.main(["--backend", "mujoco", "--task", "place_spoon_in_sink"])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and "--backend isaac" in err and "Traceback" not in err


def test_task_flag_sets_scenes_prompts_and_the_default_horizon():
    from dz_gym.eval import cli

    parser = cli.build_parser(isaac_args=False)
    args = parser.parse_args(
        [
            "--backend",
            "isaac",
            "--task",
            "place_spoon_in_sink",
            "--task",
            "stack_red_bowl_into_grey_bowl",
            "--scene",
            "1",
        ]
    )
    config, _, _ = cli.resolve_config(parser, args)
    assert config.plan.scenes == [1, 101, 103] and config.plan.max_steps == 600
    args = parser.parse_args(["--backend", "isaac", "--task", "place_spoon_in_sink", "--max-steps", "50"])
    assert cli.resolve_config(parser, args)[0].plan.max_steps == 50
    from dz_gym.eval.summary import build_summary  # noqa: F401  (prompts of task ids come from the task table)

    assert scenes.scene_prompt(101) == "Pick up the spoon and place it in the sink."


@pytest.mark.parametrize("version", ["2.2", "3.0"])
def test_per_scene_layout_gets_the_multi_env_patches_and_start_up_quirks(install, version):
    world = install(version, layout="per_scene", scene_dome_light=True)
    env = make(scene=1, num_envs=3)
    cfg = world.env.cfg
    assert cfg.scene.sphere_light.prim_path == "{ENV_REGEX_NS}/sphere_light"
    assert cfg.observations.policy.arm_joint_pos.func is not isaac_stubs.cfgs.upstream_arm_joint_pos
    assert sum("infinite light" in change for change in env.patches) == 2
    obs, _ = env.reset(seed=0)
    assert len([call for call in world.calls if call[0] == "env.reset"]) == 2  # the double reset
    action = hold(obs)
    action[:, 0] = torch.tensor([-0.3, 0.0, 0.3])
    for _ in range(6):
        obs, *_ = env.step(action)
    assert tuple(obs["policy"]["arm_joint_pos"].shape) == (3, 7)
    assert np.allclose(obs["policy"]["arm_joint_pos"][:, 0].numpy(), [-0.3, 0.0, 0.3], atol=1e-3)
    irradiance = world.env.irradiance()
    assert np.allclose(irradiance, irradiance[0], rtol=0.01)  # every env lit as env 0


def test_mila_initial_conditions_follow_the_episode_seed_whatever_num_envs(install):
    """sim-evals deals its pose sets round-robin in reset order; dz-gym deals pose set seed % count."""
    starts = {}
    for num_envs in (1, 3):
        world = install("2.2", layout="per_scene", mila=True)
        env = make(scene="place_spoon_in_sink", num_envs=num_envs)
        poses = world.env.event_manager.get_term_cfg("reset_initial_conditions").func
        count = len(poses.initial_conditions)
        obs, info = env.reset(seed=0)
        seen = {int(s): info["object_pos"][i].copy() for i, s in enumerate(info["episode_seed"])}
        for _ in range(2):  # two lock-step autoresets
            world.env.episode_length_buf[:] = env.max_episode_length - 1
            obs, _, _, truncated, info = env.step(hold(obs))
            assert truncated.all()
            obs, _, _, _, info = env.step(hold(obs))
            seen.update({int(s): info["object_pos"][i].copy() for i, s in enumerate(info["episode_seed"])})
        assert poses.current_index == 0 and len(poses.initial_conditions) == count  # restored after each reset
        starts[num_envs] = seen
        for seed, pos in seen.items():
            expected = poses.initial_conditions[seed % count]["spoon"][:3]
            assert np.allclose(pos, expected, atol=1e-5), (num_envs, seed)
        env.close()
    shared = sorted(set(starts[1]) & set(starts[3]))
    assert shared == [0, 1, 2] and all(np.allclose(starts[1][s], starts[3][s]) for s in shared)


def test_mila_without_sim_evals_milestone_buffer_computes_them_from_the_poses(install, monkeypatch):
    world = install("2.2", layout="per_scene", mila=True)
    monkeypatch.setattr(sim_evals_layouts, "milestone_reward", lambda env, task_id: torch.zeros(env.num_envs))
    monkeypatch.setattr(sim_evals_layouts, "reset_milestones", lambda env, env_ids: None)
    env = make(scene="place_spoon_in_sink", num_envs=2)
    _, infos = run_mila_case(world, env, "place_spoon_in_sink", 2)
    assert getattr(world.env, "_mila_milestones_reached", None) is None and env._fallback.used
    milestones = infos[-1]["milestones"]
    assert {key: milestones[key].tolist() for key in scenes.GENERIC_MILESTONES} == {
        key: [step, step] for key, step in MILA_CASES["place_spoon_in_sink"][1].items()
    }
    assert [info["success"].tolist() for info in infos] == [[False, False]] * 3 + [[True, True]]


# -- finding 7: the residual RL env on the isaac backend ------------------------------------------------------
def test_make_residual_env_on_the_isaac_backend(install):
    """make_residual_env(backend="isaac") used to fail with a TypeError (max_episode_length was no
    IsaacDroidEnv argument); Isaac Lab's own time-out now sits one step past the residual episode."""
    from dz_gym.rl.residual import make_residual_env
    from dz_gym.server.policies import HoldPolicy
    from dz_gym.testing.memory_client import MemoryPolicyClient

    world = install("2.2")
    client = MemoryPolicyClient(HoldPolicy(), num_envs=2)
    env = make_residual_env(
        1, 2, client=client, episode_length=5, seed=0, backend="isaac",
        env_kwargs={"device": "cpu", "check_gpu": False, "image_shape": SMALL},
    )  # fmt: skip
    try:
        assert world.env.max_episode_length == 6
        env.reset(seed=0)
        ended = []
        for _ in range(5):
            _, _, terminated, truncated, info = env.step(torch.zeros(2, 8))
            ended.append(bool((terminated | truncated).all()))
        assert ended == [False] * 4 + [True]  # the residual env ends the episode, not Isaac Lab's time-out
    finally:
        env.close()


def test_max_episode_length_sets_isaac_labs_time_out(install):
    world = install("3.0")
    env = make(num_envs=2, max_episode_length=7)
    assert world.env.max_episode_length == 7 and env.max_episode_length == 7
    assert any(change.startswith("episode_length_s:") for change in env.patches)
    with pytest.raises(ValueError, match="max_episode_length"):
        make(num_envs=2, max_episode_length=0)


# -- finding 3: the layout is what the installed sim-evals registers and exposes -----------------------------
@pytest.mark.parametrize(
    ("layout", "expected", "built"),
    [
        ("run_eval", "run_eval", "sim-evals scene 2 (DROID.set_scene)"),  # 3a6b0e8
        ("per_scene", "per_scene", "sim-evals scene DROID-CanInMug"),  # 711ff04
        ("de7ae486", "per_scene", "sim-evals scene DROID-CanInMug"),  # per-scene ids only, no DROID, no droid/
        ("fea59e52", "droid_by_id", "sim-evals DROID.set_scene('DROID-CanInMug')"),  # set_scene(env_id: str)
        ("7ef6f1bc", "per_scene", "sim-evals scene DROID-CanInMug"),  # DROID and the per-scene ids
    ],
)
def test_layout_is_decided_before_launch_by_gym_ids_and_set_scene(install, layout, expected, built):
    from dz_gym.envs import scenes
    from dz_gym.envs.isaac import checks, tasks

    world = install("2.2", layout=layout)
    read = tasks.read_sim_evals(checks.sim_evals_package_dir())
    assert read.layout_for(scenes.task_for(2)) == expected and not world.launched  # before Kit starts
    env = make(scene=2, num_envs=2)
    assert env.layout == expected and env.patches[0].startswith(built)
    obs, _ = env.reset(seed=0)
    state = env._probe.read(env.isaac_env)  # the object and the container are entities in every layout
    assert state.object_pos.shape == (2, 3) and np.isfinite(state.container_pos).all()
    env.close()


def test_a_sim_evals_without_the_scene_fails_before_launch(install):
    from dz_gym.envs.isaac import checks, tasks

    world = install("2.2", layout="de7ae486")
    ids = tasks.read_sim_evals(checks.sim_evals_package_dir()).gym_ids
    assert "DROID" not in ids and "DROID-CubeInBowl" in ids
    broken = tasks.SimEvalsInstall(frozenset({"DROID-Other"}), None, False, False)
    with pytest.raises(ValueError, match="registers neither 'DROID-CubeInBowl' nor 'DROID'"):
        broken.layout_for(scenes.task_for(1))
    assert not world.launched


def test_mila_on_the_droid_environment_layout(install):
    """MILA first shipped on the droid_environment.py layout (510b7dfb): no droid/ package."""
    world = install("2.2", layout="run_eval", mila=True)
    env = make(scene="place_spoon_in_sink", num_envs=2)
    obs, info = env.reset(seed=0)
    assert env.patches[0].startswith("sim-evals MILA task place_spoon_in_sink")
    assert set(entries(info["milestones"])) >= {"reached_spoon", "completely_in_sink"} and world.launched
    env.close()


# -- finding 6: the exterior view a MILA task sends ----------------------------------------------------------
def test_mila_task_sends_its_policy_external_camera_as_the_first_exterior_view(install):
    from dz_gym.envs import droid
    from dz_gym.requests import build_requests

    install("2.2", layout="per_scene", mila=True)
    env = make(scene="place_spoon_in_sink", num_envs=2)
    obs, _ = env.reset(seed=0)
    keys = env.request_image_keys
    assert keys["external_cam_2"] == "observation/exterior_image_0_left"
    assert keys["external_cam"] == "observation/exterior_image_1_left"
    request = build_requests(
        obs["policy"], [1], prompts=["p", "p"], session_ids=["a", "b"], image_resolution=None, image_keys=keys
    )[1]
    sent = request["observation/exterior_image_0_left"]
    assert np.array_equal(np.asarray(sent), obs["policy"]["external_cam_2"][1].numpy())
    env.close()
    launch._forget_app_for_tests()
    install("2.2")
    assert make(num_envs=1).request_image_keys == droid.REQUEST_IMAGE_KEYS  # DROID scenes: the reference mapping
