"""The Isaac Lab backend against stand-in isaaclab / isaaclab_tasks / sim_evals modules (2.2 and 3.0).

The stand-ins (isaac_stubs) record every call and reproduce sim-evals' config objects, its env-0
observation bug, Isaac Lab's step/reset order and the version differences; their docstring lists what
only a machine with Isaac Sim can verify.
"""

from __future__ import annotations

import argparse
import importlib.util
import math
import shutil
import sys
import warnings
from pathlib import Path

import isaac_stubs
import numpy as np
import pytest
import torch
from isaac_helpers import SMALL, hold, make
from isaac_stubs import cfgs

import dz_gym
from dz_gym.envs import droid
from dz_gym.envs.isaac import checks, compat, launch
from dz_gym.errors import BackendUnavailable


@pytest.fixture(params=["2.2", "3.0"])
def world(request, tmp_path):
    root = isaac_stubs.make_sim_evals_checkout(tmp_path / "sim-evals")
    launch._forget_app_for_tests()
    world = isaac_stubs.install(request.param, root)
    yield world
    for env in world.envs:
        env.close()
    isaac_stubs.uninstall()
    launch._forget_app_for_tests()


def image_channel(obs, channel, camera="external_cam"):
    return obs["policy"][camera][:, 0, 0, channel].to(torch.int64).numpy()


# -- launch and import order ----------------------------------------------------------------------------
def test_sim_evals_is_imported_only_after_the_app_launched(world):
    assert "sim_evals.environments" not in sys.modules
    make()
    calls = world.calls
    launched = world.index("app.launch")
    imported = calls.index(("import", "sim_evals.environments"))
    assert launched < imported < world.index("parse_env_cfg") < world.index("gym.make")


def test_importing_the_backend_and_adding_launcher_args_imports_no_simulator_module(world):
    parser = argparse.ArgumentParser()
    dz_gym.envs.isaac.add_launcher_args(parser)
    assert "--device" in parser.format_help()
    assert "sim_evals" not in sys.modules and "isaaclab.envs" not in sys.modules
    assert not world.launched


def test_launch_enables_cameras_and_runs_headless(world):
    env = make()
    args = world.calls[world.index("app.launch")][1]
    assert args["enable_cameras"] is True
    if world.is_v3:
        assert args["require_kit"] is True and not args.get("visualizer")
        assert world.calls[world.index("app.launch")][2] is None  # no config: sim-evals comes after launch
    else:
        assert args["headless"] is True
    assert world.launched
    env.close()
    assert "app.close" in world.names() and not world.launched


def test_launch_takes_the_callers_launcher_args_without_changing_them(world):
    parser = argparse.ArgumentParser()
    parser.add_argument("--episodes", type=int, default=3)
    dz_gym.envs.isaac.add_launcher_args(parser)
    app_args = parser.parse_args(["--device", "cpu", "--episodes", "5"])
    before = dict(vars(app_args))
    env = make(app_args=app_args, device=None, headless=False)
    args = world.calls[world.index("app.launch")][1]
    assert args["episodes"] == 5 and args["device"] == "cpu" and env.device == "cpu"
    if world.is_v3:
        assert args["visualizer"] == ["kit"]  # the parsed form of --visualizer kit (a comma list)
    else:
        assert args["headless"] is False
    assert vars(app_args) == before


# -- configuration patches ---------------------------------------------------------------------------------
def test_config_is_patched_before_the_env_is_made(world):
    env = make(num_envs=4)
    assert world.calls[world.index("parse_env_cfg")][1:] == (
        "DROID",
        {"device": "cpu", "num_envs": 4, "use_fabric": True},
    )
    assert ("cfg.set_scene", 1) in world.calls
    cfg = world.calls[world.index("gym.make")][1]
    assert cfg is env.cfg
    policy = cfg.observations.policy
    assert policy.arm_joint_pos.func is not cfgs.upstream_arm_joint_pos
    assert policy.gripper_pos.func is not cfgs.upstream_gripper_pos
    assert policy.gripper_pos.clip == (0, 1)
    assert cfg.scene.sphere_light.prim_path == "{ENV_REGEX_NS}/sphere_light"
    probe = cfg.terminations.dz_gym_state_probe
    assert probe.time_out is False and callable(probe.func)
    if world.is_v3:
        assert cfg.num_rerenders_on_reset >= 1
    else:
        assert cfg.rerender_on_reset is True
    assert (cfg.scene.external_cam.height, cfg.scene.external_cam.width) == SMALL


