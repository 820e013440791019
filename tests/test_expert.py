"""The scripted expert solves every embedded scene; a hold-still policy does not; drop/nudge act on grasps."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("mujoco")

from dz_gym.envs import droid, episodes
from dz_gym.envs.mujoco import make_env
from dz_gym.envs.mujoco.expert import ScriptedExpert, run_episodes

HORIZON = 190  # the expert needs ~110-140 steps; leave time for the object to come to rest


@pytest.mark.parametrize("scene_id", [1, 2, 3])
def test_expert_succeeds_on_every_scene(scene_id):
    env = make_env(scene=scene_id, num_envs=2, seed=1000 + scene_id, num_workers=0, max_episode_length=HORIZON)
    try:
        env.reset()
        expert = ScriptedExpert(scene_id, env.num_envs)
        result = run_episodes(env, expert)
        assert result["success"].all(), result
        assert result["success_any_step"].all()
        assert np.all((result["steps_to_success"] > 50) & (result["steps_to_success"] < HORIZON))
        # milestones come in order, and "placed" is the first successful step
        steps = np.stack([result["milestones"][name] for name in episodes.MILESTONES])
        assert (steps > 0).all() and (np.diff(steps, axis=0) > 0).all(), steps
        np.testing.assert_array_equal(result["milestones"]["placed"], result["steps_to_success"])
        # the episode ended by time-out and autoreset: the expert starts over on the next episode
        state = env.privileged_state()
        assert state["episode_count"].tolist() == [2, 2] and state["episode_step"].tolist() == [0, 0]
        action = expert.act(state)
        assert expert.phase_names() == ["approach", "approach"]
        assert action.shape == (2, droid.ACTION_DIM) and action.dtype == np.float32
        assert np.all(action[:, droid.ARM_DOF] == 0.0)  # gripper open while approaching
    finally:
        env.close()


def test_holding_still_fails():
    env = make_env(scene=1, num_envs=2, seed=7, num_workers=0, max_episode_length=60)
    try:
        env.reset()
        env.set_render_mask(np.zeros(2, dtype=bool))
        hold = np.hstack([np.tile(droid.HOME_JOINT_POSITIONS, (2, 1)), np.zeros((2, 1))])
        any_success = np.zeros(2, dtype=bool)
        for _ in range(60):
            *_, info = env.step(hold)
            any_success |= info["success_any_step"]
        assert not any_success.any()
        assert all((info["milestones"][name] == -1).all() for name in episodes.MILESTONES)
    finally:
        env.close()


def test_drop_takes_the_object_out_of_the_gripper():
    env = make_env(scene=1, num_envs=1, seed=3, num_workers=0)
    try:
        env.reset()
        env.set_render_mask(np.zeros(1, dtype=bool))
        expert = ScriptedExpert(1, 1)
        for _ in range(150):
            env.step(expert.act(env.privileged_state()))
            if expert.phase_names()[0] == "carry":
                break
        state = env.privileged_state()
        assert expert.phase_names()[0] == "carry" and state["object_pos"][0, 2] > 0.1  # lifted
        assert env.perturb(0, "nudge") is False  # held objects are not nudged
        assert env.perturb(0, "drop") is True
        for _ in range(15):
            env.step(expert.act(env.privileged_state()))
        state = env.privileged_state()
        assert state["object_pos"][0, 2] < 0.04  # fell onto the table
        assert np.linalg.norm(state["object_pos"][0] - state["tcp_pos"][0]) > 0.08
    finally:
        env.close()
