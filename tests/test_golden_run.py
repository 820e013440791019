"""What a user sees of a run stays as it was: the README's quick start (``dz-gym-eval --num-envs 8 --scene 1``:
the embedded MuJoCo simulator, the embedded reference server) writes the rows, summary, trajectories, videos and
report of the committed golden file, apart from what varies between any two runs (:mod:`dz_gym.testing.golden`).

The golden file was written from such a run; after a change that must not alter outputs, this test says where
they differ. A change that alters them on purpose rewrites it with the generator of the module's docstring.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from report_runs import toy_run

from dz_gym.testing.golden import VOLATILE, first_differences, normalized_run

GOLDEN = Path(__file__).parent / "data" / "embedded_defaults_golden.json"
QUICK_START = ["--num-envs", "8", "--scene", "1"]


def the_run_dir(root: Path) -> Path:
    (path,) = [p for p in root.iterdir() if p.is_dir()]
    return path


def assert_same(got, want, what: str) -> None:
    differences = first_differences(got, want)
    assert not differences, f"{what} differs, first at:\n" + "\n".join(differences)


@pytest.mark.slow  # 90-220 s on 2 shared cores: 8 episodes of 450 steps, rendered and encoded
@pytest.mark.timeout(900)
def test_the_quick_start_writes_what_the_golden_run_wrote(tmp_path):
    pytest.importorskip("mujoco")
    from dz_gym.eval import cli

    if cli.default_policy() != "reference":
        pytest.skip("the reference policy is not registered")
    assert cli.main([*QUICK_START, "--output-root", str(tmp_path)]) == 0
    got = normalized_run(the_run_dir(tmp_path))
    assert_same(got, json.loads(GOLDEN.read_text()), "the quick start's run")


def test_two_runs_of_one_plan_normalize_alike(tmp_path):
    """Two real runs (toy env, reference server, one errored episode) differ only in volatile values."""
    a, b = (toy_run(tmp_path / name, scenes=(1,), episodes=4, num_envs=2, max_steps=6, fail_seed=1) for name in "ab")
    rows = a.read_rows()
    assert {r["session_id"] for r in rows}.isdisjoint(r["session_id"] for r in b.read_rows())
    assert_same(normalized_run(b.path), normalized_run(a.path), "a second run of the same plan")


def write_run(path: Path, *, success: bool, session: str, wall: float, port: int) -> Path:
    """A small hand-made run directory: one row, a summary, a trajectory, a video and a report page."""
    url = f"ws://127.0.0.1:{port}/v1/realtime/robot/openpi"
    (path / "trajectories").mkdir(parents=True)
    (path / "videos").mkdir()
    (path / "config.json").write_text(json.dumps({"scenes": [1], "episodes": 1}))
    row = {"scene": 1, "episode": 0, "seed": 0, "server": url, "session_id": session, "steps": 4,
           "success_at_end": success, "started_at": f"2026-01-01T00:00:{wall:02.0f}Z", "wall_s": wall,
           "latency_ms": {"p50": wall}, "latencies_ms": [wall], "attempts": 1}  # fmt: skip
    (path / "episodes.jsonl").write_text(json.dumps(row) + "\n")
    summary = {"1": {"episodes": 1, "latency_ms": {"p50": wall}}, "overall": {"latency_ms": {"p50": wall}},
               "wall_s": wall, "env_steps_per_s": 4 / wall, "server_busy_s": {url: wall / 2},
               "server_utilization": 0.5, "server_utilization_per_server": {url: 0.5}, "latency_ms": {"p50": wall},
               "segments": [{"started_at": str(wall), "wall_s": wall, "busy_s": {url: wall}, "env_steps": 4}],
               "versions": {"numpy": str(wall)}, "command": f"dz-gym-eval --output-root {path.parent}",
               "provenance": {"simulator": {"isaaclab": str(wall)}, "seeds": {"seed": 0},
                              "dz_gym": {"version": "0.1.0", "commit": "ab" * 20 if wall > 2 else "cd" * 20,
                                         "dirty": wall > 2}},
               "server_metadata": {url: {"needs_session_id": True}}}  # fmt: skip
    (path / "summary.json").write_text(json.dumps(summary))
    np.savez(path / "trajectories" / "scene1_ep0000.npz", actions=np.ones((4, 8), np.float32),
             chunk_latency_ms=np.full(4, wall, np.float32))  # fmt: skip
    (path / "videos" / "scene1_ep0000.mp4").write_bytes(b"frames")
    episodes = [{"k": "scene1_ep0000", "i": {"session_id": session, "wall_s": wall, "started_at": str(wall),
                 "server": url}, "c": [1, 0, 0, 0, "success", "success", "yes", 4, 1, str(wall), "time_limit"]}]  # fmt: skip
    (path / "report.html").write_text(
        f"<html><head><title>{path.name}</title><style>p {{ margin: 0; }}</style></head><body>"
        f'<p class="muted">{path.name} · written 2026-01-01 00:00:{wall:02.0f} UTC</p>'
        f"<dl><dt>started</dt><dd>{wall}</dd><dt>env-steps/s</dt><dd>{4 / wall:.1f}</dd></dl>"
        f'<td data-field="success_at_end">{int(success)}/1</td><td data-field="latency">{wall:.0f}</td>'
        f'<svg class="plot" id="plot-latency" viewBox="0 0 9 9"><rect height="{wall}"/></svg>'
        f'<ul class="util"><li><code>{url}</code>: {wall}%</li></ul>'
        f'<script type="application/json" id="dz-episodes">{json.dumps(episodes)}</script>'
        f'<script type="application/json" id="dz-traj">{{"scene1_ep0000": {{"T": 4}}}}</script>'
        "<script>var x = 1;</script></body></html>"
    )
    return path


def test_volatile_values_are_dropped_and_the_rest_kept(tmp_path):
    a = normalized_run(write_run(tmp_path / "a" / "20260101-000001_scene1", success=True, session="s1", wall=1.0,
                                 port=8001))  # fmt: skip
    b = normalized_run(write_run(tmp_path / "b" / "20260101-000003_scene1", success=True, session="s2", wall=3.0,
                                 port=8002))  # fmt: skip
    assert_same(b, a, "a run differing only in volatile values")
    (row,) = a["rows"]
    assert not set(VOLATILE["rows"]) & set(row)
    assert row == {"scene": 1, "episode": 0, "seed": 0, "steps": 4, "success_at_end": True, "attempts": 1,
                   "server": "ws://127.0.0.1:{port}/v1/realtime/robot/openpi"}  # fmt: skip
    summary = a["summary"]
    assert summary["1"] == {"episodes": 1} and summary["overall"] == {} and summary["segments"] == [{"env_steps": 4}]
    assert summary["provenance"] == {"seeds": {"seed": 0}, "dz_gym": {"version": "0.1.0"}}
    assert summary["command"] == "dz-gym-eval --output-root {output-root}"
    assert "versions" not in summary and "wall_s" not in summary and "server_utilization" not in summary
    assert list(a["trajectories"]["scene1_ep0000.npz"]) == ["actions"]
    assert a["videos"]["scene1_ep0000.mp4"].startswith("sha256:") and a["run"] == "{time}_scene1"
    (episode,) = a["report"]["episodes"]
    assert (
        episode["i"] == {"server": "ws://127.0.0.1:{port}/v1/realtime/robot/openpi"} and episode["c"][9] == "{masked}"
    )
    assert a["report"]["trajectories"] == {"scene1_ep0000": {"T": 4}}
    page = "\n".join(a["report"]["page"])
    for kept in ('<td data-field="success_at_end">1/1</td>', "<title>{time}_scene1</title>", "<style>sha256:"):
        assert kept in page


def test_a_changed_result_is_named(tmp_path):
    a = normalized_run(write_run(tmp_path / "a" / "20260101-000001_scene1", success=True, session="s", wall=1.0,
                                 port=1))  # fmt: skip
    b = normalized_run(write_run(tmp_path / "b" / "20260101-000001_scene1", success=False, session="s", wall=1.0,
                                 port=1))  # fmt: skip
    first, page = first_differences(b, a)
    assert first == ".rows[0].success_at_end: got false, want true"
    assert page.startswith(".report.page[") and 'success_at_end\\">0/1</td>", want ' in page
