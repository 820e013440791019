"""Tests of the Isaac Lab DROID env stand-in (dz_gym.testing.isaac_standin)."""

from __future__ import annotations

import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from dz_gym.envs import droid, episodes
from dz_gym.envs.vector_info import entries
from dz_gym.preprocess import resize_with_pad
from dz_gym.testing.isaac_standin import (
    IsaacDroidStandIn,
    decode_stamp,
    isaac_env_origins,
    joint_byte,
)

SMALL = (72, 128)
INFO_KEYS = set(episodes.INFO_KEYS)
HOME = np.asarray(droid.HOME_JOINT_POSITIONS, dtype=np.float32)


def actions(n: int, arm=HOME, gripper: float = 0.0) -> np.ndarray:
    out = np.empty((n, droid.ACTION_DIM), dtype=np.float32)
    out[:, : droid.ARM_DOF] = arm
    out[:, -1] = gripper
    return out


def test_isaac_contract_shapes_and_types():
    env = IsaacDroidStandIn(scene=1, num_envs=3, image_shape=SMALL)
    obs, info = env.reset(seed=0)
    policy = obs[droid.POLICY_GROUP]
    assert set(policy) == set(droid.CAMERA_KEYS) | {droid.OBS_JOINT_KEY, droid.OBS_GRIPPER_KEY}
    for camera in droid.CAMERA_KEYS:
        assert isinstance(policy[camera], torch.Tensor)
        assert tuple(policy[camera].shape) == (3, *SMALL, 3) and policy[camera].dtype == torch.uint8
    assert tuple(policy[droid.OBS_JOINT_KEY].shape) == (3, 7) and policy[droid.OBS_JOINT_KEY].dtype == torch.float32
    assert tuple(policy[droid.OBS_GRIPPER_KEY].shape) == (3, 1) and policy[droid.OBS_GRIPPER_KEY].dtype == torch.float32
    assert set(entries(info)) == INFO_KEYS
    obs, reward, terminated, truncated, info = env.step(actions(3))
    assert reward.dtype == torch.float32 and tuple(reward.shape) == (3,)
    assert terminated.dtype == torch.bool and truncated.dtype == torch.bool
    assert tuple(terminated.shape) == tuple(truncated.shape) == (3,)
    assert set(entries(info)) == INFO_KEYS
    arrays = [v for value in info.values() for v in (value.values() if isinstance(value, dict) else [value])]
    assert all(np.asarray(value).shape[0] == 3 for value in arrays)
    assert info["object_pos"].shape == info["container_pos"].shape == (3, 3)
    assert env.unwrapped is env and env.unwrapped.num_envs == 3
    assert env.device == "cpu" and env.max_episode_length == droid.MAX_EPISODE_LENGTH == 450
    assert env.episode_length_buf.tolist() == [1, 1, 1]
    assert env.single_observation_space[droid.POLICY_GROUP]["wrist_cam"].shape == (*SMALL, 3)
    assert env.metadata["autoreset_mode"].name == "SAME_STEP"


def test_default_views_are_720p():
    env = IsaacDroidStandIn(num_envs=2)
    obs, _ = env.reset()
    assert tuple(obs["policy"]["external_cam"].shape) == (2, 720, 1280, 3)
    stamp = decode_stamp(obs["policy"]["external_cam_2"][1])
    assert (stamp.env_id, stamp.camera, stamp.step, stamp.episode) == (1, 1, 0, 0)


def test_joints_follow_targets_with_first_order_lag_and_gripper_binarizes():
    env = IsaacDroidStandIn(num_envs=2, image_shape=SMALL, joint_tau=0.1)
    env.reset()
    alpha = 1.0 - math.exp(-droid.STEP_DT / 0.1)
    target = HOME + 0.5
    obs, *_ = env.step(actions(2, target, gripper=0.6))
    joints = obs["policy"][droid.OBS_JOINT_KEY].numpy()
    np.testing.assert_allclose(joints, np.tile(HOME + alpha * 0.5, (2, 1)), atol=1e-6)
    np.testing.assert_allclose(obs["policy"][droid.OBS_GRIPPER_KEY].numpy(), alpha, atol=1e-6)
    previous = np.abs(joints - target).max()
    for _ in range(12):
        obs, *_ = env.step(actions(2, target, gripper=0.6))
        error = np.abs(obs["policy"][droid.OBS_JOINT_KEY].numpy() - target).max()
        np.testing.assert_allclose(error, previous * (1 - alpha), rtol=1e-3)
        previous = error
    assert previous < 1e-3
    assert obs["policy"][droid.OBS_GRIPPER_KEY].numpy().min() > 0.99
    # 0.4 opens; a bool True closes (it becomes 1.0 before the > 0.5 test)
    obs, *_ = env.step(actions(2, target, gripper=0.4))
    assert obs["policy"][droid.OBS_GRIPPER_KEY].numpy().max() < 0.99
    bools = torch.zeros(2, droid.ACTION_DIM, dtype=torch.bool)
    bools[:, -1] = True
    before = obs["policy"][droid.OBS_GRIPPER_KEY].clone()
    obs, *_ = env.step(bools)
    assert (obs["policy"][droid.OBS_GRIPPER_KEY] > before).all()


