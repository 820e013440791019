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
from dz_gym.eval.plan import build_plan, plan_of
from dz_gym.eval.rundir import RunDir
from dz_gym.server.launch import start_server_thread
from dz_gym.server.policies import HoldPolicy
from dz_gym.testing.memory_client import MemoryPolicyClient
from dz_gym.testing.toy_env import ToyDroidEnv

PATH = "/v1/realtime/robot/openpi"


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
    assert [e.server for e in plan_of(config, ["embedded"]).entries] == ["ws://127.0.0.1:1/x", "embedded", "embedded"]


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
        factory = lambda scene, cfg: ToyDroidEnv(cfg.num_envs, scene=scene, max_episode_length=cfg.max_steps)  # noqa: E731
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


def test_three_arm_cli_run_on_the_embedded_simulator(tmp_path):
    """``--arm`` with embedded policies: one embedded server per arm, MuJoCo, tiny episodes."""
    argv = ["--num-envs", "3", "--episodes", "2", "--scene", "1", "--arm", "a=reference", "--arm", "b=hold",
            "--arm", "c=reference:skill=0.3", "--max-steps", "6", "--backend", "mujoco", "--no-video", "--no-report",
            "--output-root", str(tmp_path)]  # fmt: skip
    env = {**os.environ, "MUJOCO_GL": os.environ.get("MUJOCO_GL", "egl")}
    proc = subprocess.run([sys.executable, "-m", "dz_gym.eval.cli", *argv], env=env, capture_output=True, text=True,
                          timeout=600, check=False)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    (run,) = tmp_path.iterdir()
    rows = RunDir(run).read_rows()
    assert sorted((r["episode"], r["arm"]) for r in rows) == [(k, n) for k in range(2) for n in "abc"]
    assert all(r["error"] is None for r in rows)
    assert len({r["server"] for r in rows}) == 3  # an embedded server per arm
    summary = json.loads((run / "summary.json").read_text())
    assert {e["arm"] for e in summary["ranking"]["arms"]} == set("abc")
    assert summary["server"]["arms"]["c"]["policy"] == "reference:skill=0.3"
    assert "ranking of 3 arms on the same seeds" in proc.stdout
