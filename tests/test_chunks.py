"""Chunk bookkeeping in isolation: replan cadence, per-env isolation, session rotation, gripper binarization."""

import numpy as np
import pytest

from dz_gym.chunks import ChunkSchedule, HorizonError, binarize_gripper
from dz_gym.errors import DzGymError, ProtocolError


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
        if schedule.requests_due()[0]:
            calls.append(step)
            schedule.accept_chunk(0, chunk(100.0 * step))
        action = schedule.pop_actions()[0]
        assert action[0] == 100.0 * calls[-1] + (step - calls[-1])
    assert calls == [0, 8, 16, 24]


def test_only_envs_with_spent_caches_ask_and_episode_end_touches_one_env():
    schedule = ChunkSchedule(3, open_loop_horizon=4, session_id_factory=counter_ids())
    assert schedule.requests_due().tolist() == [True, True, True]
    for i in range(3):
        schedule.accept_chunk(i, chunk(i))
    schedule.pop_actions()
    schedule.pop_actions()
    before = list(schedule.session_ids)
    ended = schedule.end_episodes([1])
    assert ended == [before[1]]
    assert schedule.session_ids[0] == before[0] and schedule.session_ids[2] == before[2]
    assert schedule.session_ids[1] != before[1]
    assert schedule.requests_due().tolist() == [False, True, False]
    assert schedule.episode_step.tolist() == [2, 0, 2]


def test_inactive_envs_keep_their_cursor_and_get_nan_rows():
    schedule = ChunkSchedule(2, open_loop_horizon=8)
    schedule.accept_chunk(0, chunk(0))
    schedule.accept_chunk(1, chunk(1))
    actions = schedule.pop_actions(active=np.array([True, False]))
    assert np.isfinite(actions[0]).all() and np.isnan(actions[1]).all()
    actions = schedule.pop_actions()  # env 1 starts at its chunk's first row, env 0 goes on to its second
    assert actions[1, 0] == chunk(1)[0, 0] and actions[0, 0] == chunk(0)[1, 0]
    schedule = ChunkSchedule(2, open_loop_horizon=8)
    with pytest.raises(RuntimeError, match="no cached action"):
        schedule.pop_actions()


def test_a_chunk_shorter_than_the_horizon_is_a_configuration_error():
    schedule = ChunkSchedule(1, open_loop_horizon=8)
    with pytest.raises(
        HorizonError, match=r"open_loop_horizon: 8 is longer than the server's chunk of 3 row\(s\)"
    ) as info:
        schedule.accept_chunk(0, chunk(0, horizon=3))
    assert isinstance(info.value, DzGymError) and (info.value.horizon, info.value.chunk_length) == (8, 3)
    assert "\n" not in str(info.value)
    token = schedule.mark_sent(0)
    with pytest.raises(HorizonError):
        schedule.deliver(0, token, chunk(0, horizon=7))
    assert schedule.deliver(0, token, chunk(0, horizon=8))  # a chunk of exactly the horizon is fine
    for _ in range(8):
        schedule.pop_actions()
    assert schedule.requests_due()[0]


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
    with pytest.raises(ProtocolError, match="reply actions: expected"):
        schedule.accept_chunk(0, bad)


def test_bad_construction():
    with pytest.raises(ValueError, match="num_envs"):
        ChunkSchedule(0)
    with pytest.raises(ValueError, match="open_loop_horizon"):
        ChunkSchedule(1, open_loop_horizon=0)


# -- latency hiding (prefetch) ---------------------------------------------------------------------


def rows_chunk(tag: float, horizon: int = 24) -> np.ndarray:
    """Row j carries ``tag + j`` in its first column, so executed actions reveal (chunk, row)."""
    actions = np.zeros((horizon, 8), dtype=np.float32)
    actions[:, 0] = tag + np.arange(horizon)
    return actions