def test_upstream_proprio_terms_read_env_0_and_the_patched_terms_read_every_env(world):
    env = make(num_envs=3)
    isaac = world.env
    robot = isaac.scene["robot"]
    robot.q[:, :8] = torch.arange(24, dtype=torch.float32).reshape(3, 8) / 10
    robot.refresh()
    upstream = cfgs.upstream_arm_joint_pos(isaac)
    assert tuple(upstream.shape) == (7,)  # the bug: env 0 only, no batch dimension
    assert torch.equal(upstream, robot.q[0, :7])
    arm = env.cfg.observations.policy.arm_joint_pos.func(isaac)
    grip = env.cfg.observations.policy.gripper_pos.func(isaac)
    assert tuple(arm.shape) == (3, 7) and tuple(grip.shape) == (3, 1)
    assert torch.equal(arm, robot.q[:, :7])
    assert torch.allclose(grip[:, 0], robot.q[:, 7] / (math.pi / 4))


def test_patched_terms_equal_upstream_with_one_env(world):
    env = make(num_envs=1)
    isaac = world.env
    isaac.scene["robot"].q[0, :8] = torch.linspace(-0.5, 0.7, 8)
    isaac.scene["robot"].refresh()
    policy = env.cfg.observations.policy
    assert torch.equal(policy.arm_joint_pos.func(isaac)[0], cfgs.upstream_arm_joint_pos(isaac))
    assert torch.allclose(policy.gripper_pos.func(isaac)[0], cfgs.upstream_gripper_pos(isaac))


def test_observations_are_batched_tensors_with_each_envs_values(world):
    env = make(num_envs=3)
    obs, _ = env.reset(seed=0)
    action = hold(obs)
    action[:, 0] = torch.tensor([-0.3, 0.0, 0.3])
    for _ in range(6):
        obs, *_ = env.step(action)
    policy = obs["policy"]
    assert tuple(policy["arm_joint_pos"].shape) == (3, 7) and policy["arm_joint_pos"].dtype == torch.float32
    assert tuple(policy["gripper_pos"].shape) == (3, 1)
    for key in droid.CAMERA_KEYS:
        assert tuple(policy[key].shape) == (3, *SMALL, 3) and policy[key].dtype == torch.uint8
    assert np.allclose(policy["arm_joint_pos"][:, 0].numpy(), [-0.3, 0.0, 0.3], atol=1e-3)
    assert len(set(image_channel(obs, 1).tolist())) == 3  # each env's image shows its own arm


def test_env_exposes_the_contract(world):
    env = make(num_envs=2)
    assert env.num_envs == 2 and env.device == "cpu"
    assert env.max_episode_length == droid.MAX_EPISODE_LENGTH == 450
    assert env.step_dt == pytest.approx(1 / 15)
    assert env.observation_space["policy"]["external_cam"].shape == (2, *SMALL, 3)
    assert env.action_space.shape == (2, 8)
    assert env.metadata["autoreset_mode"].name == "SAME_STEP"
    assert env.isaac_env is world.env


# -- resets, start-up quirks ---------------------------------------------------------------------------------
def resets(world):
    return [call[1] for call in world.calls if call[0] == "env.reset"]


def test_first_reset_resets_twice_with_keywords(world):
    env = make(num_envs=2)
    env.reset(seed=7)
    calls = resets(world)
    assert len(calls) == 2
    # every env as an int64 tensor, the form 2.2, the 3.0.0 release and develop all accept
    assert all(call["env_ids"] == ("tensor", "torch.int64", [0, 1]) and call["seed"] == 7 for call in calls)
    env.reset()
    assert len(resets(world)) == 3


