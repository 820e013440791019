"""Residual RL env (dz_gym.rl): actions, observations, rewards, SAME_STEP resets, server calls, the views.

Most tests run the residual env over the toy env (dz_gym.testing.toy_env: success known in advance from the
episode seed) and the in-process policy client, which counts requests on the serving side; one runs over the
reference server on loopback and counts on the server; rsl_rl's own runner runs on the embedded simulator.
"""

from __future__ import annotations

import math
import subprocess
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from dz_gym.envs import droid
from dz_gym.rl.residual import DEFAULT_RESIDUAL_SCALE, ResidualEnv
from dz_gym.rl.rewards import RewardConfig, step_reward
from dz_gym.server.policies import HoldPolicy, ProbePolicy
from dz_gym.testing.memory_client import MemoryPolicyClient
from dz_gym.testing.toy_env import ToyDroidEnv, expected_success
from dz_gym.wrapper import DreamZeroPolicyWrapper

HORIZON = droid.DEFAULT_OPEN_LOOP_HORIZON


def toy_residual(num_envs=3, episode_length=10, policy=None, **kwargs):
    env = ToyDroidEnv(num_envs, max_episode_length=episode_length + 1, image_shape=(18, 32))
    client = MemoryPolicyClient(policy or HoldPolicy(), num_envs=num_envs)
    wrapper = DreamZeroPolicyWrapper(env, client=client)
    return ResidualEnv(wrapper, episode_length=episode_length, **kwargs), client


def expected_calls(lengths_ended: list[int], steps_now: int) -> int:
    """Requests the schedule makes for the ended episodes plus the current one, whose proposal for its step
    ``steps_now`` (0-based) has been read already."""
    return sum(math.ceil(length / HORIZON) for length in lengths_ended) + steps_now // HORIZON + 1


def run_and_count(env: ResidualEnv, steps: int, seed: int, rng: np.random.Generator):
    """Step with random residuals; per env the lengths of the episodes that ended, and what each step gave."""
    n = env.num_envs
    lengths: list[list[int]] = [[] for _ in range(n)]
    env.reset(seed=seed)
    history = []
    for _ in range(steps):
        action = torch.as_tensor(rng.uniform(-1, 1, size=(n, 8)), dtype=torch.float32)
        obs, reward, terminated, truncated, info = env.step(action)
        history.append((obs, reward, terminated, truncated, info))
        if "_final_info" in info:
            for i in np.flatnonzero(info["_final_info"]):
                lengths[i].append(int(info["final_info"]["length"][i]))
    return lengths, history


# -- rewards ----------------------------------------------------------------------------------------------
def _info(success, step, **milestones):
    names = ("reached", "lifted", "above_target", "placed")
    return {
        "success": np.asarray(success, dtype=bool),
        "episode_step": np.asarray(step),
        "milestones": {name: np.asarray(milestones.get(name, [-1] * len(success))) for name in names},
    }


def test_dense_reward_pays_each_milestone_once_and_success_once():
    config = RewardConfig()
    info = _info([False, False], [4, 4], reached=[4, 2], lifted=[-1, 4])
    reward, first = step_reward(config, info, np.array([False, False]))
    assert reward.tolist() == pytest.approx([0.1, 0.2])  # env 1 reached at step 2: paid then, not now
    assert not first.any()
    info = _info([True, True], [9, 9], reached=[4, 2], lifted=[6, 4], above_target=[8, 7], placed=[9, 9])
    reward, first = step_reward(config, info, np.array([False, True]))
    assert reward.tolist() == pytest.approx([1.0, 0.0])  # placed weighs 0; success paid only the first time
    assert first.tolist() == [True, False]
    assert config.max_return == pytest.approx(1.5)


