"""The reference policy: segmentation and geometry maths, perception on rendered frames against the
simulator's privileged state, planner and session bookkeeping, safety of the emitted chunks, and a few
closed-loop episodes on the embedded simulator."""

from __future__ import annotations

import math
import threading

import numpy as np
import pytest

from dz_gym.envs import droid
from dz_gym.policies.reference.geometry import (
    PinholeCamera,
    intersect_plane_z,
    principal_axis_yaw,
    square_yaw,
    triangulate,
)
from dz_gym.policies.reference.perception import EntityView, Track, WristView
from dz_gym.policies.reference.planner import Measurement, Phase, Planner, PlannerConfig, PlannerState
from dz_gym.policies.reference.segmentation import ImagePlanes, colour_mask, find_blob, opened
from dz_gym.policies.reference.sessions import SessionStore
from dz_gym.policies.reference.tasks import TASKS, task_for_prompt

# ----------------------------------------------------------------------------------- segmentation


def _image(h=40, w=60, background=(150, 140, 128)):
    return np.tile(np.asarray(background, dtype=np.uint8), (h, w, 1))


@pytest.mark.parametrize(
    "colour, rgb",
    [
        ("red", (216, 20, 20)),
        ("green", (25, 183, 46)),
        ("blue", (20, 56, 216)),
        ("yellow", (242, 209, 20)),
        ("cyan", (13, 191, 216)),
        ("magenta", (216, 25, 191)),
    ],
)
def test_each_scene_colour_falls_in_exactly_its_class(colour, rgb):
    image = _image()
    image[10:20, 10:20] = rgb
    image[25:30, 40:50] = (90, 90, 92)  # grey robot part
    planes = ImagePlanes(image)
    for other in ("red", "green", "blue", "yellow", "cyan", "magenta"):
        mask = planes.mask(other)
        assert mask.sum() == (100 if other == colour else 0), other
    # darker shading of the same colour stays in the class
    dark = _image()
    dark[:5, :5] = (np.asarray(rgb) * 0.45).astype(np.uint8)
    assert colour_mask(dark, colour).sum() == 25


def test_unsaturated_table_wood_and_greys_are_rejected():
    image = _image(background=(158, 143, 125))  # the table's wood under the scene's light
    image[:10] = (200, 200, 205)
    image[10:20] = (30, 30, 30)
    planes = ImagePlanes(image)
    assert not planes.saturated.any()
    with pytest.raises(ValueError, match="colour: expected one of"):
        planes.mask("orange")
    with pytest.raises(ValueError, match="image: expected uint8"):
        ImagePlanes(np.zeros((4, 4, 3), dtype=np.float32))


def test_blob_keeps_the_largest_group_with_near_neighbours_and_exact_centroid():
    mask = np.zeros((64, 96), dtype=bool)
    mask[20:30, 20:28] = True  # left half of an object...
    mask[20:30, 31:39] = True  # ...split by a 3-px occluder
    mask[50:52, 80:82] = True  # stray pixels far away
    blob = find_blob(mask)
    assert blob.area == 160
    np.testing.assert_allclose(blob.centroid, [29.0, 24.5])  # (u, v) = (column, row)
    assert blob.bbox == (20, 29, 20, 38) and not blob.touches_border
    assert find_blob(np.zeros((8, 8), dtype=bool)) is None
    edge = np.zeros((16, 16), dtype=bool)
    edge[0:4, 5:9] = True
    assert find_blob(edge).touches_border


def test_opening_drops_a_thin_handle_but_keeps_the_body():
    mask = np.zeros((60, 60), dtype=bool)
    mask[10:40, 10:30] = True  # body
    mask[15:35, 33:35] = True  # 2-px handle bar
    mask[15:17, 30:33] = True
    mask[33:35, 30:33] = True
    out = opened(mask, 4)
    assert out[10:40, 10:30].all() and not out[:, 31:].any()
    plain, trimmed = find_blob(mask), find_blob(mask, opening=4)
    assert plain.centroid[0] > 20.0
    np.testing.assert_allclose(trimmed.centroid, [19.5, 24.5])


# -------------------------------------------------------------------------------------- geometry


def _look_at(eye, target):
    forward = np.asarray(target, float) - eye
    forward /= np.linalg.norm(forward)
    right = np.cross(forward, [0.0, 0.0, 1.0])
    right /= np.linalg.norm(right)
    down = np.cross(forward, right)
    pose = np.eye(4)
    pose[:3, :3] = np.stack([right, down, forward], axis=1)
    pose[:3, 3] = eye
    return pose


