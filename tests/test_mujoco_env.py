"""The embedded MuJoCo backend honours the batched DROID contract (dz_gym.envs.base)."""

from __future__ import annotations

import math
import os

import numpy as np
import pytest

pytest.importorskip("mujoco")

from dz_gym.envs import (
    droid,
    episodes,
    make_droid_env,
)
from dz_gym.envs.base import BatchedDroidEnv
from dz_gym.envs.mujoco import (
    MujocoDroidEnv,
    Randomization,
    RenderingUnavailable,
    gl,
    make_env,
    scene,
)
from dz_gym.envs.vector_info import entries

INFO_KEYS = set(episodes.INFO_KEYS)


@pytest.fixture(scope="module")
def env2():
    env = make_env(scene=1, num_envs=2, seed=7, num_workers=0)
    yield env
    env.close()


def hold_action(env) -> np.ndarray:
    """Keep the arm where it is, gripper open."""
    joints = env.privileged_state()["joint_pos"]
    return np.hstack([joints, np.zeros((env.num_envs, 1))])


def test_contract_shapes_dtypes_and_spaces(env2):
    assert isinstance(env2, BatchedDroidEnv)
    obs, info = env2.reset(seed=3)
    policy = obs[droid.POLICY_GROUP]
    assert set(policy) == set(droid.CAMERA_KEYS) | {droid.OBS_JOINT_KEY, droid.OBS_GRIPPER_KEY}
    for key in droid.CAMERA_KEYS:
        assert policy[key].shape == (2, 180, 320, 3) and policy[key].dtype == np.uint8
        assert policy[key].std() > 5  # a rendered scene, not a blank buffer
    assert policy[droid.OBS_JOINT_KEY].shape == (2, 7) and policy[droid.OBS_JOINT_KEY].dtype == np.float32
    assert policy[droid.OBS_GRIPPER_KEY].shape == (2, 1) and policy[droid.OBS_GRIPPER_KEY].dtype == np.float32
    np.testing.assert_allclose(policy[droid.OBS_JOINT_KEY][0], droid.HOME_JOINT_POSITIONS, atol=0.02)
    assert env2.observation_space.contains(obs)
    assert env2.action_space.shape == (2, 8)
    assert set(entries(info)) == INFO_KEYS
    assert info["episode_seed"].tolist() == [3, 4] and info["episode_step"].tolist() == [0, 0]
    assert info["object_pos"].shape == (2, 3) and info["container_pos"].shape == (2, 3)

    obs, reward, terminated, truncated, info = env2.step(hold_action(env2))
    assert env2.observation_space.contains(obs)
    assert reward.shape == (2,) and terminated.shape == (2,) and truncated.shape == (2,)
    assert not terminated.any() and not truncated.any()
    assert set(entries(info)) == INFO_KEYS
    assert info["episode_step"].tolist() == [1, 1] and info["images_fresh"].all()
    assert env2.max_episode_length == droid.MAX_EPISODE_LENGTH


def test_torch_actions_are_accepted(env2):
    torch = pytest.importorskip("torch")
    env2.reset(seed=1)
    action = torch.as_tensor(hold_action(env2), dtype=torch.float32)
    obs, *_ = env2.step(action)
    assert obs["policy"]["arm_joint_pos"].shape == (2, 7)


def test_bad_inputs_get_clear_errors(env2):
    env2.reset(seed=0)
    with pytest.raises(ValueError, match=r"action: expected shape \(2, 8\)"):
        env2.step(np.zeros((2, 7)))
    with pytest.raises(ValueError, match="action: expected finite"):
        env2.step(np.full((2, 8), np.nan))
    with pytest.raises(ValueError, match="scene"):
        make_env(scene=4, num_envs=1, num_workers=0)
    with pytest.raises(ValueError, match="num_envs"):
        make_env(scene=1, num_envs=0, num_workers=0)
    with pytest.raises(ValueError, match="image_shape"):
        make_env(scene=1, num_envs=1, image_shape=(180,), num_workers=0)
    with pytest.raises(ValueError, match="kind"):
        env2.perturb(0, "shake")
    with pytest.raises(ValueError, match="render mask"):
        env2.set_render_mask(np.ones(3, dtype=bool))


def test_step_before_reset_is_an_error():
    env = make_env(scene=1, num_envs=1, num_workers=0)
    try:
        with pytest.raises(RuntimeError, match="reset"):
            env.step(np.zeros((1, 8)))
    finally:
        env.close()
    with pytest.raises(RuntimeError, match="closed"):
        env.reset()


