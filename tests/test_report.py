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


@pytest.fixture(scope="module")
def arms_run(tmp_path_factory):
    """Three named arms on the same 12 seeds: x closes the gripper (solves every seed of the gripper toy), z
    too but its server fails seed 1, y holds the gripper open (solves none)."""
    from report_runs import FailOnSeed, toy_arms_run

    from dz_gym.server.policies import HoldPolicy

    policies = {"x": HoldPolicy(gripper=1.0), "y": HoldPolicy(), "z": FailOnSeed(1, gripper=1.0)}
    return toy_arms_run(tmp_path_factory.mktemp("arms"), policies, episodes=12)


def _leaderboard_rows(html):
    board = re.search(r'<table class="leaderboard" id="leaderboard">(.*?)</table>', html).group(1)
    out = []
    for arm, cells in re.findall(r'<tr data-arm="([^"]+)">(.*?)</tr>', board):
        field = dict(re.findall(r'data-field="([a-z_]+)">(.*?)</t[dh]>', cells))
        out.append((arm, field))
    return out


def _expected_discordant(rows, upper, lower):
    """(scene, seed, which) where exactly one of the two arms succeeded, neither errored (from the rows alone)."""
    table = {(r["arm"], r["scene"], r["seed"]): r for r in rows}
    out = set()
    for (arm, scene, seed), r in table.items():
        other = table.get((lower, scene, seed))
        if arm != upper or other is None or r["error"] is not None or other["error"] is not None:
            continue
        if bool(r["success_at_end"]) != bool(other["success_at_end"]):
            out.add((scene, seed, "a_only" if r["success_at_end"] else "b_only"))
    return out


def test_named_arms_page_has_the_leaderboard_and_the_neighbours_discordant_episodes(arms_run):
    html = build_report(arms_run.path)
    summary = json.loads((arms_run.path / "summary.json").read_text())
    rows = arms_run.read_rows()
    ranking = summary["ranking"]["arms"]
    order = [e["arm"] for e in ranking]
    assert order[-1] == "y" and set(order) == set("xyz")
    board = _leaderboard_rows(html)
    assert [arm for arm, _ in board] == order
    specs = dict(s.split("=", 1) for s in summary["config"]["arm_specs"])
    for (arm, field), entry in zip(board, ranking):
        mine = [r for r in rows if r["arm"] == arm and r["error"] is None]
        k, n = sum(bool(r["success_at_end"]) for r in mine), len(mine)
        errored = sum(r["arm"] == arm and r["error"] is not None for r in rows)
        assert (entry["successes"], entry["n"], entry["errored"]) == (k, n, errored)
        # Wilson's interval widened over the errored episodes (as failures below, as successes above)
        lo, hi = results.rate(k, n + errored)["ci95"][0], results.rate(k + errored, n + errored)["ci95"][1]
        assert f'<span class="kn">{k}/{n}</span>' in field["success"]
        assert f"[{100 * lo:.1f}, {100 * hi:.1f}]" in field["success"]
        low, high = entry["rank_interval"]
        assert field["rank_interval"] == (str(low) if low == high else f"{low}-{high}")
        assert field["rank"] == str(entry["rank"]) and specs[arm] in field["label"]
    # 12 seeds of 12 against 0: both closing arms are surely better than y, which is surely last.
    assert dict(board)["y"]["rank_interval"] == "3" and {dict(board)[a]["rank_interval"] for a in "xz"} == {"1-2"}
    assert 'id="compare"' not in html and 'id="paired"' not in html  # not an A/B page
    assert "selection" not in dict(board)["x"]  # no --select-best: no selection column
    found_any = False
    for upper, lower in zip(order, order[1:]):
        start = html.index(f'<div class="neighbours" data-arms="{upper} {lower}">')
        body = html[start : html.index("</section>", start)].split('<div class="neighbours"')[1]
        items = re.findall(r'<li class="pair" data-scene="(\d+)" data-seed="(\d+)" data-which="(\w+)" '
                           r'data-a="([^"]*)" data-b="([^"]*)"', body)  # fmt: skip
        expected = _expected_discordant(rows, upper, lower)
        assert {(int(s), int(d), w) for s, d, w, _, _ in items} == expected
        videos = {(r["arm"], r["seed"]): r["video"] for r in rows}
        for _, seed, _, va, vb in items:
            assert (va, vb) == (videos[(upper, int(seed))], videos[(lower, int(seed))])
        found_any = found_any or bool(expected)
        assert f"{upper} vs {lower}: {len(expected)} discordant episode(s)" in body
    assert found_any  # the closing arms against y: one discordant episode per seed both completed


