"""``dz-gym-compare``: is policy B better than policy A? A paired comparison of two evaluation runs.

    dz-gym-compare RUN_A RUN_B [--json FILE] [--force] [--alpha 0.05]
    dz-gym-compare RUN                 # one A/B run whose rows carry ``arm`` ("a" / "b")
    dz-gym-compare RUN_1 RUN_2 RUN_3 ...   # K >= 3 runs on the same seeds: a ranking (dz_gym.stats.ranking)
    dz-gym-compare RUN                 # one run of K named arms (--arm): the same ranking of its arms

Rows are paired by (scene, seed): two runs with the same ``--seed`` ran the same initial conditions, so
only the policy differs within a pair. The statistics are :func:`dz_gym.stats.comparison.compare_rows`; this
module reads the run directories, checks that the runs are comparable, prints the table and writes the JSON.

Two runs are comparable when they used the same simulator backend, the same steps per episode, the same
open-loop horizon (actions executed per chunk) and the same prompt per scene; otherwise the comparison is
refused with one line naming the setting (exit 2) unless ``--force``, which records the differences in the
JSON under ``problems``. Other result-changing settings that differ (e.g. ``prefetch``) are listed under
``differences`` and printed as a note: comparing them may be the point of the A/B.

Exit codes: 0 compared, 2 usage error or runs not comparable (also a ``--json`` file that cannot be written:
checked before the runs are read), 1 when that file could not be written after all.
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from dz_gym.cli_types import Flag, OneLineErrorParser, add_flags, flag_message, number, show
from dz_gym.errors import RunError
from dz_gym.eval.failure import format_transitions, mode_transitions
from dz_gym.eval.preflight import check_output_file
from dz_gym.stats.comparison import compare_rows, descriptive_comparison, format_comparison
from dz_gym.stats.ranking import format_ranking, outcomes_by_seed, rank_arms

__all__ = ["build_parser", "comparability", "load_run", "main"]

CONFIG_FILE = "config.json"
ROWS_FILE = "episodes.jsonl"
# Settings that make two runs measure different things: refuse unless --force.
MUST_MATCH = {"backend": "backend", "max_steps": "max steps", "open_loop_horizon": "horizon (--open-loop-horizon)"}
# Settings that change outcomes but may be what an A/B compares: reported, not refused.
MAY_DIFFER = ("prefetch", "simulated_delay", "latency_honest", "control_hz", "max_stale_steps")


def _run_horizon(run: Path) -> Any:
    """The open-loop horizon a run executed when its config left it to the server profile (summary.json's
    ``server.open_loop_horizon``); None when the summary does not say."""
    try:
        summary = json.loads((run / "summary.json").read_text())
    except (OSError, json.JSONDecodeError):
        return None
    server = summary.get("server") if isinstance(summary, dict) else None
    return server.get("open_loop_horizon") if isinstance(server, dict) else None


def load_run(path: str | os.PathLike) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """``(config, rows)`` of a run directory; the config is ``config.json`` in its flat layout
    (:func:`~dz_gym.eval.config.flat_layout`)."""
    run = Path(path)
    config_path = run / CONFIG_FILE
    if not config_path.is_file():
        raise RunError(f"{path}: not a dz-gym-eval run directory (no {CONFIG_FILE})")
    try:
        config = json.loads(config_path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise RunError(f"{config_path}: unreadable ({exc})") from None
    if not isinstance(config, dict):
        raise RunError(f"{config_path}: expected a JSON object")
    from dz_gym.eval.config import flat_layout

    config = flat_layout(config)  # one layout, whichever dz-gym wrote the run
    if "open_loop_horizon" in config and config["open_loop_horizon"] is None:  # the server profile's: as run
        config["open_loop_horizon"] = _run_horizon(run)
    # Same reader as the evaluator's resume (a truncated last line is skipped with a warning).
    from dz_gym.eval.row import check_row
    from dz_gym.eval.rundir import RunDir

    try:
        rows = RunDir(run).read_rows()
    except (OSError, ValueError) as exc:
        raise RunError(str(exc)) from None
    if not rows:
        raise RunError(f"{path}: no finished episodes in {ROWS_FILE}")
    for line, row in enumerate(rows, 1):  # the row schema's own check: one line naming the field
        try:
            check_row(row)
        except ValueError as exc:
            raise RunError(f"{run / ROWS_FILE}:{line}: {exc}") from None
    return config, rows


def _prompts(rows: Sequence[Mapping[str, Any]]) -> dict[int, set[str]]:
    prompts: dict[int, set[str]] = {}
    for row in rows:
        if isinstance(row.get("prompt"), str):
            prompts.setdefault(row["scene"], set()).add(row["prompt"])
    return prompts


def comparability(
    config_a: Mapping[str, Any], rows_a: Sequence[Mapping[str, Any]],
    config_b: Mapping[str, Any], rows_b: Sequence[Mapping[str, Any]],
) -> tuple[list[str], list[str]]:  # fmt: skip
    """``(problems, differences)``: settings that make the runs not comparable, and other differing settings."""
    problems = []
    for key, name in MUST_MATCH.items():
        if key in config_a and key in config_b and config_a[key] != config_b[key]:
            problems.append(f"{name} differs: A {config_a[key]!r}, B {config_b[key]!r}")
    prompts_a, prompts_b = _prompts(rows_a), _prompts(rows_b)
    for scene in sorted(set(prompts_a) & set(prompts_b)):
        if prompts_a[scene] != prompts_b[scene]:
            a, b = sorted(prompts_a[scene]), sorted(prompts_b[scene])
            problems.append(f"prompt of scene {scene} differs: A {a[0]!r}, B {b[0]!r}")
    differences = [
        f"{key}: A {config_a.get(key)!r}, B {config_b.get(key)!r}"
        for key in MAY_DIFFER
        if config_a.get(key) != config_b.get(key)
    ]
    return problems, differences


def _label(config: Mapping[str, Any], path: str) -> str:
    servers = config.get("servers") or []
    who = ", ".join(servers) if servers else f"policy {config.get('policy', '?')}"
    return f"{path} ({who})"


def _arm_suffix(config: Mapping[str, Any], rows: Sequence[Mapping[str, Any]], arm: str) -> str:
    """`` (what arm ``arm`` ran)`` of an A/B run: its policy or servers from the config, else its rows' server."""
    suffix = "" if arm == "a" else "_b"
    servers = config.get("servers" + suffix)
    if isinstance(servers, list) and servers:
        return f" ({', '.join(map(str, servers))})"
    policy = config.get("policy" + suffix)
    if isinstance(policy, str) and policy != "external":
        return f" (policy {policy})"
    seen = sorted({str(r["server"]) for r in rows if r.get("arm") == arm and r.get("server")})
    return f" ({', '.join(seen)})" if seen else ""


