"""Failure modes: the rule on rows of every kind, scripted episodes of each mode through the real runner and
milestone checks, the summary's counts, dz-gym-compare's fixed/broken modes, and the docs tables."""

from __future__ import annotations

import html
import json
from pathlib import Path

import numpy as np
import pytest

from dz_gym import compare
from dz_gym.eval import failure, trajectory
from dz_gym.eval.config import EvalConfig
from dz_gym.eval.evaluate import evaluate
from dz_gym.eval.plan import PlanEntry
from dz_gym.eval.row import EpisodeRow, check_row
from dz_gym.eval.rundir import RunDir
from dz_gym.report import build_report
from dz_gym.server.launch import start_server_thread
from dz_gym.server.policies import HoldPolicy
from dz_gym.testing.toy_env import STAGED_LENGTH, STAGED_MODES, StagedToyEnv

PATH = "/v1/realtime/robot/openpi"
DOCS = Path(__file__).resolve().parent.parent / "docs" / "eval.md"
# What each script of the staged toy env ends in (its own end at step 9 puts the object beside the container).
EXPECTED = {name: ("misplaced" if name == "terminated" else name) for name in STAGED_MODES}


class FailOnJointPolicy(HoldPolicy):
    """Hold, but raise on requests of the episode whose first joint is ``joint0`` (one seed of the toy env)."""

    def __init__(self, joint0: float):
        super().__init__()
        self.joint0 = joint0

    def infer(self, request, *, session_id, new_session):
        if abs(float(request["observation/joint_position"][0]) - self.joint0) < 1e-6:
            raise RuntimeError("injected failure for this episode")
        return super().infer(request, session_id=session_id, new_session=new_session)


def _joint0(seed: int) -> float:
    env = StagedToyEnv(1)
    env.reset_one(0, seed)
    return float(env.joints[0, 0])


def _run(tmp_path, url, *, episodes=9, seed=0, video=False):
    config = EvalConfig(scenes=[1], episodes=episodes, num_envs=3, seed=seed, max_steps=STAGED_LENGTH, video=video,
                        report=False)  # fmt: skip
    run_dir = RunDir.create(tmp_path, config)
    summary = evaluate(config, run_dir, [url], env_factory=lambda scene, cfg: StagedToyEnv(cfg.plan.num_envs, scene),
                       progress=False)  # fmt: skip
    return summary, run_dir


def test_scripted_episodes_end_in_their_modes(tmp_path):
    # Seeds 0..7 run the eight scripts; seed 8 (the success script again) errors at the server.
    with start_server_thread(FailOnJointPolicy(_joint0(8))) as server:
        summary, run_dir = _run(tmp_path, server.url + PATH, video=True)
    rows = {r["seed"]: r for r in run_dir.read_rows()}
    got = {STAGED_MODES[s % 8] if s < 8 else "error": rows[s]["failure_mode"] for s in rows}
    assert got == {**EXPECTED, "error": "server_error"}
    assert rows[7]["ended_by"] == "terminated" and rows[5]["ended_by"] == "time_limit"
    assert rows[8]["error_event"] == "server_error"
    for row in rows.values():  # the mode is the rule's on the row as written, and every trajectory fits its schema
        assert failure.failure_mode(row) == row["failure_mode"]
        arrays = trajectory.read(run_dir.path / row["trajectory"])
        assert trajectory.check(arrays) == row["steps"]
        names = arrays["milestone_names"].tolist()
        assert [row["milestones"][n] or -1 for n in names] == arrays["milestone_first_step"].tolist()
    counts = summary["overall"]["failure_modes"]
    assert counts == {"server_error": 1, "success": 1, "undone": 1, "never_reached": 1, "grasp_failed": 1,
                      "dropped": 1, "timeout_near": 1, "misplaced": 2}  # fmt: skip
    assert summary["1"]["failure_modes"] == counts
    # The report: the counts per mode, then each mode's episodes with their videos.
    page = build_report(run_dir.path)
    table = page[page.index('id="modes-table"') : page.index("</table>", page.index('id="modes-table"'))]
    assert '<td data-mode="misplaced">2' in table and '<td data-mode="server_error">1' in table
    for mode in counts:
        start = page.index(f'<details class="mode" data-mode="{mode}">')
        section = page[start : page.index("</details>", start)]
        button = html.unescape(section.split('data-videos="', 1)[1].split('"', 1)[0])
        shown = [src for _, src, _ in json.loads(button)]  # the videos "show videos" plays
        videos = [r["video"] for r in rows.values() if r["failure_mode"] == mode]
        assert sorted(shown) == sorted(videos) and len(videos) == counts[mode]
        assert all((run_dir.path / video).is_file() for video in videos)


