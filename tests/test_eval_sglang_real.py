"""dz-gym-eval against SGLang 0.5.23's real ``/openpi/policy`` route (its router, websocket loop and protocol
from the PyPI wheel under uvicorn; the FLUX model stood in for by dz-gym's reference policy, see
:mod:`dz_gym.testing.sglang_real`): 8 envs of the embedded scene 1 through the detected ``sglang`` profile,
360x640 views in dot keys, 32 of 32 actions per chunk; then with failures injected, each one SGLang's binary
``{"error"}`` frame and close 1011 on that env's connection only."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("mujoco")
sglang_real = pytest.importorskip("dz_gym.testing.sglang_real")
if sglang_real.installed_version() != sglang_real.SGLANG_VERSION:
    pytest.skip(f"needs sglang=={sglang_real.SGLANG_VERSION} (installed --no-deps)", allow_module_level=True)
pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")

from dz_gym.eval import cli  # noqa: E402
from dz_gym.eval.rundir import RunDir  # noqa: E402

ARGS = ["--num-envs", "8", "--scene", "1", "--no-video", "--no-report", "--no-progress"]


def _run(tmp_path: Path, url: str, *extra: str) -> tuple[list[dict], dict]:
    assert cli.main([*ARGS, "--server", url, "--output-root", str(tmp_path), *extra]) == 0
    (path,) = [p for p in tmp_path.iterdir() if p.is_dir()]
    return RunDir(path).read_rows(), json.loads((path / "summary.json").read_text())


@pytest.mark.slow  # 8 envs x 450 steps on the embedded simulator
def test_eight_envs_of_scene_1_against_the_real_sglang_route(tmp_path):
    with sglang_real.serve() as server:
        rows, summary = _run(tmp_path, server.url)  # no --server-kind: the handshake names the profile
        calls = server.pipeline.calls
    assert sorted(r["episode"] for r in rows) == list(range(8))  # every episode has a row
    assert [r["error"] for r in rows] == [None] * 8 and summary["overall"]["errored"] == 0
    assert all(r["server_calls"] == 15 for r in rows) and calls == 8 * 15  # ceil(450 / 32): 32 of 32 run
    assert summary["server"]["profile"] == "sglang" and summary["server"]["open_loop_horizon"] == 32
    assert summary["provenance"]["server_profile"] == "sglang"
    assert summary["overall"]["success_any_step"]["rate"] >= 0.75


@pytest.mark.slow
def test_the_real_route_s_1011_closes_cost_only_the_hit_episodes_attempts(tmp_path):
    pipeline = sglang_real.ReferencePipeline(fail_every=10)  # about one chunk in ten fails: 4 chunks an episode
    with sglang_real.serve(pipeline) as server:
        rows, summary = _run(tmp_path, server.url, "--max-steps", "128", "--episode-retries", "5")
    injected = pipeline.calls // 10
    assert injected >= 2 and sorted(r["episode"] for r in rows) == list(range(8))
    assert [r["error"] for r in rows] == [None] * 8  # every hit episode ran again from its reset
    assert sum(r["attempts"] - 1 for r in rows) == injected
    assert all(set(r["retried_events"]) == {"server_error"} for r in rows if r["attempts"] > 1)
    assert all(r["reconnects"] == 0 and r["server_errors"] == 0 for r in rows if r["attempts"] == 1)
