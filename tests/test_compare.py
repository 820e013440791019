"""Paired comparison of runs: compare_rows (pairing, errored pairs, milestones, Holm) and dz-gym-compare."""

from __future__ import annotations

import contextlib
import io
import json
import subprocess
import sys

import pytest

from dz_gym import compare as dz_compare
from dz_gym.compare import main
from dz_gym.envs import droid
from dz_gym.eval.config import EvalConfig
from dz_gym.stats import PairedCounts, compare_rows, format_comparison, mcnemar_exact_p, paired_difference_interval

PROMPT = {s: droid.SCENES[s].prompt for s in (1, 2, 3)}


def row(scene, seed, success, *, any_step=None, error=None, arm=None, milestones=None, prompt=None):
    out = {
        "scene": scene, "episode": seed, "seed": seed, "env": 0, "session_id": f"s{scene}-{seed}",
        "prompt": prompt or PROMPT[scene], "steps": 450, "server_calls": 57,
        "success_at_end": None if error else success,
        "success_any_step": None if error else (success if any_step is None else any_step),
        "error": error,
    }  # fmt: skip
    if arm is not None:
        out["arm"] = arm
    if milestones is not None:
        out["milestones"] = milestones
    return out


def outcomes(scene, a_results, b_results, **kwargs):
    rows_a = [row(scene, i, x, **kwargs) for i, x in enumerate(a_results)]
    rows_b = [row(scene, i, x, **kwargs) for i, x in enumerate(b_results)]
    return rows_a, rows_b


def test_counts_diff_interval_and_p_value():
    # Scene 1: 10 pairs, A only 1, B only 6, both 2, neither 1.
    a = [True] * 2 + [True] + [False] * 6 + [False]
    b = [True] * 2 + [False] + [True] * 6 + [False]
    rows_a, rows_b = outcomes(1, a, b)
    result = compare_rows(rows_a, rows_b)
    entry = result["scenes"]["1"]
    assert (entry["pairs"], entry["a"], entry["b"], entry["a_only"], entry["b_only"]) == (10, 3, 8, 1, 6)
    assert entry["diff"] == pytest.approx(0.5)
    assert entry["p_value"] == pytest.approx(mcnemar_exact_p(1, 6)) == pytest.approx(16 / 128)
    lo, hi = entry["ci95"]
    assert lo < 0.5 < hi
    assert result["scenes"]["overall"]["pairs"] == 10
    assert result["schema"] == "dz-gym-compare/1" and result["metric"] == "success_at_end"
    for key in ("pairs", "a", "b", "a_only", "b_only", "diff", "ci95", "p_value"):
        assert key in result["scenes"]["overall"]


def test_errored_and_unpaired_rows_are_left_out_and_counted():
    rows_a, rows_b = outcomes(1, [True, False, True], [True, True, False])
    rows_b[2] = row(1, 2, None, error="timeout")
    rows_a.append(row(1, 7, True))  # no partner in B
    result = compare_rows(rows_a, rows_b)
    entry = result["scenes"]["1"]
    assert entry["pairs"] == 2 and entry["errored_pairs"] == 1
    assert result["unpaired"] == {"a": 1, "b": 0}


def test_errored_pairs_are_imputed_against_each_claim():
    # B errors on the 8 seeds A solved, wins the other 8: dropping the errors reads "B better" (p = 2/2^8);
    # imputed against B (its errors as failures) it is 8 A only vs 8 B only: no verdict.
    rows_a, rows_b = outcomes(1, [True, False] * 8, [None, True] * 8)
    for k in range(0, 16, 2):
        rows_b[k] = row(1, k, None, error="connection lost")
    entry = compare_rows(rows_a, rows_b)["scenes"]["overall"]
    assert entry["errored_pairs"] == 8 and entry["pairs"] == 8 and entry["b_only"] == 8
    assert entry["p_without_errored"] == pytest.approx(2 / 2**8)
    assert entry["worst_for_b"] == [8, 8] and entry["worst_for_a"] == [0, 8]
    assert entry["p_value"] == 1.0 and entry["verdict"] == "no_difference_detected"
    # A real difference survives its errors: B wins 13 seeds, one errored episode per arm.
    rows_a, rows_b = outcomes(1, [False] * 12 + [True, False, True, False], [True] * 12 + [False, True, True, True])
    rows_b[12], rows_a[13] = row(1, 12, None, error="timeout"), row(1, 13, None, error="timeout")
    entry = compare_rows(rows_a, rows_b)["scenes"]["overall"]
    assert entry["worst_for_b"] == [1, 13] and entry["verdict"] == "b_better"
    assert entry["p_value"] == pytest.approx(2 * 15 / 2**14)


