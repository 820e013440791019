"""Scene appearance: unique saturated task colours, a connected banana, objects visible in both external views."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("mujoco")
Image = pytest.importorskip("PIL.Image")

from dz_gym.envs import droid
from dz_gym.envs.mujoco import Randomization, make_env, scene


def _hue_sat_val(image: np.ndarray) -> np.ndarray:
    return np.asarray(Image.fromarray(image).convert("HSV")).astype(np.int32)


def _hue(rgba) -> int:
    pixel = np.array([[np.array(rgba[:3]) * 255]], dtype=np.uint8)
    return int(_hue_sat_val(pixel)[0, 0, 0])


def _hue_distance(a, b):
    d = np.abs(np.asarray(a) - b) % 256
    return np.minimum(d, 256 - d)


def test_task_colours_are_saturated_and_distinct():
    hues = {name: _hue(rgba) for name, rgba in scene.COLOURS.items()}
    names = list(hues)
    for i, a in enumerate(names):
        rgb = np.array(scene.COLOURS[a][:3])
        assert (rgb.max() - rgb.min()) / rgb.max() > 0.8, a
        for b in names[i + 1 :]:
            assert _hue_distance(hues[a], hues[b]) >= 18, (a, b)
    for rgba in (scene.TABLE_RGBA, scene.FLOOR_RGBA, scene.TABLE_LEG_RGBA):
        rgb = np.array(rgba[:3])
        assert (rgb.max() - rgb.min()) / rgb.max() < 0.3


def test_banana_is_one_connected_shape():
    segments = scene.banana_segments()
    assert len(segments) >= 3
    for (_, end, _r0), (start, _, _r1) in zip(segments, segments[1:]):
        np.testing.assert_allclose(end, start)  # consecutive capsules share their joint: no gaps
    model = scene.build_model(3)
    body = model.body(scene.OBJECT_BODY).id
    assert sum(model.geom_bodyid == body) == len(segments)  # one rigid body


@pytest.mark.parametrize("scene_id", [1, 2, 3])
def test_only_task_objects_are_saturated_and_both_views_see_them(scene_id):
    spec = droid.scene_spec(scene_id)
    object_hue = _hue(scene.COLOURS[spec.object_name])
    container_hue = _hue(scene.COLOURS[spec.container_name])
    env = make_env(scene=scene_id, num_envs=4, seed=11, num_workers=0, randomization=Randomization(0.1, 0.1))
    try:
        obs, _ = env.reset()
    finally:
        env.close()
    for cam in ("external_cam", "external_cam_2"):
        for i in range(4):
            hsv = _hue_sat_val(obs["policy"][cam][i])
            saturated = (hsv[..., 1] > 140) & (hsv[..., 2] > 60)
            hue = hsv[..., 0][saturated]
            near_object = _hue_distance(hue, object_hue) <= 12
            near_container = _hue_distance(hue, container_hue) <= 12
            assert np.all(near_object | near_container), (cam, i, np.unique(hue[~(near_object | near_container)]))
            assert near_object.sum() >= 15, (cam, i, near_object.sum())  # the object is in view
            assert near_container.sum() >= 40, (cam, i, near_container.sum())


@pytest.mark.parametrize("scene_id", [1, 2, 3])
def test_whole_randomization_range_projects_inside_both_external_views(scene_id):
    from dz_gym.envs.mujoco import camera_calibration

    calib = camera_calibration((180, 320))
    spec, rand = scene.LAYOUTS[scene_id], Randomization()
    for nominal, radius, top in (
        (spec.object_nominal, spec.object_radius, 2 * spec.object_rest_z),
        (spec.container_nominal, spec.container_radius, 0.1),
    ):
        # the footprint circle's extremes at every corner of the xy range, at the table and at the top
        corners = [
            (nominal[0] + sx * rand.object_xy, nominal[1] + sy * rand.object_xy) for sx in (-1, 1) for sy in (-1, 1)
        ]
        angles = np.linspace(0, 2 * np.pi, 8, endpoint=False)
        points = np.array(
            [
                [x + radius * np.cos(a), y + radius * np.sin(a), z]
                for x, y in corners
                for a in angles
                for z in (0.0, top)
            ]
        )
        for cam in ("external_cam", "external_cam_2"):
            uv = calib[cam].project(points)
            assert np.all(uv[:, 0] > 5) and np.all(uv[:, 0] < 315), cam
            assert np.all(uv[:, 1] > 5) and np.all(uv[:, 1] < 175), cam


def test_container_sizes_fit_the_success_thresholds():
    # the object resting inside its container counts as placed (centre height band and xy radius)
    for scene_id in (1, 2, 3):
        criteria = droid.scene_spec(scene_id).success
        layout = scene.LAYOUTS[scene_id]
        floor = {1: 0.01, 2: 0.008, 3: 0.01}[scene_id]
        rest_height = floor + layout.object_rest_z
        assert criteria.z_min <= rest_height <= criteria.z_max
        assert criteria.xy_radius < layout.container_radius + 0.01


def test_object_box_is_the_objects_bounding_box():
    cube, can = scene.build_model(1), scene.build_model(2)
    assert scene.object_box(1).half_extents == tuple(cube.geom("cube").size.tolist())
    radius, half_height = can.geom("can").size[:2]
    assert scene.object_box(2).half_extents == (radius, radius, half_height)
    box = scene.object_box(3)
    lower = np.subtract(box.center, box.half_extents)
    upper = np.add(box.center, box.half_extents)
    corners = []
    for start, end, r in scene.banana_segments():
        for point in (start, end):
            corners += [point - r, point + r]
            assert np.all(point - r >= lower - 1e-12) and np.all(point + r <= upper + 1e-12)
    np.testing.assert_allclose(np.min(corners, axis=0), lower, atol=1e-12)  # tight
    np.testing.assert_allclose(np.max(corners, axis=0), upper, atol=1e-12)
