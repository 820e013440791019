"""scripts/setup_isaac3.sh's pieces that run anywhere: which listed packages a Python lacks (``--target``), the
package list itself (one file, read by the script and by ``scripts/setup.sh --isaac30``), the usage errors."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CHECKER = ROOT / "scripts" / "missing_requirements.py"
SETUP = ROOT / "scripts" / "setup_isaac3.sh"


def _installed(site: Path, name: str, version: str) -> None:
    """A distribution as pip leaves it: ``NAME-VERSION.dist-info/METADATA`` (what importlib.metadata reads)."""
    info = site / f"{name.replace('-', '_')}-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")


def _lacking(site: Path, *requirements: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(site)}
    return subprocess.run(
        [sys.executable, str(CHECKER), *requirements], env=env, capture_output=True, text=True, timeout=60
    )


def test_only_absent_or_other_version_packages_are_lacking(tmp_path):
    _installed(tmp_path, "dz-fake-present", "1.4.2")
    _installed(tmp_path, "dz-fake-pinned", "2.0.0")
    _installed(tmp_path, "dz_fake_ranged", "1.2.0")
    done = _lacking(
        tmp_path,
        "dz-fake-present",  # any version: satisfied
        "dz-fake-pinned==2.1.0",  # there, at another version
        "DZ.Fake.Ranged>=1.1,<2",  # normalised name, inside the range
        "dz-fake-absent==0.1",
        "dz-fake-absent-too",
        "dz-fake-marker; python_version < '3'",  # not for this Python
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["dz-fake-pinned==2.1.0", "dz-fake-absent==0.1", "dz-fake-absent-too"]


def test_a_malformed_requirement_is_one_line_naming_it(tmp_path):
    done = _lacking(tmp_path, "numpy", "warp-lang>=>1")
    assert done.returncode == 2 and done.stdout == ""
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "'warp-lang>=>1'" in lines[0] and "PEP 508" in lines[0]


def test_what_this_python_has_is_not_lacking(tmp_path):
    import importlib.metadata

    pytest_version = importlib.metadata.version("pytest")
    done = _lacking(tmp_path, f"pytest=={pytest_version}", "pytest>=1", "pytest<1")
    assert done.returncode == 0 and done.stdout.splitlines() == ["pytest<1"]


def _listed() -> dict[str, str]:
    """scripts/isaac3_kitless.txt as the scripts read it: requirement lines, ``#`` comments dropped."""
    lines = (
        line.split("#", 1)[0].strip() for line in (ROOT / "scripts" / "isaac3_kitless.txt").read_text().splitlines()
    )
    return {re.split(r"[<>=!~;\[ ]", text, maxsplit=1)[0].lower(): text for text in lines if text}


def test_the_package_list_is_pinned_where_it_matters_and_holds_packaging():
    names = _listed()
    for name, pin in (
        ("isaaclab", "3.0.0"),
        ("newton", "1.6.1"),
        ("warp-lang", "1.17.0"),
        ("mujoco-warp", "3.12.0"),
        ("mujoco", "3.12.0"),
    ):
        assert names[name] == f"{name}=={pin}"
    # isaaclab/utils/version.py imports packaging; every package is installed --no-deps
    assert "packaging" in names and "mujoco-usd-converter" in names and "usd-core" not in names
    done = _lacking(ROOT / "tests", *names.values())  # every line is a requirement the checker accepts
    assert done.returncode == 0, done.stderr


def test_unknown_option_is_a_usage_error():
    done = subprocess.run(["bash", str(SETUP), "--wheel", "x"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert done.stderr.strip() == "setup_isaac3: unknown option --wheel (expected --wheels DIR, --target DIR)"


def _has_the_kitless_stack() -> bool:
    if sys.version_info[:2] != (3, 12):
        return False
    done = subprocess.run([sys.executable, str(CHECKER), *_listed().values(), "torch"], capture_output=True, text=True)
    return done.returncode == 0 and done.stdout == ""


@pytest.mark.slow
@pytest.mark.skipif(not _has_the_kitless_stack(), reason="needs Python 3.12 with torch and the kit-less stack")
def test_target_with_wheels_asks_only_for_what_the_python_lacks(tmp_path):
    """A Python that has every listed package (the third CI environment): ``--target`` with an empty wheel
    folder installs nothing (it used to stop at the first package that Python already had) and converts."""
    wheels, target = tmp_path / "wheels", tmp_path / "site"
    wheels.mkdir()
    env = {**os.environ, "PYTHON": sys.executable, "DZ_GYM_ISAAC3_ASSETS": str(tmp_path / "assets")}
    done = subprocess.run(
        ["bash", str(SETUP), "--wheels", str(wheels), "--target", str(target)],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "installing into" not in done.stdout and not target.exists()
    assert [line.split()[:3] for line in done.stdout.splitlines() if line.startswith("setup_isaac3: scene")] == [
        ["setup_isaac3:", "scene", str(scene)] for scene in (1, 2, 3)
    ]
    assert (tmp_path / "assets").is_dir()
