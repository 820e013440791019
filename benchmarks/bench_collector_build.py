"""The garbage collector's full passes while a simulator's process imports and builds, with and without the
growing freeze (``freeze_collector(as_it_grows=True)``, :mod:`dz_gym.host_process`) that a scene's batch holds
while its env is built.

Each run is a fresh interpreter (a child of this script) that imports ``--modules`` in order and, with
``--build N``, builds the kit-less Isaac Lab task ``DZ-DROID-CubeInBowl-Newton-v0`` of N envs on the CPU (the
third CI environment's stack: isaaclab 3.0.0, Newton, Warp, MuJoCo-Warp), under
:class:`~dz_gym.eval.collector.CollectorPauses`. The baseline arm holds no freeze while it builds (the scene's
batch froze only once built, before this change); the other arm holds the growing freeze from its start. The
arms alternate, ``--repeats`` runs each, so both see the same machine. It prints per arm the full
(generation 2) passes, the seconds they took, the objects the collector tracks at the end and the wall time,
and the ratio of full-pass seconds (baseline / growing).

Usage::

    python benchmarks/bench_collector_build.py [--modules torch,scipy,mujoco] [--build 2] [--repeats 3]
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ARMS = ("no freeze", "growing freeze")
DEFAULT_MODULES = ("torch", "scipy.optimize", "mujoco", "warp", "newton", "mujoco_warp", "isaaclab.envs",
                   "isaaclab_newton")  # fmt: skip
TASK = "DZ-DROID-CubeInBowl-Newton-v0"


def child(arm: str, modules: list[str], build: int) -> dict:
    """One arm's imports (and build) in this fresh interpreter: the collector's passes and the heap."""
    import gc
    import importlib

    from dz_gym import host_process
    from dz_gym.eval.collector import CollectorPauses

    frozen = dataclasses.replace(host_process.UNTOUCHED, freeze_collector=arm == ARMS[1])
    started = time.perf_counter()
    with CollectorPauses() as pauses, host_process.applied(frozen):
        release = host_process.freeze_collector(as_it_grows=True)
        for name in modules:
            importlib.import_module(name)
        if build:
            import gymnasium as gym
            import warp

            import dz_gym  # noqa: F401  (registers the ids)

            warp.config.optimization_level = 0  # as the CPU tests: the compile is minutes shorter
            env = gym.make_vec(TASK, num_envs=build, device="cpu", seed=0, image_shape=(36, 64), max_episode_steps=4)
        tracked = len(gc.get_objects()) + gc.get_freeze_count()
    wall = time.perf_counter() - started
    if build:
        env.close()
    release()
    return {"full_passes": pauses.passes[2], "full_s": pauses.seconds[2], "young_s": sum(pauses.seconds[:2]),
            "tracked": tracked, "wall_s": wall}  # fmt: skip


def run_child(arm: str, modules: list[str], build: int) -> dict:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(HERE.parent), os.environ.get("PYTHONPATH", "")]))
    env.setdefault("WARP_CACHE_PATH", str(Path(sys.prefix) / "warp-cache"))
    command = [sys.executable, __file__, "--child", arm, "--modules", ",".join(modules), "--build", str(build)]
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=1800, check=False)
    if done.returncode != 0:
        raise SystemExit(f"child ({arm}) failed: {done.stderr.strip().splitlines()[-1:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--modules", default=None, help="comma-separated imports (default: those of "
                        f"{', '.join(DEFAULT_MODULES)} this Python has)")  # fmt: skip
    parser.add_argument("--build", type=int, default=0, help="also build the kit-less task of N envs on the CPU")
    parser.add_argument("--repeats", type=int, default=3, help="runs per arm, alternating")
    parser.add_argument("--child", choices=ARMS, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.modules is None:
        names = [m for m in DEFAULT_MODULES if importlib.util.find_spec(m.split(".")[0]) is not None]
    else:
        names = [m for m in args.modules.split(",") if m]
    if args.child:
        print(json.dumps(child(args.child, names, args.build)))
        return 0
    print(f"imports: {', '.join(names)}; build: {f'{TASK}, N = {args.build}, CPU' if args.build else 'none'}; "
          f"{args.repeats} run(s) per arm, alternating; Python {sys.version.split()[0]}")  # fmt: skip
    runs: dict[str, list[dict]] = {arm: [] for arm in ARMS}
    if args.build:
        run_child(ARMS[0], names, args.build)  # Warp's kernels compiled once, outside the timed runs
    for _ in range(args.repeats):
        for arm in ARMS:
            runs[arm].append(run_child(arm, names, args.build))
    print(f"{'arm':>15} | {'full passes':>11} | {'full s':>13} | {'young s':>11} | {'tracked':>9} | {'wall s':>13}")
    for arm in ARMS:
        rows = runs[arm]

        def span(key: str, fmt: str, rows=rows) -> str:
            values = [r[key] for r in rows]
            return f"{format(min(values), fmt)}-{format(max(values), fmt)}"

        print(f"{arm:>15} | {span('full_passes', 'd'):>11} | {span('full_s', '.3f'):>13} | "
              f"{span('young_s', '.3f'):>11} | {span('tracked', 'd'):>9} | {span('wall_s', '.2f'):>13}")  # fmt: skip
    base = statistics.median(r["full_s"] for r in runs[ARMS[0]])
    grown = statistics.median(r["full_s"] for r in runs[ARMS[1]])
    walls = [statistics.median(r["wall_s"] for r in runs[arm]) for arm in ARMS]
    print(
        f"full-pass seconds, median: {base:.3f} -> {grown:.3f} ({base / max(grown, 1e-9):.1f}x less); "
        f"wall {walls[0]:.2f} -> {walls[1]:.2f} s ({walls[0] / walls[1]:.2f}x)"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
