"""The runner's whole-batch step log (dz_gym.eval.steplog).

- what :meth:`StepLog.episodes` cuts out equals what per-episode lists, appended env by env at every step and
  stacked at the episode's end, give (values, dtypes, shapes, steps where a field was missing), for episodes
  of random lengths starting and ending at random steps on every slot, with several chunk sizes;
- the memory stays bounded by the chunks the longest running episode reaches, and nothing is kept once no
  episode runs;
- the values of an episode's first step that has them (:meth:`StepLog.keep_first`);
- bad input: one-line errors naming the field; the module's example.
"""

from __future__ import annotations

import numpy as np
import pytest

from dz_gym.eval.steplog import StepLog

SHAPES = {"actions": ((8,), np.float32), "called": ((), bool), "latency": ((), np.float64), "pose": ((3,), np.float32)}


def _step(rng, n, t):
    """One batch step's columns; ``pose`` is missing at every fifth step (an env that does not report it)."""
    out = {}
    for name, (shape, dtype) in SHAPES.items():
        out[name] = (rng.random((n, *shape)) * 100).astype(dtype) if dtype is not bool else rng.random(n) < 0.3
    if t % 5 == 3:
        out["pose"] = None
    return out


def _bound(max_len, chunk_steps):
    """The most steps the log holds with episodes of at most ``max_len`` steps: the chunks they reach."""
    return chunk_steps * (-(-max_len // chunk_steps) + 1)


def _reference(lists):
    """The per-episode lists as the runner used to stack them (a missing field: None)."""
    return {name: (np.stack(values) if values else None) for name, values in lists.items()}


@pytest.mark.parametrize("chunk_steps", [1, 3, 64])
def test_cut_episodes_equal_the_per_episode_lists(chunk_steps):
    rng = np.random.default_rng(chunk_steps)
    n, max_len = 7, 9
    log = StepLog(n, chunk_steps=chunk_steps)
    lists = [None] * n  # per slot: its running episode's lists, or None (idle)
    limit = [0] * n
    checked = 0
    for t in range(200):
        for i in range(n):  # idle slots start an episode now and then (some stay idle for a while)
            if lists[i] is None and rng.random() < 0.5:
                lists[i], limit[i] = {name: [] for name in SHAPES}, int(rng.integers(1, max_len + 1))
                log.start([i])
        live = [i for i in range(n) if lists[i] is not None]
        columns = _step(rng, n, t)
        log.append(columns, live)
        for i in live:
            for name, column in columns.items():
                if column is not None:
                    lists[i][name].append(column[i])
        np.testing.assert_array_equal(log.steps(live), [len(lists[i]["actions"]) for i in live])
        ended = [i for i in live if len(lists[i]["actions"]) >= limit[i] or rng.random() < 0.1]
        for i, got in zip(ended, log.episodes(ended), strict=True):
            want = _reference(lists[i])
            assert set(got) == set(want)
            for name, value in want.items():
                if value is None:
                    assert got[name] is None, name
                    continue
                assert got[name].dtype == value.dtype and got[name].shape == value.shape, name
                assert got[name].flags.c_contiguous
                np.testing.assert_array_equal(got[name], value)
            lists[i] = None
            checked += 1
        assert log.kept_steps <= _bound(max_len, chunk_steps)
    assert checked > 100


def test_episodes_that_began_together_are_cut_at_once_and_stay_apart():
    log = StepLog(4, chunk_steps=2)
    log.start([0, 1, 2, 3])
    for t in range(5):
        log.append({"x": np.arange(4) + 10 * t}, live=[0, 1, 2, 3])
    got = log.episodes([3, 1])
    assert [g["x"].tolist() for g in got] == [[3, 13, 23, 33, 43], [1, 11, 21, 31, 41]]
    got[0]["x"][0] = -1  # each episode's array is its own row of the cut block, not the log's storage
    assert log.episodes([3])[0]["x"].tolist() == [3, 13, 23, 33, 43] and got[1]["x"][0] == 1


def test_a_field_missing_at_every_step_of_an_episode_is_none_and_one_seen_later_only_has_those_steps():
    log = StepLog(2, chunk_steps=2)
    log.start([0, 1])
    log.append({"a": np.zeros(2), "b": None}, live=[0, 1])
    log.append({"a": np.ones(2), "b": None}, live=[0, 1])
    log.start([1])
    log.append({"a": np.full(2, 2.0), "b": None}, live=[0, 1])
    (only,) = log.episodes([1])
    assert only["a"].tolist() == [2.0] and only["b"] is None
    log.append({"a": np.full(2, 3.0), "b": np.array([5, 6])}, live=[0, 1])  # b appears in a later chunk
    first, second = log.episodes([0, 1])
    assert first["a"].tolist() == [0.0, 1.0, 2.0, 3.0] and first["b"].tolist() == [5]
    assert second["a"].tolist() == [2.0, 3.0] and second["b"].tolist() == [6]


def test_memory_is_bounded_and_freed_when_no_episode_runs():
    log = StepLog(3, chunk_steps=4)
    log.start([0, 1, 2])
    for t in range(100):  # slot 0 runs 10-step episodes, slot 1 5-step ones, slot 2 idles after step 20
        live = [0, 1] + ([2] if t < 20 else [])
        log.append({"x": np.full(3, t)}, live)
        for i, length in ((0, 10), (1, 5)):
            if log.steps([i])[0] == length:
                assert log.episodes([i])[0]["x"].tolist() == list(range(t - length + 1, t + 1))
                log.start([i])
        assert log.kept_steps <= _bound(max(10, 21 if t < 20 else 0), 4)
    log.append({"x": np.zeros(3)}, live=[])
    assert log.kept_steps == 4  # only the chunk of the step just appended


def test_keep_first_keeps_each_episodes_first_reported_value():
    log = StepLog(3)
    log.start([0, 1, 2])
    assert log.keep_first("seed", None, [0, 1, 2]).tolist() == []  # not reported at this step
    assert log.first("seed", 0) is None
    assert log.keep_first("seed", np.array([5, 6, 7]), [0, 2]).tolist() == [0, 2]  # slot 1 is idle
    assert log.keep_first("seed", np.array([0, 9, 0]), [0, 1, 2]).tolist() == [1]
    assert [int(log.first("seed", i)) for i in range(3)] == [5, 9, 7]
    log.start([2])
    assert log.first("seed", 2) is None
    log.append({"x": np.zeros(3)}, [0, 1, 2])
    assert log.episodes([2])[0]["seed"] is None and int(log.episodes([0])[0]["seed"]) == 5


def test_bad_input_names_the_field():
    log = StepLog(2)
    with pytest.raises(ValueError, match=r"step log: 'x' expected an array of shape \(2, ...\), got \(3,\)"):
        log.append({"x": np.zeros(3)}, [0])
    log.append({"y": np.zeros((2, 3))}, [0])
    with pytest.raises(ValueError, match=r"step log: 'y' expected shape \(2, 3\) like its earlier steps, got \(2, 4\)"):
        log.append({"y": np.zeros((2, 4))}, [0])
    with pytest.raises(ValueError, match="chunk_steps: expected a positive number"):
        StepLog(2, chunk_steps=0)
    log = StepLog(2, chunk_steps=1)
    log.start([0, 1])
    log.append({"x": np.zeros(2)}, [0, 1])
    log.start([0])
    log.append({"x": np.ones(2)}, [0])  # slot 1's episode was not live: its first step is gone
    with pytest.raises(ValueError, match="step log: step 0 was dropped"):
        log.episodes([1])
    assert log.episodes([0])[0]["x"].tolist() == [1.0]


def test_the_module_example_runs():
    import doctest

    from dz_gym.eval import steplog

    assert doctest.testmod(steplog).failed == 0