def test_triangulation_recovers_a_point_from_two_projections():
    K = np.array([[125.0, 0, 159.5], [0, 125.0, 89.5], [0, 0, 1]])
    cams = [PinholeCamera(K, _look_at(np.array([0.05, y, 0.66]), [0.5, 0.0, 0.0])) for y in (0.57, -0.57)]
    point = np.array([0.47, -0.12, 0.031])
    rays = [cam.rays(cam.project(point)) for cam in cams]
    estimate, gap = triangulate(cams[0].centre, rays[0], cams[1].centre, rays[1])
    np.testing.assert_allclose(estimate, point, atol=1e-9)
    assert gap < 1e-9
    # a 0.5 px centroid error moves the estimate by millimetres, not centimetres
    noisy = cams[0].rays(cams[0].project(point) + [0.5, 0.0])
    estimate, _ = triangulate(cams[0].centre, noisy, cams[1].centre, rays[1])
    assert np.linalg.norm(estimate - point) < 0.006
    parallel, gap = triangulate(np.zeros(3), np.array([1.0, 0, 0]), np.ones(3), np.array([1.0, 0, 0]))
    assert np.isnan(parallel).all() and gap == math.inf


def test_plane_intersection_and_planar_orientation():
    origin = np.array([0.0, 0.0, 1.0])
    points = intersect_plane_z(origin, np.array([[0.0, 0.0, -1.0], [1.0, 0.0, -1.0], [1.0, 0.0, 1.0]]), 0.25)
    np.testing.assert_allclose(points[:2], [[0, 0, 0.25], [0.75, 0, 0.25]])
    assert np.isnan(points[2]).all()
    rng = np.random.default_rng(0)
    t = rng.uniform(-1, 1, 500)
    for yaw in (-1.2, 0.3, 1.5):
        line = np.stack([0.1 * t * math.cos(yaw), 0.1 * t * math.sin(yaw)], axis=1) + rng.normal(0, 0.004, (500, 2))
        est, elongation = principal_axis_yaw(line)
        assert abs(((est - yaw + math.pi / 2) % math.pi) - math.pi / 2) < 0.05 and elongation > 0.8
    grid = np.stack(np.meshgrid(np.linspace(-1, 1, 21), np.linspace(-1, 1, 21)), axis=-1).reshape(-1, 2)
    for yaw in (-0.6, 0.0, 0.35):
        c, s = math.cos(yaw), math.sin(yaw)
        square = grid @ np.array([[c, s], [-s, c]])
        assert abs(square_yaw(square) - yaw) < 1e-6 or abs(abs(square_yaw(square) - yaw) - math.pi / 2) < 1e-6
        assert principal_axis_yaw(square)[1] < 0.05


# ------------------------------------------------------------------------------- tasks & sessions


def test_prompts_select_scenes_and_unknown_prompts_fail_clearly():
    for scene_id, spec in droid.SCENES.items():
        assert task_for_prompt(spec.prompt).scene_id == scene_id
        assert task_for_prompt("  " + spec.prompt.upper() + ". ").scene_id == scene_id
    with pytest.raises(ValueError, match="prompt: expected one of"):
        task_for_prompt("stack the blocks")
    with pytest.raises(ValueError, match="prompt: expected a string"):
        task_for_prompt(None)
    assert all(task.release_height > task.rim_height for task in TASKS.values())


def test_session_store_is_lru_bounded_and_renews_on_request():
    made = []
    store = SessionStore(lambda: made.append(1) or {"n": len(made)}, max_sessions=3)
    for sid in ("a", "b", "c"):
        with store.session(sid) as state:
            state["seen"] = sid
    with store.session("a") as state:  # touch a: b is now the oldest
        assert state["seen"] == "a"
    with store.session("d"):
        pass
    assert "b" not in store and "a" in store and len(store) == 3 and store.evictions == 1
    with store.session("a", new=True) as state:
        assert "seen" not in state
    store.drop("a")
    assert "a" not in store
    store.drop()
    assert len(store) == 0
    with pytest.raises(ValueError, match="max_sessions"):
        SessionStore(dict, max_sessions=0)


def test_session_store_counts_and_warns_once_when_an_evicted_session_comes_back(caplog):
    """1024 envs asking in turn of a store of 64 sessions: every session is evicted before it asks again, so
    its plan would silently restart at every chunk (the reference policy's old default gave 0/1024 on Isaac Lab
    at N = 1024); the loss is counted and said once. The default store keeps 1024 envs x 4 scenes."""
    small = SessionStore(dict, max_sessions=64)
    with caplog.at_level("WARNING", logger="dz_gym.policies.reference.sessions"):
        for _ in range(2):
            for env in range(1024):
                with small.session(f"s{env}"):
                    pass
    assert small.lost == 1024 and small.evictions == 2 * 1024 - 64
    warnings = [r for r in caplog.records if "evicted" in r.getMessage()]
    assert len(warnings) == 1 and "max_sessions=64" in warnings[0].getMessage()
    default = SessionStore(dict)
    for _ in range(2):
        for env in range(4 * 1024):
            with default.session(f"s{env}"):
                pass
    assert default.lost == 0 and default.evictions == 0
    with small.session("fresh", new=True):  # a new session is never a loss
        pass
    assert small.lost == 1024


