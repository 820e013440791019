"""The Isaac backend against the real isaaclab wheels: 2.2.0 (Python 3.11, ``.venv-isaac22``) and 3.0.0 (Python
3.12, ``.venv-isaac30``), built by ``scripts/setup.sh --isaac22`` / ``--isaac30``.

Everything of Isaac Lab here is the wheel's own code; only Isaac Sim's modules (``isaacsim``, ``carb``,
``omni.*``, Isaac Sim's USD schemas) are faked, by :mod:`isaac_kit`. Each scenario runs in a fresh process
(:mod:`isaac_wheel_probe`), since Isaac Lab's launcher changes process state for good. Skipped where no
isaaclab wheel is installed (the main ``.venv``).
"""

from __future__ import annotations

import importlib.metadata
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

PROBE = Path(__file__).resolve().parent / "isaac_wheel_probe.py"

try:
    ISAACLAB = importlib.metadata.version("isaaclab")
except importlib.metadata.PackageNotFoundError:
    ISAACLAB = None
pytestmark = pytest.mark.skipif(
    ISAACLAB not in ("2.2.0", "3.0.0"), reason="needs the isaaclab 2.2.0 or 3.0.0 wheel (setup.sh --isaac22/--isaac30)"
)
V3 = bool(ISAACLAB) and ISAACLAB.startswith("3")
_RUNS: dict[str, dict] = {}


def probe(scenario: str) -> dict:
    """What ``isaac_wheel_probe.py scenario`` saw (run once per test session)."""
    if scenario not in _RUNS:
        done = subprocess.run(
            [sys.executable, str(PROBE), scenario], capture_output=True, text=True, timeout=240, check=False
        )
        lines = [line for line in done.stdout.splitlines() if line.startswith("PROBE ")]
        assert done.returncode == 0 and lines, f"probe {scenario} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
        _RUNS[scenario] = json.loads(lines[-1][len("PROBE ") :])
    return _RUNS[scenario]


def ok(result: dict, *steps: str) -> dict:
    """``result``, after checking that the named steps raised nothing (their traceback otherwise)."""
    failed = {name: result.get("tracebacks", {}).get(name) for name in steps if name in result.get("errors", {})}
    assert not failed, "\n".join(f"{name}:\n{trace}" for name, trace in failed.items())
    return result


# -- version detection ----------------------------------------------------------------------------------------
def test_version_of_the_wheel_install():
    result = ok(probe("wheel"), "detect")
    if V3:
        assert result["detect"] == [[3, 0], "Isaac Lab 3.0.0", True]  # launch_simulation read from the file
    else:
        assert result["detect"] == [[2, 2], "Isaac Lab 2.2.0", False]


@pytest.mark.skipif(not V3, reason="3.0.0's fallback version")
def test_version_of_a_3_0_checkout_without_metadata_is_read_from_its_launcher():
    """A 3.0 checkout on PYTHONPATH reports "0.0.0"; only the launcher file tells it is 3.0 (finding 4: the
    launcher was looked for in isaaclab_tasks/utils/, where no release has it, so it was refused)."""
    result = ok(probe("wheel"), "checkout")
    assert result["checkout_fallback_version"] == "0.0.0" and result["checkout_release"] == [3, 0]


def test_version_of_a_source_install_is_the_extensions():
    result = ok(probe("source"), "detect", "packages")
    if V3:  # source/isaaclab/pyproject.toml of the 3.0.0 release
        assert result["extension_version"] == "28.0.0" and result["detect"][0] == [3, 0] and result["detect"][2]
    else:  # source/isaaclab/config/extension.toml of 2.2.0
        assert result["extension_version"] == "0.44.9" and result["detect"][0] == [2, 2]
        assert "source install" in result["detect"][1]
    assert result["tasks_found"] and result["check_packages"].startswith("sim-evals is not installed")


# -- finding 1: the package check before launch ---------------------------------------------------------------
def test_package_check_before_launch_finds_isaaclab_tasks_of_the_wheel():
    """2.2.0: ``isaaclab_tasks`` is under ``isaaclab/source/`` and invisible to ``find_spec`` before Kit runs;
    the check used to stop every wheel install with "Isaac Lab is not installed"."""
    result = ok(probe("wheel"), "packages")
    assert result["tasks_find_spec_before_launch"] is V3  # 3.0.0 ships isaaclab_tasks as a top-level package
    assert result["tasks_found_before_launch"]
    # only sim-evals is missing here (it is not on PyPI)
    assert result["check_packages"].startswith("sim-evals is not installed (module sim_evals)")


# -- finding 2 (2.2) / finding 4 (3.0): launcher flags and the launch -----------------------------------------
def test_launcher_flags_come_from_the_installed_launcher():
    flags = set(ok(probe("wheel"), "launcher_flags")["launcher_flags"])
    assert {"--device", "--experience", "--livestream", "--kit_args"} <= flags
    if V3:  # isaaclab.app.add_launcher_args: no --headless, a visualizer list instead
        assert {"--visualizer", "--viz"} <= flags and "--headless" not in flags and "--enable_cameras" not in flags
    else:  # AppLauncher.add_app_launcher_args, reached through 'from isaaclab.app import AppLauncher'
        assert {"--headless", "--enable_cameras"} <= flags


