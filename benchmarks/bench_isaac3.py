"""Isaac Lab 3.0 kit-less throughput on one GPU: env-steps/s of ``dz-gym-eval`` at N envs against the bound.

For each N of ``--sizes`` a fresh child process (Isaac Lab builds one simulation per process) runs the
DROID task ``DZ-DROID-CubeInBowl-Newton-v0`` (Newton physics with the MuJoCo-Warp solver and CUDA graph
capture, Newton Warp cameras, three 180x320 views per env) through the isaac backend, against a reference
server in a subprocess (``dz-gym-serve --policy hold --workers N --latency-ms L``), and measures:

- ``s_N``: seconds per batch step (physics, the three views of every env, the state probe), after warm-up;
- GPU memory: device memory in use after the env is built and stepped, less what was in use before
  (``torch.cuda.mem_get_info``: it counts Warp's allocations too), in total and per env;
- env-steps/s of :func:`dz_gym.eval.evaluate.evaluate` with N envs and N episodes, synchronous and with
  ``--prefetch K``, against the synchronous bound ``8N / (ceil(N/W) * L + 8 * s_N)`` (bench_eval's).

The same run measures the embedded MuJoCo backend (``--mujoco-sizes``, its worker processes on this host's
cores) the same way, as the baseline of the same machine. Targets: N = 1024 fits on the GPU; at N = 256 the
prefetching evaluator reaches >= 90 % of the bound.

Usage (the GPU host; Isaac Lab 3.0 installed by ``scripts/setup_isaac3.sh``)::

    python benchmarks/bench_isaac3.py --sizes 8,64,256,1024 --mujoco-sizes 64,256 --max-steps 64
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("MUJOCO_GL", "egl")
sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_eval  # noqa: E402  (measure_batch_step, the MuJoCo env, mean_latency_ms)

TASK = "DZ-DROID-CubeInBowl-Newton-v0"
PATH = bench_eval.PATH
HORIZON = bench_eval.HORIZON
RESULT = "BENCH_RESULT "


def bound(n: int, workers: int, latency_s: float, step_s: float) -> float:
    """``8N / (ceil(N/W) * L + 8 * s)``."""
    return HORIZON * n / (math.ceil(n / workers) * latency_s + HORIZON * step_s)


def _gpu_used() -> int:
    try:
        import torch

        if not torch.cuda.is_available():
            return 0
        free, total = torch.cuda.mem_get_info()
        return int(total - free)
    except ImportError:
        return 0


def _isaac_env(num_envs: int, max_steps: int, device: str):
    from dz_gym.envs.isaac import make_env

    env = make_env(TASK, num_envs=num_envs, device=device, seed=0, close_app_on_close=False)
    env.max_episode_length = max_steps
    return env


def child(args) -> dict:
    """One backend at one N: s_N, memory, and the evaluator's rates (synchronous and prefetching)."""
    from dz_gym.eval.config import EvalConfig
    from dz_gym.eval.evaluate import evaluate
    from dz_gym.eval.rundir import RunDir
    from dz_gym.server.launch import start_server_process

    n, backend = args.num_envs, args.child
    before = _gpu_used()
    start = time.perf_counter()
    if backend == "isaac":
        env = _isaac_env(n, args.max_steps, args.device)
        scene = env.task.key
    else:
        env = bench_eval.make_env(n, args.max_steps, 1)
        scene = 1
    built_s = time.perf_counter() - start
    step_s = bench_eval.measure_batch_step(env, cycles=args.cycles)
    memory = _gpu_used() - before
    out = {"backend": backend, "n": n, "build_s": built_s, "step_s": step_s, "gpu_bytes": memory, "runs": {}}

    def factory(scene_id, config, **_):
        env.max_episode_length = config.max_steps
        return env

    env.close = lambda: None  # both runs use this env (Isaac Lab builds one simulation per process)

    serve = ["--policy", "hold", "--workers", str(n), "--latency-ms", str(args.latency_ms), "--quiet"]
    with start_server_process(serve, timeout=120.0) as server:
        for prefetch in sorted({0, args.prefetch}):
            config = EvalConfig(
                scenes=[scene], episodes=n, num_envs=n, max_steps=args.max_steps, video=False, report=False,
                prefetch=prefetch, backend=backend,
            )  # fmt: skip
            with tempfile.TemporaryDirectory() as root:
                run_dir = RunDir.create(root, config)
                summary = evaluate(
                    config, run_dir, [server.url + PATH], env_factory=factory, progress=False, log=lambda _: None
                )
                rows = run_dir.read_rows()
            out["runs"][prefetch] = {
                "rate": summary["env_steps_per_s"],
                "latency_ms": bench_eval.mean_latency_ms(rows),
                "episodes": len(rows),
            }
    out["gpu_bytes_after_runs"] = _gpu_used() - before
    return out


