"""Budgets from the sequential design, and what a run that stopped adaptively reports.

The power a budget has is checked against an independent dynamic program in *pair* time (each pair concordant,
B-only or A-only; the rule applied after every pair, the final look at the last pair), not the walk-and-mix
computation the design uses. The claims after --select-best are checked against BestArmSelection's own
e-processes.
"""

from __future__ import annotations

import json
import math
import re

import numpy as np
import pytest

from dz_gym import compare
from dz_gym.eval import cli
from dz_gym.eval.config import EvalConfig
from dz_gym.eval.evaluate import evaluate
from dz_gym.eval.results import format_table
from dz_gym.eval.rundir import RunDir
from dz_gym.report import build_report
from dz_gym.server.launch import start_server_thread
from dz_gym.server.policies import HoldPolicy
from dz_gym.stats.design import SequentialDesign
from dz_gym.stats.ranking import anytime_claims
from dz_gym.stats.select import BestArmSelection
from dz_gym.testing.toy_env import GripperToyEnv

PATH = "/v1/realtime/robot/openpi"


def pair_time_power(design: SequentialDesign, pairs: int) -> float:
    """P(decide B better) at the planned point for a run of ``pairs`` pairs, by a DP over (d, S) per pair."""
    pi, q, b = design.discordance, design.q1, design.bounds
    d = np.minimum(np.arange(pairs + 1), b.cap)[:, None]
    s = np.abs(np.arange(-pairs, pairs + 1))[None, :]
    signed = np.arange(-pairs, pairs + 1)[None, :]
    up = signed >= b.reject[d]
    stop = (s >= b.reject[d]) | (s <= b.futile[d])
    final_up = signed >= b.final[d]
    mass = np.zeros((pairs + 1, 2 * pairs + 1))  # mass[d, S + pairs] of the runs still going
    mass[0, pairs] = 1.0
    decided = 0.0
    for _ in range(pairs):
        new = (1 - pi) * mass
        new[1:, 1:] += pi * q * mass[:-1, :-1]
        new[1:, :-1] += pi * (1 - q) * mass[:-1, 1:]
        decided += new[up].sum()
        mass = np.where(stop, 0.0, new)
    return float(decided + mass[final_up].sum())


def test_power_of_a_budget_below_the_cap_is_exact():
    design = SequentialDesign.plan(0.1)  # docs/compare.md's example: cap 567 pairs, 200 pairs give 0.47
    assert design.max_pairs == 567
    expected = pair_time_power(design, 200)
    assert design.power_at(200) == pytest.approx(expected, abs=1e-9) and 0.46 < expected < 0.48
    small = SequentialDesign.plan(0.3)
    assert small.power_at(small.max_pairs) == pytest.approx(pair_time_power(small, small.max_pairs), abs=1e-9)
    assert small.power_at(small.max_pairs) >= 0.8 and small.power_at(10_000) == small.power_at(small.max_pairs)


def _config(**fields):
    return EvalConfig(backend="mujoco", num_envs=2, policy_b="hold", sequential=True, **fields)


def test_the_budget_defaults_to_the_design_cap_and_a_shorter_one_is_refused():
    assert _config(min_difference=0.1).plan.episodes == 567  # the whole cap, not a default of 200
    assert _config(min_difference=0.1, scenes=[1, 2]).plan.episodes == 284  # spread over the scenes
    power = pair_time_power(SequentialDesign.plan(0.1), 200)
    with pytest.raises(ValueError, match=r"^max_episodes: .*below the design's cap of 567 pairs") as exc:
        _config(min_difference=0.1, max_episodes=200)
    assert f"{power:.3f}" in str(exc.value) and "--accept-lower-power" in str(exc.value)
    with pytest.raises(ValueError, match=r"^episodes: --episodes 50 x 1 scene\(s\) gives the sequential test 50"):
        _config(episodes=50)
    accepted = _config(min_difference=0.1, max_episodes=200, accept_lower_power=True)
    assert accepted.sequential_budget == 200
    with pytest.raises(ValueError, match="^accept_lower_power: only with --sequential"):
        EvalConfig(backend="mujoco", num_envs=2, policy_b="hold", accept_lower_power=True)


def test_a_config_saved_before_budgets_were_checked_keeps_its_budget():
    old = _config(min_difference=0.1, max_episodes=200, accept_lower_power=True).to_flat_dict()  # version 1
    del old["accept_lower_power"]
    assert EvalConfig.from_dict(old).sequential_budget == 200
    old["max_episodes"] = None  # the budget was 200 pairs by default then
    assert EvalConfig.from_dict(old).sequential_max_pairs == 200