def test_launch_starts_one_headless_app_with_cameras_and_closes_it():
    result = ok(probe("wheel"), "launch", "close")
    assert len(result["apps"]) == 1
    config, experience = result["apps"][0]
    assert config["headless"] is True and experience == "isaaclab.python.headless.rendering.kit"
    assert result["launch_args"]["enable_cameras"] is True and result["launch_args"]["device"] == "cpu"
    if V3:  # through launch_simulation(None, args) with Kit asked for explicitly
        assert result["launch_args"]["require_kit"] is True
    assert result["closed"] == [True]


def test_isaac_lab_wheel_without_isaac_sim_is_not_picked_by_auto_and_the_cli_builds():
    """An isaaclab wheel alone (no Isaac Sim): ``--backend auto`` takes MuJoCo, and the CLI's parser builds
    (2.2's wheel raises ImportError on import without Isaac Sim: dz-gym-eval --help used to crash). Beside
    3.0's kit-less stack (Newton, Warp, MuJoCo-Warp: the third CI environment) auto takes Isaac Lab."""
    result = ok(probe("nokit"), "detect", "build_parser")
    expected = "isaac" if result["kitless_found"] else "mujoco"
    assert not result["isaacsim_found"] and result["auto"] == expected
    assert result["flags_wanted_auto"] is (expected == "isaac")
    assert result["detect"] == ([3, 0] if V3 else [2, 2])  # read from the metadata, nothing imported
    if V3:  # 3.0's launcher flags need no Kit; they join the CLI without a clash
        assert "--viz" in result["launcher_flags"] and "--viz" in result["cli_flags_with_isaac"]
    else:
        assert "Isaac Sim must be installed" in result["errors"]["add_launcher_args"]
        assert "--scene" in result["cli_flags_with_isaac"]


def test_dz_gym_eval_help_runs_where_the_wheel_is_importable():
    done = subprocess.run(
        [sys.executable, "-c", "from dz_gym.eval.cli import main; main(['--help'])"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0 and "--backend" in done.stdout, done.stderr[-2000:]


# -- after launch: the real config classes, parse_env_cfg, mdp terms ------------------------------------------
def test_parse_env_cfg_as_sim_evals_calls_it():
    result = probe("wheel")
    if not V3 and "torchvision" in result.get("errors", {}).get("parse_env_cfg", ""):
        pytest.skip("isaaclab_tasks 2.2.0 imports torchvision, whose PyPI builds need CUDA torch (not on CPU)")
    ok(result, "parse_env_cfg")
    assert result["parse_env_cfg"][1:] == [3, "cpu", True]  # num_envs, device, use_fabric=True


def test_the_camera_term_of_each_version():
    name, is_class, has_image, has_image_rgb = ok(probe("wheel"), "image_term")["image_term"]
    if V3:
        assert (name, is_class, has_image, has_image_rgb) == ("image_rgb", True, False, True)
    else:
        assert (name, is_class, has_image) == ("image", False, True)


def test_quaternion_order_is_read_from_the_installed_configs():
    assert ok(probe("wheel"), "quaternion_order")["quaternion_order"] == ("xyzw" if V3 else "wxyz")


def test_reset_signature_the_adapter_calls_with_keywords():
    signature = ok(probe("wheel"), "reset_signature")["reset_signature"]
    if V3:
        assert signature.startswith("(self, env_ids:") and ", *, seed:" in signature
    else:
        assert signature.startswith("(self, seed:") and "env_ids:" in signature


def test_multi_env_patches_on_the_real_config_classes():
    patch = ok(probe("wheel"), "patch_env_cfg")["patch"]
    assert patch["arm_func"] == "arm_joint_pos" and patch["gripper_func"] == "gripper_pos"
    assert patch["gripper_clip"] == [0.0, 1.0]  # the term's clip stays
    assert patch["sphere_light"] == "{ENV_REGEX_NS}/sphere_light" and patch["dome_light"] == "/World/DomeLight"
    assert patch["probe_term"] == ["TerminationTermCfg", False, True]
    assert patch["reward_probe"] == "RewardTermCfg" and patch["env_spacing"] == 30.0
    if V3:
        assert patch["rerender"][1] >= 1 and all(c == ["CameraCfg", 4, 6] for c in patch["cameras"])
    else:  # 2.2's TiledCameraCfg takes every field of the CameraCfg it replaces
        assert patch["rerender"][0] is True and all(c == ["TiledCameraCfg", 4, 6] for c in patch["cameras"])
    assert patch["to_dict"][0] == "arm_joint_pos"  # the patched config still serialises (Isaac Lab dumps it)


# -- finding 5: an object's orientation under a scaled transform ----------------------------------------------
def test_prim_entity_pose_under_a_scaled_transform_is_a_unit_quaternion():
    entity = ok(probe("wheel"), "prim_entities")["prim_entities"]
    assert entity["type"] == "RigidObjectCfg" and entity["prim_path"] == "{ENV_REGEX_NS}/scene/Spoon054/Spoon054"
    assert entity["pos"] == [0.5, 0.1, 0.02]
    half = round(math.sqrt(0.5), 6)
    assert entity["rot"] == ([0.0, 0.0, half, half] if V3 else [half, 0.0, 0.0, half])