# The level of the verdicts: compare_rows' own default and its own range check (one rule, one place).
ALPHA = Flag("--alpha", "significance level of the verdicts", dest="alpha", type=number, metavar="A",
             shown=lambda: show(inspect.signature(compare_rows).parameters["alpha"].default))  # fmt: skip
FLAGS = (
    Flag("--json", "also write the comparison as JSON to FILE ('-': stdout)", dest="json", metavar="FILE"),
    Flag("--force", "compare runs whose settings differ (recorded in the JSON)", dest="force", action="store_true",
         default=False),
    ALPHA,
)  # fmt: skip


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineErrorParser(
        prog="dz-gym-compare",
        description="Paired A/B comparison of two dz-gym-eval runs (or of one A/B run): is B better than A?",
    )
    parser.add_argument("runs", nargs="+", metavar="RUN",
                        help="RUN_A RUN_B, one A/B run directory, or K >= 3 runs to rank")  # fmt: skip
    add_flags(parser, FLAGS)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    problem = check_output_file(args.json, "--json")
    if problem is not None:  # before any run is read
        parser.error(problem)
    level = {} if args.alpha is None else {"alpha": args.alpha}
    if len(args.runs) > 2:
        return _rank(parser, args, level)
    problems: list[str] = []
    differences: list[str] = []
    try:
        if len(args.runs) == 2:
            (config_a, rows_a), (config_b, rows_b) = load_run(args.runs[0]), load_run(args.runs[1])
            problems, differences = comparability(config_a, rows_a, config_b, rows_b)
            if problems and not args.force:
                parser.error(f"runs not comparable: {'; '.join(problems)} (--force compares them anyway)")
            labels = {"a": _label(config_a, args.runs[0]), "b": _label(config_b, args.runs[1])}
            result = compare_rows(rows_a, rows_b, labels=labels, **level)
            result["failure_modes"] = mode_transitions(rows_a, rows_b)
        else:
            config, rows = load_run(args.runs[0])
            if not any("arm" in row for row in rows):
                parser.error(f"{args.runs[0]}: not an A/B run (its rows carry no 'arm'); give two runs: RUN_A RUN_B")
            if config.get("arm_specs"):  # a run of named arms (--arm): its leaderboard
                ranking = _rank_arms_of_run(config, rows, level, Path(args.runs[0]))
                return _print_ranking(args, ranking, [args.runs[0]], [])
            labels = {arm: f"{args.runs[0]} arm {arm.upper()}" + _arm_suffix(config, rows, arm) for arm in "ab"}
            result = compare_rows(rows, labels=labels, **level)
            arm_rows = [[r for r in rows if r.get("arm") == arm] for arm in "ab"]
            result["failure_modes"] = mode_transitions(*arm_rows)
    except ValueError as exc:
        parser.error(flag_message(exc, FLAGS))
    result["runs"] = list(args.runs)
    result["forced"] = bool(problems)
    result["problems"] = problems
    result["differences"] = differences
    overall = result["scenes"]["overall"]
    if overall["pairs"] + overall["errored_pairs"] + overall["missing"] == 0:
        parser.error("no pairs: the runs share no (scene, seed); run both with the same --seed and scenes")
    sequential = len(args.runs) == 1 and bool(config.get("sequential"))
    if sequential:  # the run stopped by its sequential test: no fixed-n verdicts, the numbers descriptive
        result = descriptive_comparison(result)
    text = format_comparison(result, descriptive=sequential)
    text += "\n" + "\n".join(format_transitions(result["failure_modes"]))
    if sequential:
        text += "\n\n" + _sequential_line(args.runs[0])
    notes = [f"note: not comparable, compared anyway (--force): {p}" for p in problems]
    notes += [f"note: {d} (this may be what the comparison is about)" for d in differences]
    return _emit(args.json, result, "\n".join([text, *notes]))