def test_hold_step_after_reset_returns_fresh_images(world):
    env = make(num_envs=2)
    obs, info = env.reset(seed=0)
    isaac = world.env
    assert (image_channel(obs, 2) == isaac.episode_id.numpy() % 256).all()  # the renderer saw this episode
    assert (image_channel(obs, 0) > 0).all()  # materials loaded
    assert info["images_fresh"].all()
    assert (isaac.episode_length_buf == 0).all()  # the hold step does not count


def test_without_the_hold_step_the_first_frame_is_stale(world):
    env = make(num_envs=2, settle_steps=0)
    env.reset(seed=0)
    obs, info = env.reset()
    assert (image_channel(obs, 2) != world.env.episode_id.numpy() % 256).all()  # IsaacLab#6394, reproduced
    assert not info["images_fresh"].any()


def test_partial_reset_resets_only_those_envs_with_a_tensor_of_ids(world):
    env = make(num_envs=3)
    obs, _ = env.reset(seed=0)
    for _ in range(5):
        obs, *_ = env.step(hold(obs))
    env.set_episode_seeds([1], [77])
    obs, info = env.reset(options={"env_ids": [1]})
    call = resets(world)[-1]
    assert call["env_ids"] == ("tensor", "torch.int64", [1]) and call["seed"] is None
    assert info["episode_step"].tolist() == [5, 0, 5]
    assert info["episode_seed"].tolist() == [0, 77, 2]
    assert info["images_fresh"].tolist() == [True, False, True]
    assert world.env.episode_length_buf.tolist() == [5, 0, 5]


def test_partial_reset_ids_are_validated(world):
    env = make(num_envs=3)
    env.reset()
    for bad in ([3], [-1], [1, 1]):
        with pytest.raises(ValueError, match="env_ids"):
            env.reset(options={"env_ids": bad})
    calls = len(resets(world))
    obs, info = env.reset(options={"env_ids": []})  # an empty selection resets nothing
    assert len(resets(world)) == calls and tuple(obs["policy"]["arm_joint_pos"].shape) == (3, 7)


# -- episodes, success ---------------------------------------------------------------------------------
def run_episode(env, world, on_step=None, steps=None):
    obs, info = env.reset(seed=0)
    infos = []
    for step in range(1, (steps or env.max_episode_length) + 1):
        if on_step is not None:
            on_step(step)
        obs, reward, terminated, truncated, info = env.step(hold(obs))
        infos.append((reward, terminated, truncated, info))
    return obs, infos


def test_episode_times_out_after_450_policy_steps_and_reports_success_at_end(world):
    env = make(num_envs=2)
    bowl = cfgs.SCENE_BODIES[1]["_24_bowl"]

    def place(step):
        if step == 450:
            world.env.teleport("rubiks_cube", 1, (bowl[0], bowl[1], bowl[2] + 0.01))

    obs, infos = run_episode(env, world, place)
    reward, terminated, truncated, info = infos[-1]
    assert not any(bool(t.any()) for _, t, _, _ in infos)
    assert [bool(tr.any()) for _, _, tr, _ in infos].index(True) == 449  # the 450th step
    assert info["time_outs"].all() and info["episode_step"].tolist() == [450, 450]
    assert info["success"].tolist() == [False, True]  # measured before the in-step reset
    assert reward.tolist() == [0.0, 1.0]
    assert np.allclose(info["object_pos"][1], (bowl[0], bowl[1], bowl[2] + 0.01), atol=1e-5)
    # the returned observation belongs to the next episode, rendered after a hold step
    assert (image_channel(obs, 2) == world.env.episode_id.numpy() % 256).all()
    assert info["images_fresh"].all()
    obs, _, _, _, info = env.step(hold(obs))
    assert info["episode_step"].tolist() == [1, 1] and not info["success"].any()
    assert info["episode_seed"].tolist() == [2, 3]