def test_session_store_serialises_calls_of_one_session_across_threads():
    store = SessionStore(lambda: {"inside": 0, "max": 0, "calls": 0}, max_sessions=8)
    barrier = threading.Barrier(8)

    def worker(k):
        barrier.wait()
        for _ in range(200):
            with store.session(f"s{k % 2}") as state:
                state["inside"] += 1
                state["max"] = max(state["max"], state["inside"])
                state["calls"] += 1
                state["inside"] -= 1

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for sid in ("s0", "s1"):
        with store.session(sid) as state:
            assert state["max"] == 1 and state["calls"] == 800


# -------------------------------------------------------------------------------------- planner


def _track(position, yaw=0.0, elongation=0.0, areas=(100, 100)):
    track = Track()
    track.update(EntityView(np.asarray(position, float), 0.0, areas, yaw, elongation))
    return track


def _meas(tcp, gripper=0.0, q=None, yaw=0.0):
    return Measurement(np.zeros(7) if q is None else q, gripper, np.asarray(tcp, float), yaw)


def _call(planner, state, meas, obj, con, rows=24, executed=8):
    planner.begin_call(state, meas, obj, con)
    planner.advance(state, meas, obj, con)
    return planner.rollout(state, obj, con, rows, executed)


def test_rollout_moves_at_bounded_speed_and_hands_over_from_approach_to_descend():
    task = TASKS[1]
    planner = Planner(task)
    cfg = planner.config
    obj, con = _track([0.5, -0.1, 0.025]), _track([0.55, 0.15, 0.04])
    state = PlannerState()
    rows, kept = _call(planner, state, _meas([0.36, 0.0, 0.335]), obj, con)
    steps = np.linalg.norm(np.diff([r.position for r in rows], axis=0), axis=1)
    assert steps.max() <= cfg.fast_speed * cfg.dt + 1e-9
    assert rows[0].phase == Phase.APPROACH and rows[-1].phase == Phase.DESCEND
    assert kept.phase == Phase.APPROACH  # 8 rows are not enough to reach the hover point
    hover = np.array([0.5, -0.1, 0.025 + cfg.hover_height])
    assert np.linalg.norm(kept.anchor_position - hover) < np.linalg.norm(np.array([0.36, 0.0, 0.335]) - hover)
    # descending rows stop at the grasp height and never go below the table margin
    low = Planner(task)
    obj_low = _track([0.5, -0.1, -0.05])
    state = PlannerState(phase=Phase.DESCEND, anchor_position=np.array([0.5, -0.1, 0.03]))
    rows, _ = low.rollout(state, obj_low, con, 24, 8)
    assert min(r.position[2] for r in rows) >= cfg.min_tcp_z


def test_gated_phases_wait_for_measured_arrival_and_gripper():
    planner = Planner(TASKS[1])
    obj, con = _track([0.5, -0.1, 0.025]), _track([0.55, 0.15, 0.04])
    state = PlannerState(phase=Phase.DESCEND, anchor_position=np.array([0.5, -0.1, 0.025]))
    _call(planner, state, _meas([0.5, -0.1, 0.06]), obj, con)
    assert state.phase == Phase.DESCEND  # commanded there, but the arm is still 3.5 cm above
    _call(planner, state, _meas([0.502, -0.1, 0.03]), obj, con)
    assert state.phase == Phase.CLOSE and obj.frozen
    obj.update(EntityView(np.array([0.6, 0.0, 0.025]), 0.0, (100, 100)))
    np.testing.assert_allclose(obj.position, [0.5, -0.1, 0.025])  # frozen while grasping
    rows, _ = _call(planner, state, _meas([0.502, -0.1, 0.026], gripper=0.0), obj, con)
    assert state.phase == Phase.CLOSE and all(r.gripper == 1.0 for r in rows)
    _call(planner, state, _meas([0.502, -0.1, 0.026], gripper=0.48), obj, con)
    assert state.phase == Phase.LIFT