def test_named_arms_leaderboard_is_recomputed_from_the_rows_in_progress(arms_run, tmp_path):
    import shutil

    from dz_gym.report import leaderboard

    copy = tmp_path / arms_run.path.name
    shutil.copytree(arms_run.path, copy)
    saved = json.loads((copy / "summary.json").read_text())["ranking"]
    (copy / "summary.json").unlink()
    view = load.load_run(copy, trajectories=False)
    assert view.summary_is_recomputed and leaderboard.named_arms(view) == ["x", "y", "z"]
    assert leaderboard.ranking_of(view, ["x", "y", "z"])["arms"] == saved["arms"]
    assert [arm for arm, _ in _leaderboard_rows(build_report(copy))] == [e["arm"] for e in saved["arms"]]
    assert paired.split_arms(view.rows) is None  # named arms are not an A/B run


def test_select_best_leaderboard_shows_the_winner_and_the_eliminated_arms(tmp_path):
    from report_runs import toy_arms_run

    from dz_gym.server.policies import HoldPolicy

    policies = {"x": HoldPolicy(gripper=1.0), "y": HoldPolicy(), "z": HoldPolicy()}
    run = toy_arms_run(tmp_path / "race", policies, episodes=40, select_best=True, video=False)
    selection = json.loads((run.path / "summary.json").read_text())["selection"]
    assert selection["best"] == "x"
    html = build_report(run.path)
    board = dict(_leaderboard_rows(html))
    assert board["x"]["selection"] == "best"
    for arm in "yz":
        after, by = selection["eliminated_after_seeds"][arm], selection["eliminated"][arm]["by"]
        assert board[arm]["selection"] == f"eliminated after {after} seed(s) (by {by})"
    note = re.search(r'<p id="selection" data-best="x">(.*?)</p>', html).group(1)
    assert "best arm: <b>x</b>" in note and f"{selection['rounds']} of 40 seeds raced" in note

    same = {"x": HoldPolicy(), "y": HoldPolicy(), "z": HoldPolicy()}
    html = build_report(toy_arms_run(tmp_path / "hold", same, episodes=3, select_best=True, video=False).path)
    assert '<p id="selection" data-best="">--select-best: no winner named; eliminated: none' in html
    assert {f["selection"] for f in dict(_leaderboard_rows(html)).values()} == {"still in"}


def _copy_run(run, path):
    import shutil

    shutil.copytree(run.path, path, ignore=shutil.ignore_patterns("report.html"))
    return path


def _report_error(capsys, *argv):
    """``dz-gym-report ARGV``'s exit status and its stderr lines."""
    with pytest.raises(SystemExit) as exc:
        cli.main([str(a) for a in argv])
    return exc.value.code, capsys.readouterr().err.strip().splitlines()