def test_sparse_reward_and_residual_cost():
    info = _info([False, True], [3, 3], reached=[3, 3], placed=[-1, 3])
    reward, _ = step_reward(RewardConfig(mode="sparse"), info, np.zeros(2, bool))
    assert reward.tolist() == [0.0, 1.0]
    residual = np.array([[1.0] * 8, [0.0] * 8])
    reward, _ = step_reward(RewardConfig(mode="sparse", residual_cost=0.5), info, np.zeros(2, bool), residual)
    assert reward.tolist() == pytest.approx([-0.5, 1.0])
    assert RewardConfig(mode="sparse").max_return == 1.0


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"mode": "shaped"}, "reward mode"),
        ({"milestone_weights": {"grasped": 1.0}}, "milestone_weights"),
        ({"success": float("nan")}, "reward success"),
        ({"residual_cost": -1.0}, "residual_cost"),
    ],
)
def test_reward_config_rejects_bad_values(kwargs, match):
    with pytest.raises(ValueError, match=match):
        RewardConfig(**kwargs)


# -- the residual env -------------------------------------------------------------------------------------
def test_zero_residual_executes_the_proposal_and_a_residual_is_added_bounded():
    env, _ = toy_residual(num_envs=2, episode_length=20, terminate_on_success=False)
    try:
        obs, _ = env.reset(seed=3)  # no episode ends in these steps
        base = env.wrapper.env.unwrapped
        assert obs["policy"].shape == (2, env.observation_dims["policy"]) and obs["policy"].dtype == torch.float32
        assert obs["privileged"].shape == (2, env.observation_dims["privileged"])
        proposal = env.proposal
        assert np.allclose(obs["policy"][:, 8:16].numpy(), proposal)  # the proposal is in the observation
        joints = base.joints.copy()
        _, _, _, _, info = env.step(torch.zeros(2, 8))
        np.testing.assert_allclose(info["policy_action"], proposal)
        np.testing.assert_allclose(base.joints, joints + 0.5 * (proposal[:, :7] - joints), atol=1e-6)
        proposal, joints = env.proposal, base.joints.copy()
        env.step(torch.full((2, 8), 3.0))  # clipped to 1: proposal + scale
        target = proposal[:, :7] + np.asarray(DEFAULT_RESIDUAL_SCALE[:7], dtype=np.float32)
        np.testing.assert_allclose(base.joints, joints + 0.5 * (target - joints), atol=1e-5)
        assert base.gripper[:, 0].tolist() == [0.5, 0.5]  # hold's gripper 0 + 0.5, clipped to [0, 1]
        env.step(-torch.ones(2, 8))
        assert base.gripper[:, 0].tolist() == [0.0, 0.0]
    finally:
        env.close()


def test_same_step_resets_final_observations_and_outcomes():
    env, _ = toy_residual(num_envs=3, episode_length=10)  # seeds 0, 1, 2: success at 3, 2, never
    try:
        obs, _ = env.reset(seed=0)
        sessions = env.wrapper.session_ids
        obs, reward, terminated, truncated, info = env.step(torch.zeros(3, 8))  # step 1: nothing ends
        assert "_final_obs" not in info and not (terminated | truncated).any()
        obs, reward, terminated, truncated, info = env.step(torch.zeros(3, 8))  # step 2: env 1 succeeds
        assert terminated.tolist() == [False, True, False] and not truncated.any()
        assert reward.tolist() == [0.0, 1.0, 0.0]
        assert info["_final_obs"].tolist() == [False, True, False]
        final = info["final_obs"]["policy"]
        assert final[1, 16] == pytest.approx(2 / 10)  # the ended episode's last observation: step 2 of 10
        assert obs["policy"][1, 16].item() == 0.0  # the returned one is the next episode's first
        assert info["final_info"]["length"][1] == 2 and info["final_info"]["success"][1]
        assert info["_chunk_stats"].tolist() == [False, True, False]
        assert env.wrapper.session_ids[1] != sessions[1] and env.wrapper.session_ids[0] == sessions[0]
        assert info["session_id"][1] == sessions[1]  # the step's info names the ended episode's session
        assert info["episode_seed"][1] == 1 and env.wrapper.env.unwrapped.episode_seed[1] == 4
        # The new episode of env 1 succeeds at its step 2 again (seed 4: 4 % 3 == 1); env 2 runs out.
        for _ in range(8):
            obs, reward, terminated, truncated, info = env.step(torch.zeros(3, 8))
        assert truncated[2] and not terminated[2]
        assert info["final_info"]["length"][2] == 10 and not info["final_info"]["success_any_step"][2]
        assert info["final_obs"]["policy"][2, 16] == pytest.approx(1.0)
        assert env.episode_steps[2] == 0
    finally:
        env.close()


