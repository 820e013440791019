"""Camera calibration agrees with what the embedded simulator renders (OpenCV convention)."""

from __future__ import annotations

import math

import numpy as np
import pytest

pytest.importorskip("mujoco")

import mujoco

from dz_gym.envs.mujoco import camera_calibration, make_env, scene, wrist_camera_pose
from dz_gym.envs.mujoco.cameras import EXTERNAL_FOVY_DEG, invert_pose


def test_intrinsics_and_rig_geometry():
    calib = camera_calibration((180, 320))
    assert set(calib) == {"external_cam", "external_cam_2", "wrist_cam"}
    assert EXTERNAL_FOVY_DEG == pytest.approx(71.5, abs=0.05)
    ext = calib["external_cam"]
    assert (ext.height, ext.width) == (180, 320)
    assert ext.K[0, 0] == pytest.approx(90 / math.tan(math.radians(EXTERNAL_FOVY_DEG / 2)))
    assert ext.K[0, 0] == ext.K[1, 1] and ext.K[0, 2] == 159.5 and ext.K[1, 2] == 89.5
    # the two external cameras mirror each other across the robot's x-z plane and look down at the table
    left, right = calib["external_cam"].world_from_camera, calib["external_cam_2"].world_from_camera
    assert left[1, 3] == pytest.approx(0.57) and right[1, 3] == pytest.approx(-0.57)
    for pose in (left, right):
        forward = pose[:3, 2]
        assert forward[0] > 0.5 and forward[2] < -0.5
        np.testing.assert_allclose(pose[:3, :3].T @ pose[:3, :3], np.eye(3), atol=1e-9)
        np.testing.assert_allclose(invert_pose(pose) @ pose, np.eye(4), atol=1e-12)
    # intrinsics scale with the image
    big = camera_calibration((720, 1280))["external_cam"]
    assert big.K[0, 0] == pytest.approx(4 * ext.K[0, 0])


def _colour_at(image: np.ndarray, uv: np.ndarray) -> np.ndarray:
    u, v = int(round(uv[0])), int(round(uv[1]))
    return image[v - 1 : v + 2, u - 1 : u + 2].reshape(-1, 3).mean(axis=0)


@pytest.mark.parametrize("scene_id", [1, 2])
def test_projected_object_centres_land_on_the_object_colours(scene_id):
    env = make_env(scene=scene_id, num_envs=2, seed=5, num_workers=0)
    try:
        obs, _ = env.reset()
        state = env.privileged_state()
        calib = env.camera_calibration()
    finally:
        env.close()
    object_rgb = np.array(scene.COLOURS[env.scene.object_name][:3]) * 255
    for i in range(2):
        for cam in ("external_cam", "external_cam_2"):
            image = obs["policy"][cam][i]
            uv = calib[cam].project(state["object_pos"][i])
            colour = _colour_at(image, uv)
            # the rendered colour is the object's, shaded: same dominant channels
            assert np.argmax(colour) == np.argmax(object_rgb), (cam, i, colour)
            assert colour.max() - colour.min() > 60, (cam, i, colour)


def test_wrist_camera_pose_matches_the_scene_camera():
    model = scene.build_model(1)
    data = mujoco.MjData(model)
    q = np.array([0.2, -0.4, 0.1, -2.2, 0.05, 1.9, 0.3])
    data.qpos[:7] = q
    mujoco.mj_forward(model, data)
    cam = model.camera("wrist_cam").id
    pose = wrist_camera_pose(q)
    np.testing.assert_allclose(pose[:3, 3], data.cam_xpos[cam], atol=1e-9)
    # OpenCV z (forward) is MuJoCo's -z; OpenCV y (down) is MuJoCo's -y
    xmat = data.cam_xmat[cam].reshape(3, 3)
    np.testing.assert_allclose(pose[:3, 2], -xmat[:, 2], atol=1e-9)
    np.testing.assert_allclose(pose[:3, 1], -xmat[:, 1], atol=1e-9)
    calib = camera_calibration((180, 320))["wrist_cam"]
    assert calib.K[1, 1] == pytest.approx(90 / math.tan(math.radians(model.cam_fovy[cam] / 2)))