def test_failed_grasps_retry_then_give_up_and_a_lost_object_is_noticed():
    planner = Planner(TASKS[1], PlannerConfig(max_retries=2))
    con = _track([0.55, 0.15, 0.04])
    state = PlannerState()
    for _ in range(3):
        obj = _track([0.5, -0.1, 0.025])
        state.enter(Phase.CLOSE)
        state.anchor_position = np.array([0.5, -0.1, 0.025])
        _call(planner, state, _meas([0.5, -0.1, 0.025], gripper=0.98), obj, con)  # closed on nothing
        assert obj.position is None and not obj.frozen  # re-locates from scratch
    assert state.retries == 3 and state.phase == Phase.HOME and state.events[-1].endswith("giving_up")
    assert state.events[:2] == ["grasp_missed", "grasp_missed"]
    rows, _ = planner.rollout(state, obj, con, 24, 8)
    assert all(r.joints is not None and r.gripper == 0.0 for r in rows)

    # carrying: the gripper closes fully (object taken) -> reopen and try again
    state = PlannerState(phase=Phase.CARRY, anchor_position=np.array([0.5, 0.0, 0.22]))
    obj = _track([0.5, 0.0, 0.2])
    _call(planner, state, _meas([0.5, 0.0, 0.22], gripper=0.97), obj, con)
    assert state.phase == Phase.REOPEN and state.events == ["object_lost"] and state.retries == 1
    # lifted but the views show the object still on the table -> the grasp check fails
    state = PlannerState(phase=Phase.LIFT, anchor_position=np.array([0.5, -0.1, 0.2]), lift_xy=np.array([0.5, -0.1]))
    obj = _track([0.5, -0.1, 0.025])
    obj.last_view = EntityView(np.array([0.5, -0.1, 0.025]), 0.0, (100, 100))
    _call(planner, state, _meas([0.5, -0.1, 0.19], gripper=0.5), obj, con)
    assert state.phase == Phase.REOPEN and state.events == ["grasp_check_failed"]


def test_a_moving_or_unreachable_object_is_bounded_by_the_retries():
    planner = Planner(TASKS[1], PlannerConfig(max_moves=2))
    con = _track([0.55, 0.15, 0.04])
    state = PlannerState(phase=Phase.DESCEND, anchor_position=np.array([0.5, -0.1, 0.09]))
    obj = _track([0.5, -0.1, 0.025])
    events = []
    for k in range(1, 4):  # the object keeps jumping away from under the gripper
        obj.update(EntityView(np.array([0.5 + 0.04 * k, -0.1, 0.025]), 0.0, (100, 100)))
        state.enter(Phase.DESCEND)
        _call(planner, state, _meas(state.anchor_position), obj, con)
        events.append(state.events[-1])
    assert events == ["object_moved", "object_moved", "object_keeps_moving"] and state.retries == 1
    state = PlannerState()
    far = _track([0.1, 0.6, 0.025])
    _call(planner, state, _meas([0.36, 0.0, 0.335]), far, con)
    assert state.events == ["out_of_reach"] and state.retries == 1  # open and high: straight back to approach
    assert state.phase == Phase.APPROACH


def test_placement_check_after_release():
    planner = Planner(TASKS[1])
    con = _track([0.55, 0.15, 0.04])
    # outside: retry (the gripper is already open and high, so it goes straight back to approaching)
    for obj_xy, expected in (([0.56, 0.16], Phase.HOME), ([0.40, 0.10], Phase.APPROACH)):
        state = PlannerState(phase=Phase.RETREAT, anchor_position=np.array([0.55, 0.15, 0.21]))
        state.retreat_xy, state.retreat_z = np.array([0.55, 0.15]), 0.21
        obj = Track()
        obj.update(EntityView(np.array([*obj_xy, 0.03]), 0.0, (50, 50)))
        _call(planner, state, _meas([0.55, 0.15, 0.205]), obj, con)
        assert state.phase == expected
        assert state.events == (["placed"] if expected == Phase.HOME else ["place_check_failed"])


