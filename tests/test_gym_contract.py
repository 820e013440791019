"""Gymnasium 1.x's contract, checked with Gymnasium's own classes: single envs end and wait for ``reset``, the
same-step vector env's ``final_obs``/``final_info``, seeding, bounded spaces and JSON-able specs (the wrapper's
side: tests/test_gym_wrapper_contract.py)."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env
from gymnasium.vector import AutoresetMode, SyncVectorEnv

import dz_gym  # noqa: F401 - registers the ids
from dz_gym.envs import droid, make_droid_env, registration
from dz_gym.envs.isaac_droid3 import GYM_IDS as KITLESS_IDS
from dz_gym.envs.limits import JOINT_OVERSHOOT, joint_limits

SMALL = {"image_shape": (24, 32), "num_workers": 0}
ID = registration.EMBEDDED_IDS[1]
HOME = np.array([*droid.HOME_JOINT_POSITIONS, 0.0], np.float32)


def _moves(steps: int, num_envs: int | None = None, seed: int = 0) -> np.ndarray:
    """``steps`` actions near home (one per env with ``num_envs``), the same for every env maker."""
    rng = np.random.default_rng(seed)
    shape = (steps, 8) if num_envs is None else (steps, num_envs, 8)
    moves = np.broadcast_to(HOME, shape) + rng.uniform(-0.3, 0.3, shape).astype(np.float32)
    moves[..., 7] = 0.0
    return moves.astype(np.float32)


def _assert_same(a, b) -> None:
    assert sorted(a) == sorted(b)
    for key in a:
        np.testing.assert_array_equal(np.asarray(a[key]), np.asarray(b[key]), err_msg=key)


def test_make_ends_the_episode_and_waits_for_reset():
    env = gym.make(ID, max_episode_length=4, **SMALL)
    longer = gym.make(ID, max_episode_length=10, **SMALL)  # the same episode, not ended at step 4
    env.reset(seed=3)
    longer.reset(seed=3)
    for t, action in enumerate(_moves(4)):
        obs, _, terminated, truncated, info = env.step(action)
        reference, *_ = longer.step(action)
        assert (terminated, truncated) == (False, t == 3)
    # the observation returned with truncated is the episode's last, not the next episode's first
    _assert_same(obs["policy"], reference["policy"])
    assert info["episode_seed"] == 3 and info["episode_step"] == 4 and info["time_outs"]
    with pytest.raises(RuntimeError, match=r"^step: the episode ended .*call reset\(\) first$"):
        env.step(HOME)
    _, info = env.reset()
    assert info["episode_seed"] == 4  # the next seed, none skipped
    env.close()
    longer.close()


def test_make_vec_sync_resets_once_and_applies_every_action():
    env = gym.make_vec(ID, num_envs=2, vectorization_mode="sync", max_episode_length=3, **SMALL)
    assert env.metadata["autoreset_mode"] == AutoresetMode.NEXT_STEP  # Gymnasium's SyncVectorEnv
    _, info = env.reset(seed=5)
    assert info["episode_seed"].tolist() == [5, 6]
    steps, seeds = [], []
    for action in _moves(8, 2):
        _, _, _, truncated, info = env.step(action)
        steps.append(info["episode_step"].tolist())
        seeds.append(info["episode_seed"].tolist())
    # three steps, SyncVectorEnv's own reset step (episode_step 0), three steps of the next episode, ...
    assert [s[0] for s in steps] == [1, 2, 3, 0, 1, 2, 3, 0]
    assert [s[0] for s in seeds] == [5, 5, 5, 6, 6, 6, 6, 7]  # one reset per episode: each seed runs once
    env.close()


def test_same_step_final_obs_and_final_info_equal_gymnasiums_sync_vector_env():
    """The batched env's info against Gymnasium's own SyncVectorEnv(autoreset_mode=SAME_STEP) of gym.make envs."""
    ours = gym.make_vec(ID, num_envs=2, max_episode_steps=3, **SMALL)
    theirs = SyncVectorEnv(
        [lambda: gym.make(ID, max_episode_length=3, **SMALL) for _ in range(2)], autoreset_mode=AutoresetMode.SAME_STEP
    )
    assert ours.metadata["autoreset_mode"] == theirs.metadata["autoreset_mode"] == AutoresetMode.SAME_STEP
    ours.reset(seed=11)
    theirs.reset(seed=11)
    for t, action in enumerate(_moves(4, 2)):
        obs, _, _, truncated, info = ours.step(action)
        obs_g, _, _, truncated_g, info_g = theirs.step(action)
        np.testing.assert_array_equal(truncated, truncated_g)
        assert ("final_obs" in info) == ("final_obs" in info_g) == (t == 2)
        assert ("final_info" in info) == ("final_info" in info_g) == (t == 2)
        if t < 2:
            _assert_same(obs["policy"], obs_g["policy"])
        if t == 2:  # the next episodes: seed + num_envs in the batch, the next seed of each single env there
            assert ours.unwrapped.episode_seed.tolist() == [13, 14] and info_g["episode_seed"].tolist() == [12, 13]
            assert info["episode_step"].tolist() == [3, 3]  # the batch's top-level info: the step reached
    ours.close()
    theirs.close()


def test_final_entries_follow_gymnasiums_layout():
    ours = gym.make_vec(ID, num_envs=2, max_episode_steps=3, **SMALL)
    theirs = SyncVectorEnv(
        [lambda: gym.make(ID, max_episode_length=3, **SMALL) for _ in range(2)], autoreset_mode=AutoresetMode.SAME_STEP
    )
    ours.reset(seed=2)
    theirs.reset(seed=2)
    for action in _moves(3, 2):
        *_, info = ours.step(action)
        *_, info_g = theirs.step(action)
    assert info["_final_obs"].tolist() == info_g["_final_obs"].tolist() == [True, True]
    assert info["_final_info"].tolist() == info_g["_final_info"].tolist() == [True, True]
    assert info["final_obs"].dtype == info_g["final_obs"].dtype == object
    for i in range(2):
        _assert_same(info["final_obs"][i]["policy"], info_g["final_obs"][i]["policy"])
    final, final_g = info["final_info"], info_g["final_info"]
    for key in ("success", "success_any_step", "time_outs", "episode_seed", "episode_step", "object_pos"):
        np.testing.assert_array_equal(final[key], final_g[key], err_msg=key)
        assert final[f"_{key}"].tolist() == final_g[f"_{key}"].tolist() == [True, True]
    assert final["episode_step"].tolist() == [3, 3] and final["episode_seed"].tolist() == [2, 3]
    assert final["milestones"]["_reached"].tolist() == [True, True]
    ours.close()
    theirs.close()


def test_final_info_masks_only_the_envs_that_ended():
    env = make_droid_env("mujoco", 1, num_envs=3, max_episode_length=10, seed=0, **SMALL)
    env.reset(seed=0)
    env.step(np.tile(HOME, (3, 1)))
    env.reset(options={"reset_mask": np.array([True, False, False])})  # env 0 ends a step after the others
    for _ in range(9):
        *_, truncated, info = env.step(np.tile(HOME, (3, 1)))
    assert truncated.tolist() == [False, True, True]
    assert info["_final_obs"].tolist() == info["_final_info"].tolist() == [False, True, True]
    assert info["final_obs"][0] is None and info["final_info"]["_episode_step"].tolist() == [False, True, True]
    env.close()


def test_under_a_render_mask_the_final_info_comes_without_final_obs():
    env = make_droid_env("mujoco", 1, num_envs=2, max_episode_length=2, seed=0, **SMALL)
    env.reset(seed=0)
    env.set_render_mask(np.array([True, False]))
    for _ in range(2):
        *_, truncated, info = env.step(np.tile(HOME, (2, 1)))
    assert truncated.all() and info["_final_info"].all() and "final_obs" not in info
    env.close()


def test_disabled_autoreset_leaves_ended_envs_for_a_reset():
    env = make_droid_env("mujoco", 1, num_envs=2, max_episode_length=2, autoreset_mode="Disabled", **SMALL)
    assert env.metadata["autoreset_mode"] == AutoresetMode.DISABLED
    env.reset(seed=0)
    for _ in range(2):
        *_, truncated, info = env.step(np.tile(HOME, (2, 1)))
    assert truncated.all() and "final_info" not in info and env.episode_seed.tolist() == [0, 1]
    with pytest.raises(RuntimeError, match=r"^step: envs \[0, 1\] ended .*reset them first"):
        env.step(np.tile(HOME, (2, 1)))
    _, info = env.reset(options={"reset_mask": np.array([True, True])})
    assert info["episode_seed"].tolist() == [2, 3]
    env.step(np.tile(HOME, (2, 1)))
    env.close()
    with pytest.raises(ValueError, match=r"^autoreset_mode: .* runs SAME_STEP, DISABLED; got"):
        make_droid_env("mujoco", 1, num_envs=1, autoreset_mode="Sometimes", **SMALL)


def test_reset_seed_sets_np_random_seed():
    vec = gym.make_vec(ID, num_envs=2, **SMALL)
    vec.reset(seed=5)
    assert vec.unwrapped.np_random_seed == 5
    single = gym.make(ID, **SMALL)
    single.reset(seed=9)
    assert single.unwrapped.np_random_seed == 9
    vec.close()
    single.close()


def test_observed_joints_stay_in_the_bounded_space_under_actions_at_the_bounds():
    low, high = joint_limits()
    env = make_droid_env("mujoco", 1, num_envs=2, max_episode_length=200, seed=0, **SMALL)
    space = env.single_observation_space["policy"]["arm_joint_pos"]
    np.testing.assert_allclose(space.low, low - JOINT_OVERSHOOT, rtol=1e-6)
    np.testing.assert_allclose(space.high, high + JOINT_OVERSHOOT, rtol=1e-6)
    obs, _ = env.reset(seed=0)
    bounds = env.single_action_space
    rng = np.random.default_rng(0)
    for _ in range(60):  # switching between the action space's bounds: the largest overshoots
        obs, *_ = env.step(np.where(rng.random((2, 8)) < 0.5, bounds.low, bounds.high))
        assert env.observation_space["policy"]["arm_joint_pos"].contains(obs["policy"]["arm_joint_pos"])
    env.close()


def test_check_env_runs_through_the_end_of_an_episode():
    env = gym.make(ID, max_episode_length=2, render_mode="rgb_array", **SMALL)
    with pytest.warns(UserWarning, match="symmetric and normalized"):  # its advice on Box action spaces only
        check_env(env.unwrapped)
    env.close()


def test_specs_have_max_episode_steps_and_serialize_to_json():
    assert registration.MAX_EPISODE_STEPS == droid.MAX_EPISODE_LENGTH
    for gym_id in registration.EMBEDDED_IDS.values():
        spec = gym.spec(gym_id)
        assert spec.max_episode_steps == droid.MAX_EPISODE_LENGTH
        assert gym.envs.registration.EnvSpec.from_json(spec.to_json()) == spec
    for gym_id in KITLESS_IDS.values():
        spec = gym.spec(gym_id)
        assert spec.vector_entry_point == registration.KITLESS_VECTOR_ENTRY_POINT
        assert gym.envs.registration.EnvSpec.from_json(spec.to_json()) == spec
    with pytest.raises(ValueError, match=r"^env_cfg_entry_point: expected one of"):
        registration.make_kitless_vector(1, env_cfg_entry_point="elsewhere:Cfg")


def test_make_vec_takes_max_episode_length_over_the_specs_max_episode_steps():
    env = gym.make_vec(ID, num_envs=1, max_episode_length=7, **SMALL)
    assert env.max_episode_length == 7
    env.close()
    env = gym.make_vec(ID, num_envs=1, max_episode_steps=6, **SMALL)
    assert env.max_episode_length == 6
    env.close()


def test_make_with_num_envs_names_make_vec():
    with pytest.raises(ValueError, match=r"^num_envs: gym.make builds one env; for 4 envs use gym.make_vec\(") as info:
        gym.make(ID, num_envs=4, **SMALL)
    assert "\n" not in str(info.value)