def test_compare_says_which_modes_b_fixes_and_breaks(tmp_path, capsys):
    with start_server_thread("hold") as server:
        _, run_a = _run(tmp_path / "a", server.url + PATH, episodes=8)
        _, run_b = _run(tmp_path / "b", server.url + PATH, episodes=8, seed=0)
    # B: the same seeds, but rewrite B's rows so that its "dropped" seed succeeds and its success seed is undone.
    rows = run_b.read_rows()
    for row in rows:
        if row["failure_mode"] == "dropped":
            row.update(success_at_end=True, success_any_step=True, failure_mode="success")
        elif row["failure_mode"] == "success":
            row.update(success_at_end=False, failure_mode="undone")
    (run_b.path / "episodes.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "cmp.json"
    assert compare.main([str(run_a.path), str(run_b.path), "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "failure modes B fixes against A (same seeds): dropped 1" in text
    assert "failure modes B breaks against A (same seeds): undone 1" in text
    modes = json.loads(out.read_text())["failure_modes"]
    assert modes["pairs"] == 8 and modes["fixed"] == {"dropped": 1} and modes["broken"] == {"undone": 1}
    assert modes["changes"]["misplaced -> misplaced"] == 2


ENTRY = PlanEntry(order=0, scene=1, episode=0, arm=None, seed=0, slot=0, server="ws://a")
CONTEXT = {"prompt": "put the cube in the bowl", "task": "DROID-CubeInBowl", "max_steps": 450, "backend": "mujoco"}
ALL = {"reached": 10, "lifted": 20, "above_target": 30, "placed": None}


@pytest.mark.parametrize(
    ("measured", "mode"),
    [
        ({"error": "server error: x", "error_event": "timeout"}, "server_error"),
        ({"success_at_end": True, "success_any_step": True, "milestones": {**ALL, "placed": 40}}, "success"),
        ({"success_at_end": False, "success_any_step": True, "milestones": {**ALL, "placed": 40}}, "undone"),
        ({"success_at_end": False, "success_any_step": False, "milestones": None}, "failed"),
        ({"success_at_end": False, "success_any_step": False, "milestones": {"reached": None}}, "never_reached"),
        (
            {
                "success_at_end": False,
                "success_any_step": False,
                "milestones": ALL,
                "ended_by": "time_limit",
                "final_object_pos": [0.5, 0.0, 0.2],
                "final_container_pos": [0.5, 0.06, 0.0],
            },
            "timeout_near",
        ),
        (
            {
                "success_at_end": False,
                "success_any_step": False,
                "milestones": ALL,
                "ended_by": "time_limit",
                "final_object_pos": [0.5, 0.0, 0.2],
                "final_container_pos": [0.5, 0.08, 0.0],
            },
            "misplaced",
        ),
        (
            {
                "success_at_end": False,
                "success_any_step": False,
                "milestones": ALL,
                "ended_by": "terminated",
                "final_object_pos": [0.5, 0.0, 0.2],
                "final_container_pos": [0.5, 0.0, 0.0],
            },
            "misplaced",
        ),
    ],
)
def test_the_rule_on_rows(measured, mode):
    row = EpisodeRow.of(ENTRY, **CONTEXT, **measured).to_dict()
    assert row["failure_mode"] == mode == failure.failure_mode(row)


def test_a_task_that_judges_itself_times_out_near_after_above_target():
    row = {"scene": 101, "error": None, "success_at_end": False, "success_any_step": False, "ended_by": "time_limit",
           "milestones": ALL, "final_object_pos": [9.0, 9.0, 0.0], "final_container_pos": [0.0, 0.0, 0.0]}  # fmt: skip
    assert failure.failure_mode(row) == "timeout_near"


def test_old_rows_get_their_mode_and_bad_modes_are_refused():
    row = EpisodeRow.of(ENTRY, **CONTEXT, success_at_end=True, success_any_step=True).to_dict()
    del row["failure_mode"]
    check_row(row)
    assert failure.mode_of(row) == "success" and failure.mode_counts([row, row]) == {"success": 2}
    with pytest.raises(ValueError, match="^episode row: 'failure_mode' expected one of server_error, success"):
        check_row({**row, "failure_mode": "oops"})


def test_trajectory_files_are_checked_against_the_schema():
    good = {"actions": np.zeros((3, 8), np.float32), "joint_pos": np.zeros((3, 7), np.float32),
            "gripper_pos": np.zeros((3, 1), np.float32), "policy_called": np.zeros(3, bool),
            "chunk_latency_ms": np.zeros(3, np.float32), "success": np.zeros(3, bool),
            "reward": np.zeros(3, np.float32), "seed": np.int64(1)}  # fmt: skip
    assert trajectory.check(good) == 3
    for bad, needle in (
        ({**good, "joint_pos": np.zeros((4, 7), np.float32)}, "'joint_pos' has 4 steps, expected 3"),
        ({**good, "actions": np.zeros((3, 7), np.float32)}, r"'actions' expected shape \(T, 8\)"),
        ({**good, "success": np.zeros(3, np.float32)}, "'success' expected dtype bool"),
        ({k: v for k, v in good.items() if k != "seed"}, "missing key 'seed'"),
        ({**good, "extra": np.zeros(3)}, "unknown key 'extra'"),
    ):
        with pytest.raises(ValueError, match=f"^trajectory: {needle}"):
            trajectory.check(bad)


def test_the_docs_tables_are_the_declarations():
    text = DOCS.read_text()
    assert trajectory.markdown_table() in text
    assert failure.markdown_table() in text