def run_child(backend: str, n: int, args) -> dict | None:
    command = [sys.executable, __file__, "--child", backend, "--num-envs", str(n), "--latency-ms", str(args.latency_ms),
               "--max-steps", str(args.max_steps), "--prefetch", str(args.prefetch), "--cycles", str(args.cycles),
               "--device", args.device]  # fmt: skip
    start = time.perf_counter()
    proc = subprocess.run(command, capture_output=True, text=True, timeout=args.child_timeout, check=False)
    for line in proc.stdout.splitlines():
        if line.startswith(RESULT):
            result = json.loads(line[len(RESULT) :])
            result["wall_s"] = time.perf_counter() - start
            return result
    tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-15:])
    print(f"{backend} N={n}: no result (exit {proc.returncode}):\n{tail}", flush=True)
    return None


def report(results: list[dict], args) -> bool:
    latency = args.latency_ms / 1000.0
    print()
    print(
        f"L={args.latency_ms:.0f} ms, {args.max_steps}-step episodes, policy hold, W=N server workers, prefetch {args.prefetch}"
    )
    print(f"{'backend':>7} {'N':>5} {'s_N ms':>8} {'GPU MiB':>8} {'MiB/env':>8} {'bound':>8} {'sync':>8} {'of bnd':>7} "
          f"{'prefetch':>8} {'of bnd':>7} {'build s':>8}")  # fmt: skip
    ok = True
    for r in results:
        n, s = r["n"], r["step_s"]
        b = bound(n, n, latency, s)
        sync, pre = r["runs"]["0"]["rate"], r["runs"][str(args.prefetch)]["rate"]
        mib = r["gpu_bytes_after_runs"] / 2**20
        print(f"{r['backend']:>7} {n:>5} {1e3 * s:>8.1f} {mib:>8.0f} {mib / n:>8.2f} {b:>8.1f} {sync:>8.1f} {100 * sync / b:>6.1f}% "
              f"{pre:>8.1f} {100 * pre / b:>6.1f}% {r['build_s']:>8.1f}")  # fmt: skip
        if r["backend"] == "isaac" and n == 256:
            ok &= pre >= 0.9 * b
    sizes = {r["n"] for r in results if r["backend"] == "isaac"}
    if 1024 in [int(v) for v in args.sizes.split(",") if v]:
        ok &= 1024 in sizes
    print(
        "(env-steps/s; bound = 8N / (ceil(N/W) * L + 8 * s_N); targets: N=1024 fits, >= 90% of bound at N=256 with prefetch)"
    )
    return ok


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="8,64,256,1024", help="isaac N values (comma-separated)")
    parser.add_argument("--mujoco-sizes", default="64,256", help="embedded MuJoCo N values ('' for none)")
    parser.add_argument("--latency-ms", type=float, default=200.0)
    parser.add_argument("--max-steps", type=int, default=64, help="steps per episode (multiple of 8)")
    parser.add_argument("--prefetch", type=int, default=4)
    parser.add_argument("--cycles", type=int, default=3, help="8-step cycles timed for s_N")
    parser.add_argument("--device", default="cuda:0")
    parser.add_argument("--child-timeout", type=float, default=900.0)
    parser.add_argument("--json", help="also write the results here")
    parser.add_argument("--child", choices=("isaac", "mujoco"), help=argparse.SUPPRESS)
    parser.add_argument("--num-envs", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        result = child(args)
        print(RESULT + json.dumps(result), flush=True)
        os._exit(0)  # skip Isaac Lab's and Warp's teardown
    t0 = time.perf_counter()
    results = []
    plan = [("isaac", int(v)) for v in args.sizes.split(",") if v]
    plan += [("mujoco", int(v)) for v in args.mujoco_sizes.split(",") if v]
    for backend, n in plan:
        result = run_child(backend, n, args)
        if result is not None:
            results.append(json.loads(json.dumps(result)))  # the run keys as strings, as read back
            print(f"{backend} N={n}: s_N {1e3 * result['step_s']:.1f} ms, {result['wall_s']:.0f} s", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    ok = report(results, args)
    print(f"targets {'met' if ok else 'NOT met'}; total {time.perf_counter() - t0:.0f} s")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
