"""The Gymnasium face of dz-gym: registered ids, the batched env as a true VectorEnv, Gymnasium's checks and
vector wrappers over it, the bounded action space, the wrapper over any VectorEnv, the embedded server."""

from __future__ import annotations

import subprocess
import sys

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env
from gymnasium.utils.passive_env_checker import check_obs
from gymnasium.vector import AutoresetMode, SyncVectorEnv
from gymnasium.vector.utils import batch_space

import dz_gym
from dz_gym.envs import droid, limits, registration
from dz_gym.envs.adapter import VectorEnvAdapter
from dz_gym.server.embedded import embedded_server
from dz_gym.server.policies import HoldPolicy
from dz_gym.testing.memory_client import MemoryPolicyClient
from dz_gym.testing.toy_env import ToyDroidEnv

SMALL = {"image_shape": (24, 32), "seed": 0, "num_workers": 0}


def test_import_registers_the_ids_and_imports_no_simulator():
    code = (
        "import sys, dz_gym, gymnasium as gym\n"
        "heavy = [m for m in ('mujoco', 'torch', 'websockets', 'isaaclab') if m in sys.modules]\n"
        "ids = sorted(i for i in gym.registry if 'DROID' in i)\n"
        "print(heavy, ids)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    heavy, _, ids = out.stdout.partition("] ")
    assert heavy == "["
    for gym_id in [*registration.EMBEDDED_IDS.values(), "DZ-DROID-CubeInBowl-Newton-v0"]:
        assert repr(gym_id) in ids


def test_action_space_is_bounded_by_the_model_joint_ranges():
    low, high = limits.joint_limits()
    space = gym.spec(registration.EMBEDDED_IDS[1])  # the spec exists; the space comes from the env's base class
    assert space.vector_entry_point == registration.VECTOR_ENTRY_POINT
    env = ToyDroidEnv(3, image_shape=(18, 32))
    single = env.single_action_space
    np.testing.assert_allclose(single.low[:7], low, rtol=1e-6)
    np.testing.assert_allclose(single.high[:7], high, rtol=1e-6)
    assert (single.low[7], single.high[7]) == (0.0, 1.0)
    assert not single.contains(np.zeros(8, np.float32))  # zeros: joints 4 and 6 out of range
    assert single.contains(np.array([*droid.HOME_JOINT_POSITIONS, 0.0], np.float32))
    assert env.action_space == batch_space(single, 3)
    assert env.observation_space == batch_space(env.single_observation_space, 3)
    env.close()


def test_limits_equal_the_compiled_models_joint_and_actuator_ranges():
    mujoco = pytest.importorskip("mujoco")
    model = mujoco.MjModel.from_xml_path(str(limits.MODEL_XML))
    low, high = limits.joint_limits()
    for k, name in enumerate(limits.ARM_JOINTS):
        np.testing.assert_allclose(model.joint(name).range, [low[k], high[k]])
        np.testing.assert_allclose(model.actuator(name).ctrlrange, [low[k], high[k]])  # what the sim clips to


def test_bad_model_range_is_a_one_line_error(tmp_path):
    model = tmp_path / "model.xml"
    model.write_text('<mujoco><worldbody><body><joint name="joint1" range="1 0"/></body></worldbody></mujoco>')
    with pytest.raises(ValueError, match=r"joint joint1: expected low < high"):
        limits.joint_limits(model)


@pytest.mark.slow  # full episodes of the embedded simulator, three scenes
@pytest.mark.parametrize("scene", [1, 2, 3])
def test_make_vec_passes_checks_and_runs_under_record_episode_statistics(scene):
    env = gym.make_vec(registration.EMBEDDED_IDS[scene], num_envs=2, max_episode_steps=20, **SMALL)
    assert isinstance(env, gym.vector.VectorEnv) and isinstance(env, gym.Env)
    assert env.metadata["autoreset_mode"] == AutoresetMode.SAME_STEP
    assert env.spec.id == registration.EMBEDDED_IDS[scene] and env.num_envs == 2
    assert env.observation_space == batch_space(env.single_observation_space, 2)
    stats = gym.wrappers.vector.RecordEpisodeStatistics(env)
    obs, info = stats.reset(seed=3)
    check_obs(obs, env.observation_space, "reset")
    stats.action_space.seed(0)
    ended = 0
    for _ in range(50):
        obs, reward, terminated, truncated, info = stats.step(stats.action_space.sample())
        check_obs(obs, env.observation_space, "step")
        assert reward.shape == terminated.shape == truncated.shape == (2,)
        assert info["_success"].all() and info["milestones"]["_placed"].all()
        ended += int(truncated.sum())
    assert ended == 4 and stats.episode_count == 4  # two 20-step episodes per env
    stats.close()
    assert env.closed


def test_vector_info_lists_per_env_under_dict_info_to_list():
    env = gym.wrappers.vector.DictInfoToList(gym.make_vec(registration.EMBEDDED_IDS[1], num_envs=2, **SMALL))
    _, infos = env.reset(seed=5)
    _, _, _, _, infos = env.step(np.tile(np.array([*droid.HOME_JOINT_POSITIONS, 0.0], np.float32), (2, 1)))
    assert [i["episode_seed"] for i in infos] == [5, 6]
    assert set(infos[0]["milestones"]) == set(dz_gym.envs.episodes.MILESTONES)
    env.close()


