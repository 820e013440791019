"""The report without a browser: what it reads from a run directory, its statistics, trajectories, CLI."""

from __future__ import annotations

import base64
import json
import re

import numpy as np
import pytest
from report_runs import toy_run

from dz_gym.eval import results
from dz_gym.report import build_report, cli, load, paired, write_report
from dz_gym.report.page import rate_text


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    return toy_run(tmp_path_factory.mktemp("toy"))


def test_page_is_self_contained_and_shows_the_summary(run):
    html = build_report(run.path)
    summary = json.loads((run.path / "summary.json").read_text())
    # Nothing the browser would fetch from elsewhere: no external scripts, styles, fonts or images.
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:|//)""", html)
    assert "<link" not in html and "@import" not in html and "url(" not in html
    for key in ["1", "2", "overall"]:
        assert rate_text(summary[key]["success_at_end"]).split(" ")[0] in html
    grid = json.loads(re.search(r'<script type="application/json" id="dz-episodes">(.*?)</script>', html).group(1))
    assert len(grid) == len(run.read_rows()) == 12
    assert {e["o"] for e in grid} == {"success", "failure", "errored"}
    assert "injected failure" in html or "Internal inference error" in html


def test_rate_text_matches_wilson():
    entry = results.rate(5, 10)
    assert rate_text(entry) == "5/10 50.0% [23.7, 76.3]"
    assert rate_text(results.rate(0, 0)) == "-"


def test_compact_trajectory_round_trip(run):
    row = run.read_rows()[0]
    with np.load(run.path / row["trajectory"]) as data:
        joints, gripper, called = data["joint_pos"], data["gripper_pos"][:, 0], data["policy_called"]
    compact = load.compact_trajectory(run.path / row["trajectory"])
    assert compact["T"] == len(joints) == row["steps"] and compact["dof"] == 7
    assert compact["calls"] == np.flatnonzero(called).tolist() and len(compact["calls"]) == row["server_calls"]
    m = compact["m"]
    q = np.frombuffer(base64.b64decode(compact["j"]), dtype=np.uint8).reshape(7, m)
    lo, hi = compact["jr"]
    index = np.round(np.linspace(0, len(joints) - 1, m)).astype(int)
    decoded = lo + q / 255.0 * (hi - lo)
    assert np.abs(decoded - joints[index].T).max() <= (hi - lo) / 255.0 + 1e-4
    g = np.frombuffer(base64.b64decode(compact["g"]), dtype=np.uint8)
    glo, ghi = compact["gr"]
    assert np.abs(glo + g / 255.0 * (ghi - glo) - gripper[index]).max() <= (ghi - glo) / 255.0 + 1e-4


def test_long_trajectories_are_downsampled(tmp_path):
    steps = 450
    path = tmp_path / "t.npz"
    np.savez_compressed(
        path,
        joint_pos=np.random.default_rng(0).normal(size=(steps, 7)).astype(np.float32),
        gripper_pos=np.linspace(0, 1, steps, dtype=np.float32)[:, None],
        policy_called=(np.arange(steps) % 8 == 0),
        success=np.arange(steps) >= 400,
    )
    compact = load.compact_trajectory(path)
    assert compact["m"] == load.TRAJ_POINTS and compact["T"] == steps
    assert len(compact["calls"]) == 57 and compact["ok"] == [[400, 450]]
    assert len(json.dumps(compact)) < 2500  # what 500 episodes inline would multiply


def test_run_state(run, tmp_path):
    view = load.load_run(run.path)
    assert view.state == "complete" and not view.summary_is_recomputed
    assert view.summary == json.loads((run.path / "summary.json").read_text())
    # A run still going: rows newer than the summary -> recomputed from the rows and said so.
    copy = tmp_path / "copy"
    copy.mkdir()
    for name in ("config.json", "episodes.jsonl", "summary.json"):
        (copy / name).write_bytes((run.path / name).read_bytes())
    lines = (copy / "episodes.jsonl").read_text().splitlines()
    summary = json.loads((copy / "summary.json").read_text())
    (copy / "episodes.jsonl").write_text("\n".join(lines[:5]) + "\n")
    summary_short = dict(summary, overall=dict(summary["overall"], episodes=3))
    (copy / "summary.json").write_text(json.dumps(summary_short))
    view = load.load_run(copy)
    assert view.state == "in progress" and "2 episode(s) finished since" in view.state_detail
    rows = [json.loads(x) for x in lines[:5]]
    assert view.summary["overall"]["success_at_end"] == results.summarize(rows)["overall"]["success_at_end"]
    assert view.summary["command"] == summary["command"]  # kept from the last summary
    (copy / "summary.json").unlink()
    view = load.load_run(copy)
    assert view.state == "in progress" and "no summary.json yet" in view.state_detail
    assert "Numbers recomputed from episodes.jsonl" in build_report(copy)


def test_interrupted_and_aborted_states():
    rows: list = []
    assert load.run_state({"interrupted": True}, rows, False)[0] == "interrupted"
    assert load.run_state({"aborted": "max-errors exceeded"}, rows, False) == ("aborted", "max-errors exceeded")
    assert load.run_state({"complete": False}, rows, False)[0] == "incomplete"