def test_grasp_yaw_follows_the_object_shape():
    cube, banana, can = Planner(TASKS[1]), Planner(TASKS[3]), Planner(TASKS[2])

    def boxed(yaw):
        track = _track([0.5, 0, 0.025])
        assert track.update_shape(WristView(np.array([0.5, 0.0]), yaw, 0.05, 900, False))
        return track

    assert cube.grasp_yaw(_track([0.5, 0, 0.025], yaw=0.3), 0.1) == 0.1  # external views only: keep the yaw
    assert cube.grasp_yaw(boxed(0.3), 0.0) == pytest.approx(0.3)
    assert cube.grasp_yaw(boxed(-0.7), 0.0) == pytest.approx(-0.7)
    assert cube.grasp_yaw(boxed(0.7), 1.0) == pytest.approx(0.7)
    assert cube.grasp_yaw(boxed(0.7), -1.0) == pytest.approx(0.7 - math.pi / 2)
    assert banana.grasp_yaw(_track([0.5, 0, 0.02], yaw=1.4, elongation=0.8), 0.0) == pytest.approx(1.4)
    assert banana.grasp_yaw(_track([0.5, 0, 0.02], yaw=1.4, elongation=0.8), -1.0) == pytest.approx(1.4 - math.pi)
    assert banana.grasp_yaw(_track([0.5, 0, 0.02], yaw=1.4, elongation=0.8), -1.9) == pytest.approx(1.4 - math.pi)
    assert banana.grasp_yaw(_track([0.5, 0, 0.02], yaw=0.5, elongation=0.8), -1.9) == pytest.approx(
        0.5
    )  # -2.64 is out of range
    assert can.grasp_yaw(_track([0.5, 0, 0.04], yaw=1.0), 0.2) == pytest.approx(0.2)  # round: keep yaw


# --------------------------------------------------------------------- on the embedded simulator


def _env(scene, num_envs, **kwargs):
    pytest.importorskip("mujoco")
    from dz_gym.envs.mujoco import make_env

    return make_env(scene=scene, num_envs=num_envs, seed=0, num_workers=0, **kwargs)


def _request(obs, i, scene):
    policy = obs[droid.POLICY_GROUP]
    request = {droid.REQUEST_IMAGE_KEYS[key]: policy[key][i] for key in droid.CAMERA_KEYS}
    request[droid.REQUEST_JOINT_KEY] = policy[droid.OBS_JOINT_KEY][i].astype(np.float64)
    request[droid.REQUEST_GRIPPER_KEY] = policy[droid.OBS_GRIPPER_KEY][i].astype(np.float64)
    request["prompt"] = droid.SCENES[scene].prompt
    return request


@pytest.mark.parametrize("scene", [1, 2, 3])
def test_triangulation_on_rendered_frames_matches_privileged_positions(scene):
    from dz_gym.policies.reference import ReferencePolicy

    policy = ReferencePolicy()
    env = _env(scene, 3)
    try:
        env.set_episode_seeds([0, 1, 2], [11 + scene, 23, 37])
        obs, _ = env.reset()
        state = env.privileged_state()
        perception = policy.perception(env.image_shape)
        task = TASKS[scene]
        for i in range(3):
            images = tuple(obs[droid.POLICY_GROUP][key][i] for key in ("external_cam", "external_cam_2"))
            seen = perception.observe(images, task)
            assert seen.object is not None and seen.container is not None
            error = seen.object.position - state["object_pos"][i]
            if scene == 3:
                # a curved banana: the two views' centroids are not one 3-D point, so only xy (within the
                # 3.6 cm wide body) and the long axis are asserted
                assert np.linalg.norm(error[:2]) < 0.012, error
                w, x, y, z = state["object_quat"][i]
                chord = math.atan2(2 * (w * z + x * y), 1 - 2 * (y * y + z * z))
                assert seen.object.elongation > 0.5
                assert abs((seen.object.yaw - chord + math.pi / 2) % math.pi - math.pi / 2) < 0.1
            else:
                assert np.linalg.norm(error) < 0.004, error
            # a container's visible centroid lies on its axis (above its base): check xy
            con_xy_error = np.linalg.norm(seen.container.position[:2] - state["container_pos"][i][:2])
            assert con_xy_error < (0.015 if scene == 3 else 0.005), con_xy_error
    finally:
        env.close()


def test_wrist_view_reads_a_box_yaw_the_external_views_cannot():
    """Hovering over the cube, the wrist camera's top-down look gives its yaw (mod 90 degrees)."""
    from dz_gym.envs.mujoco.kinematics import Kinematics
    from dz_gym.policies.reference import ReferencePolicy

    kin = Kinematics()
    policy = ReferencePolicy()
    env = _env(1, 1)
    try:
        env.set_episode_seeds([0], [41])
        obs, _ = env.reset()
        state = env.privileged_state()
        target = state["object_pos"][0] + [0.0, 0.0, 0.11]
        q = state["joint_pos"][0].astype(np.float64)
        for _ in range(25):
            q = kin.ik(target, yaw=0.0, q_init=q).q
            obs, *_ = env.step(np.concatenate([q, [0.0]])[None])
        q_now = obs[droid.POLICY_GROUP][droid.OBS_JOINT_KEY][0].astype(np.float64)
        perception = policy.perception(env.image_shape)
        seen = perception.observe_wrist(obs[droid.POLICY_GROUP]["wrist_cam"][0], kin.camera_pose(q_now), "red", 0.05)
    finally:
        env.close()
    w, x, y, z = state["object_quat"][0]
    yaw = math.atan2(2 * (w * z + x * y), 1 - 2 * (y * y + z * z))
    assert seen is not None and not seen.touches_border and seen.elongation < 0.3
    assert abs((seen.yaw - yaw + math.pi / 4) % (math.pi / 2) - math.pi / 4) < 0.05
    assert np.linalg.norm(seen.xy - state["object_pos"][0][:2]) < 0.01


