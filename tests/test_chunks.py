"""Chunk bookkeeping in isolation: replan cadence, per-env isolation, session rotation, gripper binarization."""

import numpy as np
import pytest

from dz_gym.chunks import ChunkSchedule, binarize_gripper


def chunk(value: float, horizon: int = 24) -> np.ndarray:
    actions = np.full((horizon, 8), value, dtype=np.float32)
    actions[:, -1] = np.linspace(0.0, 1.0, horizon)
    actions[:, 0] = np.arange(horizon) + value
    return actions


def counter_ids():
    count = iter(range(10_000))
    return lambda: f"s{next(count)}"


def test_replans_at_steps_0_8_16_like_the_reference_client():
    schedule = ChunkSchedule(1, open_loop_horizon=8, session_id_factory=counter_ids())
    calls = []
    for step in range(30):
        if schedule.needs_chunk()[0]:
            calls.append(step)
            schedule.accept_chunk(0, chunk(100.0 * step))
        action = schedule.pop_actions()[0]
        assert action[0] == 100.0 * calls[-1] + (step - calls[-1])
    assert calls == [0, 8, 16, 24]


def test_only_envs_with_spent_caches_ask_and_episode_end_touches_one_env():
    schedule = ChunkSchedule(3, open_loop_horizon=4, session_id_factory=counter_ids())
    assert schedule.needs_chunk().tolist() == [True, True, True]
    for i in range(3):
        schedule.accept_chunk(i, chunk(i))
    schedule.pop_actions()
    schedule.pop_actions()
    before = list(schedule.session_ids)
    ended = schedule.end_episodes([1])
    assert ended == [before[1]]
    assert schedule.session_ids[0] == before[0] and schedule.session_ids[2] == before[2]
    assert schedule.session_ids[1] != before[1]
    assert schedule.needs_chunk().tolist() == [False, True, False]
    assert schedule.episode_step.tolist() == [2, 0, 2]
    assert schedule.episode_index.tolist() == [0, 1, 0]


def test_inactive_envs_keep_their_cursor_and_get_nan_rows():
    schedule = ChunkSchedule(2, open_loop_horizon=8)
    schedule.accept_chunk(0, chunk(0))
    actions = schedule.pop_actions(active=np.array([True, False]))
    assert np.isfinite(actions[0]).all() and np.isnan(actions[1]).all()
    assert schedule.cursor(0) == 1 and schedule.cursor(1) == 0
    with pytest.raises(RuntimeError, match="no cached action"):
        schedule.pop_actions()


def test_short_chunks_replan_when_exhausted():
    schedule = ChunkSchedule(1, open_loop_horizon=8)
    schedule.accept_chunk(0, chunk(0, horizon=3))
    for _ in range(3):
        schedule.pop_actions()
    assert schedule.needs_chunk()[0]


def test_gripper_is_binarized_and_cached_chunk_is_a_copy():
    raw = chunk(0)
    schedule = ChunkSchedule(1, open_loop_horizon=24)
    schedule.accept_chunk(0, raw)
    grips = [schedule.pop_actions()[0, -1] for _ in range(24)]
    assert set(grips) == {0.0, 1.0}
    assert grips == [1.0 if g > 0.5 else 0.0 for g in np.linspace(0.0, 1.0, 24)]
    assert raw[-1, -1] == 1.0 and raw[1, -1] != 0.0  # the caller's array is not modified
    assert binarize_gripper(np.array([[0] * 7 + [0.5]]))[0, -1] == 0.0


@pytest.mark.parametrize("bad", [np.zeros((24, 7)), np.zeros((0, 8)), np.zeros(8)])
def test_bad_chunk_shapes_are_rejected(bad):
    schedule = ChunkSchedule(1)
    with pytest.raises(ValueError, match="actions: expected shape"):
        schedule.accept_chunk(0, bad)


def test_bad_construction():
    with pytest.raises(ValueError, match="num_envs"):
        ChunkSchedule(0)
    with pytest.raises(ValueError, match="open_loop_horizon"):
        ChunkSchedule(1, open_loop_horizon=0)