def _emit(path: str | None, result: Mapping[str, Any], text: str) -> int:
    """Print ``text`` and write ``result`` as JSON to ``path`` (``-``: stdout, ``text`` then to stderr); a file
    that cannot be written after all (checked before the work) is one line and exit status 1."""
    if path == "-":
        print(json.dumps(result, indent=2))
        print(text, file=sys.stderr)
        return 0
    print(text)
    if path:
        try:
            Path(path).write_text(json.dumps(result, indent=2) + "\n")
        except OSError as exc:
            print(f"dz-gym-compare: error: --json: cannot write {path} ({exc.strerror or exc})", file=sys.stderr)
            return 1
    return 0


def _sequential_line(run: str) -> str:
    """The decision of a sequential A/B run, from its summary (the line to read after such a run)."""
    try:
        entry = json.loads((Path(run) / "summary.json").read_text()).get("sequential") or {}
    except (OSError, json.JSONDecodeError, AttributeError):
        entry = {}
    if not entry:
        return "DECISION (sequential test): not in summary.json (run still in progress?); the table is descriptive"
    return f"DECISION (sequential test): {entry.get('reason')} [stopped by: {entry.get('stopped_by')}]\n  {entry.get('why')}"


def _rank(parser: argparse.ArgumentParser, args: argparse.Namespace, level: Mapping[str, Any]) -> int:
    """K >= 3 runs: check each against the first, rank them on their common seeds, print the leaderboard."""
    problems: list[str] = []
    try:
        loaded = [load_run(run) for run in args.runs]
        for run, (config, rows) in zip(args.runs[1:], loaded[1:]):
            found, _ = comparability(loaded[0][0], loaded[0][1], config, rows)
            problems += [f"{run}: {p}" for p in found]
        if problems and not args.force:
            parser.error(f"runs not comparable: {'; '.join(problems)} (--force compares them anyway)")
        names = [str(run) for run in args.runs]
        if len(set(names)) != len(names):
            parser.error("RUN: the same run directory given twice")
        result = rank_arms(outcomes_by_seed({n: rows for n, (_, rows) in zip(names, loaded)}), **level)
    except ValueError as exc:
        parser.error(flag_message(exc, FLAGS))
    return _print_ranking(args, result, list(args.runs), problems)


def _rank_arms_of_run(config: Mapping[str, Any], rows: Sequence[Mapping[str, Any]], level: Mapping[str, Any],
                      run: Path) -> dict:  # fmt: skip
    """The ranking of one run's named arms (``--arm``), in the config's arm order, on their common seeds.

    After ``--select-best`` the arms stopped adaptively and fixed-n claims do not hold: the summary's ranking
    (claims valid at any stop) when it covers every arm, else the rates with no claims, marked descriptive."""
    names = [str(spec).split("=", 1)[0] for spec in config["arm_specs"]]
    outcomes = outcomes_by_seed({n: [r for r in rows if r.get("arm") == n] for n in names})
    if config.get("select_best"):
        try:
            saved = json.loads((run / "summary.json").read_text()).get("ranking")
        except (OSError, json.JSONDecodeError, AttributeError):
            saved = None
        if isinstance(saved, dict) and {e.get("arm") for e in saved.get("arms", [])} == set(names):
            result = saved
        else:
            result = rank_arms(outcomes, **level, claims=[], claims_method="no claims: the run's summary.json, whose "
                               "claims hold after the race's adaptive stop, is missing")  # fmt: skip
    else:
        result = rank_arms(outcomes, **level)
    result["labels"] = {str(spec).split("=", 1)[0]: str(spec).split("=", 1)[1] for spec in config["arm_specs"]}
    return result


def _print_ranking(args: argparse.Namespace, result: dict, runs: list[str], problems: list[str]) -> int:
    """Print the leaderboard (and write its ``dz-gym-rank/1`` JSON)."""
    result.update(schema="dz-gym-rank/1", runs=runs, forced=bool(problems), problems=problems)
    return _emit(args.json, result, format_ranking(result))


if __name__ == "__main__":
    sys.exit(main())
