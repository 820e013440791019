"""``dz-gym-report RUN_DIR [RUN_DIR_B] [-o OUT_DIR]``: write the HTML report of a run, or of two runs compared.

Examples::

    dz-gym-report runs/dz_gym_eval/20261130-120000_scene1            # -> that run's report.html
    dz-gym-report runs/a runs/b -o runs/a_vs_b                        # paired A/B page -> runs/a_vs_b/report.html

With one run the page goes into the run directory unless ``-o`` names another folder; with two runs ``-o`` is
required (the page belongs to neither run). Videos are linked relative to the page, so keep the run
directories where they are (or move them together with the output folder). The rows are read through the
same ledger checks as ``dz-gym-eval --resume`` (a duplicate row, a row of another seed or step limit is refused,
naming its line), two runs through ``dz-gym-compare``'s comparability check (refused unless ``--force``, which
draws no verdict), and a video that a resume would withdraw (missing, or not a complete mp4) is not linked.
Exit status: 0 on success, 2 for bad arguments (not a run directory, a missing folder, an output folder that
cannot be written: checked before the page is built; rows that are not the run's plan; runs not comparable).
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from dz_gym.cli_types import OneLineErrorParser
from dz_gym.eval.preflight import check_writable
from dz_gym.report import REPORT_FILE, write_report


def build_parser() -> argparse.ArgumentParser:
    p = OneLineErrorParser(
        prog="dz-gym-report", description="Write a static HTML report of a dz-gym-eval run (or compare two runs)."
    )
    p.add_argument("run_dir", type=Path, metavar="RUN_DIR", help="a dz-gym-eval run directory (A in a comparison)")
    p.add_argument(
        "run_dir_b",
        type=Path,
        nargs="?",
        metavar="RUN_DIR_B",
        help="a second run to compare with, paired by scene and seed (B)",
    )
    p.add_argument(
        "--force",
        action="store_true",
        help="with two runs that are not comparable (another backend, step limit, horizon or prompt): write the "
        "page anyway, the comparison without verdicts",
    )
    p.add_argument(
        "-o",
        "--out-dir",
        type=Path,
        metavar="OUT_DIR",
        help=f"folder for {REPORT_FILE} (default: RUN_DIR; required with two runs)",
    )
    return p


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    if args.run_dir_b is not None and args.out_dir is None:
        parser.error("-o/--out-dir: required when comparing two runs (the page belongs to neither run directory)")
    for name, path in (("RUN_DIR", args.run_dir), ("RUN_DIR_B", args.run_dir_b)):
        if path is not None and not path.is_dir():
            parser.error(f"{name}: expected a run directory, got {path} (not a directory)")
    problem = check_writable(args.out_dir or args.run_dir, "-o/--out-dir" if args.out_dir else "RUN_DIR")
    if problem is not None:  # before the rows are read and the page is built
        parser.error(problem)
    try:
        path = write_report(args.run_dir, args.run_dir_b, out_dir=args.out_dir, force=args.force)
    except ValueError as exc:
        parser.error(str(exc))
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
