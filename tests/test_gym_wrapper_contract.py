"""The wrapper under Gymnasium 1.x's contract, against the reference server on loopback: a ``VectorEnv`` that
Gymnasium's vector wrappers go around, around a ``gym.make`` env or Gymnasium's own ``SyncVectorEnv``, with
``final_info`` in its info; openpi ``BasePolicy`` objects served; ``run_eval``/``EvalConfig`` exported."""

from __future__ import annotations

import inspect

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.vector import AutoresetMode, SyncVectorEnv, VectorEnv
from gymnasium.wrappers.vector import RecordEpisodeStatistics

import dz_gym
from dz_gym.envs import droid, registration
from dz_gym.envs.adapter import VectorEnvAdapter
from dz_gym.server.launch import start_server_thread
from dz_gym.server.policies import HoldPolicy, OpenPIPolicy, as_server_policy
from dz_gym.testing.toy_env import ToyDroidEnv
from dz_gym.wrapper import DreamZeroPolicyWrapper

SMALL = {"image_shape": (24, 32), "num_workers": 0, "seed": 0}
ID = registration.EMBEDDED_IDS[1]
PATH = "/v1/realtime/robot/openpi"


@pytest.fixture(scope="module")
def server():
    with start_server_thread(HoldPolicy()) as handle:
        yield handle.url + PATH


def test_wrapper_is_a_vector_env_under_record_episode_statistics(server):
    wrapper = DreamZeroPolicyWrapper(ToyDroidEnv(2, max_episode_length=6, image_shape=(18, 32)), server=server)
    assert isinstance(wrapper, VectorEnv) and wrapper.metadata["autoreset_mode"] == AutoresetMode.SAME_STEP
    stats = RecordEpisodeStatistics(wrapper)
    assert stats.num_envs == 2 and stats.single_action_space == wrapper.single_action_space
    stats.reset(seed=0)
    lengths = []
    for t in range(12):
        _, _, _, truncated, info = stats.step(None)  # None: the policy's actions
        assert truncated.all() == (t in (5, 11))
        if truncated.all():
            lengths.append(info["episode"]["l"].tolist())
    # Gymnasium 1.2.0's wrapper counts every episode after the first as if the env reset on the next step (its
    # NEXT_STEP rule: one step short); newer ones count same-step episodes whole.
    counts_same_step = "SAME_STEP" in inspect.getsource(RecordEpisodeStatistics.step)
    assert lengths == [[6, 6], [6, 6] if counts_same_step else [5, 5]] and stats.episode_count == 4
    assert info["_final_info"].all() and info["final_info"]["chunk_stats"]["chunks"].tolist() == [1, 1]
    assert info["final_info"]["_policy_called"].all() and len(info["final_obs"]) == 2  # the toy env's own
    stats.close()
    assert wrapper.closed


def test_a_reset_mask_restarts_only_its_envs_sessions(server):
    wrapper = DreamZeroPolicyWrapper(ToyDroidEnv(3, image_shape=(18, 32)), server=server)
    stats = RecordEpisodeStatistics(wrapper)
    stats.reset(seed=0)
    stats.step(None)
    before = wrapper.session_ids
    _, info = stats.reset(options={"reset_mask": np.array([False, True, False])})
    after = wrapper.session_ids
    assert [a == b for a, b in zip(before, after)] == [True, False, True]
    assert info["episode_seed"].tolist()[1] == 4  # env 1's next seed (0 + 1 + 3)
    stats.close()


def test_wrapper_around_a_gym_make_env(server):
    env = gym.make(ID, max_episode_length=5, **SMALL)
    wrapper = DreamZeroPolicyWrapper(env, server=server)
    assert isinstance(wrapper.env, VectorEnvAdapter) and isinstance(wrapper.env.vector_env, SyncVectorEnv)
    assert wrapper.num_envs == 1 and wrapper.prompts == [droid.scene_spec(1).prompt]
    obs, info = wrapper.reset(seed=4)
    assert obs["policy"]["wrist_cam"].shape == (1, 24, 32, 3) and info["episode_seed"].tolist() == [4]
    for t in range(5):
        obs, _, _, truncated, info = wrapper.step()
        assert info["policy_error"].tolist() == [None] and truncated.tolist() == [t == 4]
    # Gymnasium's SAME_STEP: the ended episode's last observation and info, the next episode's first returned
    assert info["_final_obs"].tolist() == [True] and info["final_info"]["episode_step"].tolist() == [5]
    assert info["final_info"]["episode_seed"].tolist() == [4] and info["episode_seed"].tolist() == [5]
    np.testing.assert_allclose(  # the hold policy's actions keep the arm where it was
        info["final_obs"][0]["policy"]["arm_joint_pos"], info["final_info"]["policy_action"][0, :7], atol=1e-5
    )
    wrapper.close()