def test_rows_go_through_the_ledger_checks_of_a_resume(run, tmp_path, capsys):
    """A duplicate row, or rows of another seed, are refused in one line naming the row, as --resume refuses them
    (not counted twice, not called complete)."""
    duplicated = _copy_run(run, tmp_path / "duplicated")
    lines = (duplicated / "episodes.jsonl").read_text().splitlines()
    (duplicated / "episodes.jsonl").write_text("\n".join([*lines, lines[2]]) + "\n")
    first = json.loads(lines[2])
    with pytest.raises(ValueError, match=rf"episodes.jsonl:{len(lines) + 1}: a second row of scene {first['scene']} "):
        build_report(duplicated)
    code, err = _report_error(capsys, duplicated)
    assert code == 2 and len(err) == 1 and "a second row of scene" in err[0], err

    reseeded = _copy_run(run, tmp_path / "reseeded")
    rows = [json.loads(line) for line in lines]
    (reseeded / "episodes.jsonl").write_text("".join(json.dumps(dict(r, seed=r["seed"] + 100)) + "\n" for r in rows))
    assert json.loads((reseeded / "summary.json").read_text())["complete"]  # what the page would have said
    code, err = _report_error(capsys, reseeded)
    assert code == 2 and len(err) == 1 and "episodes.jsonl:1: seed 100 is not this run's seed" in err[0], err

    unreadable = _copy_run(run, tmp_path / "unreadable")
    (unreadable / "config.json").write_text("{not json")
    code, err = _report_error(capsys, unreadable)
    assert code == 2 and len(err) == 1 and "config.json: unreadable" in err[0], err


@pytest.fixture(scope="module")
def longer_run(tmp_path_factory):
    """The module's run but with another step limit (``--max-steps``): the same seeds, not comparable."""
    return toy_run(tmp_path_factory.mktemp("longer"), max_steps=16, video=False)


def test_runs_with_another_step_limit_get_no_verdict(run, longer_run, tmp_path, capsys):
    """dz-gym-compare's comparability check: refused in one line; with --force, the page says why and the paired
    table has no verdict column."""
    with pytest.raises(ValueError, match=r"^runs not comparable: max steps differs: A 12, B 16 \(--force"):
        build_report(run.path, longer_run.path, out_dir=tmp_path)
    code, err = _report_error(capsys, run.path, longer_run.path, "-o", tmp_path / "page")
    assert code == 2 and len(err) == 1 and "max steps differs" in err[0], err
    assert not (tmp_path / "page" / "report.html").exists()
    assert cli.main([str(run.path), str(longer_run.path), "-o", str(tmp_path / "page"), "--force"]) == 0
    html = (tmp_path / "page" / "report.html").read_text()
    assert 'id="paired-not-comparable"' in html and "max steps differs: A 12, B 16" in html
    table = html[html.index('<table class="paired"') : html.index("</table>", html.index('<table class="paired"'))]
    assert 'data-descriptive="true"' in table and "verdict" not in table and "better" not in table


def test_a_video_a_resume_would_withdraw_is_not_linked(run, tmp_path):
    """A missing or torn mp4 (no moov box: an encoder stopped early) is not linked; the grid says why."""
    copy = _copy_run(run, tmp_path / "videos")
    rows = [json.loads(line) for line in (copy / "episodes.jsonl").read_text().splitlines()]
    linked = [r["video"] for r in rows if r.get("video")]
    torn, gone, kept = linked[0], linked[1], linked[2]
    (copy / torn).write_bytes((copy / torn).read_bytes()[:64])
    (copy / gone).unlink()
    html = build_report(copy)
    grid = json.loads(re.search(r'<script type="application/json" id="dz-episodes">(.*?)</script>', html).group(1))
    by_video = {r["video"]: entry for r, entry in zip(sorted(rows, key=lambda r: (r["scene"], r["episode"])), grid)
                if r.get("video")}  # fmt: skip
    assert by_video[torn]["v"] == "" and by_video[torn]["nv"].startswith(f"video not playable: {torn}: ")
    assert by_video[gone]["v"] == "" and by_video[gone]["nv"] == f"video not playable: {gone}: missing (not finished)"
    assert by_video[kept]["v"].endswith(kept) and by_video[kept]["nv"] == ""
