"""``scripts/test.sh``, the command CI runs: every stage runs even after a failure, and the end lists every
failure with exit status 1.

The script runs in a copy of the repository's layout where ``scripts/setup.sh`` and each environment's
``bin/python`` are one small stand-in that logs its arguments and fails when they match ``FAIL`` (the real
stages are the whole suite: they cannot run inside one of its tests); the script itself is the real file.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
STAND_IN = """#!/usr/bin/env bash
# Logs "PATH ARGS" (PATH as the script called it) and exits with $FAIL_STATUS when that line matches the
# extended regex in $FAIL.
line="$0 $*"
echo "$line" >> "$LOG"
if [ -n "$FAIL" ] && echo "$line" | grep -Eq "$FAIL"; then exit "$FAIL_STATUS"; fi
exit 0
"""

pytestmark = pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")


def _tree(tmp_path: Path) -> Path:
    root = tmp_path / "repo"
    (root / "scripts").mkdir(parents=True)
    shutil.copy(REPO / "scripts" / "test.sh", root / "scripts" / "test.sh")
    for where in ("scripts/setup.sh", ".venv/bin/python", ".venv-isaac22/bin/python", ".venv-isaac30/bin/python"):
        path = root / where
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(STAND_IN)
        path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return root


def _run(tmp_path: Path, fail: str = "", status: int = 3, **env: str) -> tuple[int, str, list[str]]:
    """Run the script in the stand-in tree with ``-x`` for pytest: its exit status, output and the calls."""
    root = _tree(tmp_path)
    log = tmp_path / "calls.log"
    full = {**os.environ, "LOG": str(log), "FAIL": fail, "FAIL_STATUS": str(status), "DZ_GYM_SKIP_ISAAC22": "0",
            "DZ_GYM_SKIP_ISAAC30": "0", **env}  # fmt: skip
    proc = subprocess.run(["bash", str(root / "scripts" / "test.sh"), "-x"], env=full, capture_output=True,
                          text=True, timeout=120, check=False)  # fmt: skip
    calls = log.read_text().splitlines() if log.exists() else []
    return proc.returncode, proc.stdout + proc.stderr, calls


def test_every_stage_runs_and_passes(tmp_path):
    status, out, calls = _run(tmp_path)
    assert status == 0, out
    assert "every stage passed" in out
    assert calls[0] == "scripts/setup.sh --test"
    assert ".venv/bin/python -m pytest -q -x" in calls
    assert ".venv/bin/python -m pytest -q --doctest-modules dz_gym" in calls
    assert ".venv-isaac22/bin/python -m pytest -q -m not slow -x" in calls
    assert ".venv-isaac22/bin/python -m pytest -q --doctest-modules dz_gym" in calls
    assert any(c.startswith(".venv-isaac30/bin/python -m pytest") for c in calls)
    assert "scripts/setup.sh --isaac30" in calls


def test_a_failing_first_pytest_still_runs_the_doctests_and_the_other_environments(tmp_path):
    status, out, calls = _run(tmp_path, fail=r"^\.venv/bin/python -m pytest -q -x$")
    assert status == 1, out
    assert ".venv/bin/python -m pytest -q --doctest-modules dz_gym" in calls
    assert ".venv-isaac22/bin/python -m pytest -q -m not slow -x" in calls
    assert any(c.startswith(".venv-isaac30/bin/python -m pytest") for c in calls)
    tail = out[out.index("== FAILED") :].splitlines()
    assert tail[0] == "== FAILED: 1 stage(s) =="
    assert tail[1].strip() == "pytest (exit status 3)"


def test_every_failure_is_listed_at_the_end(tmp_path):
    fail = r"ruff check|^\.venv-isaac22/bin/python -m pytest -q --doctest|^\.venv-isaac30/bin/python"
    status, out, calls = _run(tmp_path, fail=fail)
    assert status == 1, out
    tail = [line.strip() for line in out[out.index("== FAILED") :].splitlines()]
    assert tail[0] == "== FAILED: 3 stage(s) =="
    assert tail[1:] == [
        "ruff check (exit status 3)",
        "doctests (.venv-isaac22) (exit status 3)",
        "third environment: the real isaaclab 3.0.0 wheel on Python 3.12 (.venv-isaac30) (exit status 3)",
    ]
    assert ".venv/bin/python -m ruff format --check ." in calls  # the stage after the failed one ran


def test_a_failed_setup_reports_its_stages_as_not_run_and_goes_on(tmp_path):
    status, out, calls = _run(tmp_path, fail=r"^scripts/setup.sh --test$", DZ_GYM_SKIP_ISAAC30="1")
    assert status == 1, out
    assert not any(c.startswith(".venv/bin/python") for c in calls)
    assert ".venv-isaac22/bin/python -m pytest -q -m not slow -x" in calls
    tail = [line.strip() for line in out[out.index("== FAILED") :].splitlines()]
    assert tail[0] == "== FAILED: 5 stage(s) =="
    assert tail[1] == "setup (.venv) (exit status 3)"
    assert tail[2] == "ruff check (not run: scripts/setup.sh --test failed)"
    assert not any(c.startswith(".venv-isaac30") or "--isaac30" in c for c in calls)


def test_the_third_environment_skipped_for_want_of_python_312_is_no_failure(tmp_path):
    status, out, calls = _run(tmp_path, fail=r"^scripts/setup.sh --isaac30$", status=2)
    assert status == 0, out
    assert "skipped: no Python 3.12 here" in out
    assert not any(c.startswith(".venv-isaac30/bin/python") for c in calls)
    tail = [line.strip() for line in out[out.index("== skipped: 1") :].splitlines()]
    assert (
        tail[1]
        == "third environment: the real isaaclab 3.0.0 wheel on Python 3.12 (.venv-isaac30): no Python 3.12 here"
    )
    assert tail[2] == "== every stage passed =="


def test_environments_skipped_on_purpose_are_said_at_the_end(tmp_path):
    status, out, calls = _run(tmp_path, DZ_GYM_SKIP_ISAAC22="1", DZ_GYM_SKIP_ISAAC30="1")
    assert status == 0, out
    assert not any("isaac" in c for c in calls)
    tail = [line.strip() for line in out[out.index("== skipped: 2") :].splitlines()]
    assert tail[1:] == [
        "second environment (.venv-isaac22): DZ_GYM_SKIP_ISAAC22=1",
        "third environment: the real isaaclab 3.0.0 wheel on Python 3.12 (.venv-isaac30): DZ_GYM_SKIP_ISAAC30=1",
        "== every stage passed ==",
    ]


def test_a_failed_third_environment_setup_is_a_failure(tmp_path):
    status, out, calls = _run(tmp_path, fail=r"^scripts/setup.sh --isaac30$")
    assert status == 1, out
    assert not any(c.startswith(".venv-isaac30/bin/python") for c in calls)
    assert "setup.sh --isaac30 failed (exit status 3)" in out
    assert out.rstrip().endswith("(.venv-isaac30) (exit status 3)")
