"""Scale-out throughput: env-steps/s of ``dz-gym-eval`` in one process and in K Ray shards, against the bound.

For each N of ``--sizes`` one reference server (``dz-gym-serve --policy hold --workers W --latency-ms L``,
W = N unless ``--server-workers`` is given) serves, in turn:

- *one process*: :func:`dz_gym.eval.evaluate.evaluate` with N envs (``bench_eval.evaluator``: its own s_N is
  measured on its env right before the run);
- *K shards*: :func:`dz_gym.eval.shards.driver.evaluate_sharded` with N envs over K shards on Ray
  (``--ray local`` starts a private instance on this machine). Its s is measured by K probe actors with the
  shards' resources and env workers, all stepping at once, as the shards do in the run and as one process's
  s_N steps all N envs on all cores at once (the slowest probe counts). The table also shows s of each probe
  stepping *alone* (the machine's other cores and the GPU idle) and the share of the bound computed from it:
  a stricter figure, which also charges the shards for the cores and the GPU that they share.

Every row is compared with the synchronous bound of ``bench_eval``, ``8N / (ceil(N/W) * L + 8 * s)`` (s: the
batch step of the simulator, measured with the evaluator's render pattern), and with the reference client's
one-env loop (``bench_eval.one_env_loop``, measured once). For the shards it also prints the speed-up over one
process at the same N and the scaling efficiency: that speed-up over the one the bounds allow
(``(rate_K / rate_1) / (bound_K / bound_1)``; 1.0 = the shards turn all of their simulator gain into speed).
env-steps/s counts the stepping loops (first reset to last step), as one process does: the start of Ray
actors and simulators is printed apart ("start-up").

Targets (16-core GPU host): K shards >= 90 % of their bound at N = 64 and N = 256 with 64-step episodes.
On a 2-core machine: K = 2 shards at N = 8 not slower than one process (>= 0.9x).

``--gpus 1,2,4`` measures GPU scaling instead, in one run: for each GPU count g (those the machine has), a
private Ray instance with g GPUs and g times the machine's CPUs per GPU runs N = n*g envs on K = k*g shards
(``--sizes``: n per GPU, ``--shards``: k per GPU), each shard asking for 1/k of a GPU, so that k shards
render on each GPU (every shard's MuJoCo renders on the GPU Ray gave it). Each row shows env-steps/s, the
share of the synchronous bound (s of the K probes stepping together, each on its shard's GPU share), the
views drawn per second per GPU (3 camera views per env every 8 steps) and the speed-up over one GPU at
the same n. Targets (at n = 256): >= 1.8x on 2 GPUs, >= 3.5x on 4, >= 90 % of the bound throughout.
``--logical-gpus`` lets Ray declare GPUs the machine does not have (a smoke run with ``MUJOCO_GL=osmesa``).

Usage::

    MUJOCO_GL=egl python benchmarks/bench_scale.py --sizes 8,64,256 --shards 4 --episode-steps 64
    MUJOCO_GL=egl python benchmarks/bench_scale.py --quick        # N=8, 2 shards, short episodes
    MUJOCO_GL=egl python benchmarks/bench_scale.py --gpus 1,2,4 --sizes 256 --shards 4 --episode-steps 64

``--repeat R`` runs one process and the shards R times in turn per N and prints the medians (for a shared,
noisy machine).
"""

from __future__ import annotations

import argparse
import math
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

os.environ.setdefault("MUJOCO_GL", "egl")
sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_eval  # noqa: E402  (the bound, s_N, the one-env loop and the one-process run)

from dz_gym.envs import droid  # noqa: E402
from dz_gym.eval.plan import slot_ranges  # noqa: E402
from dz_gym.eval.shards.driver import connect, evaluate_sharded  # noqa: E402
from dz_gym.eval.shards.options import RayOptions  # noqa: E402
from dz_gym.eval.shards.plan import cpus_per_shard, env_workers  # noqa: E402

HORIZON = bench_eval.HORIZON
VIEWS = len(droid.CAMERA_KEYS)  # views an env renders before each request