def test_prefetch_sends_k_steps_early_and_skips_the_steps_already_executed():
    schedule = ChunkSchedule(1, open_loop_horizon=8, prefetch=3)
    schedule.accept_chunk(0, rows_chunk(0))  # episode start: synchronous, delay 0
    executed, sent_at = [], None
    for _ in range(5):
        assert not schedule.requests_due()[0]
        executed.append(schedule.pop_actions()[0, 0])
    assert schedule.requests_due()[0]  # 3 actions left in the window
    token = schedule.mark_sent(0)
    sent_at = int(schedule.episode_step[0])
    executed.append(schedule.pop_actions()[0, 0])  # keeps executing the old chunk
    executed.append(schedule.pop_actions()[0, 0])
    assert schedule.deliver(0, token, rows_chunk(100))
    assert schedule.stats[0].delays == [0, 2] and sent_at == 5
    executed += [schedule.pop_actions()[0, 0] for _ in range(8)]
    assert executed == [0, 1, 2, 3, 4, 5, 6] + [102 + j for j in range(8)]
    assert schedule.stats[0].stale_steps == 0 and schedule.stats[0].wait_steps == 0


def test_late_reply_runs_stale_rows_up_to_the_bound_then_must_wait():
    schedule = ChunkSchedule(1, open_loop_horizon=8, prefetch=2, max_stale_steps=3)
    schedule.accept_chunk(0, rows_chunk(0))
    for _ in range(6):
        schedule.pop_actions()
    token = schedule.mark_sent(0)
    rows = [schedule.pop_actions()[0, 0] for _ in range(5)]  # 2 in the window + 3 stale
    assert rows == [6, 7, 8, 9, 10]
    assert schedule.stats[0].stale_steps == 3
    assert schedule.must_wait()[0]
    with pytest.raises(RuntimeError, match="no cached action"):
        schedule.pop_actions()
    schedule.count_wait([0])
    assert schedule.deliver(0, token, rows_chunk(100))
    assert not schedule.must_wait()[0]
    assert schedule.pop_actions()[0, 0] == 105  # delay 5 steps: rows 0..4 are in the past
    assert schedule.stats[0].wait_steps == 1


def test_reply_for_an_ended_episode_is_discarded():
    schedule = ChunkSchedule(2, open_loop_horizon=8, prefetch=4)
    for i in range(2):
        schedule.accept_chunk(i, rows_chunk(0))
    for _ in range(4):
        schedule.pop_actions()
    tokens = [schedule.mark_sent(i) for i in range(2)]
    schedule.end_episodes([1])
    assert not schedule.deliver(1, tokens[1], rows_chunk(500))
    assert schedule.requests_due().tolist() == [False, True]  # env 1 starts over with a fresh request
    assert schedule.deliver(0, tokens[0], rows_chunk(100))


def test_simulated_delay_is_exact_in_steps_whatever_the_arrival_time():
    def run(arrive_after: int) -> list[float]:
        schedule = ChunkSchedule(1, open_loop_horizon=8, prefetch=4, simulated_delay=3)
        out, token, reply_in = [], None, None
        for _ in range(30):
            if schedule.requests_due()[0]:
                token, reply_in = schedule.mark_sent(0), arrive_after
            if token is not None and reply_in == 0:
                schedule.deliver(0, token, rows_chunk(100 * (len(schedule.stats[0].delays) + 1)))
                token = None
            if schedule.must_wait()[0] and token is not None:  # a late reply is waited for
                schedule.deliver(0, token, rows_chunk(100 * (len(schedule.stats[0].delays) + 1)))
                token = None
            schedule.apply_arrivals()
            out.append(float(schedule.pop_actions(active=schedule.has_action())[0, 0]))
            reply_in = None if reply_in is None else reply_in - 1
        assert schedule.stats[0].delays == [3] * len(schedule.stats[0].delays)
        assert len(schedule.stats[0].delays) >= 4
        return out

    first = run(arrive_after=0)
    assert np.isnan(first[:3]).all() and first[3] == 103  # the first chunk also takes 3 steps
    assert first[3:] == run(arrive_after=2)[3:] == run(arrive_after=6)[3:]
    assert run(arrive_after=6)[3:] == first[3:]


def test_synchronous_simulated_delay_holds_the_pose_while_waiting():
    schedule = ChunkSchedule(1, open_loop_horizon=8, simulated_delay=2)
    token = schedule.mark_sent(0)
    assert not schedule.has_action()[0] and not schedule.must_wait()[0]
    schedule.deliver(0, token, rows_chunk(0))  # early arrival is held back
    held = schedule.pop_actions(active=schedule.has_action())
    assert np.isnan(held).all() and schedule.stats[0].wait_steps == 1
    schedule.pop_actions(active=schedule.has_action())
    schedule.apply_arrivals()
    assert schedule.pop_actions()[0, 0] == 2