def test_discordant_pairs_follow_the_comparison():
    def row(scene, seed, ok, error=None):
        return {"scene": scene, "seed": seed, "episode": seed, "success_at_end": None if error else ok, "error": error}

    a = [
        row(1, 0, True),
        row(1, 1, False),
        row(1, 2, True),
        row(2, 0, False),
        row(2, 1, True, error="x"),
        row(2, 5, True),
    ]
    b = [row(1, 0, True), row(1, 1, True), row(1, 2, False), row(2, 0, True), row(2, 1, True), row(2, 9, True)]
    out = paired.compare(a, b)
    overall = out["scenes"]["overall"]
    assert (overall["pairs"], overall["both"], overall["a_only"], overall["b_only"], overall["neither"]) == (
        4,
        1,
        1,
        2,
        0,
    )
    assert overall["errored_pairs"] == 1
    found = {(ra["scene"], ra["seed"], which) for which, ra, _ in out["discordant"]}
    assert found == {(1, 1, "b_only"), (1, 2, "a_only"), (2, 0, "b_only")}
    assert len(out["discordant"]) == overall["a_only"] + overall["b_only"]
    arms = paired.split_arms([dict(r, arm="a") for r in a] + [dict(r, arm="b") for r in b])
    assert arms is not None and len(arms[0]) == len(a) and paired.split_arms(a) is None


def test_cli(run, tmp_path, capsys):
    assert cli.main([str(run.path)]) == 0
    assert (run.path / "report.html").is_file()
    assert capsys.readouterr().out.strip().endswith("report.html")
    out = tmp_path / "ab"
    assert cli.main([str(run.path), str(run.path), "-o", str(out)]) == 0
    html = (out / "report.html").read_text()
    assert 'id="paired"' in html and "../" in html  # videos linked relative to the page
    for argv, needle in [
        ([str(tmp_path / "missing")], "RUN_DIR: expected a run directory"),
        ([str(run.path), str(run.path)], "-o/--out-dir: required"),
        ([str(tmp_path)], "not a dz-gym-eval run directory"),
    ]:
        with pytest.raises(SystemExit) as exc:
            cli.main(argv)
        assert exc.value.code == 2
        assert needle in capsys.readouterr().err


def test_write_report_is_atomic_and_returns_the_path(run, tmp_path):
    path = write_report(run.path, out_dir=tmp_path / "elsewhere")
    assert path == tmp_path / "elsewhere" / "report.html" and path.is_file()
    assert not list((tmp_path / "elsewhere").glob(".*tmp"))


@pytest.mark.slow
def test_dz_gym_eval_writes_the_report_unless_told_not_to(tmp_path):
    """A real run on the embedded simulator against the embedded reference server."""
    pytest.importorskip("mujoco")
    from dz_gym.eval import cli as eval_cli

    base = ["--num-envs", "1", "--episodes", "1", "--max-steps", "4", "--no-progress", "--no-video"]
    assert eval_cli.main([*base, "--output-root", str(tmp_path / "with")]) == 0
    (run_path,) = (tmp_path / "with").iterdir()
    html = (run_path / "report.html").read_text()
    summary = json.loads((run_path / "summary.json").read_text())
    assert rate_text(summary["overall"]["success_at_end"]).split(" ")[0] in html
    assert "--no-video" in html  # the page says why there are no videos
    assert eval_cli.main([*base, "--no-report", "--output-root", str(tmp_path / "without")]) == 0
    (run_path,) = (tmp_path / "without").iterdir()
    assert (run_path / "summary.json").is_file() and not (run_path / "report.html").exists()


def test_milestone_funnel_shows_the_summary():
    from dz_gym.report.page import funnel_table

    def row(scene, episode, error=None, **steps):
        names = ("reached", "lifted", "above_target", "placed")
        return {
            "scene": scene,
            "episode": episode,
            "seed": episode,
            "env": 0,
            "session_id": "s",
            "steps": 50,
            "server_calls": 7,
            "success_at_end": None if error else bool(steps.get("placed")),
            "success_any_step": None if error else bool(steps.get("placed")),
            "error": error,
            "milestones": None if error else {n: steps.get(n) for n in names},
        }

    rows = [
        row(1, 0, reached=3, lifted=9, above_target=30, placed=41),
        row(1, 1, reached=5),
        row(2, 0, reached=2, lifted=8),
        row(2, 1, error="x"),
    ]
    summary = results.summarize(rows)
    html = funnel_table(summary)
    cells = re.findall(r'<tr data-scene="([^"]+)">(.*?)</tr>', html)
    counts = {scene: re.findall(r"<span class=\"kn\">(\d+/\d+)</span>", body) for scene, body in cells}
    assert counts == {
        "1": ["2/2", "1/2", "1/2", "1/2"],
        "2": ["1/1", "1/1", "0/1", "0/1"],
        "overall": ["3/3", "2/3", "1/3", "1/3"],
    }
    lifted = summary["overall"]["milestones"]["lifted"]
    assert f"[{100 * lifted['ci95'][0]:.1f}, {100 * lifted['ci95'][1]:.1f}]" in html
    assert "No milestones" in funnel_table(results.summarize([dict(rows[0], milestones=None)]))