def test_requests_are_validated_with_one_line_errors():
    from dz_gym.policies.reference import ReferencePolicy

    policy = ReferencePolicy()
    env = _env(1, 1)
    try:
        obs, _ = env.reset()
    finally:
        env.close()
    good = _request(obs, 0, 1)
    stacked = dict(good)
    for key in droid.REQUEST_IMAGE_KEYS.values():
        stacked[key] = np.stack([good[key]] * 4)  # (T, H, W, 3): the last frame is used
    chunk = policy.infer(stacked, session_id="stack", new_session=True)
    assert chunk.shape == (24, 8) and chunk.dtype == np.float32 and np.isfinite(chunk).all()
    cases = {
        "observation/wrist_image_left: missing": {
            k: v for k, v in good.items() if k != droid.REQUEST_IMAGE_KEYS["wrist_cam"]
        },
        "observation/exterior_image_0_left: expected uint8": {
            **good,
            droid.REQUEST_IMAGE_KEYS["external_cam"]: good[droid.REQUEST_IMAGE_KEYS["external_cam"]].astype(np.float32),
        },
        "observation/joint_position: expected 7": {**good, droid.REQUEST_JOINT_KEY: np.zeros(6)},
        "prompt: expected one of": {**good, "prompt": "fold the towel"},
    }
    for message, request in cases.items():
        with pytest.raises(ValueError, match=message.replace("/", ".")):
            policy.infer(request, session_id="bad")
    with pytest.raises(ValueError, match="open_loop_horizon"):
        ReferencePolicy(open_loop_horizon=0)


def test_chunks_are_safe_and_sessions_are_per_id_and_bounded():
    from dz_gym.envs.mujoco.kinematics import Kinematics
    from dz_gym.policies.reference import ReferencePolicy

    kin = Kinematics()
    policy = ReferencePolicy(max_sessions=2)
    env = _env(1, 1)
    try:
        obs, _ = env.reset()
        request = _request(obs, 0, 1)
        q_prev = request[droid.REQUEST_JOINT_KEY]
        for call in range(6):
            chunk = policy.infer(request, session_id="a", new_session=call == 0).astype(np.float64)
            joints = np.vstack([q_prev, chunk[:, :7]])
            assert np.abs(np.diff(joints, axis=0)).max() <= policy.motion.max_joint_step + 1e-6
            assert (chunk[:, :7] >= kin.lower).all() and (chunk[:, :7] <= kin.upper).all()
            assert all(kin.fk(q)[0][2] >= policy.config.min_tcp_z - 1e-3 for q in chunk[:, :7])
            for row in chunk[:8]:
                obs, *_ = env.step(row[None].astype(np.float32))
            request = _request(obs, 0, 1)
            q_prev = chunk[7, :7]
    finally:
        env.close()
    with policy.sessions.session("a") as session:
        assert session.calls == 6 and session.plan.phase.value != "approach"
    policy.infer(request, session_id="b")
    policy.infer(request, session_id="c")
    assert "a" not in policy.sessions and len(policy.sessions) == 2  # least recently used out
    policy.infer(request, session_id="c", new_session=True)
    with policy.sessions.session("c") as session:
        assert session.calls == 1  # a new session starts from scratch
    policy.reset("c")
    assert "c" not in policy.sessions
    policy.reset()
    assert len(policy.sessions) == 0


def test_concurrent_sessions_from_several_threads_match_sequential_calls():
    from concurrent.futures import ThreadPoolExecutor

    from dz_gym.policies.reference import ReferencePolicy

    env = _env(2, 4)
    try:
        env.set_episode_seeds(range(4), [3, 5, 7, 9])
        obs, _ = env.reset()
    finally:
        env.close()
    requests = [_request(obs, i % 4, 2) for i in range(8)]

    def run(policy, sid_prefix, executor=None):
        out = {}
        for call in range(3):
            jobs = [(f"{sid_prefix}{i}", requests[i], call == 0) for i in range(8)]
            if executor is None:
                results = [policy.infer(r, session_id=s, new_session=n) for s, r, n in jobs]
            else:
                results = list(
                    executor.map(lambda job: policy.infer(job[1], session_id=job[0], new_session=job[2]), jobs)
                )
            for (sid, _, _), chunk in zip(jobs, results):
                out[(sid[len(sid_prefix) :], call)] = chunk
        return out

    sequential = run(ReferencePolicy(), "seq")
    with ThreadPoolExecutor(4) as executor:
        threaded = run(ReferencePolicy(max_sessions=8), "thr", executor)
    assert sequential.keys() == threaded.keys()
    for key in sequential:
        np.testing.assert_array_equal(sequential[key], threaded[key])