def test_per_env_time_outs_autoreset_in_the_same_step_and_stay_isolated():
    env = IsaacDroidStandIn(num_envs=3, image_shape=SMALL, episode_lengths=[2, 3, None], max_episode_length=5)
    obs, info = env.reset(seed=100)
    assert info["episode_seed"].tolist() == [100, 101, 102]
    seen = []
    for t in range(1, 7):
        obs, reward, terminated, truncated, info = env.step(actions(3, HOME + 0.2))
        assert not terminated.any()
        assert truncated.numpy().tolist() == info["time_outs"].tolist()
        seen.append((t, truncated.numpy().nonzero()[0].tolist(), info["episode_step"].tolist()))
        for i in range(3):
            stamp = decode_stamp(obs["policy"]["wrist_cam"][i])
            assert stamp.env_id == i and stamp.step == int(env.episode_length_buf[i])
    assert seen == [
        (1, [], [1, 1, 1]),
        (2, [0], [2, 2, 2]),
        (3, [1], [1, 3, 3]),
        (4, [0], [2, 1, 4]),
        (5, [2], [1, 2, 5]),
        (6, [0, 1], [2, 3, 1]),
    ]
    # The observation after a time-out already belongs to the next episode: home pose, step 0.
    assert env.episode_length_buf.tolist() == [0, 0, 1]
    assert [decode_stamp(obs["policy"]["external_cam"][i]).episode for i in range(3)] == [3, 2, 1]
    np.testing.assert_allclose(obs["policy"][droid.OBS_JOINT_KEY][0].numpy(), HOME)
    assert not np.allclose(obs["policy"][droid.OBS_JOINT_KEY][2].numpy(), HOME)
    # Seeds of the following episodes: + num_envs per episode.
    assert info["episode_seed"].tolist() == [100 + 3 * 2, 101 + 3, 102 + 3]
    assert env.episode_seed.tolist() == [100 + 3 * 3, 101 + 3 * 2, 102 + 3]


def test_default_time_out_is_max_episode_length():
    env = IsaacDroidStandIn(num_envs=2, image_shape=SMALL, max_episode_length=4)
    env.reset()
    outs = [env.step(actions(2))[3].tolist() for _ in range(5)]
    assert outs == [[False, False]] * 3 + [[True, True], [False, False]]


def test_success_schedule_uses_the_placement_check():
    env = IsaacDroidStandIn(scene=2, num_envs=2, image_shape=SMALL, success_steps=[2, None], max_episode_length=4)
    _, info = env.reset()
    assert info["success"].tolist() == [False, False]
    rewards, successes = [], []
    for _ in range(5):
        _, reward, _, truncated, info = env.step(actions(2))
        rewards.append(reward.tolist())
        successes.append(info["success_any_step"].tolist())
    assert rewards == [[0.0, 0.0], [1.0, 0.0], [1.0, 0.0], [1.0, 0.0], [0.0, 0.0]]
    assert successes == [[False, False], [True, False], [True, False], [True, False], [False, False]]
    delta = info["object_pos"] - info["container_pos"]
    assert np.hypot(delta[:, 0], delta[:, 1]).min() > env.spec.success.xy_radius  # back at the start
    env2 = IsaacDroidStandIn(num_envs=1, image_shape=SMALL, success_steps=0)
    _, info = env2.reset()
    assert info["success"].tolist() == [True] and info["success_any_step"].tolist() == [True]


def test_scene_entities_world_frame_and_origins():
    env = IsaacDroidStandIn(scene=3, num_envs=8, image_shape=SMALL, env_spacing=7.0, success_steps=1)
    _, info = env.reset()
    assert env.scene.keys() == ["_11_banana", "Magenta_Box", "robot"]
    assert "Magenta_Box" in env.scene and "_24_bowl" not in env.scene
    assert env.scene.prompt == droid.SCENES[3].prompt and env.unwrapped.scene.scene_id == 3
    origins = env.scene.env_origins.numpy()
    assert sorted(set(origins[:, 0].tolist())) == [-10.5, -3.5, 3.5, 10.5]
    assert sorted(set(origins[:, 1].tolist())) == [-3.5, 3.5]
    assert len({tuple(row) for row in origins.tolist()}) == 8
    obj = env.scene["_11_banana"].data.root_pos_w.numpy()
    box = env.scene["Magenta_Box"].data.root_pos_w.numpy()
    np.testing.assert_allclose(obj - origins, info["object_pos"], atol=1e-5)
    np.testing.assert_allclose(box - origins, info["container_pos"], atol=1e-5)
    env.step(actions(8))
    placed = env.scene["_11_banana"].data.root_pos_w.numpy() - origins
    assert np.hypot(*(placed - (box - origins))[:, :2].T).max() < 1e-6
    robot = env.scene["robot"].data
    assert tuple(robot.joint_pos.shape) == (8, 8)
    np.testing.assert_allclose(robot.root_pos_w.numpy(), origins)
    with pytest.raises(KeyError, match="scene entity 'rubiks_cube': expected one of"):
        env.scene["rubiks_cube"]
    assert env.scene.spec is droid.SCENES[3]


