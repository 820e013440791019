"""benchmarks/README.md's generated tables stay equal to what benchmarks/tables.py renders from
benchmarks/results/: a table there changes only with its result file (its command, machine, date and commit
included), so the README cannot quote numbers that no committed run produced."""

import json
import sys
from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))

import tables  # noqa: E402


def test_readme_tables_equal_their_result_files():
    text = tables.README.read_text()
    assert tables.rendered_readme(text) == text, "run: python benchmarks/tables.py write"


def test_every_result_file_has_a_table_and_says_where_it_ran():
    names = {m.group("name") for m in tables.BLOCK.finditer(tables.README.read_text())}
    files = {path.stem for path in tables.RESULTS.glob("*.json")}
    assert names == files
    for name in files:
        record = json.loads((tables.RESULTS / f"{name}.json").read_text())
        for key in ("script", "command", "machine", "date", "commit", "result"):
            assert record.get(key), f"results/{name}.json: '{key}' missing"
        assert record["script"] in tables.RENDERERS
        assert (BENCHMARKS / record["script"]).is_file()


def test_a_changed_result_changes_its_table(tmp_path, monkeypatch):
    for path in tables.RESULTS.glob("*.json"):
        (tmp_path / path.name).write_text(path.read_text())
    record = json.loads((tmp_path / "bench_server_ceiling.json").read_text())
    base = record["result"]["rows"][record["result"]["baseline"]]
    base["requests_per_s"] *= 2
    (tmp_path / "bench_server_ceiling.json").write_text(json.dumps(record))
    monkeypatch.setattr(tables, "RESULTS", tmp_path)
    text = tables.README.read_text()
    changed = tables.rendered_readme(text)
    assert changed != text
    assert f"| {base['requests_per_s']:.0f} |" in changed


def test_every_benchmark_script_has_its_section():
    """One current table per script: a ``### `NAME.py``` section for every script of benchmarks/ (the two tools
    that render and count are not benchmarks)."""
    text = tables.README.read_text()
    scripts = {path.name for path in BENCHMARKS.glob("*.py")} - {"tables.py", "complexity.py"}
    missing = sorted(name for name in scripts if f"### `{name}`" not in text)
    assert not missing, f"benchmarks/README.md: no section for {missing}"