def test_prefetch_bounds_are_validated():
    with pytest.raises(ValueError, match="prefetch"):
        ChunkSchedule(1, open_loop_horizon=8, prefetch=8)
    with pytest.raises(ValueError, match="simulated_delay"):
        ChunkSchedule(1, simulated_delay=-1)


def _wrapper_steps(schedule, rng, steps, latency_steps, chunk_rows):
    """Drive ``schedule`` in the wrapper's order (replies in, due requests out, block where an env must wait,
    pop), replies taking ``latency_steps()`` steps; checks that every request's env had its views due at the
    step before; returns (views rendered, views window_nearly_spent would have rendered)."""
    n = schedule.num_envs
    due_views = np.ones(n, dtype=bool)  # the reset observation is rendered
    flights: dict[int, tuple[int, int]] = {}  # env -> (token, step its reply is in)
    rendered = naive = 0
    for t in range(steps):
        for i, (token, at) in list(flights.items()):
            if at <= t:
                schedule.deliver(i, token, np.ones((chunk_rows, 8), np.float32))
                del flights[i]
        for i in np.flatnonzero(schedule.requests_due()):
            assert due_views[i], f"step {t}: env {i} sends a request its views were not rendered for"
            flights[int(i)] = (schedule.mark_sent(int(i)), t + latency_steps())
        for i in np.flatnonzero(schedule.must_wait()):  # the wrapper blocks: the reply comes now
            token, _ = flights.pop(int(i))
            schedule.deliver(int(i), token, np.ones((chunk_rows, 8), np.float32))
        schedule.apply_arrivals()
        schedule.pop_actions(schedule.has_action())
        due_views = schedule.views_due()
        rendered += int(due_views.sum())
        naive += int(schedule.window_nearly_spent().sum())
        ended = np.flatnonzero(rng.random(n) < 0.01)
        for i in ended:
            flights.pop(int(i), None)
        schedule.end_episodes(ended.tolist())
        due_views[ended] = True  # a reset observation is rendered
    return rendered, naive


@pytest.mark.parametrize("prefetch", [0, 2, 4, 7])
@pytest.mark.parametrize("max_latency", [1, 4, 12])
def test_views_are_due_at_the_step_before_every_request(prefetch, max_latency):
    """Whatever the replies' delays (beyond the chunk too), every request reads views rendered for it; with
    prefetch and replies within the window, an env in flight is not rendered while its request is out."""
    rng = np.random.default_rng(prefetch * 100 + max_latency)
    schedule = ChunkSchedule(24, 8, prefetch=prefetch)
    rendered, naive = _wrapper_steps(schedule, rng, 300, lambda: int(rng.integers(1, max_latency + 1)), 8)
    assert rendered <= naive
    if prefetch in (2, 4) and max_latency <= 4:
        assert rendered < 0.8 * naive  # fewer renders than rendering every env whose window is nearly spent


def test_views_due_with_longer_chunks_and_a_simulated_delay():
    rng = np.random.default_rng(7)
    for delay in (0, 3, 9):
        schedule = ChunkSchedule(8, 4, prefetch=2, simulated_delay=delay)
        _wrapper_steps(schedule, rng, 200, lambda: int(rng.integers(1, 6)), 10)


def _honest_run(schedule, latencies_s, steps=40):
    """Drive a latency-honest ``schedule`` of one env in the wrapper's order, the k-th reply taking
    ``latencies_s[k]`` of round trip and arriving only when the env must wait for it; the executed rows."""
    out, token, sent = [], None, 0
    for _ in range(steps):
        if schedule.requests_due()[0]:
            token = schedule.mark_sent(0)
        if token is not None and schedule.must_wait()[0]:
            schedule.deliver(0, token, rows_chunk(100 * (sent + 1)), latency_s=latencies_s[sent])
            token, sent = None, sent + 1
        schedule.apply_arrivals()
        out.append(float(schedule.pop_actions(active=schedule.has_action())[0, 0]))
    return out


