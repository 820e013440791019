"""StepOutcome: one batch step's report read once, and which episodes ended at it and how."""

from __future__ import annotations

import numpy as np

from dz_gym.eval.step_outcome import StepOutcome, info_column, milestone_columns


def _info(**extra):
    info = {"policy_error": [None, None, "timeout"], "integrity_event": [None, None, "timeout"],
            "policy_called": [True, False, True], "chunk_latency_s": [0.01, 0.0, 2.0]}  # fmt: skip
    return {**info, **extra}


def test_an_error_comes_first_then_the_env_s_end_then_the_step_limit():
    out = StepOutcome.read([0.0, 1.0, 0.0], [False, False, True], [False, True, False], _info(), 3)
    assert out.done.tolist() == [False, True, True] and out.failed.tolist() == [False, False, True]
    assert [out.end_of(slot) for slot in (1, 2)] == [(None, None, "time_limit"), ("timeout", "timeout", "error")]
    assert out.ends(np.arange(3), np.array([5, 5, 5]), max_steps=10).tolist() == [1, 2]
    assert out.ends(np.arange(3), np.array([10, 5, 5]), max_steps=10).tolist() == [0, 1, 2]  # the run's limit
    assert out.ends(np.array([0]), np.array([5]), max_steps=10).tolist() == []  # only running slots end


def test_latency_only_where_a_chunk_arrived_or_a_call_failed_and_flags_default_to_false():
    out = StepOutcome.read([0.0] * 3, [False] * 3, [False] * 3, _info(chunk_received=[False, False, False]), 3)
    assert np.isnan(out.latency_ms[0]) and np.isnan(out.latency_ms[1]) and out.latency_ms[2] == 2000.0
    assert out.success.tolist() == [False] * 3 and out.success_any.dtype == bool


def test_info_columns_and_milestones_as_host_arrays():
    info = _info(milestones={"reached": [3, -1, 7]}, episode_seed=[1, 2, 3])
    assert milestone_columns(info)["reached"].tolist() == [3, -1, 7] and milestone_columns(_info()) is None
    assert info_column(info, "episode_seed").tolist() == [1, 2, 3] and info_column(info, "object_start_pos") is None
