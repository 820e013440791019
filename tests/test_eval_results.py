"""Unit tests of dz_gym.eval.results: Wilson intervals, latency stats, row checks and summaries."""

from __future__ import annotations

import math

import pytest

from dz_gym.eval import results


@pytest.mark.parametrize(
    "k, n, lo, hi",
    [(5, 10, 0.237, 0.763), (0, 10, 0.0, 0.278), (10, 10, 0.722, 1.0), (40, 80, 0.393, 0.607)],
)
def test_wilson_matches_reference_values(k, n, lo, hi):
    got = results.wilson_interval(k, n)
    assert got == pytest.approx((lo, hi), abs=5e-4)


def test_wilson_edges_and_errors():
    assert results.wilson_interval(0, 0) is None
    lo, hi = results.wilson_interval(0, 1)
    assert lo == 0.0 and 0 < hi < 1
    lo, hi = results.wilson_interval(1, 1)
    assert hi == 1.0 and 0 < lo < 1
    with pytest.raises(ValueError, match="0 <= k <= n"):
        results.wilson_interval(3, 2)
    assert results.rate(0, 0) == {"k": 0, "n": 0, "rate": None, "ci95": None}


def test_wilson_contains_the_rate_and_shrinks_with_n():
    for n in (1, 7, 30, 200):
        for k in range(0, n + 1, max(1, n // 7)):
            lo, hi = results.wilson_interval(k, n)
            assert 0.0 <= lo <= k / n <= hi <= 1.0
    assert results.wilson_interval(50, 100)[1] - results.wilson_interval(50, 100)[0] < (
        results.wilson_interval(5, 10)[1] - results.wilson_interval(5, 10)[0]
    )


def test_latency_stats():
    assert results.latency_stats([]) is None
    stats = results.latency_stats([10.0, 20.0, 30.0, 40.0, float("nan")])
    assert stats["count"] == 4
    assert stats["mean"] == pytest.approx(25.0)
    assert stats["p50"] == pytest.approx(25.0)
    assert stats["max"] == 40.0
    assert stats["p90"] <= stats["p99"] <= stats["max"]


def test_latency_percentiles_are_numpys_to_the_bit():
    """The rows' p50/p90/p99 are what np.percentile gave them before (same floats, not merely close)."""
    import numpy as np

    rng = np.random.default_rng(0)
    for trial in range(3000):
        n = int(rng.integers(1, 70))
        values = rng.random(n) * 10.0 ** int(rng.integers(-2, 4))
        if trial % 3 == 1:
            values = np.round(values, 3)  # as the rows' latencies are
        elif trial % 3 == 2:
            values = rng.integers(0, 4, n) * 0.1  # ties
        percents = [50, 90, 99] if trial % 2 else [int(p) for p in rng.integers(0, 101, 3)]
        expected = [float(v) for v in np.percentile(values, percents)]
        assert results.linear_percentiles(sorted(values.tolist()), percents) == expected, (values, percents)
        stats = results.latency_stats(values.tolist())
        assert [stats["p50"], stats["p90"], stats["p99"]] == [float(v) for v in np.percentile(values, [50, 90, 99])]
        assert stats["mean"] == float(values.mean()) and stats["max"] == float(values.max())


def _row(scene=1, episode=0, success=True, any_step=True, error=None, calls=3, lat=(10.0, 20.0, 30.0)):
    return {
        "scene": scene,
        "episode": episode,
        "seed": episode,
        "env": 0,
        "session_id": f"s{scene}-{episode}",
        "steps": 24,
        "server_calls": calls,
        "server_errors": 1 if error else 0,
        "success_at_end": None if error else success,
        "success_any_step": None if error else any_step,
        "error": error,
        "latencies_ms": list(lat),
    }


def test_check_row_rejects_bad_rows():
    results.check_row(_row())
    bad = _row()
    del bad["seed"]
    with pytest.raises(ValueError, match="missing key 'seed'"):
        results.check_row(bad)
    bad = _row()
    bad["success_at_end"] = 1
    with pytest.raises(ValueError, match="success_at_end"):
        results.check_row(bad)
    bad = _row(error="server error: boom")
    bad["success_any_step"] = False
    with pytest.raises(ValueError, match="null for an errored episode"):
        results.check_row(bad)


def test_summarize_counts_per_scene_and_overall():
    rows = [
        _row(1, 0, True, True),
        _row(1, 1, False, True),
        _row(1, 2, error="server error: boom", calls=1, lat=(5.0,)),
        _row(2, 0, False, False),
    ]
    summary = results.summarize(rows, planned={1: 3, 2: 2}, wall_s=2.0, busy_s={"ws://a": 1.0, "ws://b": 0.5})
    s1, s2, overall = summary["1"], summary["2"], summary["overall"]
    assert (s1["episodes"], s1["errored"], s1["completed"]) == (3, 1, 2)
    assert s1["success_at_end"]["k"] == 1 and s1["success_at_end"]["n"] == 2
    assert s1["success_any_step"]["k"] == 2
    # 1 of 2 completed; the errored episode widens the interval over both of its possible outcomes
    assert s1["success_at_end"]["rate"] == 0.5 and s1["success_at_end"]["ci95"] == [
        results.wilson_interval(1, 3)[0],
        results.wilson_interval(2, 3)[1],
    ]
    assert s2["success_at_end"] == results.rate(0, 1)
    assert overall["episodes"] == 4 and overall["errored"] == 1
    assert overall["success_at_end"]["n"] == 3
    assert summary["server_calls"] == 3 + 3 + 1 + 3
    assert summary["env_steps"] == 4 * 24
    assert summary["env_steps_per_s"] == pytest.approx(4 * 24 / 2.0)
    assert summary["latency_ms"]["count"] == 10
    assert summary["server_utilization"] == pytest.approx((0.5 + 0.25) / 2)
    assert summary["complete"] is False  # scene 2 planned 2, has 1
    assert "excluded" in summary["note"]
    table = results.format_table(summary)
    assert "overall" in table and "1/2" in table and "excluded" in table


def test_summarize_empty_run():
    summary = results.summarize([], planned={1: 2})
    assert summary["overall"]["episodes"] == 0
    assert summary["overall"]["success_at_end"]["rate"] is None
    assert summary["env_steps_per_s"] is None
    assert not math.isnan(summary["env_steps"])
    results.format_table(summary)


def test_rates_come_from_the_counts_reported():
    """An interrupted run took more steps than its rows hold: the rate uses the steps it reports next to it."""
    rows = [_row(1, 0), _row(1, 1)]
    summary = results.summarize(rows, planned={1: 4}, wall_s=4.0, stepped=60, busy_s={"ws://a": 1.0})
    assert summary["env_steps"] == 48 and summary["env_steps_taken"] == 60
    assert summary["env_steps_per_s"] == pytest.approx(summary["env_steps_taken"] / summary["wall_s"])
    assert summary["server_utilization_per_server"]["ws://a"] == pytest.approx(
        summary["server_busy_s"]["ws://a"] / summary["wall_s"]
    )


def test_table_states_completed_and_errored_without_trailing_spaces():
    rows = [_row(1, 0), _row(1, 1, error="server error: boom"), _row(1, 2)]
    table = results.format_table(results.summarize(rows, planned={1: 3}, wall_s=1.0))
    assert "2/3 completed, 1 errored" in table
    assert all(line == line.rstrip() for line in table.splitlines())
    clean = results.format_table(results.summarize([_row(1, 0)], planned={1: 1}, wall_s=1.0))
    assert "errored" not in clean and all(line == line.rstrip() for line in clean.splitlines())


def test_progress_lines_when_stderr_is_not_a_terminal():
    import io

    from dz_gym.eval.progress import Progress

    stream = io.StringIO()  # not a TTY: no bars, periodic lines instead
    progress = Progress(3, 30, enabled=None, stream=stream, heartbeat_s=3600.0)
    assert progress.mode == "lines" and not progress.enabled
    latencies = []
    progress.on_latency = latencies.append
    progress.steps(2, last_latency_ms=25.0)
    progress.episode(success_at_end=False, errored=True)
    line = progress.status_line(elapsed_s=1.0)
    assert line == "progress: 1/3 episodes (success 0/0, 1 errored), 2 env steps, 2.0 env-steps/s, last chunk 25 ms"
    assert latencies == [25.0]
    progress.close()
    assert progress._thread is not None and not progress._thread.is_alive()
    assert Progress(1, 1, enabled=False, stream=io.StringIO()).mode == "off"


def test_video_recorder_keeps_finished_and_deletes_unfinished_videos(tmp_path):
    """A video still open at close() belongs to an episode that did not end: it is partial and removed."""
    import numpy as np

    pytest.importorskip("imageio_ffmpeg")
    from dz_gym.eval.video import VideoRecorder

    recorder = VideoRecorder(fps=15)
    frame = np.zeros((16, 48, 3), dtype=np.uint8)
    for key in ("done", "aborted", "open"):
        recorder.open(key, tmp_path / f"{key}.mp4")
        recorder.add(key, frame)
        recorder.add(key, frame)
    recorder.finish("done")
    recorder.abort("aborted")
    recorder.close()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["done.mp4"]
    assert recorder.finished == {"done": 2} and not recorder.failed


def test_milestone_funnel_intervals_span_the_errored_episodes():
    rows = [{"error": None, "milestones": {"reached": 3}}, {"error": None, "milestones": {"reached": None}},
            {"error": "timeout", "milestones": None}]  # fmt: skip
    reached = results.milestone_funnel(rows)["reached"]
    assert (reached["k"], reached["n"], reached["rate"]) == (1, 2, 0.5)
    assert reached["ci95"] == [results.wilson_interval(1, 3)[0], results.wilson_interval(2, 3)[1]]