def test_isaac_grid_single_env_and_odd_counts():
    assert isaac_env_origins(1, 7.0).tolist() == [[0.0, 0.0, 0.0]]
    grid = isaac_env_origins(5, 2.0)
    assert len({tuple(row) for row in grid.tolist()}) == 5
    assert grid[:, 0].max() == -grid[:, 0].min()


@pytest.mark.parametrize("shape", [(180, 320), (224, 224), (96, 128)])
def test_stamps_survive_resize_with_pad(shape):
    env = IsaacDroidStandIn(num_envs=4)
    env.reset()
    for _ in range(3):
        obs, *_ = env.step(actions(4, HOME + 0.3, gripper=1.0))
    for c, camera in enumerate(droid.CAMERA_KEYS):
        resized = resize_with_pad(obs["policy"][camera], *shape, method="exact")
        for i in range(4):
            stamp = decode_stamp(resized[i], source_shape=droid.ISAAC_IMAGE_SHAPE)
            assert (stamp.env_id, stamp.camera, stamp.step, stamp.episode) == (i, c, 3, 0)
            joint0 = float(obs["policy"][droid.OBS_JOINT_KEY][i, 0])
            assert stamp.joint0_byte == joint_byte(joint0)


def test_requests_carry_the_right_envs_frames():
    from dz_gym.requests import build_requests

    env = IsaacDroidStandIn(num_envs=4, episode_lengths=[3, 5, 7, 9])
    obs, _ = env.reset()
    for _ in range(4):
        obs, *_ = env.step(actions(4))
    requests = build_requests(
        obs["policy"],
        [1, 3],
        prompts=[env.scene.prompt] * 4,
        session_ids=[f"s{i}" for i in range(4)],
        image_resolution=(180, 320),
    )
    assert sorted(requests) == [1, 3]
    for env_id, request in requests.items():
        for c, camera in enumerate(droid.CAMERA_KEYS):
            image = request[droid.REQUEST_IMAGE_KEYS[camera]]
            assert image.shape == (180, 320, 3)
            stamp = decode_stamp(image, source_shape=droid.ISAAC_IMAGE_SHAPE)
            assert (stamp.env_id, stamp.camera) == (env_id, c)
            assert stamp.step == int(env.episode_length_buf[env_id])


def test_partial_reset_with_isaac_keywords_and_options():
    env = IsaacDroidStandIn(num_envs=3, image_shape=SMALL)
    env.reset(seed=5)
    for _ in range(2):
        env.step(actions(3, HOME + 0.1))
    obs, info = env.reset(env_ids=[1])
    assert env.episode_length_buf.tolist() == [2, 0, 2]
    assert info["episode_step"].tolist() == [2, 0, 2]
    assert info["episode_seed"].tolist() == [5, 1 + 5 + 3, 7]
    assert [decode_stamp(obs["policy"]["wrist_cam"][i]).episode for i in range(3)] == [0, 1, 0]
    obs, info = env.reset(seed=50, options={"env_ids": torch.tensor([0, 2])})
    assert env.episode_length_buf.tolist() == [0, 0, 0]
    assert info["episode_seed"].tolist() == [50, 9, 52]
    env.set_episode_seeds([2], [777])
    _, info = env.reset(env_ids=np.array([2]))
    assert info["episode_seed"][2] == 777
    for bad in ([3], [0, 0], np.array([0.5])):
        with pytest.raises(ValueError, match="env_ids: expected"):
            env.reset(env_ids=bad)


def test_same_inputs_give_identical_outputs():
    def rollout():
        env = IsaacDroidStandIn(num_envs=2, image_shape=SMALL, episode_lengths=[3, 4], success_steps=[1, 2])
        obs, _ = env.reset(seed=3)
        frames, infos = [], []
        rng = np.random.default_rng(0)
        for _ in range(6):
            obs, reward, _, truncated, info = env.step(actions(2, HOME + rng.normal(0, 0.2, 7), rng.uniform()))
            frames.append({k: v.clone() for k, v in obs["policy"].items()})
            infos.append((reward.tolist(), truncated.tolist(), repr(info)))  # repr: NaN quaternions compare equal
        return frames, infos

    (frames_a, infos_a), (frames_b, infos_b) = rollout(), rollout()
    assert infos_a == infos_b
    for a, b in zip(frames_a, frames_b):
        assert all(torch.equal(a[k], b[k]) for k in a)


