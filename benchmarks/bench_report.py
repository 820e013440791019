"""Report cost: time to write ``report.html`` and time until the page is painted and usable in Chromium.

From a real run directory (``--run-dir``, e.g. ``dz-gym-eval --num-envs 4 --scene 1 --scene 2 --scene 3
--episodes 8``: 24 episodes with videos) it builds a second run directory of ``--episodes`` (default 500)
episodes by replicating the real rows over new episode numbers and seeds (their trajectories and videos
hard-linked, so every file the page refers to exists; the summary recomputed from the rows), then for the real
run and the large one, in one process:

- *write*: :func:`dz_gym.report.write_report` (reading rows, summary and every trajectory, building the page);
- *first paint*: Chromium's ``first-contentful-paint`` after ``page.goto(file://...)``;
- *usable*: when the frame after the page's script started has painted: the first screen of the grid is on
  screen, filters and episode buttons work (``window.dzReport.paintedAt``);
- *all rows*: when the script has added the grid's last row (``window.dzReport.readyAt``);
- *open episode*: a click on an episode's button until the frame with its video element and trajectory plot
  has painted (measured inside the page).

Headless Debian Chromium driven by Playwright, a fresh page per repetition, medians of ``--repeat``. It prints
each case and the ratios of the large run to the real one; a blank page's first paint is the browser's own
floor. Target: usable < 2 s at 500 episodes.

Usage::

    python benchmarks/bench_report.py --run-dir runs/dz_gym_eval/<run> [--episodes 500] [--repeat 5]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

from dz_gym.eval import results
from dz_gym.eval.config import migrate
from dz_gym.eval.rundir import RunDir, episode_name
from dz_gym.report import write_report


def replicate(source: Path, target: Path, episodes: int) -> Path:
    """A run directory of ``episodes`` episodes made of ``source``'s rows, files hard-linked (copied if needed)."""
    src = RunDir(source)
    rows = src.read_rows()
    if not rows:
        raise SystemExit(f"--run-dir: {source} has no episodes")
    config = migrate(json.loads((source / "config.json").read_text()))  # nested, whichever dz-gym wrote it
    scenes = sorted({r["scene"] for r in rows})
    per_scene = -(-episodes // len(scenes))
    config["plan"]["episodes"] = per_scene
    target.mkdir(parents=True)
    (target / "config.json").write_text(json.dumps(config))
    (target / "trajectories").mkdir()
    (target / "videos").mkdir()
    by_scene = {s: [r for r in rows if r["scene"] == s] for s in scenes}
    out = []
    for scene in scenes:
        for k in range(per_scene):
            if len(out) == episodes:
                break
            base = dict(by_scene[scene][k % len(by_scene[scene])])
            base.update(episode=k, seed=config.get("seed", 0) + k, env=k % max(1, int(config.get("num_envs", 1))))
            for field, folder, ext in (("trajectory", "trajectories", "npz"), ("video", "videos", "mp4")):
                if base.get(field):
                    rel = f"{folder}/{episode_name(scene, k)}.{ext}"
                    link(source / base[field], target / rel)
                    base[field] = rel
            out.append(base)
    with open(target / "episodes.jsonl", "w") as f:
        f.writelines(json.dumps(row) + "\n" for row in out)
    old = json.loads((source / "summary.json").read_text()) if (source / "summary.json").exists() else {}
    planned = {s: per_scene for s in scenes}
    summary = results.summarize(
        out,
        planned=planned,
        wall_s=old.get("wall_s"),
        extra={
            k: v
            for k, v in old.items()
            if k in ("command", "backend", "server", "servers", "server_metadata", "versions")
        },
    )
    summary["config"] = config
    summary["complete"] = len(out) == per_scene * len(scenes)
    (target / "summary.json").write_text(json.dumps(summary))
    return target


def link(src: Path, dst: Path) -> None:
    try:
        os.link(src, dst)
    except OSError:
        shutil.copyfile(src, dst)


def time_write(run_dir: Path, repeat: int) -> tuple[float, int]:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        path = write_report(run_dir)
        times.append(time.perf_counter() - t0)
    return statistics.median(times), path.stat().st_size


def time_page(browser, path: Path, repeat: int, *, episode: bool = True) -> dict[str, float]:
    paint, usable, opened, complete = [], [], [], []
    for _ in range(repeat):
        context = browser.new_context(viewport={"width": 1400, "height": 1000})
        page = context.new_page()
        page.goto(path.resolve().as_uri())
        page.wait_for_function(
            "document.readyState === 'complete' && (!document.getElementById('episodes') || (window.dzReport && window.dzReport.paintedAt !== null && window.dzReport.ready))"
        )
        fcp = page.evaluate("(performance.getEntriesByName('first-contentful-paint')[0] || {}).startTime || null")
        paint.append(fcp / 1000.0 if fcp is not None else float("nan"))
        ready = page.evaluate("window.dzReport ? window.dzReport.paintedAt : null")
        if ready is not None:
            usable.append(ready / 1000.0)
            complete.append(page.evaluate("window.dzReport.readyAt") / 1000.0)
        if episode and page.locator("#episodes tr.ep").count():
            # Measured in the page: click -> the frame with the video element and trajectory plot painted.
            ms = page.evaluate(
                """() => new Promise(resolve => {
                  const t0 = performance.now();
                  document.querySelector('#episodes tr.ep button.open').click();
                  requestAnimationFrame(() => setTimeout(() => resolve(performance.now() - t0), 0));
                })"""
            )
            assert page.locator("tr.detail svg.traj, tr.detail .novideo").count() >= 1
            opened.append(ms / 1000.0)
        context.close()
    out = {"first_paint_s": statistics.median(paint)}
    if usable:
        out["usable_s"] = statistics.median(usable)
        out["all_rows_s"] = statistics.median(complete)
    if opened:
        out["open_episode_s"] = statistics.median(opened)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--run-dir", type=Path, required=True, help="a real dz-gym-eval run directory (with videos)")
    p.add_argument("--episodes", type=int, default=500, help="episodes of the synthesized large run (default 500)")
    p.add_argument("--repeat", type=int, default=5, help="repetitions per case; medians are printed (default 5)")
    p.add_argument("--chromium", default=shutil.which("chromium") or "/usr/bin/chromium", help="Chromium executable")
    args = p.parse_args(argv)
    if not (args.run_dir / "config.json").is_file():
        p.error(f"--run-dir: {args.run_dir} is not a dz-gym-eval run directory")
    from playwright.sync_api import sync_playwright

    with tempfile.TemporaryDirectory(prefix="dz-gym-bench-report-") as tmp:
        small = Path(tmp) / "small"
        shutil.copytree(args.run_dir, small, copy_function=lambda s, d: link(Path(s), Path(d)))
        (small / "report.html").unlink(missing_ok=True)
        large = replicate(small, Path(tmp) / "large", args.episodes)
        blank = Path(tmp) / "blank.html"
        blank.write_text("<!doctype html><html><body><p>blank</p></body></html>")
        n_small = len(RunDir(small).read_rows())
        cases = {}
        for name, run in ((f"{n_small} episodes", small), (f"{args.episodes} episodes", large)):
            write_s, size = time_write(run, args.repeat)
            cases[name] = {"write_s": write_s, "bytes": size, "path": run / "report.html"}
        with sync_playwright() as pw:
            browser = pw.chromium.launch(
                executable_path=args.chromium, args=["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"]
            )
            try:
                time_page(browser, blank, 1, episode=False)  # warm the browser's caches
                base = time_page(browser, blank, args.repeat, episode=False)
                for case in cases.values():
                    case.update(time_page(browser, case["path"], args.repeat))
            finally:
                browser.close()
    print(f"blank page: first paint {base['first_paint_s'] * 1000:.0f} ms (the browser's floor)")
    print(
        f"{'case':<14} {'page size':>10} {'write':>9} {'first paint':>12} {'usable':>9} {'all rows':>9} {'open episode':>13}"
    )
    for name, c in cases.items():
        print(
            f"{name:<14} {c['bytes'] / 1024:>8.0f} kB {c['write_s'] * 1000:>6.0f} ms {c['first_paint_s'] * 1000:>9.0f} ms "
            f"{c.get('usable_s', float('nan')) * 1000:>6.0f} ms {c.get('all_rows_s', float('nan')) * 1000:>6.0f} ms "
            f"{c.get('open_episode_s', float('nan')) * 1000:>10.0f} ms"
        )
    (a, ca), (b, cb) = cases.items()
    print(
        f"ratios {b} / {a}: write {cb['write_s'] / ca['write_s']:.1f}x, first paint {cb['first_paint_s'] / ca['first_paint_s']:.2f}x, "
        f"usable {cb['usable_s'] / ca['usable_s']:.2f}x; first paint at {b} vs blank page {cb['first_paint_s'] / base['first_paint_s']:.2f}x"
    )
    ok = cb["usable_s"] < 2.0
    print(f"target usable < 2 s at {b}: {'met' if ok else 'MISSED'} ({cb['usable_s']:.2f} s)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
