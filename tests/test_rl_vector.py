"""The Gymnasium vector view of the residual env: Gymnasium's checks that apply to vector envs, SAME_STEP."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("torch")

import gymnasium as gym
from gymnasium.utils import env_checker
from gymnasium.vector import AutoresetMode
from gymnasium.vector.utils import batch_space

from dz_gym.rl.residual import ResidualEnv
from dz_gym.rl.vector import ResidualVectorEnv
from dz_gym.server.policies import HoldPolicy
from dz_gym.testing.memory_client import MemoryPolicyClient
from dz_gym.testing.toy_env import ToyDroidEnv
from dz_gym.wrapper import DreamZeroPolicyWrapper


def make_vector(num_envs=2, episode_length=6, groups=("policy",)):
    toy = ToyDroidEnv(num_envs, max_episode_length=episode_length + 1, image_shape=(18, 32))
    wrapper = DreamZeroPolicyWrapper(toy, client=MemoryPolicyClient(HoldPolicy(), num_envs=num_envs))
    return ResidualVectorEnv(ResidualEnv(wrapper, episode_length=episode_length), groups=groups)


@pytest.mark.parametrize("groups, dim", [(("policy",), 17), (("policy", "privileged"), 42)])
def test_gymnasium_space_and_reset_checks(groups, dim):
    envs = make_vector(groups=groups)
    try:
        assert isinstance(envs, gym.vector.VectorEnv)
        assert envs.metadata["autoreset_mode"] == AutoresetMode.SAME_STEP
        for space in (envs.single_action_space, envs.action_space):
            env_checker.check_action_space(space)
        for space in (envs.single_observation_space, envs.observation_space):
            env_checker.check_observation_space(space)
        env_checker.check_space_limit(envs.single_action_space, "action")
        assert envs.observation_space == batch_space(envs.single_observation_space, 2)
        assert envs.action_space == batch_space(envs.single_action_space, 2)
        assert envs.single_observation_space.shape == (dim,)
        env_checker.check_seed_deprecation(envs)
        env_checker.check_reset_return_info_deprecation(envs)
        env_checker.check_reset_return_type(envs)
        env_checker.check_reset_options(envs)
        env_checker.check_reset_seed_determinism(envs)
    finally:
        envs.close()


def test_seeded_runs_repeat_and_returned_data_is_not_shared():
    def rollout(envs, actions):
        obs, _ = envs.reset(seed=11)
        out = [obs]
        for action in actions:
            obs, reward, terminated, truncated, _ = envs.step(action)
            out.append((obs, reward, terminated, truncated))
        return out

    envs = make_vector()
    try:
        envs.action_space.seed(0)
        actions = [envs.action_space.sample() for _ in range(9)]
        first = rollout(envs, actions)
        second = rollout(envs, actions)
        assert env_checker.data_equivalence(first, second, exact=True)
    finally:
        envs.close()
    single = make_vector(num_envs=1)  # Gymnasium's check reads terminated/truncated as one env's flags
    try:
        check = getattr(env_checker, "check_returned_data_not_reused", None)  # Gymnasium >= 1.3
        if check is not None:
            check(single)
        obs_1, _ = single.reset(seed=1)
        obs_2, *_ = single.step(single.action_space.sample())
        obs_3, *_ = single.step(single.action_space.sample())
        assert not any(np.shares_memory(a, b) for a, b in ((obs_1, obs_2), (obs_2, obs_3), (obs_1, obs_3)))
    finally:
        single.close()


def test_steps_stay_in_the_spaces_and_follow_same_step_autoreset():
    envs = make_vector(num_envs=3, episode_length=6)  # seeds 0, 1, 2: success at step 3, step 2, never
    try:
        obs, _ = envs.reset(seed=0)
        assert obs in envs.observation_space
        ended = np.zeros(3, dtype=int)
        for _ in range(1, 8):
            obs, reward, terminated, truncated, info = envs.step(np.zeros((3, 8), dtype=np.float32))
            assert obs in envs.observation_space
            assert reward.dtype == np.float32 and terminated.dtype == bool and truncated.dtype == bool
            done = terminated | truncated
            assert not (terminated & truncated).any()
            if done.any():
                assert info["_final_obs"].tolist() == done.tolist()
                for i in np.flatnonzero(done):
                    assert info["final_obs"][i] in envs.single_observation_space
                    assert obs[i, 16] == 0.0 and info["final_obs"][i, 16] > 0.0  # new episode vs the ended one
                ended += done
            else:
                assert "final_obs" not in info
        assert ended.tolist() == [2, 3, 1]
    finally:
        envs.close()


def test_vector_view_rejects_unknown_groups():
    toy = ToyDroidEnv(1, max_episode_length=5, image_shape=(18, 32))
    wrapper = DreamZeroPolicyWrapper(toy, client=MemoryPolicyClient(HoldPolicy(), num_envs=1))
    env = ResidualEnv(wrapper)
    try:
        with pytest.raises(ValueError, match="groups"):
            ResidualVectorEnv(env, groups=("camera",))
    finally:
        env.close()