def test_resume_locks_every_setting_that_shapes_the_sequential_test():
    from dz_gym.eval.config import resume_conflicts

    # Run at a budget below the cap (40 pairs), then resumed with more episodes: the budget would grow to 80
    # pairs after the test took its final look at 40 (type I above alpha): refused, naming the field.
    saved = _config(min_difference=0.2, episodes=40, accept_lower_power=True)
    grown = _config(min_difference=0.2, episodes=80, accept_lower_power=True)
    assert saved.sequential_budget == 40 and grown.sequential_budget == 80
    (line,) = resume_conflicts(saved, grown)
    assert line.startswith("episodes: --episodes 80 gives the sequential test 80 pairs, the run planned 40")
    # accept_lower_power itself is locked, as are the design's settings.
    lines = resume_conflicts(saved, _config(min_difference=0.2, episodes=40, accept_lower_power=True, power=0.9))
    assert [x.split(":")[0] for x in lines] == ["power"]
    assert "accept_lower_power" in {line.split(":")[0] for line in resume_conflicts(
        _config(min_difference=0.2), _config(min_difference=0.2, accept_lower_power=True))}  # fmt: skip
    # Episodes past the budget change nothing the test sees: a resume may add them.
    capped = _config(min_difference=0.2, max_episodes=40, accept_lower_power=True, episodes=40)
    assert resume_conflicts(capped, _config(min_difference=0.2, max_episodes=40, accept_lower_power=True,
                                            episodes=60)) == []  # fmt: skip


def test_cli_refuses_a_budget_below_the_cap_with_exit_2(capsys):
    with pytest.raises(SystemExit) as exc:
        cli.main(["--backend", "mujoco", "--policy-b", "hold", "--sequential", "--min-difference", "0.1",
                  "--max-episodes", "200"])  # fmt: skip
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "--max-episodes: --max-episodes 200 gives the sequential test 200 pairs" in err


def _gripper_run(root, specs=None, **fields):
    """A real run on the gripper toy: arm(s) that close the gripper succeed, those that hold it open fail."""
    closing = {"a": 0.0, "b": 1.0} if specs is None else specs
    with start_server_thread(HoldPolicy(gripper=closing.get("a", 0.0))) as a, \
            start_server_thread(HoldPolicy(gripper=closing.get("b", 1.0))) as b, \
            start_server_thread(HoldPolicy(gripper=closing.get("c", 0.0))) as c:  # fmt: skip
        urls = {"a": a.url + PATH, "b": b.url + PATH, "c": c.url + PATH}
        if specs is None:
            arms = {"servers": [urls["a"]], "servers_b": [urls["b"]]}
        else:
            arms = {"arm_specs": [f"{name}={urls[name]}" for name in specs], "select_best": True}
        config = EvalConfig(scenes=[1], max_steps=4, video=False, report=False, **arms, **fields)
        run_dir = RunDir.create(root, config)
        summary = evaluate(config, run_dir, progress=False,
                           env_factory=lambda s, cfg: GripperToyEnv(cfg.plan.num_envs, scene=s, max_episode_length=4))  # fmt: skip
    return summary, run_dir


def test_a_short_budget_reports_its_power_and_a_sequential_stop_marks_fixed_n_fields(tmp_path):
    summary, run_dir = _gripper_run(tmp_path, num_envs=4, sequential=True, max_episodes=12, accept_lower_power=True)
    seq = summary["sequential"]
    power = pair_time_power(SequentialDesign.plan(0.2), 12)
    assert seq["budget_pairs"] == 12 and seq["below_cap"] and seq["power"] == pytest.approx(power, abs=1e-9)
    assert seq["reason"] == "b_better" and "power" not in seq["design"]  # the planned power is not shown as such
    shown = f"power {power:.3f}"
    table = format_table(summary)
    assert shown in table and "power 0.8" not in table and "below the design's cap 156 pairs" in table
    # the per-arm rates and their intervals do not account for the stop: labelled so, in the summary and the table
    assert summary["descriptive"]["fields"] == ["<scene>", "overall", "arms"]
    assert "DESCRIPTIVE ONLY: the rates and 95% CIs above" in table
    # summary.json: no fixed-n verdict anywhere, the comparison marked descriptive; the ranking's one claim is
    # the test's decision, its rates and Wilson intervals descriptive.
    comparison = summary["comparison"]
    assert all("verdict" not in e for table in comparison["metrics"].values() for e in table.values())
    assert comparison["descriptive"]["dropped"] == ["verdict"] and "p_value" in comparison["descriptive"]["fields"]
    ranking = summary["ranking"]
    assert "wilson95" in ranking["descriptive"]["fields"] and "sequential test" in ranking["method"]
    assert {e["arm"]: e["surely_better_than"] for e in ranking["arms"]} == {"b": ["a"], "a": []}
    html = build_report(run_dir.path)
    assert shown in html and 'data-below-cap="true"' in html and "power 0.8" not in html
    paired = html[html.index('id="paired"') : html.index("</table>", html.index('id="paired"'))]
    assert "verdict" not in paired and "B better" not in paired
    assert 'data-descriptive="true"' in html and 'id="paired-descriptive"' in html
    assert 'id="rates-descriptive"' in html and "<dt>episode retries</dt>" in html
    # dz-gym-compare on the run: the same (no verdict in its JSON, the numbers descriptive)
    assert compare.main([str(run_dir.path), "--json", str(tmp_path / "cmp.json")]) == 0
    again = json.loads((tmp_path / "cmp.json").read_text())
    assert "verdict" not in again["scenes"]["overall"] and again["descriptive"]["dropped"] == ["verdict"]


