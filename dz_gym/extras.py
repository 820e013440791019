"""Optional extras: which ``pip install 'dz-gym[EXTRA]'`` brings which module, and a one-line refusal when one
is missing (for the examples and the optional features: ``--log``, ``--ray``, the rl package).

:func:`missing` names, in one line, the first module of a list that cannot be imported and how to get it;
:func:`require` ends a script with that line (exit status 1) instead of a ``ModuleNotFoundError`` traceback
from deep inside it. Nothing is imported here: ``importlib.util.find_spec`` only looks.

>>> missing(["json"]) is None
True
>>> print(missing(["no_such_module_xyz"]))
needs the no_such_module_xyz package, which is not installed (pip install no_such_module_xyz)
"""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Iterable

__all__ = ["EXTRAS", "missing", "require"]

# module -> how to install it: the dz-gym extra that brings it, or what else to do
EXTRAS = {
    "torch": "pip install 'dz-gym[torch]'",
    "rsl_rl": "pip install 'dz-gym[rl]'",
    "mujoco": "pip install 'dz-gym[mujoco]'",
    "ray": "pip install 'dz-gym[ray]'",
    "wandb": "pip install 'dz-gym[wandb]'",
    "tensorboard": "pip install 'dz-gym[tensorboard]'",
    "matplotlib": "pip install 'dz-gym[plot]'",
    "PIL": "pip install pillow",
    "isaaclab": "an Isaac Lab install, see docs/isaac.md",
}


def _importable(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a parent package that is missing or broken
        return False


def missing(modules: Iterable[str]) -> str | None:
    """One line naming the first of ``modules`` that is not importable, with how to install it; None if all are."""
    for module in modules:
        if not _importable(module):
            how = EXTRAS.get(module, f"pip install {module}")
            return f"needs the {module} package, which is not installed ({how})"
    return None


def require(program: str, *modules: str) -> None:
    """End the script with ``PROGRAM: error: needs ...`` on stderr (exit status 1) when a module is missing."""
    problem = missing(modules)
    if problem is not None:
        print(f"{program}: error: {problem}", file=sys.stderr)
        raise SystemExit(1)
