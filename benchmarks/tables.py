"""The tables of benchmarks/README.md that come from a script's JSON result, rendered from benchmarks/results/.

A benchmark that writes ``--json`` has its latest run committed as ``benchmarks/results/NAME.json``: the
script's own JSON under ``result``, and beside it what the table states about the run (``script``,
``command``, ``machine``, ``date``, ``commit``; ``settings`` where the script's JSON leaves out an argument the
table needs; ``source`` where the numbers were transcribed from the journal instead of read from the script's
file). The README holds each rendered table between ``<!-- table: NAME -->`` and ``<!-- /table -->``, and
tests/test_benchmark_tables.py keeps them equal to what this module renders, so that a table changes only with
its result file. Usage::

    python benchmarks/tables.py record NAME OUT.json --command "..." --machine "..." [--setting KEY=VALUE]
    python benchmarks/tables.py write    # rewrite the README's generated tables
    python benchmarks/tables.py check    # exit 1 if they differ from the result files
"""

from __future__ import annotations

import argparse
import datetime
import json
import re
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
README = HERE / "README.md"
BLOCK = re.compile(r"(<!-- table: (?P<name>[\w.-]+) -->\n)(?P<body>.*?)(<!-- /table -->)", re.S)


def _markdown(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def _num(value: float) -> str:
    """Three significant digits, without a trailing point: 111, 15.2, 2.08, 0.73."""
    return f"{value:.3g}" if abs(value) < 1000 else f"{value:,.0f}"


def _run_line(record: dict) -> str:
    line = (
        f"`{record['command']}`: {record['machine']}, {record['date']}, commit `{record['commit']}`"
        + (f" ({record['source']})" if record.get("source") else "")
        + "."
    )
    return line


def _ceiling(record: dict) -> str:
    result = record["result"]
    base = result["rows"][result["baseline"]]["requests_per_s"]
    rows = [
        [
            name,
            f"{row['requests_per_s']:.0f}",
            f"{row['mb_per_s']:.0f}",
            f"{row['client_cpu_ms_per_request']:.3f}",
            f"{row['requests_per_s'] / base:.2f}x",
        ]
        for name, row in result["rows"].items()
    ]
    header = ["client", "requests/s", "MB/s", "client CPU ms/request", "vs baseline"]
    return _markdown(header, rows) + f"\n\nMedians of {len(result['rounds'])} interleaved rounds."


def _preprocess(record: dict) -> str:
    rows = [
        [r["name"], _num(r["ms"]), f"{_num(r['speedup'])}x", f"{r['max_diff']} ({100 * r['share_differing']:.2g} %)"]
        for r in record["result"]["results"]
    ]
    header = ["implementation", "ms", "vs baseline", "max diff (share of values)"]
    return _markdown(header, rows) + f"\n\n{record['result']['views']} views, medians."


def _isaac3(record: dict) -> str:
    sys.path.insert(0, str(HERE))
    from bench_isaac3 import bound, raw_rate  # the script's own formulas

    settings = record["settings"]
    steps, latency = int(settings["max_steps"]), float(settings["latency_ms"]) / 1e3
    modes = ("sync", "prefetch", "locked")
    header = ["backend", "scene", "N", "s_N ms", "s_N all ms", "reset ms", "bound", "raw"]
    header += ["sync", "of bound", "prefetch", "of bound", "locked", "of raw", "errored"]
    rows = []
    for r in record["result"]:
        n, s, s_all, reset = r["n"], r["step_s"], r["step_all_s"], r.get("reset_s")
        recorded = r.get("recorded", {})  # bound and raw as the run printed them, where transcribed
        b = recorded.get("bound") or bound(n, n, latency, s, s_all, steps, reset or 0.0)
        raw = recorded.get("raw") or raw_rate(n, s, s_all, steps, reset or 0.0)
        cells = [r["backend"], str(r.get("scene", 1)), str(n), f"{1e3 * s:.1f}", f"{1e3 * s_all:.1f}"]
        cells += ["-" if reset is None else f"{1e3 * reset:.0f}", f"{b:,.0f}", f"{raw:,.0f}"]
        for mode, limit in zip(modes, (b, b, raw)):  # the targets: sync and prefetch of the bound, locked of raw
            rate = r["runs"].get(mode, {}).get("rate")
            cells += ["-", "-"] if rate is None else [f"{rate:,.0f}", f"{100 * rate / limit:.1f} %"]
        cells.append(str(sum(run.get("errored", 0) for run in r["runs"].values())))
        rows.append(cells)
    return _markdown(header, rows) + f"\n\nL = {latency * 1e3:.0f} ms, {steps}-step episodes, W = N."


def _mechanisms(record: dict) -> str:
    sys.path.insert(0, str(HERE))
    from bench_mechanisms import decide, table  # the script's own verdicts

    text, verdicts = table(record["result"])
    runs = record["result"][0]["runs"]["all"]["sync"]
    decisions = [f"`{name}` {decide(found)} ({', '.join(found)})" for name, found in verdicts.items()]
    return text + f"\n\n{len(runs)} runs of each configuration and mode. Verdicts: " + "; ".join(decisions) + "."


RENDERERS = {
    "bench_mechanisms.py": _mechanisms,
    "bench_server_ceiling.py": _ceiling,
    "bench_preprocess.py": _preprocess,
    "bench_isaac3.py": _isaac3,
}


def render(name: str) -> str:
    """The README block of ``results/NAME.json``: the run's command, machine, date and commit, then its table."""
    record = json.loads((RESULTS / f"{name}.json").read_text())
    return _run_line(record) + "\n\n" + RENDERERS[record["script"]](record) + "\n"


def rendered_readme(text: str) -> str:
    """``text`` with every generated block replaced by what its result file renders."""
    return BLOCK.sub(lambda m: m.group(1) + render(m.group("name")) + m.group(4), text)


def record(name: str, result_path: Path, command: str, machine: str, settings: dict[str, str]) -> Path:
    """Write ``results/NAME.json`` from a script's ``--json`` output, with today's date and the current commit."""
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=HERE, capture_output=True, text=True, check=True
    ).stdout.strip()
    script = command.split()[1].rsplit("/", 1)[-1]
    if script not in RENDERERS:
        raise SystemExit(f"command: expected 'python benchmarks/SCRIPT ...' with one of {sorted(RENDERERS)}")
    out = {"script": script, "command": command, "machine": machine, "date": datetime.date.today().isoformat()}
    out.update({"commit": commit, "settings": settings, "result": json.loads(result_path.read_text())})
    path = RESULTS / f"{name}.json"
    path.write_text(json.dumps(out, indent=1) + "\n")
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="action", required=True)
    rec = sub.add_parser("record", help="store a script's --json output as results/NAME.json")
    rec.add_argument("name")
    rec.add_argument("result", type=Path)
    rec.add_argument("--command", required=True)
    rec.add_argument("--machine", required=True)
    rec.add_argument("--setting", action="append", default=[], metavar="KEY=VALUE")
    sub.add_parser("write", help="rewrite the README's generated tables")
    sub.add_parser("check", help="exit 1 if the README's generated tables differ from the result files")
    args = parser.parse_args(argv)
    if args.action == "record":
        settings = dict(item.split("=", 1) for item in args.setting)
        print(record(args.name, args.result, args.command, args.machine, settings))
        return 0
    text = README.read_text()
    new = rendered_readme(text)
    if args.action == "write":
        README.write_text(new)
        return 0
    if new != text:
        print("benchmarks/README.md: a generated table differs; run python benchmarks/tables.py write")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
