"""dz-gym-eval against the FLUX flavors of the reference server, on the embedded MuJoCo simulator: 8 envs of
scene 1 driven by the reference policy through BFL's composite and SGLang's views, 32 of 32 actions per
chunk; then with failures injected (each one the flavor's error frame and close 1011)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("mujoco")

from dz_gym.eval import cli  # noqa: E402
from dz_gym.eval.rundir import RunDir  # noqa: E402
from dz_gym.protocol.profiles import PROFILES  # noqa: E402
from dz_gym.server.launch import start_server_thread  # noqa: E402

ARGS = ["--num-envs", "8", "--scene", "1", "--no-video", "--no-report", "--no-progress"]


def _run(tmp_path: Path, url: str, *extra: str) -> tuple[list[dict], dict]:
    assert cli.main([*ARGS, "--server", url, "--output-root", str(tmp_path), *extra]) == 0
    (path,) = [p for p in tmp_path.iterdir() if p.is_dir()]
    run = RunDir(path)
    return run.read_rows(), json.loads((path / "summary.json").read_text())


def test_a_server_of_no_known_kind_is_a_usage_error_until_it_is_named(tmp_path, capsys):
    short = ["--num-envs", "1", "--max-steps", "8", "--no-video", "--no-report", "--no-progress"]
    with start_server_thread("hold", policy_args={"metadata": {"policy_name": "mine"}}, flavor="openpi") as server:
        assert cli.main([*short, "--server", server.url, "--output-root", str(tmp_path / "a")]) == 2
        line = [x for x in capsys.readouterr().err.splitlines() if "--server-kind" in x][-1]
        assert "['policy_name']" in line and "dreamzero|openpi|vllm-omni|flux3-bfl|sglang" in line
        argv = [*short, "--server", server.url, "--server-kind", "openpi", "--output-root", str(tmp_path / "b")]
        assert cli.main(argv) == 0


@pytest.mark.slow  # 8 envs x 450 steps on the embedded simulator
@pytest.mark.parametrize("flavor", ["flux3-bfl", "sglang"])
def test_eight_envs_of_scene_1_against_each_flux_flavor(flavor, tmp_path):
    with start_server_thread("reference", flavor=flavor) as server:
        rows, summary = _run(tmp_path, server.url + PROFILES[flavor].url_path)
    assert sorted(r["episode"] for r in rows) == list(range(8))  # every episode has a row
    assert [r["error"] for r in rows] == [None] * 8 and summary["overall"]["errored"] == 0
    assert all(r["server_calls"] == 15 for r in rows)  # ceil(450 / 32): all 32 actions of each chunk run
    assert summary["server"]["profile"] == flavor and summary["server"]["open_loop_horizon"] == 32
    assert summary["overall"]["success_any_step"]["rate"] >= 0.75


@pytest.mark.slow
@pytest.mark.parametrize("flavor", ["flux3-bfl", "sglang"])
def test_injected_1011_closes_cost_only_their_own_episodes_attempts(flavor, tmp_path):
    with start_server_thread("reference", flavor=flavor, fail_every=10) as server:  # 4 chunks an episode
        rows, summary = _run(tmp_path, server.url + PROFILES[flavor].url_path, "--max-steps", "128",
                             "--episode-retries", "5")  # fmt: skip
        injected = server.stats().failures
    assert injected >= 2 and sorted(r["episode"] for r in rows) == list(range(8))
    assert [r["error"] for r in rows] == [None] * 8  # every hit episode ran again from its reset
    retried = [r for r in rows if r["attempts"] > 1]
    assert sum(r["attempts"] - 1 for r in rows) == injected
    assert all(set(r["retried_events"]) == {"server_error"} for r in retried)
    assert all(r["reconnects"] == 0 and r["server_errors"] == 0 for r in rows if r["attempts"] == 1)
    assert summary["server"]["profile"] == flavor


@pytest.mark.slow  # starts a dz-gym-serve process
def test_the_embedded_server_runs_the_flavor_given_in_serve_args(tmp_path):
    argv = ["--num-envs", "2", "--max-steps", "64", "--no-video", "--no-report", "--no-progress",
            "--serve-arg=--flavor=sglang", "--output-root", str(tmp_path)]  # fmt: skip
    assert cli.main(argv) == 0
    (path,) = [p for p in tmp_path.iterdir() if p.is_dir()]
    rows, summary = RunDir(path).read_rows(), json.loads((path / "summary.json").read_text())
    assert [r["error"] for r in rows] == [None, None] and [r["server_calls"] for r in rows] == [2, 2]
    assert summary["server"]["flavor"] == summary["server"]["profile"] == "sglang"
    assert summary["server"]["url"].endswith("/openpi/policy")
