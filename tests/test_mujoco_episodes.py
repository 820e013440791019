"""The shared episode bookkeeping (dz_gym.envs.episodes): ids, seeds, success at any step and milestones."""

from __future__ import annotations

import math

import numpy as np
import pytest

from dz_gym.envs import droid
from dz_gym.envs.episodes import (
    INFO_KEYS,
    MILESTONES,
    Episodes,
    ObjectBox,
    TaskState,
    reach_distance,
    resolve_env_ids,
)
from dz_gym.envs.vector_info import entries

SCENE = droid.scene_spec(1)
CONTAINER = np.array([0.55, 0.16, 0.0])
REST = np.array([0.50, -0.10, 0.025])


def state(obj, tcp, container=CONTAINER, speed=0.0, quat=None) -> TaskState:
    obj = np.atleast_2d(np.asarray(obj, dtype=np.float64))
    n = len(obj)
    return TaskState(
        obj, np.tile(container, (n, 1)), np.atleast_2d(np.asarray(tcp, dtype=np.float64)), np.full(n, speed),
        None if quat is None else np.atleast_2d(quat),
    )  # fmt: skip


def started(n: int = 2, seed: int = 0) -> Episodes:
    book = Episodes(n, SCENE, seed=seed, box=ObjectBox((0.0, 0.0, 0.0), (0.025, 0.025, 0.025)))  # the 5 cm cube
    ids = book.resolve_reset_ids(None)
    book.record_reset(
        ids, book.reset_seeds(ids, None), state(np.tile(REST, (n, 1)), np.tile(REST + [0, 0, 0.3], (n, 1)))
    )
    return book


def test_env_ids_accept_ids_masks_slices_and_tensors_and_reject_bad_ones():
    assert resolve_env_ids(4).tolist() == [0, 1, 2, 3]
    assert resolve_env_ids(4, options={"env_ids": [3, 1]}).tolist() == [1, 3]
    assert resolve_env_ids(4, options={"reset_mask": np.array([True, False, False, True])}).tolist() == [0, 3]
    assert resolve_env_ids(4, slice(1, 3)).tolist() == [1, 2]
    assert resolve_env_ids(4, 2).tolist() == [2]
    assert resolve_env_ids(4, options={"env_ids": []}).tolist() == []
    torch = pytest.importorskip("torch")
    assert resolve_env_ids(4, torch.tensor([2, 0])).tolist() == [0, 2]
    for bad, match in (([0, 0], "distinct"), ([4], r"in \[0, 4\)"), ([-1], r"in \[0, 4\)"), ([0.5], "integer")):
        with pytest.raises(ValueError, match=match):
            resolve_env_ids(4, options={"env_ids": bad})
    with pytest.raises(ValueError, match="reset_mask"):
        resolve_env_ids(4, options={"reset_mask": np.ones(3, dtype=bool)})


def test_seed_rules_queue_then_explicit_then_previous_plus_n():
    book = Episodes(3, SCENE, seed=100)
    ids = book.resolve_reset_ids(None)
    assert book.reset_seeds(ids, None).tolist() == [100, 101, 102]  # the constructor's seed, first reset only
    book.start(ids, [100, 101, 102])
    book.queue_seeds([1], [777])
    assert book.reset_seeds(ids, 5).tolist() == [5, 777, 7]  # a queued seed wins over seed + i
    book.start(ids, [5, 777, 7])
    assert book.next_seeds([0, 2]).tolist() == [8, 10]  # previous + N
    with pytest.raises(ValueError, match="seed: expected an integer"):
        book.reset_seeds(ids, 1.5)
    with pytest.raises(ValueError, match="one seed per env id"):
        book.queue_seeds([0, 1], [1])
    with pytest.raises(ValueError, match=r"env_ids: expected ids in \[0, 3\)"):
        book.queue_seeds([3], [1])


def test_without_any_seed_a_random_base_gives_consecutive_seeds():
    book = Episodes(3, SCENE)
    seeds = book.reset_seeds(np.arange(3), None)
    assert np.diff(seeds).tolist() == [1, 1]
    book.start([0], seeds[:1])
    # an env reset later, never started: the same base, so the batch still runs seeds base + i
    assert book.reset_seeds([2], None).tolist() == [seeds[2]]


def test_info_keys_and_counters_across_steps_and_autoreset():
    book = started(2, seed=10)
    info = book.record_step(state(np.tile(REST, (2, 1)), np.tile(REST + [0, 0, 0.3], (2, 1))), np.array([False, True]))
    assert tuple(entries(info)) == INFO_KEYS and set(entries(info["milestones"])) == set(MILESTONES)
    assert all(info[f"_{key}"].all() for key in INFO_KEYS) and info["milestones"]["_placed"].all()  # vector form
    assert info["episode_step"].tolist() == [1, 1] and info["episode_seed"].tolist() == [10, 11]
    assert info["time_outs"].tolist() == [False, True] and info["images_fresh"].all()
    assert np.isnan(info["object_quat"]).all()
    np.testing.assert_allclose(info["object_start_pos"], np.tile(REST, (2, 1)))
    book.start([1], book.next_seeds([1]))
    assert book.episode_seed.tolist() == [10, 13] and book.episode_step.tolist() == [1, 0]
    assert book.episode_count.tolist() == [1, 2]


