"""``dz-gym-report``: one static HTML page to look at an evaluation run (or compare two).

:func:`write_report` reads a run directory (``summary.json``, ``episodes.jsonl``, trajectories, videos) and
writes ``report.html`` next to them: the run's header, success per scene with Wilson intervals, milestones,
errored episodes, plots, a filterable grid of episodes with their videos and trajectories, and with a second
run (or an A/B run) the paired comparison; a run of named arms (``--arm``) gets the leaderboard and its
neighbours' discordant episodes. The page needs no server and no network: open it from the file
system. See ``docs/report.md``.

Example::

    from dz_gym.report import write_report
    path = write_report("runs/dz_gym_eval/20261130-120000_scene1")       # -> .../report.html
    write_report("runs/a", "runs/b", out_dir="runs/a_vs_b")             # paired comparison page
"""

from __future__ import annotations

import os
from pathlib import Path

from dz_gym.eval.rundir import RunDir
from dz_gym.report.load import REPORT_FILE, RunView, load_run

__all__ = ["REPORT_FILE", "RunView", "build_report", "load_run", "write_report"]


def build_report(
    run_dir: str | os.PathLike,
    run_dir_b: str | os.PathLike | None = None,
    *,
    out_dir: str | os.PathLike | None = None,
    force: bool = False,
) -> str:
    """The HTML text of the report of ``run_dir`` (compared with ``run_dir_b`` when given), for ``out_dir``.

    Each run's rows go through the ledger checks of a resume (:func:`~dz_gym.report.load.checked_rows`). Two
    runs that ``dz-gym-compare`` would refuse to compare (another backend, step limit, horizon or prompt:
    :func:`dz_gym.compare.comparability`) are a one-line ``ValueError``, unless ``force``: then the page shows
    why and draws no verdict."""
    from dz_gym.report.page import build_page

    views = [load_run(run_dir, label="a" if run_dir_b is not None else "")]
    problems: list[str] = []
    if run_dir_b is not None:
        from dz_gym.compare import comparability

        views.append(load_run(run_dir_b, label="b"))
        problems, _ = comparability(views[0].config, views[0].rows, views[1].config, views[1].rows)
        if problems and not force:
            raise ValueError(f"runs not comparable: {'; '.join(problems)} (--force writes the page anyway, "
                             "without verdicts)")  # fmt: skip
    return build_page(views, Path(out_dir) if out_dir is not None else Path(run_dir), problems)


def write_report(
    run_dir: str | os.PathLike,
    run_dir_b: str | os.PathLike | None = None,
    *,
    out_dir: str | os.PathLike | None = None,
    filename: str = REPORT_FILE,
    force: bool = False,
) -> Path:
    """Write the report into ``out_dir`` (default: ``run_dir``) atomically; returns the page's path."""
    target = Path(out_dir) if out_dir is not None else Path(run_dir)
    html = build_report(run_dir, run_dir_b, out_dir=target, force=force)
    return RunDir(target).write_file(filename, html.encode("utf-8"))