def test_success_any_step_keeps_a_placement_that_was_undone(world):
    env = make(num_envs=2)
    bowl = cfgs.SCENE_BODIES[1]["_24_bowl"]
    cube = cfgs.SCENE_BODIES[1]["rubiks_cube"]

    def place(step):
        if step == 10:
            world.env.teleport("rubiks_cube", 0, bowl)
        if step == 20:
            world.env.teleport("rubiks_cube", 0, cube)

    _, infos = run_episode(env, world, place, steps=30)
    assert infos[9][3]["success"].tolist() == [True, False]
    final = infos[-1][3]
    assert final["success"].tolist() == [False, False]
    assert final["success_any_step"].tolist() == [True, False]


def test_success_needs_the_object_at_rest_and_released(world):
    env = make(num_envs=3)
    env.reset()
    bowl = cfgs.SCENE_BODIES[1]["_24_bowl"]
    isaac = world.env
    isaac.teleport("rubiks_cube", 0, bowl)  # in the bowl, at rest, gripper far away
    isaac.teleport("rubiks_cube", 1, bowl, speed=0.5)  # still moving
    tcp = env._probe.read(isaac).tcp_pos[2]
    isaac.teleport("_24_bowl", 2, tuple(tcp - np.array([0.0, 0.0, 0.02])))  # bowl under the gripper ...
    isaac.teleport("rubiks_cube", 2, tuple(tcp))  # ... and the cube still in it
    state = env._probe.read(isaac)
    assert state.for_episodes().success(env.scene.success).tolist() == [True, False, False]


def test_positions_are_env_local(world):
    env = make(num_envs=4)
    _, info = env.reset()
    world_pos = world.env.scene["rubiks_cube"].pos.numpy()
    assert len({tuple(np.round(p, 3)) for p in world_pos}) == 4  # the envs sit at different places
    assert np.allclose(info["object_pos"], cfgs.SCENE_BODIES[1]["rubiks_cube"], atol=1e-5)
    assert np.allclose(info["container_pos"], cfgs.SCENE_BODIES[1]["_24_bowl"], atol=1e-5)


def test_autoreset_of_some_envs_marks_their_images_not_fresh(world):
    env = make(num_envs=2)
    obs, _ = env.reset()
    world.env.episode_length_buf[0] = env.max_episode_length - 1
    obs, _, _, truncated, info = env.step(hold(obs))
    assert truncated.tolist() == [True, False]
    assert info["images_fresh"].tolist() == [False, True]
    assert world.env.episode_length_buf.tolist() == [0, 1]  # no hold step moved env 1


def test_episode_seeds(world):
    env = make(num_envs=2, seed=100)
    obs, info = env.reset()
    assert info["episode_seed"].tolist() == [100, 101]
    obs, info = env.reset(seed=5)
    assert info["episode_seed"].tolist() == [5, 6]
    env.set_episode_seeds([0], [42])
    world.env.episode_length_buf[:] = env.max_episode_length - 1
    obs, _, _, _, info = env.step(hold(obs))
    assert info["episode_seed"].tolist() == [5, 6]  # the episode that ended
    obs, _, _, _, info = env.step(hold(obs))
    assert info["episode_seed"].tolist() == [42, 8]
    obs, info = env.reset()
    assert info["episode_seed"].tolist() == [44, 10]


# -- actions ---------------------------------------------------------------------------------
def test_actions_are_validated_and_converted(world):
    env = make(num_envs=2)
    obs, _ = env.reset()
    with pytest.raises(ValueError, match=r"action: expected shape \(2, 8\)"):
        env.step(np.zeros((2, 7)))
    bad = hold(obs)
    bad[0, 0] = float("nan")
    with pytest.raises(ValueError, match="action: expected finite"):
        env.step(bad)
    env.step(hold(obs).numpy().astype(np.float64))
    assert world.calls[-2] == ("env.action_dtype", "torch.float32")


def test_a_bool_gripper_command_closes_on_true(world):
    env = make(num_envs=1)
    obs, _ = env.reset()
    action = np.zeros((1, 8), dtype=bool)
    action[0, 7] = True
    env.step(action)  # arm targets 0 rad: fine for the stand-in
    obs, *_ = env.step(action)
    assert float(obs["policy"]["gripper_pos"][0, 0]) > 0.9  # sim-evals would have opened it (== 0 closes)


