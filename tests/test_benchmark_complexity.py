"""benchmarks/complexity.py counts a tree as it says: modules and lines per subpackage, the longest class,
EvalConfig's fields and leaves, dz-gym-eval's flags (from the parser itself) and the modules without a test
module of their name. The tree is a small one written here, counted by the script's own functions."""

import sys
import textwrap
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import complexity  # noqa: E402

FILES = {
    "dz_gym/__init__.py": "",
    "dz_gym/transport/__init__.py": '"""The transport."""\n',
    "dz_gym/transport/pool.py": "class Pool:\n    def a(self):\n        return 1\n",
    "dz_gym/eval/__init__.py": "",
    "dz_gym/eval/config.py": """
        import dataclasses
        from typing import ClassVar


        @dataclasses.dataclass
        class PlanConfig:
            episodes: int = 1
            seed: int = 0


        @dataclasses.dataclass
        class EvalConfig:
            VERSION: ClassVar[int] = 2
            plan: PlanConfig = dataclasses.field(default_factory=PlanConfig)
            num_envs: int = 8
    """,
    "dz_gym/eval/cli.py": """
        import argparse


        def main(argv=None):
            parser = argparse.ArgumentParser()
            parser.add_argument("--num-envs", "-n", type=int)
            parser.add_argument("--plan.episodes", type=int)
            return parser.parse_args(argv)
    """,
    "tests/test_transport_pool.py": "",
    "tests/test_eval_cli_flags.py": "",
}


def _tree(root: Path) -> Path:
    for name, text in FILES.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text).lstrip("\n"))
    return root


def test_counts_of_a_small_tree(tmp_path):
    tree = _tree(tmp_path)
    c = complexity.counts(tree)
    assert c["dz_gym/transport"] == {"modules": 2, "lines": 4}
    assert c["dz_gym/eval"]["modules"] == 3
    assert c["dz_gym"]["modules"] == 6
    assert c["longest_class"] == {"name": "dz_gym.eval.config.EvalConfig", "lines": 5}
    assert c["eval_config"] == {"fields": 2, "leaf_fields": 3}  # plan (2 leaves) and num_envs; ClassVar left out
    assert c["eval_flags"] == 2
    # cli.py has test_eval_cli_flags.py (a name that starts with its own), a package's __init__ any test of the
    # package; config.py has none
    assert c["modules_without_test"] == {"count": 1, "of": 6, "modules": ["dz_gym/eval/config.py"]}


def test_the_table_puts_trees_side_by_side(tmp_path):
    c = complexity.counts(_tree(tmp_path))
    text = complexity.table({"base": c, "working tree": c})
    assert text.splitlines()[0] == "| count | base | working tree |"
    assert "| dz_gym/transport: modules / lines | 2 / 4 | 2 / 4 |" in text
