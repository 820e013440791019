"""Size counts of dz-gym's source: the working tree, a commit, or both side by side.

Counts, for the tree of ``--base`` (a commit, read with ``git archive``) and the working tree:

- modules (``.py`` files) and lines of ``dz_gym/transport``, ``dz_gym/eval`` and all of ``dz_gym``;
- the longest class (``module.Class`` and its lines, decorators included);
- the fields of ``EvalConfig`` (those of its own dataclass, and the leaves where a field is a dataclass of the
  package's);
- the flags of ``dz-gym-eval`` (its parser's long options, read from the parser itself in a child process);
- the modules of ``dz_gym`` that no test module mirrors: none of ``tests/test_<name>.py``,
  ``tests/test_<package>_<name>.py``, ... (the module's path from any depth, joined by ``_``) nor a test module
  whose name starts with one of those.

Usage::

    python benchmarks/complexity.py                     # the working tree
    python benchmarks/complexity.py --base f9e5a42      # the commit and the working tree side by side
    python benchmarks/complexity.py --base f9e5a42 --json counts.json

Standard library only; run from the repository (it calls ``git``).
"""

from __future__ import annotations

import argparse
import ast
import json
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SUBPACKAGES = ("dz_gym/transport", "dz_gym/eval", "dz_gym")
SKIP = ("dz_gym/envs/mujoco/assets",)

# In the child: ask dz-gym-eval for its help and print the long options of the parser that was asked.
FLAGS_PROBE = """
import argparse, json, sys
def dump(parser, *_, **__):
    flags = sorted({s for a in parser._actions for s in a.option_strings if s.startswith("--")} - {"--help"})
    print("FLAGS " + json.dumps(flags))
    sys.exit(0)
argparse.ArgumentParser.print_help = dump
from dz_gym.eval.cli import main
main(["--help"])
"""


def _modules(tree: Path) -> list[Path]:
    return sorted(
        p
        for p in (tree / "dz_gym").rglob("*.py")
        if not any(p.relative_to(tree).as_posix().startswith(s) for s in SKIP)
    )


def _lines(path: Path) -> int:
    return len(path.read_text(encoding="utf-8").splitlines())


def _classes(tree: Path) -> dict[str, ast.ClassDef]:
    found = {}
    for path in _modules(tree):
        module = ".".join(path.relative_to(tree).with_suffix("").parts)
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ClassDef):
                found[f"{module}.{node.name}"] = node
    return found


def _class_lines(node: ast.ClassDef) -> int:
    start = min([node.lineno] + [d.lineno for d in node.decorator_list])
    return node.end_lineno - start + 1


def _fields(node: ast.ClassDef) -> list[tuple[str, str]]:
    """(name, annotation) of a class body's annotated fields, ClassVar left out."""
    out = []
    for item in node.body:
        if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
            annotation = ast.unparse(item.annotation)
            if "ClassVar" not in annotation:
                out.append((item.target.id, annotation))
    return out


def _config_fields(classes: dict[str, ast.ClassDef]) -> tuple[int, int]:
    """(fields of EvalConfig, leaf fields): a field whose annotation names another dataclass of the package
    counts that class's leaves instead."""
    by_name = {key.rsplit(".", 1)[1]: node for key, node in classes.items()}
    config = by_name.get("EvalConfig")
    if config is None:
        return 0, 0

    def leaves(node: ast.ClassDef, seen: frozenset[str]) -> int:
        count = 0
        for _, annotation in _fields(node):
            name = annotation.strip("'\"").split("[")[0].split(".")[-1]
            inner = by_name.get(name)
            count += leaves(inner, seen | {name}) if inner is not None and name not in seen else 1
        return count

    return len(_fields(config)), leaves(config, frozenset({"EvalConfig"}))