# -- lighting ---------------------------------------------------------------------------------
def upstream_env(world, num_envs, dome=True):
    """sim-evals' env exactly as run_eval.py builds it (no dz-gym patches)."""
    import gymnasium as gym
    import isaaclab.app

    if world.is_v3:
        context = isaaclab.app.launch_simulation(None, {})
        context.__enter__()
    else:
        isaaclab.app.AppLauncher(argparse.Namespace(headless=True, enable_cameras=True))
    import sim_evals.environments  # noqa: F401
    from isaaclab_tasks.utils import parse_env_cfg

    cfg = parse_env_cfg("DROID", device="cpu", num_envs=num_envs, use_fabric=True)
    cfg.set_scene(1)
    return gym.make("DROID", cfg=cfg).unwrapped


def test_upstream_lighting_differs_per_env_and_the_patch_restores_it(world, tmp_path):
    reference = upstream_env(world, 1).irradiance()[0]
    upstream = upstream_env(world, 4).irradiance()
    assert np.all(np.abs(upstream / reference - 1) > 0.5)  # global light far away + 4 dome lights summed
    launch._forget_app_for_tests()
    make(num_envs=4)  # 30 m apart by default
    assert np.all(np.abs(world.env.irradiance() / reference - 1) < 0.01)
    world.env.close()
    launch._forget_app_for_tests()
    make(num_envs=4, env_spacing=7.0)  # sim-evals' spacing: the neighbours' lights add about 5 %
    assert np.all(np.abs(world.env.irradiance() / reference - 1) < 0.08)


def test_only_env_0_keeps_its_dome_light(world):
    env = make(num_envs=3)
    domes = {
        str(p.GetPath()): p.GetAttribute("inputs:intensity").Get()
        for p in world.env.sim.stage.prims
        if p.GetTypeName() == "DomeLight"
    }
    assert domes["/World/envs/env_0/scene/DomeLight"] > 0
    assert domes["/World/envs/env_1/scene/DomeLight"] == 0 and domes["/World/envs/env_2/scene/DomeLight"] == 0
    assert sum("infinite light" in change for change in env.patches) == 2


# -- options -----------------------------------------------------------------------------------
def test_env_spacing_and_tiled_camera_options(world):
    env = make(num_envs=2, env_spacing=12.0, tiled_cameras=True)
    assert env.cfg.scene.env_spacing == 12.0
    assert float(world.env.scene.env_origins[:, 0].abs().max()) == pytest.approx(6.0)
    camera_type = type(env.cfg.scene.wrist_cam).__name__
    assert camera_type == ("CameraCfg" if world.is_v3 else "TiledCameraCfg")  # 3.0's Camera is tiled already
    obs, _ = env.reset()
    assert tuple(obs["policy"]["wrist_cam"].shape) == (2, *SMALL, 3)


def test_bad_options_are_refused(world):
    with pytest.raises(ValueError, match="env_spacing"):
        make(env_spacing=0.0)
    launch._forget_app_for_tests()
    with pytest.raises(ValueError, match="settle_steps"):
        make(settle_steps=-1)
    with pytest.raises(ValueError, match="num_envs"):
        make(num_envs=0)
    with pytest.raises(ValueError, match="scene"):
        make(scene=9)


# -- version differences ------------------------------------------------------------------------------
def test_3_0_asset_data_is_read_through_torch_not_the_deprecated_indexing(world):
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        env = make(num_envs=2)
        obs, _ = env.reset()
        env.step(hold(obs))
    if world.is_v3:
        assert type(world.env.scene["robot"].data.joint_pos).__name__ == "ProxyArray"


def test_version_is_read_from_isaaclab(world):
    api = compat.detect()
    assert api.version == ((3, 0) if world.is_v3 else (2, 2))


def test_version_parsing():
    assert compat.detect("2.2.0").version == (2, 2) and compat.detect("3.0").is_v3
    with pytest.raises(BackendUnavailable, match="Isaac Lab 2.1"):
        compat.detect("2.1")
    with pytest.raises(ValueError, match="MAJOR.MINOR"):
        compat.parse_version("latest")