def test_make_gives_one_env_that_passes_check_env():
    env = gym.make(registration.EMBEDDED_IDS[1], render_mode="rgb_array", **SMALL)
    check_env(env.unwrapped)  # with its render check: the rgb_array frames
    obs, info = env.reset(seed=7)
    assert obs["policy"]["arm_joint_pos"].shape == (7,) and obs["policy"]["wrist_cam"].shape == (24, 32, 3)
    obs, reward, terminated, truncated, info = env.step(env.action_space.sample())
    assert isinstance(reward, float) and terminated is False and info["episode_seed"] == 7
    assert isinstance(info["milestones"]["reached"], int) and "_success" not in info
    env.close()


def test_rgb_array_render_gives_each_envs_video_strip():
    env = gym.make_vec(registration.EMBEDDED_IDS[2], num_envs=2, render_mode="rgb_array", **SMALL)
    env.set_render_mask(np.zeros(2, dtype=bool))  # a recorder reads every frame: the mask is not applied
    obs, _ = env.reset(seed=1)
    obs, *_ = env.step(np.tile(np.array([*droid.HOME_JOINT_POSITIONS, 0.0], np.float32), (2, 1)))
    frames = env.render()
    assert len(frames) == 2 and frames[1].shape == (24, 96, 3) and frames[1].dtype == np.uint8
    np.testing.assert_array_equal(frames[1][:, 32:64], obs["policy"]["wrist_cam"][1])
    env.close()
    with pytest.raises(ValueError, match=r"^render_mode: expected None or one of: rgb_array; got 'human'"):
        gym.make_vec(registration.EMBEDDED_IDS[2], num_envs=1, render_mode="human", **SMALL)


def _hold_wrapper(env, num_envs):
    return dz_gym.DreamZeroPolicyWrapper(env, client=MemoryPolicyClient(HoldPolicy(), num_envs=num_envs))


@pytest.mark.slow
def test_wrapper_over_a_vector_env_under_gymnasium_wrappers():
    vec = gym.wrappers.vector.RecordEpisodeStatistics(
        gym.make_vec(registration.EMBEDDED_IDS[1], num_envs=2, max_episode_steps=12, **SMALL)
    )
    wrapper = _hold_wrapper(vec, 2)
    assert isinstance(wrapper.env, VectorEnvAdapter) and wrapper.prompts[0] == droid.scene_spec(1).prompt
    _, info = wrapper.reset(seed=0)
    assert info["_session_id"].all()
    done = 0
    for _ in range(12):
        _, _, _, truncated, info = wrapper.step()
        assert info["_success"].all() and info["_policy_called"].all()
        done += int(truncated.sum())
    assert done == 2 and info["_chunk_stats"].all() and info["_episode"].all()  # the stats wrapper's own
    wrapper.close()
    assert vec.unwrapped.closed


def test_wrapper_refuses_a_next_step_vector_env():
    vec = SyncVectorEnv([lambda: gym.make(registration.EMBEDDED_IDS[1], **SMALL)])
    with pytest.raises(ValueError, match=r"autoreset_mode.*SAME_STEP.*got NEXT_STEP"):
        _hold_wrapper(vec, 1)
    vec.close()


def test_wrapper_with_an_embedded_server_starts_and_stops_it():
    wrapper = dz_gym.DreamZeroPolicyWrapper(ToyDroidEnv(2, max_episode_length=9, image_shape=(18, 32)), policy="hold")
    server = wrapper.embedded_server
    assert server.running and wrapper.server_url(0) == server.url and server.url.startswith("ws://127.0.0.1:")
    wrapper.reset(seed=0)
    for _ in range(9):
        _, _, _, truncated, info = wrapper.step()
    assert truncated.all() and info["chunk_stats"]["chunks"].tolist() == [2, 2]
    handle = server._handle
    wrapper.close()
    assert not server.running and handle.poll() is not None  # the server's process ended


def test_embedded_server_context_manager_in_process():
    with embedded_server(HoldPolicy(), in_process=True) as server:
        wrapper = dz_gym.DreamZeroPolicyWrapper(ToyDroidEnv(1, image_shape=(18, 32)), server=server.url)
        wrapper.reset(seed=0)
        _, _, _, _, info = wrapper.step()
        assert info["chunk_received"].all()
        wrapper.close()
    assert not server.running
    with pytest.raises(ValueError, match=r"^policy: a server in its own process takes a policy name"):
        embedded_server(HoldPolicy())


WARNING_SCRIPT = """
import dz_gym
from dz_gym.testing.toy_env import ToyDroidEnv

with dz_gym.embedded_server("hold", flavor="dreamzero", in_process=True) as server:
    wrapper = dz_gym.DreamZeroPolicyWrapper(ToyDroidEnv(2, image_shape=(18, 32)), server=server.url)
    wrapper.reset(seed=0)
    for _ in range(20):
        wrapper.step()
    wrapper.close()
print(len(wrapper.server_notes))
"""


def test_dreamzero_single_session_warning_is_told_once():
    # a script of its own: Python's default warning filter and no logging configuration, as a user runs it
    out = subprocess.run([sys.executable, "-c", WARNING_SCRIPT], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["1"]
    assert out.stderr.count("behaves like DreamZero's own server") == 1, out.stderr