def test_registered_in_the_server_as_reference():
    from dz_gym.policies.reference import ReferencePolicy
    from dz_gym.server.policies import load_policy

    policy = load_policy("reference", {"max_sessions": 16})
    assert isinstance(policy, ReferencePolicy) and policy.sessions.max_sessions == 16
    assert policy.metadata["image_resolution"] == [180, 320] and policy.metadata["needs_session_id"]


@pytest.mark.slow  # 8-17 s; runs in the first environment's pass
def test_closed_loop_episodes_mostly_succeed():
    """Two seeded episodes per scene, 200 steps, replanning every 8 steps as the reference client does."""
    from dz_gym.policies.reference import ReferencePolicy

    policy = ReferencePolicy()
    results = {}
    for scene in (1, 2, 3):
        env = _env(scene, 2, max_episode_length=1000)
        try:
            env.set_episode_seeds([0, 1], [500 + scene, 600 + scene])
            obs, _ = env.reset()
            chunks = [None, None]
            for step in range(200):
                if step % 8 == 0:
                    for i in range(2):
                        chunks[i] = policy.infer(
                            _request(obs, i, scene), session_id=f"{scene}-{i}", new_session=step == 0
                        )
                env.set_render_mask(np.full(2, (step + 1) % 8 == 0))  # images are read only when replanning
                obs, _, _, _, info = env.step(np.stack([chunks[i][step % 8] for i in range(2)]))
            results[scene] = info["success"].tolist()
        finally:
            env.close()
    successes = sum(sum(r) for r in results.values())
    assert successes >= 5 and all(any(r) for r in results.values()), results


# --------------------------------------------------------------------- reduced skill (reference:skill=S)
def _first_requests(scene=1, seeds=(3, 4)):
    env = _env(scene, len(seeds))
    try:
        env.set_episode_seeds(range(len(seeds)), list(seeds))
        obs, _ = env.reset()
    finally:
        env.close()
    return [_request(obs, i, scene) for i in range(len(seeds))]


def test_skill_one_is_the_full_policy_and_draws_nothing():
    from dz_gym.policies.reference import ReferencePolicy
    from dz_gym.server.policies import load_policy

    requests = _first_requests()
    full, same, named = ReferencePolicy(), ReferencePolicy(skill=1.0), load_policy("reference:skill=1")
    assert full.config == same.config == named.config
    for call in range(3):
        for i, request in enumerate(requests):
            chunks = [p.infer(request, session_id=f"s{i}", new_session=call == 0) for p in (full, same, named)]
            np.testing.assert_array_equal(chunks[0], chunks[1])
            np.testing.assert_array_equal(chunks[0], chunks[2])
    with same.sessions.session("s0") as session:
        assert session.draws is None and session.plan.grasp_offset is None


def test_reduced_skill_draws_are_deterministic_per_episode():
    from dz_gym.policies.reference import ReferencePolicy

    requests = _first_requests()
    one, two = ReferencePolicy(skill=0.3), ReferencePolicy(skill=0.3)
    for call in range(4):
        for i, request in enumerate(requests):
            a = one.infer(request, session_id=f"x{i}", new_session=call == 0)
            b = two.infer(request, session_id=f"other-id-{i}", new_session=call == 0)  # ids differ, episodes not
            np.testing.assert_array_equal(a, b)
    with one.sessions.session("x0") as s0, two.sessions.session("other-id-0") as t0:
        assert s0.draws.seed == t0.draws.seed
        assert np.linalg.norm(s0.plan.grasp_offset) in (0.0, pytest.approx(0.05))
    with one.sessions.session("x1") as s1:
        assert s1.draws.seed != s0.draws.seed  # another episode seed, other draws
    # A client-sent seed (per-episode policy seed) takes precedence over the observation hash.
    seeded = dict(requests[0], seed=1234)
    policy = ReferencePolicy(skill=0.5)
    policy.infer(seeded, session_id="p", new_session=True)
    with policy.sessions.session("p") as session:
        assert session.draws.seed == 1234