def test_envs_and_cameras_have_distinct_backgrounds():
    env = IsaacDroidStandIn(num_envs=2, image_shape=SMALL)
    obs, _ = env.reset()
    views = [obs["policy"][camera][i] for camera in droid.CAMERA_KEYS for i in range(2)]
    for a in range(len(views)):
        for b in range(a + 1, len(views)):
            assert not torch.equal(views[a], views[b])


def test_observation_ring_buffers():
    env = IsaacDroidStandIn(num_envs=1, image_shape=SMALL, obs_buffers=2)
    obs0, _ = env.reset()
    kept = obs0["policy"]["wrist_cam"].clone()
    obs1, *_ = env.step(actions(1))
    assert torch.equal(obs0["policy"]["wrist_cam"], kept)  # valid for obs_buffers - 1 further steps
    assert obs1["policy"]["wrist_cam"].data_ptr() != obs0["policy"]["wrist_cam"].data_ptr()
    obs2, *_ = env.step(actions(1))
    assert obs2["policy"]["wrist_cam"].data_ptr() == obs0["policy"]["wrist_cam"].data_ptr()
    assert decode_stamp(obs0["policy"]["wrist_cam"][0]).step == 2
    assert env.renders == 3
    assert obs1["policy"][droid.OBS_JOINT_KEY].data_ptr() != obs2["policy"][droid.OBS_JOINT_KEY].data_ptr()


def test_render_mask_is_accepted_and_every_view_is_redrawn():
    env = IsaacDroidStandIn(num_envs=2, image_shape=SMALL)
    env.reset()
    env.set_render_mask(np.array([True, False]))
    obs, _, _, _, info = env.step(actions(2))
    assert info["images_fresh"].tolist() == [True, True]
    assert decode_stamp(obs["policy"]["external_cam"][1]).step == 1


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"num_envs": 0}, "num_envs: expected an integer >= 1"),
        ({"scene": 9}, "scene: expected one of"),
        ({"image_shape": (4, 4)}, "image_shape: expected"),
        ({"image_shape": (200, 20)}, "too small for the stamp blocks"),
        ({"episode_lengths": [3]}, "episode_lengths: expected 2 values"),
        ({"episode_lengths": [3, 0]}, "episode_lengths: expected integers >= 1"),
        ({"success_steps": [1, -2]}, "success_steps: expected integers >= 0 or None"),
        ({"max_episode_length": 0}, "max_episode_length: expected an integer >= 1"),
        ({"joint_tau": 0}, "joint_tau: expected seconds > 0"),
        ({"obs_buffers": 0}, "obs_buffers: expected an integer >= 1"),
    ],
)
def test_constructor_errors(kwargs, match):
    args = {"num_envs": 2, "image_shape": SMALL, **kwargs}
    with pytest.raises(ValueError, match=match):
        IsaacDroidStandIn(**args)


def test_step_errors_and_close():
    env = IsaacDroidStandIn(num_envs=2, image_shape=SMALL)
    with pytest.raises(RuntimeError, match="call reset"):
        env.step(actions(2))
    env.reset()
    with pytest.raises(ValueError, match=r"action: expected shape \(2, 8\), got \(3, 8\)"):
        env.step(actions(3))
    bad = actions(2)
    bad[0, 3] = np.nan
    with pytest.raises(ValueError, match="action: expected finite values"):
        env.step(bad)
    with pytest.raises(ValueError, match="dtype object"):
        env.step(np.array([[None] * 8] * 2))
    env.close()
    with pytest.raises(RuntimeError, match="closed"):
        env.reset()


def test_decode_rejects_foreign_images():
    with pytest.raises(ValueError, match="no stand-in stamp"):
        decode_stamp(np.zeros((72, 128, 3), np.uint8))
    with pytest.raises(ValueError, match=r"image: expected shape \(H, W, 3\)"):
        decode_stamp(np.zeros((72, 128), np.uint8))


def test_cuda_device():
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    env = IsaacDroidStandIn(num_envs=2, image_shape=SMALL, device="cuda", episode_lengths=[2, 3])
    obs, _ = env.reset()
    assert obs["policy"]["wrist_cam"].device.type == "cuda"
    for _ in range(2):
        obs, reward, terminated, truncated, _ = env.step(torch.zeros(2, 8, device="cuda"))
    assert reward.device.type == truncated.device.type == "cuda"
    assert truncated.tolist() == [True, False]
    assert decode_stamp(obs["policy"]["wrist_cam"][1]).step == 2