def test_milestones_are_first_steps_in_order():
    book = started(1)
    above = CONTAINER + [0.0, 0.0, 0.12]
    inside = CONTAINER + [0.0, 0.0, 0.03]
    script = [
        (REST + [0, 0, 0.10], REST + [0, 0, 0.30]),  # object up (knocked?) but not reached: does not count
        (REST, REST + [0, 0, 0.2]),  # back on the table
        (REST, REST + [0, 0, 0.04]),  # 1.5 cm above the cube's top face: reached (3)
        (REST + [0, 0, 0.06], REST + [0, 0, 0.06]),  # lifted 6 cm (4)
        (above, above),  # above the bowl (5)
        (inside, inside + [0, 0, 0.2]),  # in the bowl, released, at rest: placed (6)
    ]
    for obj, tcp in script:
        info = book.record_step(state(obj, tcp, quat=[1.0, 0, 0, 0]), np.zeros(1, dtype=bool))
    steps = {name: int(info["milestones"][name][0]) for name in MILESTONES}
    # steps 1-2 count for nothing: a stage counts only once the one before it has
    assert steps == {"reached": 3, "lifted": 4, "above_target": 5, "placed": 6}
    assert info["success"].all() and info["success_any_step"].all()
    # a new episode starts with no milestones
    book.start([0], book.next_seeds([0]), state(REST, REST + [0, 0, 0.3]))
    info = book.record_step(state(REST, REST + [0, 0, 0.3]), np.zeros(1, dtype=bool))
    assert all(info["milestones"][name][0] == -1 for name in MILESTONES)


def test_success_without_the_earlier_milestones_is_not_placed():
    book = started(1)
    inside = CONTAINER + [0.0, 0.0, 0.03]
    info = book.record_step(state(inside, inside + [0, 0, 0.2]), np.zeros(1, dtype=bool))  # pushed in, say
    assert info["success_any_step"].all() and info["milestones"]["placed"][0] == -1


def test_reach_distance_measures_to_the_rotated_box():
    box = ObjectBox((0.0, 0.0, 0.0), (0.05, 0.01, 0.01))
    yaw = math.pi / 2  # the box's long side now along world y
    quat = [math.cos(yaw / 2), 0.0, 0.0, math.sin(yaw / 2)]
    s = state([0, 0, 0], [0.0, 0.06, 0.0], quat=quat)
    assert reach_distance(s, box)[0] == pytest.approx(0.01)
    assert reach_distance(state([0, 0, 0], [0.0, 0.06, 0.0]), box)[0] == pytest.approx(0.06)  # no quat: centre
    s = state([0, 0, 0], [0.06, 0.0, 0.0], quat=quat)
    assert reach_distance(s, box)[0] == pytest.approx(0.05)


def test_a_backends_own_milestones_replace_the_built_in_checks():
    names = ("reached_spoon", "lifted_up_spoon", "above_sink", "completely_in_sink")
    book = Episodes(2, SCENE, seed=0, milestone_names=names)
    far = state([REST, REST], [REST + [0, 0, 0.3]] * 2)  # the built-in checks would find nothing here

    def flags(*rows):
        return TaskState(
            far.object_pos, far.container_pos, far.tcp_pos, far.object_speed, milestone_flags=np.array(rows)
        )

    info = book.record_reset([0, 1], book.reset_seeds([0, 1], None), flags([0, 0, 0, 0], [1, 0, 0, 0]))
    assert info["milestones"]["reached"].tolist() == info["milestones"]["reached_spoon"].tolist() == [-1, 0]
    info = book.record_step(flags([1, 1, 1, 1], [1, 1, 0, 0]), np.zeros(2, dtype=bool))
    assert info["success"].tolist() == [True, False] and info["success_any_step"].tolist() == [True, False]
    assert {name: steps.tolist() for name, steps in entries(info["milestones"]).items()} == {
        "reached": [1, 0], "lifted": [1, 1], "above_target": [1, -1], "placed": [1, -1],
        "reached_spoon": [1, 0], "lifted_up_spoon": [1, 1], "above_sink": [1, -1], "completely_in_sink": [1, -1],
    }  # fmt: skip
    info = book.record_step(flags([1, 1, 1, 0], [1, 1, 0, 0]), np.zeros(2, dtype=bool))
    assert info["success"].tolist() == [False, False] and info["success_any_step"].tolist() == [True, False]
    assert info["milestones"]["placed"].tolist() == [1, -1]  # the first step stays
    with pytest.raises(ValueError, match="milestone_flags: expected"):
        book.record_step(flags([1, 1], [1, 1]), np.zeros(2, dtype=bool))
    with pytest.raises(ValueError, match="need their flags"):
        book.record_step(far, np.zeros(2, dtype=bool))
