"""Runs of K >= 2 named arms (``--arm NAME=POLICY_OR_URL``): the plan's layout, the router, the usage errors,
the rows and the summary's ranking, and dz-gym-compare's leaderboard of such a run."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from dz_gym import compare
from dz_gym.eval import cli
from dz_gym.eval.clients import ArmRouter
from dz_gym.eval.config import EvalConfig
from dz_gym.eval.evaluate import evaluate
from dz_gym.eval.plan import build_plan, plan_of, servers_of_arms
from dz_gym.eval.rundir import RunDir
from dz_gym.server.launch import start_server_thread
from dz_gym.server.policies import HoldPolicy
from dz_gym.testing.memory_client import MemoryPolicyClient
from dz_gym.testing.toy_env import GripperToyEnv, ToyDroidEnv

PATH = "/v1/realtime/robot/openpi"


def _cli_run(argv, root):
    """Run ``dz-gym-eval ARGV`` in a subprocess (bounded); the one run directory it made under ``root``
    and what it printed."""
    env = {**os.environ, "MUJOCO_GL": os.environ.get("MUJOCO_GL", "egl")}
    proc = subprocess.run([sys.executable, "-m", "dz_gym.eval.cli", *argv], env=env, capture_output=True, text=True,
                          timeout=600, check=False)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    (run,) = root.iterdir()
    return run, proc.stdout


def test_the_plan_puts_the_k_arms_of_a_seed_on_neighbouring_slots():
    arms = [("x", ["ws://x"]), ("y", ["ws://y1", "ws://y2"]), ("z", ["ws://z"])]
    plan = build_plan(scenes=[1], episodes=3, num_envs=6, seed=5, servers=["ws://x"], arm_servers=arms)
    assert plan.arms == ("x", "y", "z")
    assert [(e.episode, e.arm, e.seed, e.slot, e.pair) for e in plan.entries[:4]] == [
        (0, "x", 5, 0, 0), (0, "y", 5, 1, 0), (0, "z", 5, 2, 0), (1, "x", 6, 3, 1)]  # fmt: skip
    assert [[(e.episode, e.arm) for e in q] for q in plan.slot_queues(1)] == [
        [(0, "x"), (2, "x")], [(0, "y"), (2, "y")], [(0, "z"), (2, "z")], [(1, "x")], [(1, "y")], [(1, "z")]]  # fmt: skip
    assert plan.arm_servers("y") == ["ws://y1", "ws://y2"] and plan.arm_servers("z") == ["ws://z", "ws://z"]
    with pytest.raises(ValueError, match="num_envs"):
        build_plan(scenes=[1], episodes=1, num_envs=2, seed=0, servers=["ws://x"], arm_servers=arms)
    config = EvalConfig(num_envs=3, backend="mujoco", arm_specs=["p=ws://127.0.0.1:1/x", "q=hold", "r=reference"])
    plan = plan_of(config)  # from the config alone: no servers yet
    assert plan.slot_servers == () and {e.server for e in plan.entries} == {None}
    with pytest.raises(ValueError, match="^arm_servers: arm 'q' names a policy; it needs its server's URL"):
        servers_of_arms(config)
    started = servers_of_arms(config, {"q": ["ws://127.0.0.1:2/q"], "r": ["ws://127.0.0.1:3/r"]})
    assert [e.server for e in plan.resolve(arm_servers=started).entries] == [
        "ws://127.0.0.1:1/x", "ws://127.0.0.1:2/q", "ws://127.0.0.1:3/r"]  # fmt: skip


def test_arm_router_routes_slot_k_j_plus_i_to_arm_i():
    clients = {n: MemoryPolicyClient(HoldPolicy(), 2, url=f"memory://{n}") for n in ("x", "y", "z")}
    router = ArmRouter(clients)
    assert router.num_sessions == 6 and len(router.connect()) == 6
    assert [router.url(i) for i in range(6)] == [f"memory://{n}" for n in "xyzxyz"]
    with pytest.raises(ValueError, match="clients"):
        ArmRouter({"x": clients["x"]})
    router.close()


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["--arm", "a=hold"], "--arm: expected at least 2 arms"),
        (["--arm", "a=hold", "--arm", "a=reference"], "--arm: expected distinct arm names"),
        (["--arm", "=hold", "--arm", "b=hold"], "--arm: expected NAME=POLICY_OR_URL"),
        (["--arm", "a", "--arm", "b=hold"], "--arm: expected NAME=POLICY_OR_URL"),
        (["--arm", "a=hold", "--arm", "b=ws://"], "--arm:"),
        (["--arm", "a=hold", "--arm", "b=hold", "--arm", "c=hold", "--num-envs", "4"],
         "--num-envs: a run of 3 arms needs a multiple of 3 envs"),
        (["--arm", "a=hold", "--arm", "b=hold", "--policy-b", "hold"], "--arm: --arm names every arm"),
        (["--arm", "a=hold", "--arm", "b=hold", "--sequential"], "--sequential: only for A/B runs"),
        (["--arm", "a=hold", "--arm", "b=hold", "--ray", "local"], "--ray"),
    ],
)  # fmt: skip
def test_arm_usage_errors_exit_2(capsys, argv, needle):
    with pytest.raises(SystemExit) as exc:
        cli.main(["--backend", "mujoco", *argv])
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip()
    assert needle in err and len(err.splitlines()) == 1


def test_three_arms_on_server_urls_write_rows_for_every_arm_and_a_ranking(tmp_path, capsys):
    with start_server_thread("hold") as x, start_server_thread("hold") as y, start_server_thread("hold") as z:
        urls = {"x": x.url + PATH, "y": y.url + PATH, "z": z.url + PATH}
        config = EvalConfig(scenes=[1], num_envs=3, episodes=4, max_steps=5, video=False, report=False,
                            arm_specs=[f"{n}={u}" for n, u in urls.items()])  # fmt: skip
        run_dir = RunDir.create(tmp_path, config)
        factory = lambda scene, cfg: ToyDroidEnv(cfg.plan.num_envs, scene=scene, max_episode_length=cfg.plan.max_steps)  # noqa: E731
        summary = evaluate(config, run_dir, env_factory=factory, progress=False)
    rows = run_dir.read_rows()
    assert sorted((r["episode"], r["arm"]) for r in rows) == [(k, n) for k in range(4) for n in "xyz"]
    assert all(r["server"] == urls[r["arm"]] and r["env"] % 3 == "xyz".index(r["arm"]) for r in rows)
    assert all(r["error"] is None for r in rows)
    ranking = summary["ranking"]
    assert [e["arm"] for e in ranking["arms"]] and {e["arm"] for e in ranking["arms"]} == set("xyz")
    assert all(e["n"] == 4 and e["rank_interval"] == [1, 3] for e in ranking["arms"])  # hold = hold = hold
    assert set(summary["arms"]) == {"x", "y", "z", "labels"} and "comparison" not in summary
    assert compare.main([str(run_dir.path)]) == 0
    out = capsys.readouterr().out
    assert "ranking of 3 arms on the same seeds" in out and all(f" {n} " in out for n in "xyz")


@pytest.mark.slow  # about 7 s on 2 cores; runs in the first environment's pass
def test_three_arm_cli_run_on_the_embedded_simulator(tmp_path):
    """``--arm`` with embedded policies: one embedded server per arm, MuJoCo, tiny episodes."""
    argv = ["--num-envs", "3", "--episodes", "2", "--scene", "1", "--arm", "a=reference", "--arm", "b=hold",
            "--arm", "c=reference:skill=0.3", "--max-steps", "6", "--backend", "mujoco", "--no-video", "--no-report",
            "--output-root", str(tmp_path)]  # fmt: skip
    run, out = _cli_run(argv, tmp_path)
    rows = RunDir(run).read_rows()
    assert sorted((r["episode"], r["arm"]) for r in rows) == [(k, n) for k in range(2) for n in "abc"]
    assert all(r["error"] is None for r in rows)
    assert len({r["server"] for r in rows}) == 3  # an embedded server per arm
    summary = json.loads((run / "summary.json").read_text())
    assert {e["arm"] for e in summary["ranking"]["arms"]} == set("abc")
    assert summary["server"]["arms"]["c"]["policy"] == "reference:skill=0.3"
    assert "ranking of 3 arms on the same seeds" in out


# -- --select-best ---------------------------------------------------------------------------------------


def _row(k, arm, success, error=None):
    return {"scene": 1, "episode": k, "seed": k, "arm": arm, "error": error, "success_at_end": success}


def test_the_race_folds_groups_in_plan_order_and_ignores_eliminated_arms():
    from dz_gym.eval.race import ArmRace

    order = [(1, k) for k in range(40)]
    race = ArmRace(["x", "y", "z"], order=order)
    for arm in "xyz":  # group 1 complete before group 0: it waits
        race.add(_row(1, arm, arm == "x"))
    assert race.next_group == 0 and race.selection.rounds == 0
    for arm in "xyz":
        race.add(_row(0, arm, arm == "x"))
    assert race.next_group == 2 and race.selection.rounds == 2
    k = 2
    while not race.eliminated_arms:
        for arm in "xyz":
            race.add(_row(k, arm, arm != "z"))  # z never solves; x and y tie
        k += 1
    assert race.eliminated_arms == {"z"} and race.seeds == {"z": k} and not race.stopped
    race.add(_row(k, "x", True))
    race.add(_row(k, "y", False))  # z is out: the group is complete without it
    assert race.next_group == k + 1
    summary = race.summary()
    assert summary["eliminated_after_seeds"] == {"z": k} and summary["best"] is None and summary["planned_seeds"] == 40
    rebuilt = ArmRace(["x", "y", "z"], order=order,
                      rows=[_row(j, a, a != "z") for j in range(2, k) for a in "xyz"]
                      + [_row(j, a, a == "x") for j in range(2) for a in "xyz"]
                      + [_row(k, "x", True), _row(k, "y", False)])  # fmt: skip
    assert rebuilt.summary() == summary  # a resume rebuilds the same state, whatever order the rows come in


def test_select_best_usage_errors(capsys):
    with pytest.raises(SystemExit) as exc:
        cli.main(["--backend", "mujoco", "--select-best"])
    assert exc.value.code == 2
    assert "--select-best: only for runs of named arms" in capsys.readouterr().err


def test_select_best_eliminates_the_worse_arms_and_stops_with_the_best(tmp_path):
    """Arm x closes the gripper (solves 2 seeds in 3), y and z hold it open (never): both go out, x is named, the
    episodes left are not run and eliminated arms' slots idle."""
    with (start_server_thread(HoldPolicy(gripper=1.0)) as x, start_server_thread("hold") as y,
          start_server_thread("hold") as z):  # fmt: skip
        specs = [f"x={x.url + PATH}", f"y={y.url + PATH}", f"z={z.url + PATH}"]
        config = EvalConfig(scenes=[1], num_envs=3, episodes=60, max_steps=6, video=False, report=False,
                            arm_specs=specs, select_best=True)  # fmt: skip
        run_dir = RunDir.create(tmp_path, config)
        summary = evaluate(config, run_dir, progress=False,
                           env_factory=lambda s, cfg: GripperToyEnv(cfg.plan.num_envs, scene=s, max_episode_length=6))  # fmt: skip
    selection = summary["selection"]
    assert selection["best"] == "x" and selection["stopped"], selection["why"]
    after = selection["eliminated_after_seeds"]
    assert set(after) == {"y", "z"} and max(after.values()) < 60
    rows = run_dir.read_rows()
    assert len(rows) < 3 * 60 and summary["complete"]
    for arm in "yz":  # no row of an eliminated arm past its elimination (but what was already running: 1 seed)
        assert max(r["episode"] for r in rows if r["arm"] == arm) <= after[arm]