def test_the_effect_size_and_its_interval_are_bounded_over_errored_pairs():
    # A solves 30 seeds where B errored (B would have failed them: B is 25 points worse than A over the 40
    # seeds), B solves the 10 that A fails. Dropping the errored pairs read B - A = +1.00 [+0.61, +1.00].
    rows_a, rows_b = outcomes(1, [True] * 30 + [False] * 10, [None] * 30 + [True] * 10)
    for k in range(30):
        rows_b[k] = row(1, k, None, error="timeout")
    result = compare_rows(rows_a, rows_b)
    entry = result["scenes"]["overall"]
    assert entry["diff"] == 1.0 and entry["ci95_without_errored"][0] > 0.6  # the rule before: B "surely" ahead
    # Over every completion B - A lies in [-0.5, +0.25] (B's errored episodes all failures / all successes), and the
    # interval holds the true -0.5.
    assert entry["diff_range"] == [-0.5, 0.25]
    low, high = entry["ci95"]
    assert low < -0.5 < 0.25 < high < 0.5
    assert (low, high) == (paired_difference_interval(PairedCounts(0, 30, 10, 0))[0],
                           paired_difference_interval(PairedCounts(30, 0, 10, 0))[1])  # fmt: skip
    text = format_comparison(result)
    assert "-0.50..+0.25 [" in text and "bounded, not dropped" in text and "multiplicity: per-scene" in text
    # Without errored pairs nothing changes: the interval is Newcombe's.
    clean = compare_rows(*outcomes(1, [True, False] * 10, [True] * 20))["scenes"]["overall"]
    assert clean["ci95"] == clean["ci95_without_errored"] and clean["diff_range"] == [clean["diff"]] * 2


def test_newcombe_lower_end_never_rises_when_a_pair_turns_worse_for_b():
    # What the bounded interval rests on, exhaustively for up to 30 pairs: a B success turned into a failure, or
    # an A failure turned into a success, never raises the lower end (the upper end mirrors it).
    for n in range(1, 31):
        for both in range(n + 1):
            for a_only in range(n + 1 - both):
                for b_only in range(n + 1 - both - a_only):
                    neither = n - both - a_only - b_only
                    low = paired_difference_interval(PairedCounts(both, a_only, b_only, neither))[0]
                    worse = []
                    if both:
                        worse.append(PairedCounts(both - 1, a_only + 1, b_only, neither))
                    if b_only:
                        worse += [PairedCounts(both, a_only, b_only - 1, neither + 1),
                                  PairedCounts(both + 1, a_only, b_only - 1, neither)]  # fmt: skip
                    if neither:
                        worse.append(PairedCounts(both, a_only + 1, b_only, neither - 1))
                    assert all(paired_difference_interval(c)[0] <= low + 1e-12 for c in worse), (both, a_only, b_only)


def test_per_scene_holm_and_pooled_overall():
    a1, b1 = outcomes(1, [False] * 12, [True] * 12)  # p = 2^-11
    a2, b2 = outcomes(2, [True, False, True], [True, True, False])  # p = 1
    result = compare_rows(a1 + a2, b1 + b2)
    s1, s2 = result["scenes"]["1"], result["scenes"]["2"]
    assert s1["p_holm"] == pytest.approx(2 * s1["p_value"])
    assert s2["p_holm"] == 1.0
    assert s1["verdict"] == "b_better" and s2["verdict"] == "no_difference_detected"
    overall = result["scenes"]["overall"]
    assert (overall["pairs"], overall["a_only"], overall["b_only"]) == (15, 1, 13)
    assert "p_holm" not in overall