def test_wrapper_over_gymnasiums_same_step_sync_vector_env_under_record_episode_statistics(server):
    vec = SyncVectorEnv(
        [lambda: gym.make(ID, max_episode_length=4, **SMALL) for _ in range(2)], autoreset_mode=AutoresetMode.SAME_STEP
    )
    stats = RecordEpisodeStatistics(DreamZeroPolicyWrapper(vec, server=server))
    stats.reset(seed=0)
    for _ in range(4):
        _, _, _, truncated, info = stats.step(None)
    assert truncated.all() and info["episode"]["l"].tolist() == [4, 4]
    assert info["final_info"]["episode_step"].tolist() == [4, 4] and info["_final_obs"].all()
    stats.close()
    assert vec.closed


@pytest.mark.parametrize("render_policy", ["due", "all"])
def test_wrapper_over_make_vec_has_final_obs_where_every_frame_renders(server, render_policy):
    wrapper = DreamZeroPolicyWrapper(gym.make_vec(ID, num_envs=2, max_episode_steps=3, **SMALL), server=server)
    wrapper.render_policy = render_policy
    wrapper.reset(seed=0)
    for _ in range(3):
        *_, info = wrapper.step()
    assert info["_final_info"].all() and info["final_info"]["chunk_stats"]["chunks"].tolist() == [1, 1]
    assert ("final_obs" in info) == (render_policy == "all")
    wrapper.close()


def test_wrapper_refuses_a_single_env_without_droid_observations():
    with pytest.raises(TypeError, match=r"^env: expected a batched DROID env .* got CartPoleEnv") as info:
        DreamZeroPolicyWrapper(gym.make("CartPole-v1"), server="ws://127.0.0.1:9")
    assert "\n" not in str(info.value)


def test_wrapper_serves_a_policy_object_itself():
    wrapper = DreamZeroPolicyWrapper(ToyDroidEnv(1, max_episode_length=9, image_shape=(18, 32)), policy=HoldPolicy())
    assert wrapper.embedded_server.in_process
    wrapper.reset(seed=0)
    *_, info = wrapper.step()
    assert info["chunk_received"].all()
    wrapper.close()
    assert not wrapper.embedded_server.running


base_policy = pytest.importorskip("openpi_client.base_policy")


class CountingOpenPIPolicy(base_policy.BasePolicy):
    """An openpi policy: holds the received joints, counts its resets."""

    def __init__(self):
        self.resets = 0

    def infer(self, obs: dict) -> dict:
        row = np.zeros(droid.ACTION_DIM, np.float32)
        row[: droid.ARM_DOF] = obs[droid.REQUEST_JOINT_KEY]
        return {"actions": np.tile(row, (droid.ACTION_HORIZON, 1))}

    def reset(self) -> None:
        self.resets += 1


def test_as_server_policy_wraps_openpi_policies_only():
    policy = CountingOpenPIPolicy()
    assert isinstance(as_server_policy(policy), OpenPIPolicy)
    hold = HoldPolicy()
    assert as_server_policy(hold) is hold
    with pytest.raises(TypeError, match=r"^policy: expected an object with an infer method, got int"):
        as_server_policy(3)


@pytest.mark.parametrize("flavor", ["vllm-omni", "openpi"])
def test_reference_server_serves_an_openpi_base_policy(flavor):
    policy = CountingOpenPIPolicy()
    with start_server_thread(policy, flavor=flavor) as handle:
        url = handle.url + (PATH if flavor == "vllm-omni" else "")
        wrapper = DreamZeroPolicyWrapper(ToyDroidEnv(2, max_episode_length=10, image_shape=(18, 32)), server=url)
        wrapper.reset(seed=0)
        for _ in range(10):
            *_, info = wrapper.step()
            assert info["policy_error"].tolist() == [None, None]
        wrapper.close()
    assert info["chunk_stats"]["chunks"].tolist() == [2, 2]
    assert policy.resets == 2  # one per new session: each env's episode (its session id) and connection


def test_run_eval_and_eval_config_are_exported():
    from dz_gym.eval.config import EvalConfig
    from dz_gym.eval.run import run_eval

    assert dz_gym.EvalConfig is EvalConfig and dz_gym.run_eval is run_eval
    assert {"EvalConfig", "run_eval"} <= set(dz_gym.__all__)
    assert "env_factory(scene, config, **env_kwargs)" in " ".join(run_eval.__doc__.split())


def _documented_env_factory(scene, config, **env_kwargs):
    """docs/eval.md's factory: a registered id through gym.make_vec."""
    ids = {1: "dz_gym/DROID-CubeInBowl-v0", 2: "dz_gym/DROID-CanInMug-v0", 3: "dz_gym/DROID-BananaInBin-v0"}
    plan = config.plan
    return gym.make_vec(ids[scene], num_envs=plan.num_envs, max_episode_steps=plan.max_steps, seed=plan.seed,
                        image_shape=(180, 320), **env_kwargs)  # fmt: skip


@pytest.mark.slow  # an embedded server's process and two short episodes: ~7 s
def test_run_eval_runs_the_documented_env_factory(tmp_path):
    config = dz_gym.EvalConfig(scenes=[1], episodes=2, num_envs=2, max_steps=10, video=False,
                               env_factory=_documented_env_factory)  # fmt: skip
    result = dz_gym.run_eval(config, output_root=tmp_path, on_line=lambda line: None)
    assert result.status == "complete" and result.summary["overall"]["episodes"] == 2