def test_select_best_leaderboard_claims_are_anytime_valid_and_rates_descriptive(tmp_path):
    summary, run_dir = _gripper_run(tmp_path, {"a": 0.0, "b": 1.0, "c": 0.0}, num_envs=3, episodes=40)
    assert summary["selection"]["best"] == "b"
    ranking = summary["ranking"]
    assert ranking["descriptive"]["fields"][:2] == ["rate", "wilson95"] and "anytime-valid" in ranking["method"]
    better = {e["arm"]: set(e["surely_better_than"]) for e in ranking["arms"]}
    assert better["a"] == better["c"] == set() and better["b"] <= {"a", "c"}
    # the claims are the race's own e-processes at the higher threshold K(K-1)/alpha (replayed here by hand)
    rows = {(r["episode"], r["arm"]): r for r in run_dir.read_rows()}
    after = summary["selection"]["eliminated_after_seeds"]
    seeds = [{arm: bool(rows[(k, arm)]["success_at_end"]) for arm in "abc" if k < after.get(arm, k + 1)}
             for k in range(summary["selection"]["rounds"])]  # fmt: skip
    assert anytime_claims(seeds, 0.05) == {("b", arm) for arm in better["b"]}
    html = build_report(run_dir.path)
    note = re.search(r'<p class="muted" id="leaderboard-note">(.*?)</p>', html).group(1)
    assert "Descriptive only: success and the Wilson intervals" in note and "however the run stopped" in note
    assert "hold together" not in html
    # dz-gym-compare RUN prints the summary's leaderboard (claims valid at the stop), marked descriptive
    assert compare.main([str(run_dir.path), "--json", str(tmp_path / "rank.json")]) == 0
    board = json.loads((tmp_path / "rank.json").read_text())
    assert board["method"] == ranking["method"] and board["descriptive"] == ranking["descriptive"]


def test_anytime_claims_follow_best_arm_selection_e_processes():
    """Claim (i, j) exactly when BestArmSelection's e-process of i against j ever reached K(K-1)/alpha, errored
    episodes (None, one in six) counted against each claim by both."""
    rng = np.random.default_rng(3)
    rates = {"x": 0.8, "y": 0.45, "z": 0.4}
    threshold = math.log(3 * 2 / 0.05)
    claimed = 0
    for _ in range(5):
        race = BestArmSelection(list(rates), alpha=1e-300)  # never eliminates: every arm on every seed
        rounds, reached = [], set()
        for _ in range(60):
            outcome = {a: None if rng.random() < 1 / 6 else bool(rng.random() < p) for a, p in rates.items()}
            rounds.append(outcome)
            race.update(outcome)
            reached |= {(a, b) for i, a in enumerate(rates) for j, b in enumerate(rates)
                        if i != j and race.log_e(i, j) >= threshold}  # fmt: skip
        assert anytime_claims(rounds, 0.05) == reached
        claimed += len(reached)
    assert claimed > 0


def test_resume_locks_the_pairs_of_a_fixed_n_comparison_but_not_of_a_plain_run_or_a_race():
    from dz_gym.eval.config import resume_conflicts

    fixed = EvalConfig(backend="mujoco", num_envs=2, policy_b="hold", episodes=20)
    (line,) = resume_conflicts(fixed, EvalConfig(backend="mujoco", num_envs=2, policy_b="hold", episodes=40))
    assert line.startswith("episodes: a fixed-n comparison's pairs are fixed when it starts") and "--sequential" in line
    arms = ["a=hold", "b=reference"]
    assert resume_conflicts(EvalConfig(backend="mujoco", num_envs=2, arm_specs=arms, episodes=20),
                            EvalConfig(backend="mujoco", num_envs=2, arm_specs=arms, episodes=40))  # fmt: skip
    race = dict(backend="mujoco", num_envs=2, arm_specs=arms, select_best=True)
    assert resume_conflicts(EvalConfig(**race, episodes=20), EvalConfig(**race, episodes=40)) == []
    plain = dict(backend="mujoco", num_envs=2)
    assert resume_conflicts(EvalConfig(**plain, episodes=20), EvalConfig(**plain, episodes=40)) == []