def test_latency_honest_delays_each_chunk_by_its_own_round_trip_in_control_periods():
    schedule = ChunkSchedule(1, open_loop_horizon=8, control_period_s=1 / 15)
    token = schedule.mark_sent(0)
    assert schedule.must_wait()[0] and not schedule.has_action()[0]  # its delay is unknown until the reply
    schedule.deliver(0, token, rows_chunk(0), latency_s=0.19)  # ceil(0.19 * 15) = 3 steps
    assert not schedule.must_wait()[0]
    for _ in range(3):  # the world moves on: the env holds its pose, the chunk is not applied yet
        schedule.apply_arrivals()
        assert np.isnan(schedule.pop_actions(active=schedule.has_action())).all()
    schedule.apply_arrivals()
    assert schedule.pop_actions()[0, 0] == 3  # the rows of the steps that passed are skipped
    assert schedule.stats[0].delays == schedule.stats[0].drawn == [3] and schedule.stats[0].wait_steps == 3

    rows = _honest_run(ChunkSchedule(1, open_loop_horizon=8, control_period_s=0.1), [0.0, 0.25, 0.05, 0.3] * 5)
    assert rows[:8] == [100 + r for r in range(8)]  # an instant reply: no step passes
    assert np.isnan(rows[8:11]).all() and rows[11:16] == [203 + r for r in range(5)]  # 0.25 s: 3 steps


def test_latency_honest_replay_reproduces_the_recorded_delays_whatever_is_measured():
    first = ChunkSchedule(1, open_loop_horizon=8, prefetch=2, control_period_s=1 / 15)
    rows = _honest_run(first, [0.31, 0.02, 0.5, 0.14, 0.2, 0.7, 0.1, 0.0, 0.3, 0.2] * 3)
    recorded = list(first.stats[0].drawn)
    assert first.stats[0].delays == recorded[: len(first.stats[0].delays)]
    assert recorded[:4] == [5, 1, 8, 3]

    again = ChunkSchedule(1, open_loop_horizon=8, prefetch=2, control_period_s=1 / 15)
    again.replay_delays(0, recorded)
    np.testing.assert_array_equal(_honest_run(again, [9.0] * 30), rows)  # the rerun's latencies are not used
    assert again.stats[0].drawn == recorded

    partial = ChunkSchedule(1, open_loop_horizon=8, control_period_s=1 / 15)
    partial.replay_delays(0, [2])
    _honest_run(partial, [0.0, 0.2, 0.2, 0.2], steps=20)
    assert partial.stats[0].drawn[:2] == [2, 3]  # past the recorded ones, delays are measured again
    partial.end_episodes([0])
    token = partial.mark_sent(0)
    assert partial.must_wait()[0]  # a new episode forgets what was left to replay
    partial.deliver(0, token, rows_chunk(0), latency_s=0.0)


def test_latency_honest_settings_are_validated():
    from dz_gym.eval.config import EvalConfig

    with pytest.raises(ValueError, match="latency_honest: each chunk's delay is measured"):
        EvalConfig(backend="mujoco", latency_honest=True, simulated_delay=2)
    with pytest.raises(ValueError, match="control_hz"):
        EvalConfig(backend="mujoco", latency_honest=True, control_hz=0)
    with pytest.raises(ValueError, match="control_period_s"):
        ChunkSchedule(1, simulated_delay=2, control_period_s=0.1)
    with pytest.raises(ValueError, match="control_period_s"):
        ChunkSchedule(1, control_period_s=0.0)
    with pytest.raises(RuntimeError, match="replay_delays"):
        ChunkSchedule(1, simulated_delay=2).replay_delays(0, [1])
    schedule = ChunkSchedule(1, control_period_s=0.1)
    with pytest.raises(ValueError, match="delays"):
        schedule.replay_delays(0, [-1])
    token = schedule.mark_sent(0)
    with pytest.raises(ValueError, match="latency_s"):
        schedule.deliver(0, token, rows_chunk(0))
    with pytest.raises(ValueError, match="latency_s"):
        schedule.deliver(0, token, rows_chunk(0), latency_s=float("nan"))