@pytest.mark.slow  # about 6 s on 2 cores; runs in the first environment's pass
def test_select_best_with_hold_arms_never_names_a_winner(tmp_path):
    """Three identical arms on the embedded simulator (tiny episodes): no arm is ever eliminated."""
    argv = ["--num-envs", "3", "--episodes", "4", "--scene", "1", "--arm", "a=hold", "--arm", "b=hold", "--arm",
            "c=hold", "--select-best", "--max-steps", "6", "--backend", "mujoco", "--no-video", "--no-report",
            "--output-root", str(tmp_path)]  # fmt: skip
    run, out = _cli_run(argv, tmp_path)
    selection = json.loads((run / "summary.json").read_text())["selection"]
    assert selection["best"] is None and selection["survivors"] == ["a", "b", "c"] and selection["rounds"] == 4
    assert len(RunDir(run).read_rows()) == 12 and "best not named" in out


@pytest.mark.slow  # about 40 s on 2 loaded cores: the race ends after 8 seeds (2 batches)
def test_embedded_select_best_finds_the_full_reference_policy(tmp_path):
    """``--arm a=reference --arm b=reference:skill=0.1 --arm c=reference:skill=0 --select-best`` on the
    embedded simulator, bounded: at most 24 seeds of 180 steps (the full policy places the cube within about
    110-130 steps). The degraded arms are far enough below the full policy that the race ends within a few
    batches of seeds (the skill draws depend on the episode seed alone)."""
    argv = ["--num-envs", "12", "--episodes", "24", "--scene", "1", "--arm", "a=reference", "--arm",
            "b=reference:skill=0.1", "--arm", "c=reference:skill=0", "--select-best", "--max-steps", "180",
            "--backend", "mujoco", "--no-video", "--no-report", "--output-root", str(tmp_path)]  # fmt: skip
    env = {**os.environ, "MUJOCO_GL": os.environ.get("MUJOCO_GL", "egl")}
    proc = subprocess.run([sys.executable, "-m", "dz_gym.eval.cli", *argv], env=env, capture_output=True, text=True,
                          timeout=3000, check=False)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    (run,) = tmp_path.iterdir()
    selection = json.loads((run / "summary.json").read_text())["selection"]
    assert selection["best"] == "a", selection["why"]
    assert (
        set(selection["eliminated_after_seeds"]) == {"b", "c"}
        and max(selection["eliminated_after_seeds"].values()) < 24
    )
    assert "SELECTION (--select-best): best a" in proc.stdout