# -- lifecycle ------------------------------------------------------------------------------------------
def test_one_env_and_one_scene_per_process(world):
    env = make(scene=1, close_app_on_close=False)
    with pytest.raises(RuntimeError, match="already open"):
        make(scene=1)
    env.close()
    with pytest.raises(RuntimeError, match="new process"):
        make(scene=2)
    env2 = make(scene=1)
    assert env2.num_envs == 2
    env2.close()
    with pytest.raises(RuntimeError, match="closed"):
        env2.reset()
    with pytest.raises(RuntimeError, match="new process"):
        make(scene=1)


def test_a_scene_without_its_entities_gives_a_clear_error(world, monkeypatch):
    monkeypatch.setitem(cfgs.SCENE_BODIES, 1, {"_24_bowl": (0.5, -0.18, 0.02)})
    with pytest.raises(KeyError, match="rubiks_cube"):
        make(scene=1)
    monkeypatch.undo()
    make(scene=1)  # the failed attempt released the process's env slot


# -- pre-launch checks -------------------------------------------------------------------------------
def test_missing_isaac_lab_is_a_clear_error():
    import importlib.util

    isaac_stubs.uninstall()
    launch._forget_app_for_tests()
    # where the real isaaclab wheel is installed (the Isaac Lab 2.2 environment), only sim-evals is missing
    missing = "sim-evals is not installed" if importlib.util.find_spec("isaaclab") else "Isaac Lab is not installed"
    with pytest.raises(BackendUnavailable, match=rf"{missing} .*docs/isaac.md"):
        make()


def test_missing_assets_say_how_to_download_them(tmp_path):
    root = isaac_stubs.make_sim_evals_checkout(tmp_path / "se", scenes=(1,))
    launch._forget_app_for_tests()
    world = isaac_stubs.install("2.2", root)
    try:
        with pytest.raises(BackendUnavailable, match=r"scene2.usd.*hf download owhan/DROID-sim-environments"):
            make(scene=2)
        assert not world.launched  # checked before the simulator starts
        shutil.rmtree(root / "src" / "sim_evals" / "environments")
        with pytest.raises(BackendUnavailable, match="older than 423e87c"):
            make(scene=1)
    finally:
        isaac_stubs.uninstall()
        launch._forget_app_for_tests()


class FakeCuda:
    def __init__(self, names):
        self.names = names

    def is_available(self):
        return bool(self.names)

    def get_device_name(self, index):
        return self.names[index]


@pytest.mark.parametrize(
    "name, lacks",
    [
        ("NVIDIA H200", True),
        ("NVIDIA H100 80GB HBM3", True),
        ("NVIDIA A100-SXM4-80GB", True),
        ("NVIDIA A800 80GB PCIe", True),
        ("NVIDIA GH200 480GB", True),
        ("NVIDIA B200", True),
        ("NVIDIA L40S", False),
        ("NVIDIA RTX 6000 Ada Generation", False),
        ("NVIDIA GeForce RTX 4090", False),
        ("NVIDIA RTX A6000", False),
        ("NVIDIA A10G", False),
    ],
)
def test_gpu_without_rt_cores_heuristic(name, lacks):
    assert checks.gpu_lacks_rt_cores(name) is lacks


def test_rtx_gpu_check(monkeypatch):
    monkeypatch.delenv(checks.SKIP_GPU_CHECK_ENV, raising=False)
    torch_like = type("T", (), {"cuda": FakeCuda(["NVIDIA L40S", "NVIDIA H200"])})
    assert checks.check_rtx_gpu("cuda:0", torch_like) == "NVIDIA L40S"
    with pytest.raises(BackendUnavailable, match=r"GPU 1 \(NVIDIA H200\) has no RT cores"):
        checks.check_rtx_gpu("cuda:1", torch_like)
    with pytest.raises(BackendUnavailable, match="no CUDA GPU"):
        checks.check_rtx_gpu("cuda:0", type("T", (), {"cuda": FakeCuda([])}))
    monkeypatch.setenv(checks.SKIP_GPU_CHECK_ENV, "1")
    assert checks.check_rtx_gpu("cuda:1", torch_like) == "(not checked)"


