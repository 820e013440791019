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
  registering no objects (the backend registers them from their prims). Its ``droid_environment.py`` also
  holds the per-scene ids, as the keys of the ``DROID_SCENES`` dict ``set_scene`` looks them up in: only
  registered ids count (:func:`read_sim_evals`).

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
    unresolved: bool = False  # a registration whose ids the source does not spell out

    def layout_for(self, task: Any) -> str:
        """The layout ``task`` (a DROID scene) is built in; a one-line error when this sim-evals has neither
        its gym id nor ``DROID``."""
        if task.gym_id in self.gym_ids:
            return "per_scene"
        if "DROID" in self.gym_ids:
            return "droid_by_id" if self.set_scene_takes == "str" else "run_eval"
        if not self.gym_ids or self.unresolved:  # registered some other way: the file layout decides
            return "per_scene" if self.has_droid_package else "run_eval"
        raise ValueError(
            f"sim-evals registers neither {task.gym_id!r} nor 'DROID' (found {', '.join(sorted(self.gym_ids))}); "
            "see docs/isaac.md"
        )


def read_sim_evals(package_dir: Path) -> SimEvalsInstall:
    """The gym ids and ``set_scene``'s argument of the sim-evals package at ``package_dir`` (``.../src/sim_evals``),
    from the source of its ``environments`` package.

    A gym id counts only where it is registered: the ``id`` of a ``register(...)`` call (or of a function that
    passes its argument on as one), given as a string, or as the variable of a ``for`` loop over a literal
    dict, list, tuple or set, or over a module-level name bound to one (``for env_id in DROID_SCENES``, in any
    file of the package; ``.keys()`` and ``.items()`` too). Strings that merely look like ids do not count:
    fea59e52's ``droid_environment.py`` holds a ``DROID_SCENES`` dict keyed ``"DROID-CubeInBowl"`` ... that
    only ``set_scene`` reads, and registers ``DROID`` alone. A registration whose ids cannot be read this way
    sets ``unresolved`` (the registry after launch decides then, :func:`confirm_layout`)."""
    environments = Path(package_dir) / "environments"
    trees = []
    for path in sorted(environments.rglob("*.py")):
        try:
            trees.append(ast.parse(path.read_text(encoding="utf-8", errors="replace")))
        except (OSError, SyntaxError, ValueError):
            continue
    literals = {name: values for tree in trees for name, values in _module_literals(tree).items()}
    helpers = {name: index for tree in trees for name, index in _registering_functions(tree).items()}
    ids: set[str] = set()
    unresolved = False
    takes: str | None = None
    for tree in trees:
        parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and (_called(node) == "register" or _called(node) in helpers):
                found = _registered_ids(node, helpers.get(_called(node), 0), parents, literals, helpers)
                if found is None:
                    unresolved = True
                else:
                    ids.update(found)
            elif (
                isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == "set_scene" and takes is None
            ):
                takes = _first_argument_kind(node)
    ids = {i for i in ids if i == "DROID" or _GYM_ID.match(i)}
    has_mila = "DROID-MILA" in ids or (environments / "mila").is_dir() or (environments / "mila.py").is_file()
    return SimEvalsInstall(frozenset(ids), takes, has_mila, (environments / "droid").is_dir(), unresolved)


def _strings(node: ast.AST) -> set[str] | None:
    """The strings of a literal: a dict's keys, a list's, tuple's or set's elements (None: not such a literal)."""
    elements = node.keys if isinstance(node, ast.Dict) else getattr(node, "elts", None)
    if not isinstance(node, (ast.Dict, ast.List, ast.Tuple, ast.Set)) or elements is None:
        return None
    values = {e.value for e in elements if isinstance(e, ast.Constant) and isinstance(e.value, str)}
    return values if len(values) == len(elements) else None


def _module_literals(tree: ast.Module) -> dict[str, set[str]]:
    """Module-level ``NAME = <literal of strings>`` (annotated or not)."""
    found = {}
    for node in tree.body:
        targets = (
            node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) else []
        )
        values = _strings(node.value) if getattr(node, "value", None) is not None else None
        for target in targets:
            if isinstance(target, ast.Name) and values is not None:
                found[target.id] = values
    return found


def _registering_functions(tree: ast.Module) -> dict[str, int]:
    """Functions that call ``register(id=<their parameter>)``: name -> that parameter's position."""
    found = {}
    for function in ast.walk(tree):
        if not isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)) or function.name == "register":
            continue
        params = [a.arg for a in function.args.args]
        for node in ast.walk(function):
            if isinstance(node, ast.Call) and _called(node) == "register":
                given = _id_argument(node, 0)
                if isinstance(given, ast.Name) and given.id in params:
                    found[function.name] = params.index(given.id)
    return found


def _id_argument(call: ast.Call, position: int) -> ast.AST | None:
    for keyword in call.keywords:
        if keyword.arg in ("id", "env_id"):
            return keyword.value
    return call.args[position] if len(call.args) > position else None


def _registered_ids(
    call: ast.Call, position: int, parents: dict, literals: dict[str, set[str]], helpers: dict[str, int]
) -> set[str] | None:
    """The ids one registration call gives (None: not readable from the source; none for the ``register``
    inside a registering helper: its callers give the ids)."""
    given = _id_argument(call, position)
    if isinstance(given, ast.Constant) and isinstance(given.value, str):
        return {given.value}
    if not isinstance(given, ast.Name):
        return None
    node = call
    while node in parents:  # the innermost enclosing for loop that binds the name
        node = parents[node]
        if isinstance(node, (ast.For, ast.AsyncFor)):
            target = node.target
            if isinstance(target, ast.Tuple) and target.elts:
                target = target.elts[0]  # for env_id, cfg in X.items()
            if isinstance(target, ast.Name) and target.id == given.id:
                return _iterated(node.iter, literals)
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name in helpers:
            if given.id in [a.arg for a in node.args.args]:
                return set()
    return None


def _iterated(node: ast.AST, literals: dict[str, set[str]]) -> set[str] | None:
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in ("keys", "items"):
        node = node.func.value
    if isinstance(node, ast.Name):
        return literals.get(node.id)
    return _strings(node)


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