def bound(n: int, workers: int, latency_s: float, step_s: float) -> float:
    """``8N / (ceil(N/W) * L + 8 * s)`` (see ``bench_eval``)."""
    return HORIZON * n / (math.ceil(n / workers) * latency_s + HORIZON * step_s)


class Probe:
    """A Ray actor holding one shard's simulator batch, to measure its batch step (``bench_eval``'s way)."""

    def __init__(self, num_envs: int, num_workers: int, max_steps: int, scene: int):
        from dz_gym.envs import make_droid_env
        from dz_gym.eval.shards.worker import pin_actor

        pin_actor()  # render on this probe's GPU, as a shard does

        self.env = make_droid_env(
            backend="mujoco", scene=scene, num_envs=num_envs, seed=0, max_episode_length=10_000, num_workers=num_workers
        )

    def ready(self) -> bool:
        return True

    def measure(self, start_at: float | None = None, cycles: int = 3) -> float:
        """s of this probe; ``start_at`` (epoch seconds): begin then, so that probes called together step
        together."""
        if start_at is not None:
            time.sleep(max(0.0, start_at - time.time()))
        return bench_eval.measure_batch_step(self.env, cycles=cycles)

    def close(self) -> None:
        self.env.close()


def shard_step_s(ray, n: int, k: int, max_steps: int, scene: int, gpus: float = 0.0) -> tuple[float, float]:
    """s of K shards, (together, alone): K probes with the shards' CPUs, GPUs and workers, all built first;
    then measured all at once (5 cycles, starting together), then one at a time. The slowest probe counts."""
    nodes = [node for node in ray.nodes() if node.get("Alive")]
    node_cpus = max(float(node.get("Resources", {}).get("CPU", 0)) for node in nodes)
    per_node = -(-k // len(nodes))
    probes = []
    for start, stop in slot_ranges(n, k):
        cpus = cpus_per_shard(stop - start, node_cpus, per_node)
        actor = ray.remote(Probe).options(num_cpus=cpus, num_gpus=gpus, scheduling_strategy="SPREAD")
        probes.append(actor.remote(stop - start, env_workers(stop - start, cpus), max_steps, scene))
    try:
        ray.get([p.ready.remote() for p in probes], timeout=600)  # all built first: start-up costs no CPU then
        start_at = time.time() + 1.0
        together = max(ray.get([p.measure.remote(start_at, 5) for p in probes], timeout=600))
        alone = max(ray.get(p.measure.remote(), timeout=600) for p in probes)
        return together, alone
    finally:
        for p in probes:
            ray.kill(p)


def sharded(
    url: str, n: int, k: int, episodes: int, max_steps: int, scene: int, address: str, gpus: float | None = None
) -> dict:
    import tempfile

    from dz_gym.eval.config import EvalConfig
    from dz_gym.eval.rundir import RunDir

    config = EvalConfig(scenes=[scene], episodes=episodes, num_envs=n, max_steps=max_steps, video=False, report=False,
                        transport_processes=0)  # fmt: skip  # in-process, as every figure of this benchmark
    with tempfile.TemporaryDirectory() as root:
        run_dir = RunDir.create(root, config)
        summary = evaluate_sharded(
            config,
            run_dir,
            [url],
            RayOptions(address=address, shards=k, shard_gpus=gpus),
            progress=False,
            log=lambda _: None,
        )
        summary["chunk_latency_ms"] = bench_eval.mean_latency_ms(run_dir.read_rows())
        return summary


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="8,64,256", help="N values, comma-separated (default 8,64,256)")
    parser.add_argument("--shards", type=int, default=2, help="K shards (default 2)")
    parser.add_argument("--episode-steps", type=int, default=64, help="steps per episode (multiple of 8; default 64)")
    parser.add_argument("--latency-ms", type=float, default=200.0, help="the server's emulated model time L")
    parser.add_argument("--server-workers", type=int, default=None, help="W (default: N, one per env)")
    parser.add_argument("--baseline-episodes", type=int, default=2, help="episodes of the one-env loop")
    parser.add_argument("--ray", default="local", help="Ray address, or 'local' for a private instance (default)")
    parser.add_argument("--scene", type=int, default=1)
    parser.add_argument(
        "--episodes-per-env",
        type=int,
        default=4,
        help="episodes per env slot (default 4: the shards' staggered start-up is then a small part of the run)",
    )
    parser.add_argument("--repeat", type=int, default=1, help="interleaved runs per N; the table shows medians")
    parser.add_argument("--quick", action="store_true", help="N=8 only, 32-step episodes, one baseline episode")
    parser.add_argument("--gpus", default=None, help="GPU counts to measure, e.g. 1,2,4 (GPU scaling; see above)")
    parser.add_argument("--cpus-per-gpu", type=int, default=None, help="CPUs per GPU (default: CPUs / GPUs)")
    parser.add_argument("--logical-gpus", action="store_true", help="let Ray declare GPUs this machine lacks")
    args = parser.parse_args()
    if args.quick:
        args.sizes, args.episode_steps, args.baseline_episodes, args.episodes_per_env = "8", 32, 1, 2
    if args.gpus is not None:
        return gpu_scaling(args)
    sizes = [int(s) for s in args.sizes.split(",") if s.strip()]
    k, steps, latency = args.shards, args.episode_steps, args.latency_ms / 1e3

    from dz_gym.server.launch import start_server_process

    t0 = time.perf_counter()
    owns_ray = connect(RayOptions(address=args.ray))
    import ray

    ray.cloudpickle.register_pickle_by_value(bench_eval)  # the probes run bench_eval's code on the nodes
    cpus = int(sum(float(node.get("Resources", {}).get("CPU", 0)) for node in ray.nodes() if node.get("Alive")))
    rows, base, ratios = [], None, {}
    try:
        for n in sizes:
            workers = args.server_workers or n
            serve = ["--policy", "hold", "--workers", str(workers), "--latency-ms", str(args.latency_ms), "--quiet"]
            with start_server_process(serve) as server:
                url = server.url + bench_eval.PATH
                if base is None:
                    base, _ = bench_eval.one_env_loop(url, args.baseline_episodes, steps, args.scene)
                runs = []
                for r in range(args.repeat):  # interleaved, so that a change of the machine's load hits both
                    one, s_one = bench_eval.evaluator(url, n, n * args.episodes_per_env, steps, args.scene)
                    s_k, s_alone = shard_step_s(ray, n, k, steps, args.scene)
                    ours = sharded(url, n, k, n * args.episodes_per_env, steps, args.scene, args.ray)
                    seg = ours["segments"][-1]
                    rate_1, rate_k = one["env_steps_per_s"], ours["env_steps_per_s"]
                    runs.append((rate_1, s_one, rate_k, s_k, s_alone, seg["driver_wall_s"] - seg["wall_s"]))
                    print(
                        f"N={n} run {r + 1}/{args.repeat}: one process {rate_1:.1f} env-steps/s "
                        f"(s_N {1e3 * s_one:.1f} ms), "
                        f"{k} shards {rate_k:.1f} (s {1e3 * s_k:.1f} ms, alone {1e3 * s_alone:.1f}), "
                        f"{rate_k / rate_1:.2f}x; "
                        f"mean chunk latency {one['chunk_latency_ms']:.0f} / {ours['chunk_latency_ms']:.0f} ms",
                        flush=True,
                    )
            ratios[n] = [rk / r1 for r1, _, rk, _, _, _ in runs]
            rate_1, s_one, rate_k, s_k, s_alone, startup = (statistics.median(col) for col in zip(*runs))
            b1, bk = bound(n, workers, latency, s_one), bound(n, workers, latency, s_k)
            b_alone = bound(n, workers, latency, s_alone)
            rows.append((n, workers, rate_1, b1, s_one, rate_k, bk, s_k, b_alone, s_alone, startup))
    finally:
        if owns_ray:
            ray.shutdown()
    print()
    print(
        f"{steps}-step episodes, {args.episodes_per_env} per env, L={args.latency_ms:.0f} ms, policy hold, "
        f"Ray {args.ray} with {cpus} CPUs, {'medians of ' + str(args.repeat) + ' runs, ' if args.repeat > 1 else ''}"
        f"one-env loop {base:.1f} env-steps/s"
    )
    head = (
        f"{'N':>4}  {'W':>4}  {'mode':>9}  {'env-steps/s':>11}  {'bound':>7}  {'of bound':>8}  {'s (ms)':>7}  "
        f"{'alone: s':>8}  {'of bound':>8}  {'vs one-env':>10}  {'vs 1 proc':>9}  {'scaling eff.':>12}  {'start-up':>8}"
    )
    print(head)
    ok = True
    for n, workers, rate_1, b1, s_one, rate_k, bk, s_k, b_alone, s_alone, startup in rows:
        print(
            f"{n:>4}  {workers:>4}  {'1 process':>9}  {rate_1:>11.1f}  {b1:>7.1f}  {100 * rate_1 / b1:>7.1f}%  "
            f"{1e3 * s_one:>7.1f}  {'':>8}  {'':>8}  {rate_1 / base:>9.2f}x  {'':>9}  {'':>12}  {'':>8}"
        )
        eff = (rate_k / rate_1) / (bk / b1)
        print(
            f"{n:>4}  {workers:>4}  {f'{k} shards':>9}  {rate_k:>11.1f}  {bk:>7.1f}  {100 * rate_k / bk:>7.1f}%  "
            f"{1e3 * s_k:>7.1f}  {1e3 * s_alone:>8.1f}  {100 * rate_k / b_alone:>7.1f}%  {rate_k / base:>9.2f}x  "
            f"{rate_k / rate_1:>8.2f}x  {eff:>12.2f}  {startup:>7.1f}s"
        )
        if n >= 64:
            ok &= rate_k >= 0.9 * bk
        else:
            ok &= statistics.median(ratios[n]) >= 0.9
    if args.repeat > 1:
        for n, values in ratios.items():
            listed = ", ".join(f"{v:.2f}x" for v in values)
            print(f"N={n}: {k} shards vs one process, run by run: {listed} (median {statistics.median(values):.2f}x)")
    print(
        "(bound = 8N / (ceil(N/W) * L + 8 * s), s of the shards stepping together; 'alone': s of each stepping "
        "alone; targets: shards >= 90% of bound at N >= 64, "
        ">= 0.9x one process below (median of runs))"
    )
    print(f"targets {'met' if ok else 'NOT met'}; total {time.perf_counter() - t0:.0f} s")
    return 0 if ok else 1


