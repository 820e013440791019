"""rsl_rl's own OnPolicyRunner (rsl-rl-lib 5.x) drives the residual env on the embedded simulator."""

from __future__ import annotations

import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("rsl_rl")
pytest.importorskip("mujoco")

from rsl_rl.env import VecEnv
from rsl_rl.runners import OnPolicyRunner
from tensordict import TensorDict

from dz_gym.envs import droid
from dz_gym.rl.residual import make_residual_env
from dz_gym.rl.rsl_rl_env import OBS_GROUPS, RslRlVecEnv
from dz_gym.server.policies import HoldPolicy
from dz_gym.testing.memory_client import MemoryPolicyClient

NUM_ENVS, EPISODE, STEPS_PER_ENV, ITERATIONS = 2, 5, 6, 2


@pytest.fixture(autouse=True)
def one_torch_thread():
    """Small networks on a shared 2-core machine: one intra-op thread is many times faster than two."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def train_cfg() -> dict:
    """A small PPO configuration in rsl-rl-lib 5.x's format (class names resolved inside rsl_rl)."""
    return {
        "num_steps_per_env": STEPS_PER_ENV,
        "save_interval": 50,
        "obs_groups": dict(OBS_GROUPS),
        "actor": {
            "class_name": "MLPModel",
            "hidden_dims": [16, 16],
            "activation": "elu",
            "obs_normalization": True,
            "distribution_cfg": {"class_name": "GaussianDistribution", "init_std": 0.5},
        },
        "critic": {"class_name": "MLPModel", "hidden_dims": [16, 16], "activation": "elu", "obs_normalization": True},
        "algorithm": {
            "class_name": "PPO",
            "num_learning_epochs": 2,
            "num_mini_batches": 2,
            "learning_rate": 1e-3,
            "schedule": "fixed",
        },
    }


def test_on_policy_runner_two_iterations_on_the_embedded_simulator(tmp_path):
    client = MemoryPolicyClient(HoldPolicy(), num_envs=NUM_ENVS)
    env = make_residual_env(
        1, NUM_ENVS, client=client, episode_length=EPISODE, seed=0,
        env_kwargs={"num_workers": 0, "image_shape": (32, 48)},
    )  # fmt: skip
    vec = RslRlVecEnv(env, seed=0)
    try:
        assert isinstance(vec, VecEnv)
        obs = vec.get_observations()
        assert isinstance(obs, TensorDict) and obs.batch_size == torch.Size([NUM_ENVS])
        assert obs["policy"].shape == (NUM_ENVS, 17) and obs["privileged"].shape == (NUM_ENVS, 25)
        assert vec.num_actions == droid.ACTION_DIM and vec.max_episode_length == EPISODE
        runner = OnPolicyRunner(vec, train_cfg(), log_dir=str(tmp_path / "log"), device="cpu")
        before = [p.detach().clone() for p in runner.alg.actor.parameters()]
        runner.learn(ITERATIONS)
        after = list(runner.alg.actor.parameters())
        assert any(not torch.equal(a, b) for a, b in zip(before, after)), "PPO updated the actor"
        assert list(tmp_path.joinpath("log").glob("model_*.pt")), "the runner saved its model"
        # 12 steps of 5-step episodes: every env ended two episodes and is at step 2 of its third; the server
        # was asked once per episode (5 <= 8 steps) and once for the current one, nothing more.
        steps = ITERATIONS * STEPS_PER_ENV
        assert env.episode_steps.tolist() == [steps % EPISODE] * NUM_ENVS
        episodes = steps // EPISODE + 1
        assert client.requests == [episodes * math.ceil(EPISODE / droid.DEFAULT_OPEN_LOOP_HORIZON)] * NUM_ENVS
        policy = runner.get_inference_policy()
        with torch.inference_mode():
            actions = policy(vec.get_observations())
        assert actions.shape == (NUM_ENVS, droid.ACTION_DIM) and torch.isfinite(actions).all()
    finally:
        vec.close()


def test_step_returns_dones_time_outs_and_episode_logs():
    client = MemoryPolicyClient(HoldPolicy(), num_envs=NUM_ENVS)
    env = make_residual_env(
        1, NUM_ENVS, client=client, episode_length=3, seed=0,
        env_kwargs={"num_workers": 0, "image_shape": (32, 48)},
    )  # fmt: skip
    vec = RslRlVecEnv(env, seed=0)
    try:
        vec.get_observations()
        for _ in range(3):
            obs, rewards, dones, extras = vec.step(torch.zeros(NUM_ENVS, droid.ACTION_DIM))
            assert rewards.shape == (NUM_ENVS,) and rewards.dtype == torch.float32
            assert dones.shape == (NUM_ENVS,) and extras["time_outs"].dtype == torch.bool
        assert dones.tolist() == [1, 1] and extras["time_outs"].tolist() == [True, True]  # hold never succeeds
        assert extras["log"]["/episode/length"].tolist() == [3.0, 3.0]
        assert extras["log"]["/episode/success"].tolist() == [0.0, 0.0]
        assert vec.episode_length_buf.tolist() == [0, 0]
        vec.episode_length_buf = torch.tensor([2, 0])  # rsl_rl's init_at_random_ep_len writes here
        _, _, dones, _ = vec.step(torch.zeros(NUM_ENVS, droid.ACTION_DIM))
        assert dones.tolist() == [1, 0]
        assert np.isfinite(obs["privileged"].numpy()).all()
    finally:
        vec.close()