def test_a_time_out_that_ends_an_envs_last_episode_renders_nothing_for_it():
    """Under a render mask that asks for every env, the time-out step renders the env whose episode was its
    last neither for the mask nor for its autoreset (its frames stay those of the step before); the other
    env, which goes on to its next episode, renders."""
    env = make_env(scene=1, num_envs=2, seed=10, num_workers=0, max_episode_length=2)
    try:
        env.reset()
        action = hold_action(env)
        env.set_render_mask(np.ones(2, dtype=bool))
        env.set_last_episodes(np.array([True, False]))
        obs, _, _, truncated, info = env.step(action)
        assert not truncated.any() and info["images_fresh"].all()  # episodes go on: the mask holds
        before = {key: obs["policy"][key].copy() for key in droid.CAMERA_KEYS}
        obs, _, _, truncated, info = env.step(action)
        assert truncated.all() and info["images_fresh"].tolist() == [False, True]
        for key in droid.CAMERA_KEYS:
            np.testing.assert_array_equal(obs["policy"][key][0], before[key][0])
        env.set_last_episodes(None)
        env.step(action)
        _, _, _, truncated, info = env.step(action)
        assert truncated.all() and info["images_fresh"].all()  # without the hint every reset env renders
        with pytest.raises(ValueError, match=r"last episodes mask: expected shape \(2,\)"):
            env.set_last_episodes(np.ones(3, dtype=bool))
    finally:
        env.close()


def test_views_to_render_follows_the_mask_the_endings_and_the_last_episodes():
    env = make_env(scene=1, num_envs=4, seed=0, num_workers=0)
    try:
        ending = np.array([True, True, False, False])
        assert env.views_to_render(ending).all()  # no mask: every env
        env.set_render_mask(np.array([True, False, True, False]))
        assert env.views_to_render(ending).tolist() == [True, True, True, False]  # reset envs render
        env.set_last_episodes(np.array([True, True, True, False]))
        # env 0: asked for but ends its last episode; env 1: ends its last; env 2: asked for, goes on
        assert env.views_to_render(ending).tolist() == [False, False, True, False]
    finally:
        env.close()


def test_time_out_and_same_step_autoreset():
    env = make_env(scene=1, num_envs=2, seed=10, num_workers=0, max_episode_length=3)
    try:
        obs, info = env.reset()
        assert info["episode_seed"].tolist() == [10, 11]
        env.set_render_mask(np.zeros(2, dtype=bool))
        action = hold_action(env)
        for step in (1, 2):
            obs, _, terminated, truncated, info = env.step(action)
            assert not truncated.any() and not info["time_outs"].any()
            assert info["episode_step"].tolist() == [step, step]
            assert not info["images_fresh"].any()  # lazy: nobody asked for images
        before = env.privileged_state()
        obs, _, terminated, truncated, info = env.step(action)
        assert truncated.all() and info["time_outs"].all() and not terminated.any()
        # info describes the finished episode; the observation already belongs to the next one
        assert info["episode_step"].tolist() == [3, 3] and info["episode_seed"].tolist() == [10, 11]
        np.testing.assert_allclose(info["object_pos"], before["object_pos"], atol=0.01)
        assert info["images_fresh"].all()  # reset envs are always rendered
        after = env.privileged_state()
        assert after["episode_seed"].tolist() == [12, 13] and after["episode_step"].tolist() == [0, 0]
        assert after["episode_count"].tolist() == [2, 2]
        assert np.linalg.norm(after["object_pos"] - before["object_pos"], axis=1).min() > 1e-3
        _, _, _, truncated, info = env.step(action)
        assert not truncated.any() and info["episode_step"].tolist() == [1, 1]
        assert info["episode_seed"].tolist() == [12, 13]
    finally:
        env.close()


def test_same_seed_same_initial_state_and_trajectory():
    runs = []
    for _ in range(2):
        env = make_env(scene=3, num_envs=2, seed=42, num_workers=0)
        try:
            obs, _ = env.reset()
            state0 = env.privileged_state()
            rng = np.random.default_rng(0)
            target = state0["joint_pos"] + rng.normal(0, 0.05, (2, 7))
            action = np.hstack([target, np.ones((2, 1))])
            env.set_render_mask(np.zeros(2, dtype=bool))
            for _ in range(5):
                env.step(action)
            runs.append((obs, state0, env.privileged_state()))
        finally:
            env.close()
    (obs_a, s0_a, s5_a), (obs_b, s0_b, s5_b) = runs
    for key in droid.CAMERA_KEYS:
        np.testing.assert_array_equal(obs_a["policy"][key], obs_b["policy"][key])
    for key in ("object_pos", "container_pos", "object_quat", "joint_pos"):
        np.testing.assert_array_equal(s0_a[key], s0_b[key])
        np.testing.assert_array_equal(s5_a[key], s5_b[key])
    # different seeds give different layouts
    assert np.linalg.norm(s0_a["object_pos"][0] - s0_a["object_pos"][1]) > 1e-3