def test_without_terminate_on_success_episodes_run_to_their_length():
    env, _ = toy_residual(num_envs=3, episode_length=6, terminate_on_success=False)
    try:
        env.reset(seed=0)
        returns = np.zeros(3)
        for step in range(6):
            _, reward, terminated, truncated, info = env.step(torch.zeros(3, 8))
            returns += reward.numpy()
            assert not terminated.any() and truncated.all() == (step == 5)
        expected = [float(expected_success(seed, 6)[1]) for seed in (0, 1, 2)]
        assert returns.tolist() == expected  # success paid once per episode (env 1 succeeds at steps 2..4)
        assert info["final_info"]["return"].tolist() == expected
    finally:
        env.close()


def test_server_calls_equal_the_schedule_in_memory():
    env, client = toy_residual(num_envs=3, episode_length=10)
    try:
        lengths, _ = run_and_count(env, 37, seed=0, rng=np.random.default_rng(0))
        assert all(lengths), "every env ended episodes"
        expected = [expected_calls(lengths[i], int(env.episode_steps[i])) for i in range(3)]
        assert client.requests == expected
        # One session per episode, each announced to the server as new once.
        sessions = [s for s in client.sessions_seen if s[2]]
        assert len(sessions) == sum(len(x) + 1 for x in lengths)
    finally:
        env.close()


def test_server_calls_equal_the_schedule_over_the_websocket():
    from dz_gym.server.launch import start_server_thread

    with start_server_thread(ProbePolicy()) as server:
        toy = ToyDroidEnv(2, max_episode_length=10, image_shape=(18, 32))
        wrapper = DreamZeroPolicyWrapper(toy, server=server.url + "/v1/realtime/robot/openpi")
        env = ResidualEnv(wrapper, episode_length=9)
        try:
            lengths, history = run_and_count(env, 25, seed=5, rng=np.random.default_rng(1))
            expected = sum(expected_calls(lengths[i], int(env.episode_steps[i])) for i in range(2))
            assert server.stats().inferences == expected
            called = sum(int(np.sum(h[4]["policy_called"])) for h in history)
            assert called + 2 == expected  # the wrapper's count: every request, reset's first ones included
        finally:
            env.close()


def test_bad_arguments_are_one_line_errors():
    env = ToyDroidEnv(2, max_episode_length=10, image_shape=(18, 32))
    wrapper = DreamZeroPolicyWrapper(env, client=MemoryPolicyClient(HoldPolicy(), num_envs=2))
    try:
        with pytest.raises(ValueError, match=r"episode_length: expected an integer in \[1, 9\]"):
            ResidualEnv(wrapper, episode_length=10)
        with pytest.raises(ValueError, match="residual_scale"):
            ResidualEnv(wrapper, residual_scale=[0.1, 0.2])
        with pytest.raises(TypeError, match="reward"):
            ResidualEnv(wrapper, reward="dense")
        residual = ResidualEnv(wrapper)
        assert residual.episode_length == 9
        with pytest.raises(RuntimeError, match="reset"):
            residual.step(torch.zeros(2, 8))
        residual.reset(seed=0)
        with pytest.raises(ValueError, match=r"action: expected shape \(2, 8\)"):
            residual.step(torch.zeros(2, 7))
        with pytest.raises(ValueError, match="finite"):
            residual.step(torch.full((2, 8), float("nan")))
        with pytest.raises(ValueError, match="options"):
            residual.reset(options={"env_ids": [0]})
    finally:
        wrapper.close()


def test_importing_dz_gym_does_not_import_the_rl_extra():
    code = (
        "import sys, dz_gym, dz_gym.wrapper, dz_gym.eval; "
        "bad = [m for m in ('dz_gym.rl', 'rsl_rl', 'tensordict') if m in sys.modules]; "
        "assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def test_reward_module_examples():
    import doctest

    from dz_gym.rl import rewards

    assert doctest.testmod(rewards).failed == 0