def test_skill_draws_scale_with_the_knob():
    from dz_gym.policies.reference.skill import MAX_DROP, MAX_GRASP_OFFSET, SkillDraws, retries_at

    for skill in (0.0, 0.3, 0.6):
        draws = SkillDraws(skill, seed=42)
        offsets = np.array([draws.grasp_offset(k) for k in range(2000)])
        radii = np.linalg.norm(offsets, axis=1)
        missed = radii > 0
        np.testing.assert_allclose(radii[missed], MAX_GRASP_OFFSET)  # a miss is all or nothing
        assert abs(missed.mean() - (1 - skill)) < 0.04
        if missed.any():
            assert np.std(np.arctan2(offsets[missed, 1], offsets[missed, 0])) > 1.0  # directions spread around
        dropped = np.mean([draws.drops(call) for call in range(1, 2001)])
        assert abs(dropped - (1 - skill) * MAX_DROP) < 0.04
        np.testing.assert_array_equal(draws.grasp_offset(3), SkillDraws(skill, seed=42).grasp_offset(3))
    assert not any(SkillDraws(1.0, seed=1).drops(c) for c in range(1, 500))
    assert [retries_at(s, 4) for s in (0.0, 0.3, 0.6, 1.0)] == [0, 1, 2, 4]


def test_dropped_calls_hold_the_arm_and_the_plan():
    from dz_gym.policies.reference import ReferencePolicy

    request = _first_requests(seeds=(3,))[0]
    policy = ReferencePolicy(skill=0.0)
    policy.infer(request, session_id="d", new_session=True)
    with policy.sessions.session("d") as session:
        call = next(c for c in range(2, 200) if session.draws.drops(c))
        session.calls = call - 1  # the next call is a dropped one
        phase_calls = session.plan.phase_calls
        gripper = session.last_gripper
    chunk = policy.infer(request, session_id="d")
    assert (chunk == chunk[0]).all()
    np.testing.assert_array_equal(chunk[0, :7], request[droid.REQUEST_JOINT_KEY].astype(np.float32))
    assert chunk[0, 7] == gripper
    with policy.sessions.session("d") as session:
        assert session.plan.phase_calls == phase_calls  # the plan did not advance


def test_grasp_offset_shifts_approach_and_descend_targets():
    planner = Planner(TASKS[1], PlannerConfig(), np.zeros(7), np.array([0.4, 0.0, 0.4]))
    obj = _track([0.5, 0.1, 0.025])
    con = _track([0.6, -0.1, 0.02])
    state = PlannerState(anchor_position=np.array([0.5, 0.1, 0.2]))
    exact, _ = planner.target(state, obj, con)
    state.grasp_offset = np.array([0.02, -0.01])
    shifted, _ = planner.target(state, obj, con)
    np.testing.assert_allclose(shifted - exact, [0.02, -0.01, 0.0])
    state.enter(Phase.DESCEND)
    np.testing.assert_allclose(planner.target(state, obj, con)[0][:2], [0.52, 0.09])


def test_skill_is_selected_by_name_and_validated():
    from dz_gym.server.policies import load_policy, parse_policy_spec

    assert parse_policy_spec("reference:skill=0.3") == ("reference", {"skill": 0.3})
    assert parse_policy_spec("reference:skill=0.3,max_sessions=8") == ("reference", {"skill": 0.3, "max_sessions": 8})
    assert parse_policy_spec("dz_gym.server.policies:HoldPolicy") == ("dz_gym.server.policies:HoldPolicy", {})
    policy = load_policy("reference:skill=0.6", {"max_sessions": 4})
    assert policy.skill == 0.6 and policy.config.max_retries == 2 and policy.sessions.max_sessions == 4
    for spec, message in [("reference:skill=1.5", "skill"), ("reference:skill=abc", "skill"), ("reference:", "key=value"),
                          ("reference:skill", "key=value")]:  # fmt: skip
        with pytest.raises(ValueError, match=message):
            load_policy(spec)
    with pytest.raises(ValueError, match="give each once"):
        load_policy("reference:skill=0.5", {"skill": 0.4})


def test_an_approach_to_the_lookout_does_not_descend_onto_nothing():
    # The object is not seen: after two calls the approach heads for the lookout (home TCP). Reaching it inside
    # the rollout must not hand over to DESCEND, whose target needs the object (it used to raise TypeError).
    home_tcp = np.array([0.45, 0.0, 0.35])
    planner = Planner(TASKS[2], PlannerConfig(), np.zeros(7), home_tcp)
    state = PlannerState(anchor_position=home_tcp + [0.0, 0.0, 0.01], phase_calls=3)
    rows, kept = planner.rollout(state, Track(), Track(min_visible=0.7), 24, 8)
    assert kept.phase == Phase.APPROACH and all(row.phase == Phase.APPROACH for row in rows)
    np.testing.assert_allclose(rows[-1].position, home_tcp)