# -- examples/isaac_check_batched.py ---------------------------------------------------------------------
def load_example():
    path = Path(__file__).resolve().parents[1] / "examples" / "isaac_check_batched.py"
    spec = importlib.util.spec_from_file_location("isaac_check_batched", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_check_batched_example_passes_on_the_batched_env(world, tmp_path, capsys):
    example = load_example()
    args = example.build_parser().parse_args(
        ["--num-envs", "3", "--steps", "40", "--device", "cpu", "--skip-gpu-check"]
    )
    example.run_role(args, "reference", tmp_path / "reference.npz", image_shape=SMALL)
    launch._forget_app_for_tests()
    example.run_role(args, "batched", tmp_path / "batched.npz", image_shape=SMALL)
    reference, batched = dict(np.load(tmp_path / "reference.npz")), dict(np.load(tmp_path / "batched.npz"))
    assert batched["arm_joint_pos"].shape == (40, 3, 7) and reference["arm_joint_pos"].shape == (40, 1, 7)
    assert np.ptp(reference["arm_joint_pos"][:, 0, 0]) > 0.2  # the arm really moved
    assert example.report(example.compare(reference, batched), 3)
    assert capsys.readouterr().out.strip().endswith("PASS")


def test_check_batched_example_fails_when_an_env_differs(capsys):
    example = load_example()
    rng = np.random.default_rng(0)
    reference = {
        "arm_joint_pos": rng.normal(size=(5, 1, 7)),
        "gripper_pos": rng.uniform(size=(5, 1, 1)),
        "object_pos": rng.normal(size=(5, 1, 3)),
        "container_pos": rng.normal(size=(5, 1, 3)),
        "success": rng.uniform(size=(5, 1)) > 0.5,
        "milestones": rng.integers(-1, 5, size=(5, 1, 4)),
        "images": rng.integers(0, 255, size=(5, 1, 3, 4, 6, 3), dtype=np.uint8),
    }
    batched = {name: np.repeat(value, 2, axis=1) for name, value in reference.items()}
    assert all(ok for *_, ok in example.compare(reference, batched))
    batched["arm_joint_pos"][:, 1, 0] += 0.01  # env 1 sees env 0's joints, say
    batched["images"][:, 1] = np.clip(batched["images"][:, 1].astype(int) + 20, 0, 255).astype(np.uint8)
    results = {name: ok for name, _, _, ok in example.compare(reference, batched)}
    assert results == {
        "arm_joint_pos": False,
        "gripper_pos": True,
        "object_pos": True,
        "container_pos": True,
        "success": True,
        "milestones": True,
        "images": False,
    }
    assert not example.report(example.compare(reference, batched), 2)
    assert capsys.readouterr().out.strip().endswith("FAIL")


def test_scenes_from_the_asset_root_and_the_robot_from_the_checkout(tmp_path, monkeypatch):
    """sim-evals 711ff04 reads the scenes from SIM_EVALS_ASSET_ROOT and the robot from the checkout's assets/:
    the check used to want both in one folder and refused that install before launch."""
    from dz_gym.envs.isaac import checks

    root = isaac_stubs.make_sim_evals_checkout(tmp_path / "se", scenes=())
    scenes = tmp_path / "scenes"
    scenes.mkdir()
    (scenes / "scene2.usd").write_text("#usda 1.0\n")
    monkeypatch.setenv("SIM_EVALS_ASSET_ROOT", str(scenes))
    launch._forget_app_for_tests()
    isaac_stubs.install("2.2", root)
    try:
        assert checks.check_assets(2) == scenes
        (root / "assets" / checks.ROBOT_USD).unlink()
        with pytest.raises(BackendUnavailable, match=rf"{checks.ROBOT_USD} in {root / 'assets'}"):
            checks.check_assets(2)
        with pytest.raises(BackendUnavailable, match=rf"scene1.usd in {scenes}"):
            checks.check_assets(1)
    finally:
        isaac_stubs.uninstall()
        launch._forget_app_for_tests()