def test_episode_seed_alone_decides_the_layout_and_queued_seeds_apply():
    env = make_env(scene=2, num_envs=3, num_workers=0)
    try:
        env.set_episode_seeds([1], [123])
        _, info = env.reset(seed=5)
        assert info["episode_seed"].tolist() == [5, 123, 7]
        layout = env.privileged_state()
        env.reset(seed=122)  # env 1 now runs seed 123 by the default rule
        again = env.privileged_state()
        np.testing.assert_allclose(again["object_pos"][1], layout["object_pos"][1])
        np.testing.assert_allclose(again["container_pos"][1], layout["container_pos"][1])
        _, info = env.reset(options={"env_ids": [2]})  # partial reset: env 2's next seed, others kept
        assert info["episode_seed"].tolist() == [122, 123, 127]
        assert env.privileged_state()["episode_count"].tolist() == [2, 2, 3]
    finally:
        env.close()


def test_lazy_rendering_keeps_last_frame_of_masked_envs(env2):
    obs, _ = env2.reset(seed=0)
    obs = {"policy": {key: np.array(value) for key, value in obs["policy"].items()}}  # views: keep copies
    action = hold_action(env2)
    action[:, 5] += 0.3  # turn the wrist: the wrist view changes
    env2.set_render_mask(np.array([True, False]))
    try:
        new, *_, info = env2.step(action)
        assert info["images_fresh"].tolist() == [True, False]
        np.testing.assert_array_equal(new["policy"]["wrist_cam"][1], obs["policy"]["wrist_cam"][1])
        assert np.abs(new["policy"]["wrist_cam"][0].astype(int) - obs["policy"]["wrist_cam"][0]).mean() > 1
        # joints are always fresh, images or not
        assert not np.allclose(new["policy"]["arm_joint_pos"][1], obs["policy"]["arm_joint_pos"][1])
    finally:
        env2.set_render_mask(None)
    new2, *_, info = env2.step(action)
    assert info["images_fresh"].all()


def test_frames_are_read_only_views_until_the_next_render_or_copies_on_request():
    for workers in (0, 1):
        env = make_env(scene=1, num_envs=2, seed=0, num_workers=workers)
        try:
            obs, _ = env.reset()
            assert len(env.worker_pids) == workers and os.getpid() not in env.worker_pids
            frame = obs["policy"]["wrist_cam"]
            with pytest.raises(ValueError, match="read-only"):
                frame[0, 0, 0, 0] = 1
            kept = frame.copy()
            env.set_render_mask(np.zeros(2, dtype=bool))
            new, *_, info = env.step(hold_action(env))
            assert not info["images_fresh"].any()
            assert np.shares_memory(new["policy"]["wrist_cam"], frame)  # handed out again, not copied
            np.testing.assert_array_equal(new["policy"]["wrist_cam"], kept)
        finally:
            env.close()
        np.testing.assert_array_equal(frame, kept)  # still readable after close
        assert env.worker_pids == []
    env = make_env(scene=1, num_envs=1, seed=0, num_workers=0, frame_views=False)
    try:
        obs, _ = env.reset()
        new, *_ = env.step(hold_action(env))
        assert obs["policy"]["wrist_cam"].flags.writeable
        assert not np.shares_memory(new["policy"]["wrist_cam"], obs["policy"]["wrist_cam"])
    finally:
        env.close()


def test_perturb_nudge_and_drop(env2):
    env2.reset(seed=4)
    before = env2.privileged_state()["object_pos"].copy()
    assert env2.perturb(0, "drop") is False  # nothing held
    assert env2.perturb(0, "nudge", 0.05) is True
    after = env2.privileged_state()["object_pos"]
    assert math.isclose(np.linalg.norm(after[0, :2] - before[0, :2]), 0.05, abs_tol=1e-6)
    np.testing.assert_array_equal(after[1], before[1])
    env2.step(hold_action(env2))
    moved = env2.privileged_state()
    assert abs(moved["object_pos"][0, 2] - before[0, 2]) < 0.005  # still resting on the table
    separation = np.linalg.norm(moved["object_pos"][0, :2] - moved["container_pos"][0, :2])
    assert separation >= scene.min_separation(1, Randomization()) - 1e-6


