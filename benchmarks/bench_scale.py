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

Usage::

    MUJOCO_GL=egl python benchmarks/bench_scale.py --sizes 8,64,256 --shards 4 --episode-steps 64
    MUJOCO_GL=egl python benchmarks/bench_scale.py --quick        # N=8, 2 shards, short episodes

``--repeat R`` runs one process and the shards R times in turn per N and prints the medians (for a shared,
noisy machine).
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("MUJOCO_GL", "egl")
sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_eval  # noqa: E402  (the bound, s_N, the one-env loop and the one-process run)

from dz_gym.eval.shards.driver import connect, evaluate_sharded  # noqa: E402
from dz_gym.eval.shards.options import RayOptions  # noqa: E402
from dz_gym.eval.shards.plan import cpus_per_shard, env_workers, plan_shards  # noqa: E402

HORIZON = bench_eval.HORIZON


def bound(n: int, workers: int, latency_s: float, step_s: float) -> float:
    """``8N / (ceil(N/W) * L + 8 * s)`` (see ``bench_eval``)."""
    return HORIZON * n / (math.ceil(n / workers) * latency_s + HORIZON * step_s)


class Probe:
    """A Ray actor holding one shard's simulator batch, to measure its batch step (``bench_eval``'s way)."""

    def __init__(self, num_envs: int, num_workers: int, max_steps: int, scene: int):
        from dz_gym.envs import make_droid_env

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


def shard_step_s(ray, n: int, k: int, max_steps: int, scene: int) -> tuple[float, float]:
    """s of K shards, (together, alone): K probes with the shards' CPUs and workers, all built first; then
    measured all at once (5 cycles, starting together), then one at a time. The slowest probe counts."""
    nodes = [node for node in ray.nodes() if node.get("Alive")]
    node_cpus = max(float(node.get("Resources", {}).get("CPU", 0)) for node in nodes)
    per_node = -(-k // len(nodes))
    probes = []
    for shard in plan_shards({scene: range(n)}, n, k):
        cpus = cpus_per_shard(shard.num_envs, node_cpus, per_node)
        actor = ray.remote(Probe).options(num_cpus=cpus, scheduling_strategy="SPREAD")
        probes.append(actor.remote(shard.num_envs, env_workers(shard.num_envs, cpus), max_steps, scene))
    try:
        ray.get([p.ready.remote() for p in probes], timeout=600)  # all built first: start-up costs no CPU then
        start_at = time.time() + 1.0
        together = max(ray.get([p.measure.remote(start_at, 5) for p in probes], timeout=600))
        alone = max(ray.get(p.measure.remote(), timeout=600) for p in probes)
        return together, alone
    finally:
        for p in probes:
            ray.kill(p)


def sharded(url: str, n: int, k: int, episodes: int, max_steps: int, scene: int, address: str) -> dict:
    import tempfile

    from dz_gym.eval.config import EvalConfig
    from dz_gym.eval.rundir import RunDir

    config = EvalConfig(scenes=[scene], episodes=episodes, num_envs=n, max_steps=max_steps, video=False, report=False)
    with tempfile.TemporaryDirectory() as root:
        run_dir = RunDir.create(root, config)
        summary = evaluate_sharded(
            config, run_dir, [url], RayOptions(address=address, shards=k), progress=False, log=lambda _: None
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
    args = parser.parse_args()
    if args.quick:
        args.sizes, args.episode_steps, args.baseline_episodes, args.episodes_per_env = "8", 32, 1, 2
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


if __name__ == "__main__":
    sys.exit(main())
