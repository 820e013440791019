"""Optional extras: a script or feature whose package is missing says so in one line (what is missing and how
to install it) instead of ending in a ModuleNotFoundError traceback."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from dz_gym import extras

ROOT = Path(__file__).resolve().parents[1]
# Runs an example with some packages made unimportable (a meta path finder that refuses them).
HIDE = """
import runpy, sys
hidden = set(sys.argv[2].split(","))
class Hide:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in hidden:
            raise ModuleNotFoundError(f"No module named {name!r}")
        return None
sys.meta_path.insert(0, Hide())
path = sys.argv[1]
sys.argv = [path]
runpy.run_path(path, run_name="__main__")
"""


@pytest.mark.parametrize(
    ("example", "hidden", "line"),
    [
        ("residual_ppo.py", "torch", "needs the torch package, which is not installed (pip install 'dz-gym[torch]')"),
        ("residual_ppo.py", "rsl_rl", "needs the rsl_rl package, which is not installed (pip install 'dz-gym[rl]')"),
        (
            "render_scenes.py",
            "mujoco",
            "needs the mujoco package, which is not installed (pip install 'dz-gym[mujoco]')",
        ),
    ],
)
def test_an_example_refuses_a_missing_extra_in_one_line(example, hidden, line):
    proc = subprocess.run([sys.executable, "-c", HIDE, str(ROOT / "examples" / example), hidden], cwd=ROOT,
                          capture_output=True, text=True, timeout=120, check=False)  # fmt: skip
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert proc.stderr == f"{example}: error: {line}\n"


def test_missing_names_the_first_missing_module():
    assert extras.missing(["json", "no_such_module_xyz", "torch"]) == (
        "needs the no_such_module_xyz package, which is not installed (pip install no_such_module_xyz)"
    )
    assert extras.missing(["json", "numpy"]) is None
