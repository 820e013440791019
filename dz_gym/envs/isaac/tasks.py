"""Which sim-evals layout is installed (the task table itself is :mod:`dz_gym.envs.scenes`).

sim-evals' versions differ in what they register and expose, and the backend builds a task by what the
installed one has, read from its source before launch (:func:`read_sim_evals`: nothing is imported, since
sim-evals can only be imported once the app runs) and confirmed from the gym registry and ``set_scene``'s
signature after launch (:func:`confirm_layout`):

- ``"run_eval"`` (up to 3a6b0e8, the ``droid_environment.py`` files): gym id ``DROID``;
  ``cfg.set_scene(k)`` with ``k`` in 1..3 registers the scene's rigid bodies as entities;
- ``"per_scene"`` (711ff04, de7ae486, 7ef6f1bc and later): the scene's own gym id (``DROID-CubeInBowl`` ...),
  whose config factory already called ``set_scene``; the objects are plain prims of the scene USD. de7ae486
  registers only those ids; 7ef6f1bc registers ``DROID`` too (the per-scene id is taken);
- ``"droid_by_id"`` (fea59e52): gym id ``DROID`` with ``set_scene(env_id: str)`` taking the per-scene id and
  registering no objects (the backend registers them from their prims).

The MILA tasks (``DROID-MILA``, ``cfg.set_task(task_id)``) exist where ``environments/mila`` does, in either
file layout (MILA first shipped on the ``droid_environment.py`` one, 510b7dfb).
"""

from __future__ import annotations

import ast
import inspect
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

LAYOUTS = ("run_eval", "per_scene", "droid_by_id")
_GYM_ID = re.compile(r"DROID(-[A-Za-z0-9_]+)+\Z")  # a per-scene or MILA id; plain "DROID" only as register(id=)


@dataclass(frozen=True)
class SimEvalsInstall:
    """What an installed sim-evals registers and exposes, read from its source."""

    gym_ids: frozenset[str]
    set_scene_takes: str | None  # "int", "str", or None when there is no set_scene (or it says nothing)
    has_mila: bool
    has_droid_package: bool  # environments/droid/ (the per-scene file layout)

    def layout_for(self, task: Any) -> str:
        """The layout ``task`` (a DROID scene) is built in; a one-line error when this sim-evals has neither
        its gym id nor ``DROID``."""
        if task.gym_id in self.gym_ids:
            return "per_scene"
        if "DROID" in self.gym_ids:
            return "droid_by_id" if self.set_scene_takes == "str" else "run_eval"
        if not self.gym_ids:  # nothing found in the source (registered some other way): the file layout decides
            return "per_scene" if self.has_droid_package else "run_eval"
        raise ValueError(
            f"sim-evals registers neither {task.gym_id!r} nor 'DROID' (found {', '.join(sorted(self.gym_ids))}); "
            "see docs/isaac.md"
        )


def read_sim_evals(package_dir: Path) -> SimEvalsInstall:
    """The gym ids and ``set_scene``'s argument of the sim-evals package at ``package_dir`` (``.../src/sim_evals``),
    from the source of its ``environments`` package."""
    environments = Path(package_dir) / "environments"
    ids: set[str] = set()
    takes: str | None = None
    for path in sorted(environments.rglob("*.py")):
        try:
            tree = ast.parse(path.read_text(encoding="utf-8", errors="replace"))
        except (OSError, SyntaxError, ValueError):
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and _GYM_ID.match(node.value):
                ids.add(node.value)
            elif isinstance(node, ast.Call) and _called(node) == "register":
                for keyword in node.keywords:
                    if (
                        keyword.arg == "id"
                        and isinstance(keyword.value, ast.Constant)
                        and keyword.value.value == "DROID"
                    ):
                        ids.add("DROID")
            elif (
                isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == "set_scene" and takes is None
            ):
                takes = _first_argument_kind(node)
    has_mila = "DROID-MILA" in ids or (environments / "mila").is_dir() or (environments / "mila.py").is_file()
    return SimEvalsInstall(frozenset(ids), takes, has_mila, (environments / "droid").is_dir())


def detect_layout(package_dir: Path) -> tuple[str, bool]:
    """``(layout, has_mila)`` of the sim-evals at ``package_dir`` for the DROID scenes' gym ids (scene 1's)."""
    from dz_gym.envs import scenes

    install = read_sim_evals(package_dir)
    return install.layout_for(scenes.task_for(1)), install.has_mila


def confirm_layout(layout: str, task: Any, registry: Any, set_scene: Any = None) -> str:
    """The layout as the running sim-evals has it (the gym registry after import; ``set_scene``'s signature):
    what was read from the source before launch, unless the registry or the signature says otherwise."""
    if task.gym_id in registry:
        return "per_scene"
    if "DROID" not in registry:
        raise ValueError(f"sim-evals: neither {task.gym_id!r} nor 'DROID' is registered; see docs/isaac.md")
    takes = argument_kind(set_scene) if set_scene is not None else None
    if takes is not None:
        return "droid_by_id" if takes == "str" else "run_eval"
    return layout if layout in ("run_eval", "droid_by_id") else "run_eval"


def argument_kind(function: Any) -> str | None:
    """``"int"`` or ``"str"``: what a bound ``set_scene`` takes, from its annotation (None if it has none)."""
    try:
        parameters = [p for p in inspect.signature(function).parameters.values() if p.name != "self"]
    except (TypeError, ValueError):
        return None
    if not parameters:
        return None
    annotation = parameters[0].annotation
    name = annotation if isinstance(annotation, str) else getattr(annotation, "__name__", "")
    return name if name in ("int", "str") else None


def _called(call: ast.Call) -> str:
    func = call.func
    return func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""


def _first_argument_kind(function: ast.FunctionDef | ast.AsyncFunctionDef) -> str | None:
    arguments = [a for a in function.args.args if a.arg != "self"]
    if not arguments:
        return None
    annotation = arguments[0].annotation
    if isinstance(annotation, ast.Name) and annotation.id in ("int", "str"):
        return annotation.id
    if isinstance(annotation, ast.Constant) and annotation.value in ("int", "str"):
        return str(annotation.value)
    return None