def machine_gpus() -> int:
    """The NVIDIA GPUs this machine has (``nvidia-smi -L``; 0 without it), within CUDA_VISIBLE_DEVICES."""
    if shutil.which("nvidia-smi") is None:
        return 0
    try:
        listed = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=60, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return 0
    count = sum(1 for line in listed.stdout.splitlines() if line.startswith("GPU "))
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    return count if visible is None else min(count, len([v for v in visible.split(",") if v.strip()]))


def gpu_run(args, g: int, n: int, k: int, cpus: int) -> dict:
    """One GPU count: a private Ray with ``g`` GPUs and ``cpus`` CPUs, ``n`` envs on ``k`` shards over them."""
    from dz_gym.server.launch import start_server_process

    each = (10_000 // args.shards) / 10_000  # 1/k, rounded down as Ray counts GPUs (1e-4): k fit on a GPU
    steps, latency = args.episode_steps, args.latency_ms / 1e3
    workers = args.server_workers or n
    owns_ray = connect(RayOptions(address="local", local_cpus=cpus, local_gpus=g))
    import ray

    ray.cloudpickle.register_pickle_by_value(bench_eval)
    serve = ["--policy", "hold", "--workers", str(workers), "--latency-ms", str(args.latency_ms), "--quiet"]
    runs = []
    try:
        with start_server_process(serve) as server:
            url = server.url + bench_eval.PATH
            for _ in range(args.repeat):
                s_k, s_alone = shard_step_s(ray, n, k, steps, args.scene, gpus=each)
                ours = sharded(url, n, k, n * args.episodes_per_env, steps, args.scene, "local", gpus=each)
                gpus_used = sorted({str(s.get("gpu")) for s in ours["shards"]["per_shard"]})
                runs.append((ours["env_steps_per_s"], s_k, s_alone, len(gpus_used)))
                print(
                    f"{g} GPU(s), N={n}, {k} shards: {ours['env_steps_per_s']:.1f} env-steps/s "
                    f"(s {1e3 * s_k:.1f} ms, alone {1e3 * s_alone:.1f}); shards on GPUs {', '.join(gpus_used)}",
                    flush=True,
                )
    finally:
        if owns_ray:
            ray.shutdown()
    rate, s_k, s_alone, used = (statistics.median(col) for col in zip(*runs))
    b = bound(n, workers, latency, s_k)
    return {"g": g, "n": n, "k": k, "cpus": cpus, "rate": rate, "bound": b, "s": s_k, "s_alone": s_alone,
            "used": used, "views_per_gpu": rate * VIEWS / HORIZON / g}  # fmt: skip


def gpu_scaling(args) -> int:
    """``--gpus``: env-steps/s, share of the bound and views/s per GPU for each GPU count (see the docstring)."""
    t0 = time.perf_counter()
    wanted = sorted({int(g) for g in args.gpus.split(",") if g.strip()})
    have = machine_gpus()
    counts = wanted if args.logical_gpus else [g for g in wanted if g <= have]
    skipped = [g for g in wanted if g not in counts]
    if skipped:
        print(f"skipped {skipped} GPU(s): this machine has {have} (--logical-gpus declares them anyway)")
    if not counts:
        return 2
    gpus_here = max(counts) if args.logical_gpus else have  # the CPUs are shared out as on this machine
    per_gpu = args.cpus_per_gpu or max(1, (os.cpu_count() or 1) // max(1, gpus_here))
    sizes = [int(s) for s in args.sizes.split(",") if s.strip()]
    results = [gpu_run(args, g, n * g, args.shards * g, per_gpu * g) for n in sizes for g in counts]
    print()
    print(
        f"{args.episode_steps}-step episodes, {args.episodes_per_env} per env, L={args.latency_ms:.0f} ms, policy "
        f"hold, {args.shards} shards per GPU ({1 / args.shards:g} GPU each), {per_gpu} CPUs per GPU"
        + (f", medians of {args.repeat} runs" if args.repeat > 1 else "")
    )
    print(
        f"{'GPUs':>4}  {'N':>5}  {'shards':>6}  {'CPUs':>4}  {'env-steps/s':>11}  {'bound':>7}  {'of bound':>8}  "
        f"{'s (ms)':>7}  {'views/s/GPU':>11}  {'vs 1 GPU':>8}  {'GPUs used':>9}"
    )
    ok = True
    targets = {2: 1.8, 4: 3.5}
    for r in results:
        base = next(b for b in results if b["n"] // b["g"] == r["n"] // r["g"] and b["g"] == counts[0])
        speedup, share = r["rate"] / base["rate"], r["rate"] / r["bound"]
        print(
            f"{r['g']:>4}  {r['n']:>5}  {r['k']:>6}  {r['cpus']:>4}  {r['rate']:>11.1f}  {r['bound']:>7.1f}  "
            f"{100 * share:>7.1f}%  {1e3 * r['s']:>7.1f}  {r['views_per_gpu']:>11.0f}  {speedup:>7.2f}x  "
            f"{r['used']:>9.0f}"
        )
        ok &= share >= 0.9 and (base["g"] != 1 or speedup >= targets.get(r["g"], 0.0))
    print(
        "(vs 1 GPU: env-steps/s over the smallest GPU count's at the same N per GPU; GPUs used: by the shards, "
        "from the runs' summaries; targets: "
        ">= 90% of the bound, >= 1.8x on 2 GPUs and >= 3.5x on 4 over one)"
    )
    print(f"targets {'met' if ok else 'NOT met'}; total {time.perf_counter() - t0:.0f} s")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
