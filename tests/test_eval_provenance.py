"""Provenance in summary.json and the report: each probe on its own (with the commands' outputs given), and a
real run's summary and report carrying them."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from dz_gym.eval import provenance as prov
from dz_gym.eval.config import EvalConfig
from dz_gym.report.page import provenance_line


def test_gpu_reads_nvidia_smi_when_present_and_says_none_without_one(monkeypatch):
    monkeypatch.delitem(sys.modules, "torch", raising=False)  # (torch's own answer is taken when it is imported)
    monkeypatch.setattr(prov.shutil, "which", lambda name: "/usr/bin/nvidia-smi" if name == "nvidia-smi" else None)
    out = "NVIDIA H100 80GB HBM3, 580.82.07\nNVIDIA H100 80GB HBM3, 580.82.07\n"
    seen = []
    assert prov.gpu(run=lambda argv: seen.append(argv) or out.strip()) == {
        "name": "NVIDIA H100 80GB HBM3", "driver": "580.82.07"}  # fmt: skip
    assert seen[0][:2] == ["nvidia-smi", "--query-gpu=name,driver_version"]
    assert prov.gpu(run=lambda argv: None) == "none"  # nvidia-smi failed, and no torch with CUDA here
    monkeypatch.setattr(prov.shutil, "which", lambda name: None)
    assert prov.gpu() == "none"


def test_the_renderer_of_the_embedded_simulator_is_its_gl_backend(monkeypatch):
    monkeypatch.setenv("MUJOCO_EGL_DEVICE_ID", "1")
    drawn = prov.renderer("mujoco")
    assert drawn["simulator"] == "mujoco" and drawn["egl_device_id"] == "1" and "backend" in drawn
    assert prov.renderer("isaac")["simulator"] == "isaac"


def test_simulator_versions_are_none_where_not_installed():
    def version(name):
        if name == "mujoco":
            return "3.3.0"
        raise prov.importlib.metadata.PackageNotFoundError(name)

    versions = prov.simulator_versions(version)
    assert versions["mujoco"] == "3.3.0" and versions["newton"] is None and versions["warp-lang"] is None
    assert set(versions) == set(prov.SIMULATOR_PACKAGES)


def test_dz_gyms_commit_from_a_checkout_and_nothing_fails_without_git():
    source = prov.dz_gym_source()
    repo = Path(prov.__file__).resolve().parents[2]
    head = subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True, text=True)
    if head.returncode == 0:
        assert source["commit"] == head.stdout.strip() and isinstance(source["dirty"], bool)
    no_git = prov.dz_gym_source(run=lambda argv: None)
    assert no_git["commit"] is None and no_git["dirty"] is None


def test_handshakes_are_kept_as_sent_and_json_safe():
    raw = {"object": "action.metadata", "output": {"action_horizon": np.int64(32), "shape": np.array([32, 8])},
           b"blob": b"\x00\xff", "scale": float("inf")}  # fmt: skip
    safe = prov.json_safe(raw)
    assert safe == {"object": "action.metadata", "output": {"action_horizon": 32, "shape": [32, 8]},
                    "blob": {"base64": "AP8="}, "scale": "inf"}  # fmt: skip
    json.dumps(safe, allow_nan=False)


def test_the_server_profile_is_one_name():
    assert prov.server_profile({"ws://a": {"profile": "sglang"}, "ws://b": {"profile": "sglang"}}, {}) == "sglang"
    assert prov.server_profile({"ws://a": {"raw": {}}}, {"flavor": "vllm-omni"}) == "vllm-omni"
    assert prov.server_profile({}, {}) is None


def test_seeds_and_the_policy_seed_rule():
    from dz_gym.eval.clients import policy_seed

    config = EvalConfig(backend="mujoco", seed=10, episodes=4, policy_seed=True, num_envs=2)
    seeds = prov.provenance(config, {}, {})["seeds"]
    assert seeds["seed"] == 10 and seeds["episode_seeds"] == [10, 13]
    assert seeds["policy_seed"]["first"] == policy_seed(10) and seeds["policy_seed"]["last"] == policy_seed(13)
    assert prov.provenance(EvalConfig(backend="mujoco", num_envs=2), {}, {})["seeds"]["policy_seed"] is None


def test_the_report_line():
    assert provenance_line(None) == "-"
    line = provenance_line({"gpu": "none", "renderer": {"backend": "egl"}, "dz_gym": {"version": "0.1.0"}})
    assert line == "no GPU; renderer egl; dz-gym 0.1.0; server -"


def test_a_runs_summary_and_report_carry_its_provenance(tmp_path):
    pytest.importorskip("mujoco")
    from dz_gym.eval import cli

    argv = ["--num-envs", "1", "--episodes", "1", "--max-steps", "2", "--no-progress", "--no-video",
            "--policy-seed", "--output-root", str(tmp_path)]  # fmt: skip
    assert cli.main(argv) == 0
    (run,) = [p for p in tmp_path.iterdir() if p.is_dir()]
    summary = json.loads((run / "summary.json").read_text())
    got = summary["provenance"]
    assert got["renderer"]["simulator"] == "mujoco" and got["renderer"]["backend"]
    assert got["gpu"] == "none" or set(got["gpu"]) == {"name", "driver"}
    assert got["simulator"]["mujoco"] and "newton" in got["simulator"]
    assert got["server_profile"] == summary["server"]["flavor"]
    (url,) = got["server_handshakes"]
    assert got["server_handshakes"][url]["image_resolution"] == [180, 320]  # the reference server's, as sent
    assert got["seeds"]["episode_seeds"] == [0, 0] and got["seeds"]["policy_seed"]["first"] >= 0
    page = (run / "report.html").read_text()
    assert "<dt>provenance</dt>" in page and "<summary>provenance</summary>" in page