def test_any_step_and_milestones_are_compared_too():
    def stone(*steps):
        return dict(zip(("reached", "lifted", "above_target", "placed"), steps))

    rows_a = [row(1, 0, False, any_step=True, milestones=stone(10, 20, None, None)),
              row(1, 1, False, milestones=stone(12, None, None, None))]  # fmt: skip
    rows_b = [row(1, 0, True, milestones=stone(9, 18, 40, 60)),
              row(1, 1, True, milestones=stone(11, 19, 41, 70))]  # fmt: skip
    result = compare_rows(rows_a, rows_b)
    assert list(result["metrics"]) == [
        "success_at_end", "success_any_step",
        "milestones.reached", "milestones.lifted", "milestones.above_target", "milestones.placed",
    ]  # fmt: skip
    assert result["metrics"]["success_any_step"]["1"]["a"] == 1
    lifted = result["metrics"]["milestones.lifted"]["1"]
    assert (lifted["a"], lifted["b"], lifted["b_only"]) == (1, 2, 1)
    assert result["metrics"]["milestones.reached"]["overall"]["a_only"] == 0


def test_rows_without_milestones_count_as_missing():
    rows_a = [row(1, 0, True, milestones={"reached": 3}), row(1, 1, True)]
    rows_b = [row(1, 0, True, milestones={"reached": 4}), row(1, 1, False, milestones={"reached": None})]
    entry = compare_rows(rows_a, rows_b)["metrics"]["milestones.reached"]["1"]
    assert entry["pairs"] == 1 and entry["missing"] == 1


def test_one_ab_run_is_split_by_arm():
    rows = [row(1, i, i % 2 == 0, arm="a") for i in range(4)] + [row(1, i, True, arm="b") for i in range(4)]
    entry = compare_rows(rows)["scenes"]["1"]
    assert (entry["a"], entry["b"], entry["b_only"]) == (2, 4, 2)
    with pytest.raises(ValueError, match="'arm' expected"):
        compare_rows([row(1, 0, True, arm="c")])


def test_duplicate_seed_is_an_error():
    rows_a, rows_b = outcomes(1, [True, True], [True, True])
    with pytest.raises(ValueError, match="appears twice"):
        compare_rows(rows_a + rows_a[:1], rows_b)


def test_empty_and_identical_runs():
    result = compare_rows([], [])
    assert result["scenes"]["overall"]["pairs"] == 0 and result["scenes"]["overall"]["ci95"] is None
    rows_a, rows_b = outcomes(1, [True, False] * 5, [True, False] * 5)
    entry = compare_rows(rows_a, rows_b)["scenes"]["overall"]
    assert entry["p_value"] == 1.0 and entry["diff"] == 0 and entry["verdict"] == "no_difference_detected"


def test_table_mentions_every_scene_and_metric():
    a1, b1 = outcomes(1, [False] * 8, [True] * 8)  # p = 2^-7, Holm-adjusted over 2 scenes: 2^-6
    a3, b3 = outcomes(3, [True] * 2, [True] * 2)
    text = format_comparison(compare_rows(a1 + a3, b1 + b3, labels={"a": "ckpt-100", "b": "ckpt-200"}))
    assert "A = ckpt-100" in text and "B = ckpt-200" in text
    assert "success_at_end" in text and "success_any_step" in text
    lines = text.splitlines()
    assert any(line.startswith("1 ") and "B better" in line for line in lines)
    assert any(line.startswith("3 ") for line in lines) and any(line.startswith("overall") for line in lines)


