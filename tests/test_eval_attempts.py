"""Attempts: retried attempts counted per (episode, arm), bounded, logged, and read back on resume."""

from __future__ import annotations

from dz_gym.eval.attempts import Attempts

FIELDS = {"scene": 1, "seed": 5, "steps": 12, "error": "server closed", "started_at": "2026-12-06T00:00:00"}


def test_retries_are_bounded_logged_in_order_and_keep_the_last_delays():
    logged = []
    attempts = Attempts([], 1, {(5, None)}, 2, logged.append)
    assert attempts.retry(episode=5, arm=None, error_event="server_error", delays=[2, 3], **FIELDS) == 1
    assert attempts.retry(episode=5, arm=None, error_event="timeout", delays=[4], **FIELDS) == 2
    assert attempts.retry(episode=5, arm=None, error_event="timeout", delays=[9], **FIELDS) is None  # used up
    assert attempts.events(5, None) == ["server_error", "timeout"] and attempts.delays(5, None) == [4]
    assert [(r["attempt"], r["error_event"], r["request_delays"]) for r in logged] == [
        (1, "server_error", [2, 3]), (2, "timeout", [4])]  # fmt: skip
    assert list(logged[0]) == ["scene", "episode", "arm", "seed", "attempt", "steps", "error_event", "error",
                               "started_at", "request_delays"]  # fmt: skip


def test_a_resume_counts_the_attempts_of_its_scene_s_episodes_still_to_run():
    records = [
        {"scene": 1, "episode": 5, "arm": "b", "error_event": "timeout", "request_delays": [1, 2]},
        {"scene": 1, "episode": 5, "arm": "a", "error_event": "server_error"},  # the other arm's
        {"scene": 2, "episode": 5, "arm": "b", "error_event": "timeout"},  # another scene's
        {"scene": 1, "episode": 7, "arm": "b", "error_event": "timeout"},  # an episode already done
    ]
    attempts = Attempts(records, 1, {(5, "a"), (5, "b")}, 1, lambda record: None)
    assert attempts.events(5, "b") == ["timeout"] and attempts.delays(5, "b") == [1, 2]
    assert attempts.events(5, "a") == ["server_error"] and attempts.delays(5, "a") is None
    assert attempts.events(7, "b") == [] and attempts.retry(episode=5, arm="b", error_event="timeout", delays=[],
                                                            **FIELDS) is None  # fmt: skip
