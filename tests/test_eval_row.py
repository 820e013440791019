"""The episode row (pure): one constructor for finished, errored and lost episodes, the kinds of its fields,
and docs/eval.md's row table equal to the declaration."""

from __future__ import annotations

from pathlib import Path

import pytest

from dz_gym.eval import row as row_mod
from dz_gym.eval.plan import PlanEntry
from dz_gym.eval.row import FILES, PLACEMENT, RESULTS, VOLATILE, EpisodeRow, check_row, comparable
from dz_gym.records import INTEGRITY_EVENTS, SHARD_LOST

DOCS = Path(__file__).resolve().parent.parent / "docs" / "eval.md"
ENTRY = PlanEntry(order=4, scene=2, episode=5, arm="b", seed=15, slot=3, server="ws://b", policy="hold")
CONTEXT = {"prompt": "put the can in the mug", "task": "DROID-CanInMug", "max_steps": 16, "backend": "mujoco"}


def test_a_finished_row_carries_the_plan_entry_and_what_was_measured():
    row = EpisodeRow.of(ENTRY, **CONTEXT, steps=16, ended_by="time_limit", success_at_end=True,
                        success_any_step=True, first_success_step=9, server_calls=2).to_dict()  # fmt: skip
    assert (row["scene"], row["episode"], row["arm"], row["seed"], row["env"], row["server"]) == (
        2, 5, "b", 15, 3, "ws://b")  # fmt: skip
    assert (row["backend"], row["policy"]) == ("mujoco", "hold")  # the configuration it ran under
    assert row["success_at_end"] is True and row["error"] is None and row["error_step"] is None
    assert list(row)[0] == "arm" and "shard" not in row and "node" not in row
    assert set(row) == set(row_mod._NAMES) - {"shard", "node", "gpu"}


def test_errored_and_lost_rows_have_null_success_and_the_same_keys():
    errored = EpisodeRow.of(ENTRY, **CONTEXT, steps=7, success_at_end=True, error="server error",
                            error_event="server_error").to_dict()  # fmt: skip
    assert errored["success_at_end"] is None and errored["ended_by"] == "error" and errored["error_step"] == 7
    lost = EpisodeRow.of(ENTRY, **CONTEXT, error="shard 1 lost", error_event=SHARD_LOST, shard=1).to_dict()
    assert lost["error_step"] == 0 and lost["node"] is None and SHARD_LOST in INTEGRITY_EVENTS
    assert set(lost) - {"shard", "node", "gpu"} == set(errored)


@pytest.mark.parametrize(
    "fields,needle",
    [
        ({"steps": 3}, "'success_at_end' expected true/false"),
        ({"error": "x", "error_event": "gremlins"}, "'error_event' expected one of"),
        ({"success_at_end": False, "success_any_step": False, "ended_by": "done"}, "'ended_by' expected one of"),
    ],
)
def test_bad_rows_are_one_line_errors(fields, needle):
    with pytest.raises(ValueError, match=needle) as info:
        EpisodeRow.of(ENTRY, **CONTEXT, **fields)
    assert "\n" not in str(info.value)


def test_unknown_fields_are_refused():
    with pytest.raises(TypeError, match="unknown field"):
        EpisodeRow.of(ENTRY, **CONTEXT, colour="red")
    good = EpisodeRow.of(ENTRY, **CONTEXT, error="x").to_dict()
    with pytest.raises(ValueError, match="unknown key"):
        EpisodeRow.from_dict({**good, "colour": "red"})
    with pytest.raises(ValueError, match="missing key 'seed'"):
        check_row({k: v for k, v in good.items() if k != "seed"})


def test_a_row_of_an_older_run_without_backend_and_policy_reads_back_as_it_was():
    new = EpisodeRow.of(ENTRY, **CONTEXT, error="x").to_dict()
    old = {k: v for k, v in new.items() if k not in ("backend", "policy")}
    row = EpisodeRow.from_dict(old)
    assert (row.backend, row.policy) == (None, None) and row.to_dict() == old


def test_every_field_has_one_kind():
    kinds = [VOLATILE, PLACEMENT, RESULTS, FILES, row_mod.IDENTITY]
    names = set(row_mod._NAMES)
    assert sum(len(k) for k in kinds) == len(names) and set().union(*kinds) == names
    assert {
        "session_id",
        "started_at",
        "wall_s",
        "latency_ms",
        "latencies_ms",
        "node",
        "gpu",
        "attempts",
        "retried_events",
    } == VOLATILE
    assert {"env", "server", "shard"} == PLACEMENT and {"trajectory", "video"} == FILES
    assert set(row_mod.INFO_FIELDS) <= names


def test_comparable_drops_the_volatile_fields_only():
    a = EpisodeRow.of(ENTRY, **CONTEXT, error="x", wall_s=1.0, session_id="s1").to_dict()
    b = EpisodeRow.of(ENTRY, **CONTEXT, error="x", wall_s=2.0, session_id="s2").to_dict()
    assert a != b and comparable([a]) == comparable([b])
    assert comparable([a]) != comparable([{**b, "steps": 1}])


def test_the_docs_row_table_is_the_declaration():
    assert row_mod.markdown_table() in DOCS.read_text()