# ------------------------------------------------------------------------------------------- CLI
def make_run(path, rows, **config):
    path.mkdir(parents=True)
    scenes = sorted({r["scene"] for r in rows}) or [1]
    cfg = EvalConfig(scenes=scenes, episodes=max(1, len(rows)), num_envs=2, policy="reference", video=False, **config)
    (path / "config.json").write_text(json.dumps(cfg.to_dict()))
    (path / "episodes.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def cli(*args):
    """Run ``dz-gym-compare ARGS`` in this process: (exit code, stdout, stderr)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(list(args))
        except SystemExit as exc:
            code = exc.code
    return code, out.getvalue(), err.getvalue()


def test_console_entry_point_runs(tmp_path):
    rows_a, rows_b = outcomes(1, [False] * 8, [True] * 8)
    run_a, run_b = make_run(tmp_path / "a", rows_a), make_run(tmp_path / "b", rows_b)
    proc = subprocess.run([sys.executable, "-m", "dz_gym.compare", run_a, run_b], capture_output=True, text=True, check=False,
                          timeout=120)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "B better" in proc.stdout


def test_cli_two_runs_table_and_json(tmp_path):
    rows_a, rows_b = outcomes(1, [False] * 8, [True] * 8)
    run_a, run_b = make_run(tmp_path / "a", rows_a), make_run(tmp_path / "b", rows_b)
    code, out, err = cli(run_a, run_b, "--json", str(tmp_path / "cmp.json"))
    assert code == 0, err
    assert "B better" in out and "overall" in out
    data = json.loads((tmp_path / "cmp.json").read_text())
    assert data["scenes"]["1"]["b_only"] == 8 and data["runs"] == [run_a, run_b]
    assert data["forced"] is False and data["problems"] == []


def test_cli_refuses_runs_that_are_not_comparable(tmp_path):
    rows_a, rows_b = outcomes(1, [True] * 3, [True] * 3)
    run_a = make_run(tmp_path / "a", rows_a)
    run_b = make_run(tmp_path / "b", rows_b, max_steps=300)
    code, out, err = cli(run_a, run_b)
    assert code == 2
    last = err.strip().splitlines()[-1]
    assert "not comparable" in last and "max steps" in last and "--force" in last
    code, out, err = cli(run_a, run_b, "--force", "--json", "-")
    assert code == 0
    data = json.loads(out)
    assert data["forced"] is True and "max steps" in data["problems"][0]


def test_cli_refuses_other_horizon_or_prompt(tmp_path):
    rows_a, rows_b = outcomes(1, [True] * 3, [True] * 3)
    run_a = make_run(tmp_path / "a", rows_a)
    run_h = make_run(tmp_path / "h", rows_b, open_loop_horizon=4)
    assert "horizon" in cli(run_a, run_h)[2]
    rows_p = [dict(r, prompt="pick up the cube") for r in rows_b]
    run_p = make_run(tmp_path / "p", rows_p)
    code, _, err = cli(run_a, run_p)
    assert code == 2 and "prompt of scene 1" in err


def test_a_horizon_left_to_the_server_profile_compares_as_it_ran(tmp_path):
    rows_a, rows_b = outcomes(1, [True] * 3, [True] * 3)
    run_8 = make_run(tmp_path / "eight", rows_a, open_loop_horizon=8)
    for name, executed in (("dz", 8), ("flux", 32)):
        run = make_run(tmp_path / name, rows_b)  # no --open-loop-horizon: the profile's, in summary.json
        (tmp_path / name / "summary.json").write_text(json.dumps({"server": {"open_loop_horizon": executed}}))
        assert ("horizon" in cli(run_8, run)[2]) == (executed != 8)


def test_cli_notes_settings_that_may_differ(tmp_path):
    rows_a, rows_b = outcomes(1, [True] * 3, [True] * 3)
    run_a = make_run(tmp_path / "a", rows_a)
    run_b = make_run(tmp_path / "b", rows_b, prefetch=2)
    code, out, _ = cli(run_a, run_b)
    assert code == 0 and "note: prefetch" in out


def test_cli_one_ab_run_and_usage_errors(tmp_path):
    rows = [row(1, i, False, arm="a") for i in range(6)] + [row(1, i, True, arm="b") for i in range(6)]
    run = make_run(tmp_path / "ab", rows)
    code, out, err = cli(run)
    assert code == 0, err
    assert "arm A" in out and "arm B" in out
    plain = make_run(tmp_path / "plain", outcomes(1, [True], [True])[0])
    assert cli(plain)[0] == 2 and "not an A/B run" in cli(plain)[2]
    assert cli(str(tmp_path / "missing"), plain)[0] == 2
    assert cli(plain, plain, plain)[0] == 2
    other = make_run(tmp_path / "other", [row(2, 0, True)])
    code, _, err = cli(plain, other)
    assert code == 2 and "no pairs" in err


def test_cli_ranks_three_runs_on_the_same_seeds(tmp_path):
    runs = [
        make_run(tmp_path / "best", [row(1, i, True) for i in range(30)]),
        make_run(tmp_path / "mid", [row(1, i, i < 15) for i in range(30)]),
        make_run(tmp_path / "worst", [row(1, i, False) for i in range(29)] + [row(1, 29, False, error="boom")]),
    ]
    out_json = tmp_path / "rank.json"
    code, out, err = cli(runs[2], runs[0], runs[1], "--json", str(out_json))
    assert code == 0, err
    result = json.loads(out_json.read_text())
    assert result["schema"] == "dz-gym-rank/1" and [e["arm"] for e in result["arms"]] == [runs[0], runs[1], runs[2]]
    assert [e["rank_interval"] for e in result["arms"]] == [[1, 1], [2, 2], [3, 3]]
    assert result["arms"][2]["n"] == 29  # the errored episode is left out
    assert "ranking of 3 arms" in out and "30/30 100%" in out
    horizon = make_run(tmp_path / "horizon", [row(1, i, True) for i in range(30)], open_loop_horizon=4)
    code, _, err = cli(runs[0], runs[1], horizon)
    assert code == 2 and "not comparable" in err


def test_cli_on_a_sequential_ab_run_reads_its_decision_and_marks_the_table_descriptive(tmp_path):
    rows = [row(1, i, False, arm="a") for i in range(12)] + [row(1, i, True, arm="b") for i in range(12)]
    run = make_run(tmp_path / "seq", rows, policy_b="reference:skill=0.3", sequential=True, accept_lower_power=True)
    code, out, err = cli(run)
    assert code == 0, err
    assert "DESCRIPTIVE ONLY" in out and "DECISION (sequential test): not in summary.json" in out
    (tmp_path / "seq" / "summary.json").write_text(json.dumps({"sequential": {
        "reason": "b_better", "stopped_by": "decision", "why": "B is better after 11 pairs"}}))  # fmt: skip
    code, out, _ = cli(run)
    assert "DECISION (sequential test): b_better [stopped by: decision]" in out and "B is better" in out


def test_a_row_that_breaks_the_schema_is_a_one_line_error(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.json").write_text(json.dumps({"scenes": [1]}))
    bad = dict(row(1, 0, True), success_at_end="yes")
    (run / "episodes.jsonl").write_text(json.dumps(row(1, 1, True)) + "\n" + json.dumps(bad) + "\n")
    with pytest.raises(
        dz_compare.RunError, match=r"episodes.jsonl:2: episode row: 'success_at_end' expected true/false"
    ):
        dz_compare.load_run(run)


@pytest.mark.parametrize("where", ["missing/out.json", "file/out.json", "folder"])
def test_cli_refuses_a_json_path_it_cannot_write_before_reading_the_runs(tmp_path, where):
    """One line naming --json, exit status 2, before any run is read (the runs given do not even exist)."""
    (tmp_path / "file").write_text("a file, not a folder")
    (tmp_path / "folder").mkdir()
    code, out, err = cli(str(tmp_path / "run_a"), str(tmp_path / "run_b"), "--json", str(tmp_path / where))
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and lines[0].startswith("dz-gym-compare: error: --json"), err
    assert "run_a" not in err and not out


def test_cli_writes_json_over_an_existing_file(tmp_path):
    rows_a, rows_b = outcomes(1, [True, False], [True, True])
    target = tmp_path / "out.json"
    target.write_text("old")
    code, _, err = cli(make_run(tmp_path / "a", rows_a), make_run(tmp_path / "b", rows_b), "--json", str(target))
    assert code == 0, err
    assert json.loads(target.read_text())["runs"]