def test_workers_match_in_process_and_close_stops_them():
    results = []
    for workers in (0, 2):
        env = make_droid_env(backend="mujoco", scene=1, num_envs=3, seed=9, num_workers=workers)
        try:
            assert isinstance(env, MujocoDroidEnv) and env.num_workers == workers
            obs, _ = env.reset()
            action = hold_action(env)
            action[:, 0] += 0.1
            for _ in range(3):
                obs, *_ = env.step(action)
            results.append((obs, env.privileged_state()))
            procs = list(env._pool.procs) if env._pool is not None else []
        finally:
            env.close()
        assert all(not p.is_alive() for p in procs)
    (obs_a, st_a), (obs_b, st_b) = results
    for key in ("object_pos", "joint_pos", "tcp_pos"):
        np.testing.assert_array_equal(st_a[key], st_b[key])
    for key in droid.CAMERA_KEYS:
        np.testing.assert_array_equal(obs_a["policy"][key], obs_b["policy"][key])


def test_randomization_ranges_and_separation():
    for scene_id, spec in scene.LAYOUTS.items():
        rand = Randomization()
        separation = scene.min_separation(scene_id, rand)
        for seed in range(200):
            layout = scene.sample_layout(scene_id, np.random.default_rng(seed), rand)
            assert np.all(np.abs(np.subtract(layout.object_xy, spec.object_nominal)) <= rand.object_xy + 1e-12)
            assert np.all(np.abs(np.subtract(layout.container_xy, spec.container_nominal)) <= rand.container_xy + 1e-12)
            assert np.linalg.norm(np.subtract(layout.object_xy, layout.container_xy)) >= separation
    fixed = scene.sample_layout(1, np.random.default_rng(0), Randomization(0, 0, 0, 0))
    assert fixed.object_xy == scene.LAYOUTS[1].object_nominal and fixed.object_yaw == 0
    with pytest.raises(ValueError, match="randomization.object_xy"):
        Randomization(object_xy=-1)


def test_rendering_error_names_the_debian_packages():
    error = gl.unavailable("EGL: no display", tried=["egl", "osmesa"])
    assert isinstance(error, RenderingUnavailable)
    text = str(error)
    assert "libegl1" in text and "libosmesa6" in text and "egl, osmesa" in text and "\n" not in text


def test_isaac_sized_images():
    env = make_env(scene=3, num_envs=1, seed=0, image_shape=(720, 1280), num_workers=0)
    try:
        obs, _ = env.reset()
        for key in droid.CAMERA_KEYS:
            assert obs["policy"][key].shape == (1, 720, 1280, 3) and obs["policy"][key].std() > 5
        assert env.camera_calibration()["external_cam"].width == 1280
    finally:
        env.close()


def test_broken_egl_falls_back_to_osmesa_in_workers_and_errors_clearly_in_process(tmp_path):
    """With EGL unusable (no vendor library) and MUJOCO_GL unset, workers render with OSMesa; in-process
    rendering, bound to EGL at import, raises the one clear error (or works where EGL is not glvnd's)."""
    import ctypes.util
    import os
    import subprocess
    import sys

    if ctypes.util.find_library("OSMesa") is None:
        pytest.skip("libosmesa6 not installed")
    script = tmp_path / "probe.py"
    script.write_text(
        "import sys, warnings\n"
        "from dz_gym.envs.mujoco import make_env, RenderingUnavailable\n"
        "if __name__ == '__main__':\n"
        "    try:\n"
        "        env = make_env(scene=1, num_envs=1, num_workers=int(sys.argv[1]))\n"
        "        obs, _ = env.reset(seed=0)\n"
        "        print('OK', int(obs['policy']['external_cam'].std() > 5))\n"
        "        env.close()\n"
        "    except RenderingUnavailable as exc:\n"
        "        print('ERROR', exc)\n"
    )
    env = {k: v for k, v in os.environ.items() if k not in ("MUJOCO_GL", "PYOPENGL_PLATFORM")}
    env["__EGL_VENDOR_LIBRARY_FILENAMES"] = str(tmp_path / "missing.json")
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env["PYTHONPATH"] = os.pathsep.join([repo, env.get("PYTHONPATH", "")])
    workers = subprocess.run([sys.executable, str(script), "1"], env=env, capture_output=True, text=True, timeout=120)
    assert workers.stdout.strip().splitlines()[-1] == "OK 1", workers.stdout + workers.stderr
    inline = subprocess.run([sys.executable, str(script), "0"], env=env, capture_output=True, text=True, timeout=120)
    last = inline.stdout.strip().splitlines()[-1]
    assert last == "OK 1" or (last.startswith("ERROR rendering:") and "libegl1" in last and "libosmesa6" in last), last
