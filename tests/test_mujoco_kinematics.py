"""Kinematics of the robot alone: FK agrees with the scenes, IK reaches down-pointing targets with a yaw."""

from __future__ import annotations

import math

import numpy as np
import pytest

pytest.importorskip("mujoco")

from dz_gym.envs import droid
from dz_gym.envs.mujoco import Kinematics, make_env


@pytest.fixture(scope="module")
def kin():
    return Kinematics()


def test_model_has_no_task_objects(kin):
    names = {kin.model.body(i).name for i in range(kin.model.nbody)}
    assert "object" not in names and "container" not in names
    lower, upper = kin.joint_limits
    assert lower.shape == upper.shape == (7,) and np.all(lower < upper)
    assert lower[3] == pytest.approx(-3.0421) and upper[5] == pytest.approx(4.5169)


def test_ik_reaches_targets_across_the_workspace(kin):
    rng = np.random.default_rng(0)
    q = kin.home
    lower, upper = kin.joint_limits
    for _ in range(40):
        target = np.array([rng.uniform(0.35, 0.7), rng.uniform(-0.3, 0.3), rng.uniform(0.02, 0.3)])
        yaw = rng.uniform(-math.pi / 2, math.pi / 2)
        result = kin.ik(target, yaw, q)
        assert result.converged, (target, yaw, result)
        assert np.all(result.q >= lower) and np.all(result.q <= upper)
        position, rotation = kin.fk(result.q)
        assert np.linalg.norm(position - target) < 1e-3
        np.testing.assert_allclose(rotation[:, 2], [0, 0, -1], atol=1e-2)  # pointing down
        # the fingers close along the TCP x axis, which yaw turns away from world -y
        closing = rotation[:, 0]
        assert abs(abs(math.atan2(closing[1], closing[0]) - (yaw - math.pi / 2)) % math.pi) < 1e-2 or \
            abs(abs(math.atan2(closing[1], closing[0]) - (yaw - math.pi / 2)) % math.pi - math.pi) < 1e-2  # fmt: skip
        q = result.q  # warm start, as the expert does


def test_unreachable_target_reports_no_convergence_and_stays_in_limits(kin):
    result = kin.ik([1.5, 0.0, 0.1], 0.0)
    lower, upper = kin.joint_limits
    assert not result.converged and result.position_error > 0.3
    assert np.all(result.q >= lower) and np.all(result.q <= upper)


def test_fk_matches_the_scene_tcp():
    kin = Kinematics()
    env = make_env(scene=2, num_envs=1, seed=0, num_workers=0)
    try:
        env.reset()
        action = np.hstack([kin.ik([0.5, 0.1, 0.2], 0.4).q, [0.0]])[None]
        env.set_render_mask(np.zeros(1, dtype=bool))
        for _ in range(3):
            env.step(action)
        state = env.privileged_state()
    finally:
        env.close()
    position, rotation = kin.fk(state["joint_pos"][0])
    np.testing.assert_allclose(position, state["tcp_pos"][0], atol=1e-6)
    np.testing.assert_allclose(rotation, state["tcp_rot"][0], atol=1e-6)


def test_home_pose_is_the_droid_home(kin):
    np.testing.assert_allclose(kin.home, droid.HOME_JOINT_POSITIONS)
    position, rotation = kin.fk(kin.home)
    assert 0.3 < position[0] < 0.4 and abs(position[1]) < 1e-6 and 0.3 < position[2] < 0.4
    np.testing.assert_allclose(rotation, kin.target_rotation(0.0))