def _flags(tree: Path) -> list[str]:
    proc = subprocess.run(
        [sys.executable, "-c", FLAGS_PROBE],
        cwd=tree,
        env={"PYTHONPATH": str(tree), "PATH": "/usr/bin:/bin", "MUJOCO_GL": "egl"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    for line in proc.stdout.splitlines():
        if line.startswith("FLAGS "):
            return json.loads(line[len("FLAGS ") :])
    raise RuntimeError(f"dz-gym-eval --help in {tree}: no flags read (exit {proc.returncode}): {proc.stderr[-500:]}")


def _unmirrored(tree: Path) -> list[str]:
    tests = [p.stem for p in (tree / "tests").glob("test_*.py")]
    missing = []
    for path in _modules(tree):
        parts = list(path.relative_to(tree / "dz_gym").with_suffix("").parts)
        if parts[-1] == "__main__" or (parts[-1] == "__init__" and len(parts) == 1):
            continue
        if parts[-1] == "__init__":
            parts = parts[:-1]
        names = ["test_" + "_".join(parts[k:]) for k in range(len(parts))]
        if not any(t == n or t.startswith(n + "_") for t in tests for n in names):
            missing.append("dz_gym/" + path.relative_to(tree / "dz_gym").as_posix())
    return missing


def counts(tree: Path) -> dict:
    """Every count of the tree at ``tree`` (a checkout: ``dz_gym/`` and ``tests/`` under it)."""
    out: dict = {}
    modules = _modules(tree)
    for sub in SUBPACKAGES:
        inside = [p for p in modules if p.relative_to(tree).as_posix().startswith(sub + "/")]
        out[sub] = {"modules": len(inside), "lines": sum(_lines(p) for p in inside)}
    classes = _classes(tree)
    name, node = max(classes.items(), key=lambda item: _class_lines(item[1]))
    out["longest_class"] = {"name": name, "lines": _class_lines(node)}
    fields, leaves = _config_fields(classes)
    out["eval_config"] = {"fields": fields, "leaf_fields": leaves}
    out["eval_flags"] = len(_flags(tree))
    missing = _unmirrored(tree)
    out["modules_without_test"] = {"count": len(missing), "of": len(modules), "modules": missing}
    return out


def _checkout(commit: str, into: Path) -> Path:
    archive = into / "tree.tar"
    with archive.open("wb") as handle:
        subprocess.run(["git", "archive", commit, "dz_gym", "tests"], cwd=ROOT, stdout=handle, check=True)
    with tarfile.open(archive) as tar:
        tar.extractall(into / "tree", filter="data")
    return into / "tree"


def _rows(c: dict) -> list[tuple[str, str]]:
    rows = [(f"{sub}: modules / lines", f"{c[sub]['modules']} / {c[sub]['lines']:,}") for sub in SUBPACKAGES]
    rows.append(("longest class (lines)", f"{c['longest_class']['name']} ({c['longest_class']['lines']})"))
    rows.append(("EvalConfig fields (leaves)", f"{c['eval_config']['fields']} ({c['eval_config']['leaf_fields']})"))
    rows.append(("dz-gym-eval flags", str(c["eval_flags"])))
    rows.append(
        ("modules without a test module", f"{c['modules_without_test']['count']} of {c['modules_without_test']['of']}")
    )
    return rows


def table(columns: dict[str, dict]) -> str:
    """A markdown table, one column per counted tree."""
    rows = {label: [] for label, _ in _rows(next(iter(columns.values())))}
    for c in columns.values():
        for label, value in _rows(c):
            rows[label].append(value)
    lines = ["| count | " + " | ".join(columns) + " |", "|---|" + "---|" * len(columns)]
    lines += [f"| {label} | " + " | ".join(values) + " |" for label, values in rows.items()]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", help="a commit to count beside the working tree (e.g. f9e5a42)")
    parser.add_argument("--json", type=Path, help="also write the counts here")
    parser.add_argument("--list", action="store_true", help="also list the modules without a test module")
    args = parser.parse_args(argv)
    columns = {}
    with tempfile.TemporaryDirectory() as tmp:
        if args.base:
            columns[args.base] = counts(_checkout(args.base, Path(tmp)))
        columns["working tree"] = counts(ROOT)
    print(table(columns))
    if args.list:
        for name, c in columns.items():
            print(f"\n{name}: modules without a test module")
            print("\n".join(f"  {m}" for m in c["modules_without_test"]["modules"]))
    if args.json:
        args.json.write_text(json.dumps(columns, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
