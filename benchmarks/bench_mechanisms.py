"""Does each transport mechanism pay end to end? Every mechanism on and off in one process, interleaved.

For each N of ``--sizes`` one child process builds the env once (Isaac Lab builds one simulation per process)
and starts the hold servers once, then runs :func:`dz_gym.eval.evaluate.evaluate` of N envs and N episodes
``--runs`` times in each configuration: every mechanism on (``all``), and each mechanism off in turn with the
others on (``-NAME``). The configurations are interleaved (run r takes them in an order rotated by r), so
the host's drift over the minutes of a run falls on every configuration alike, and each configuration runs in
the two modes of the evaluator that matter for throughput: *sync* (each reply waited for at the step it is due)
and *locked* (``--prefetch K --simulated-delay K``).

The mechanisms (what turning one off does here, in this process, on the tree as it is):

- ``worker_processes``: the sessions in worker processes (:class:`~dz_gym.transport.ProcessSessionPool`) --
  off: every session on this process's loop thread (``transport_processes=0``);
- ``host_views``: the GPU's views copied straight into memory the workers map -- off: the pool has no view
  memory, every request is copied into its worker's arena;
- ``worker_framing``: the workers frame a batch's requests from one template -- off: the caller packs
  every request;
- ``page_lock``: the view memory page-locked for CUDA (one DMA copy from the GPU) -- off: pageable;
- ``populate_views``: the view memory made and its pages mapped ahead (``madvise``) while the env resets --
  off: the first batch makes it and its first copy faults the pages in.

The last two are the settings of :mod:`dz_gym.host_process`: a configuration applies the evaluator's settings
with that one turned off, which the evaluator then keeps. (The run recorded in benchmarks/results/ also turned
off two mechanisms since removed, ``heap_thresholds`` and ``collector_freeze``: :func:`table` renders a result
file whatever mechanisms it names.)

A mechanism *pays* at a size and mode when its runs' range lies wholly above the runs' range without it;
it *costs* when wholly below; otherwise its gain is within the run-to-run spread. Ratios are on/off of the
median env-steps/s. The configurations share one env, one set of servers, one process and one host.

Usage (the GPU host; Isaac Lab 3.0 installed by ``scripts/setup_isaac3.sh``; a smoke run anywhere with
``--backend mujoco --sizes 8 --max-steps 16 --runs 1 --processes 2``)::

    python benchmarks/bench_mechanisms.py --sizes 1024,256 --runs 3 --servers 8 --json mechanisms.json
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("MUJOCO_GL", "egl")
sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_eval  # noqa: E402  (the MuJoCo env)
import bench_isaac3  # noqa: E402  (the Isaac env, the core split)

MECHANISMS = (
    "worker_processes",
    "host_views",
    "worker_framing",
    "page_lock",
    "populate_views",
)
MODES = {"sync": (0, None), "locked": (4, 4)}
RESULT = "BENCH_RESULT "
HOST_SETTINGS = ("page_lock", "populate_views")
"""The mechanisms that are settings of dz_gym.host_process (by the same name)."""


@contextlib.contextmanager
def _patched(owner, name: str, value):
    old = getattr(owner, name)
    setattr(owner, name, value)
    try:
        yield
    finally:
        setattr(owner, name, old)


@contextlib.contextmanager
def mechanism_off(name: str):
    """Turn one mechanism off for the duration (see the module docstring); ``worker_processes`` is the
    config's, handled by the caller."""
    from dz_gym import host_process
    from dz_gym.transport.workers import pool as processes

    if name in HOST_SETTINGS:  # the evaluator's settings with this one off; evaluate() keeps them
        with host_process.applied(host_process.HostProcessSettings().without(name)):
            yield
    elif name == "host_views":
        init = processes.ProcessSessionPool.__init__

        def without_views(self, *args, **kwargs):
            kwargs["views_bytes"] = 0
            init(self, *args, **kwargs)

        with _patched(processes.ProcessSessionPool, "__init__", without_views):
            yield
    elif name == "worker_framing":

        def as_dicts(self, batch, env_ids):
            raise processes._AsDicts("framing off")

        with _patched(processes.ProcessSessionPool, "_template_messages", as_dicts):
            yield
    else:
        yield


def configurations(mechanisms: list[str]) -> list[str]:
    return ["all"] + [f"-{m}" for m in mechanisms]


def rotated(items: list[str], r: int) -> list[str]:
    k = r % len(items)
    return items[k:] + items[:k]


def _evaluate(env_factory, scene, n: int, max_steps: int, mode: str, processes, backend: str, urls) -> float:
    from dz_gym.eval.config import EvalConfig
    from dz_gym.eval.evaluate import evaluate
    from dz_gym.eval.rundir import RunDir

    prefetch, delay = MODES[mode]
    config = EvalConfig(
        scenes=[scene], episodes=n, num_envs=n, max_steps=max_steps, video=False, report=False,
        prefetch=prefetch, simulated_delay=delay, backend=backend, transport_processes=processes,
    )  # fmt: skip
    with tempfile.TemporaryDirectory() as root:
        run_dir = RunDir.create(root, config)
        summary = evaluate(config, run_dir, urls, env_factory=env_factory, progress=False, log=lambda _: None)
        rows = run_dir.read_rows()
    errored = sum(1 for r in rows if r.get("error"))
    if errored or len(rows) != n:
        raise RuntimeError(f"N={n} {mode}: {len(rows)} rows, {errored} errored")
    return float(summary["env_steps_per_s"])


def child(args) -> dict:
    """One N: every configuration ``--runs`` times, interleaved, in both modes."""
    from dz_gym.server.launch import start_server_process

    n = args.num_envs
    client_cores, server_cores = bench_isaac3._split_cores()
    if client_cores:
        os.sched_setaffinity(0, client_cores)
    if args.backend == "isaac":
        env = bench_isaac3._isaac_env(n, args.max_steps, args.device, args.scene)
        scene = env.task.key
    else:
        env = bench_eval.make_env(n, args.max_steps, args.scene)
        scene = args.scene

    def factory(scene_id, config, **_):
        env.max_episode_length = config.plan.max_steps
        return env

    env.close = lambda: None  # every run uses this env
    mechanisms = [m for m in args.mechanisms.split(",") if m]
    processes = None if args.processes == "auto" else int(args.processes)
    count = max(1, min(args.servers, n))
    serve = [
        "--policy",
        "hold",
        "--workers",
        str(math.ceil(n / count)),
        "--latency-ms",
        str(args.latency_ms),
        "--quiet",
    ]
    runs: dict[str, dict[str, list[float]]] = {c: {m: [] for m in MODES} for c in configurations(mechanisms)}
    order = []
    with contextlib.ExitStack() as stack:
        servers = [stack.enter_context(start_server_process(serve, timeout=120.0)) for _ in range(count)]
        for server in servers:
            if server_cores:
                os.sched_setaffinity(server.pid, server_cores)
        urls = [server.url + bench_isaac3.PATH for server in servers]
        _evaluate(factory, scene, n, args.max_steps, "sync", processes, args.backend, urls)  # warm-up, not counted
        for r in range(args.runs):
            for name in rotated(configurations(mechanisms), r):
                off = name[1:] if name.startswith("-") else None
                procs = 0 if off == "worker_processes" else processes
                with mechanism_off(off) if off else contextlib.nullcontext():
                    for mode in rotated(list(MODES), r):
                        rate = _evaluate(factory, scene, n, args.max_steps, mode, procs, args.backend, urls)
                        runs[name][mode].append(rate)
                        order.append([r, name, mode, rate])
                        print(f"N={n} run {r} {name} {mode}: {rate:.0f} env-steps/s", flush=True)
    return {"n": n, "backend": args.backend, "max_steps": args.max_steps, "servers": count,
            "cores": [len(client_cores), len(server_cores)], "processes": args.processes, "runs": runs,
            "order": order}  # fmt: skip


def verdict(on: list[float], off: list[float]) -> str:
    if min(on) > max(off):
        return "pays"
    if max(on) < min(off):
        return "costs"
    return "within spread"


def spread(values: list[float]) -> float:
    return (max(values) - min(values)) / statistics.median(values)


def table(results: list[dict]) -> tuple[str, dict[str, list[str]]]:
    """The markdown table (one row per mechanism, size and mode) and each mechanism's verdicts."""
    lines = [
        "| mechanism | N | mode | on env-steps/s (median, range) | off | on/off | spread on, off | verdict |",
        "|---|---|---|---|---|---|---|---|",
    ]
    verdicts: dict[str, list[str]] = {}
    for result in results:
        runs = result["runs"]
        for name in runs:
            if name == "all":
                continue
            for mode in MODES:
                on, off = runs["all"][mode], runs[name][mode]
                if not on or not off:
                    continue
                v = verdict(on, off)
                verdicts.setdefault(name[1:], []).append(v)
                lines.append(
                    f"| {name[1:]} | {result['n']} | {mode} | {statistics.median(on):,.0f} ({min(on):,.0f}-{max(on):,.0f})"
                    f" | {statistics.median(off):,.0f} ({min(off):,.0f}-{max(off):,.0f})"
                    f" | {statistics.median(on) / statistics.median(off):.2f}x"
                    f" | {100 * spread(on):.0f} %, {100 * spread(off):.0f} % | {v} |"
                )
    return "\n".join(lines), verdicts


def decide(verdicts: list[str]) -> str:
    """Stays if it pays somewhere and costs nowhere."""
    return "stays" if "pays" in verdicts and "costs" not in verdicts else "goes"


def run_child(n: int, args) -> dict | None:
    command = [sys.executable, __file__, "--child", "--num-envs", str(n), "--backend", args.backend,
               "--latency-ms", str(args.latency_ms), "--max-steps", str(args.max_steps), "--runs", str(args.runs),
               "--servers", str(args.servers), "--processes", str(args.processes), "--mechanisms", args.mechanisms,
               "--device", args.device, "--scene", str(args.scene)]  # fmt: skip
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
    result = None
    for line in proc.stdout:
        if line.startswith(RESULT):
            result = json.loads(line[len(RESULT) :])
        else:
            print(line, end="", flush=True)
    proc.wait(timeout=60)
    if result is None:
        print(f"N={n}: no result (exit {proc.returncode})", flush=True)
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="1024,256", help="N values, comma-separated (one child process each)")
    parser.add_argument("--backend", choices=("isaac", "mujoco"), default="isaac")
    parser.add_argument("--runs", type=int, default=3, help="runs of each configuration and mode")
    parser.add_argument("--mechanisms", default=",".join(MECHANISMS), help="the mechanisms turned off in turn")
    parser.add_argument("--processes", default="auto", help="the worker processes when on: auto or a count")
    parser.add_argument("--latency-ms", type=float, default=200.0)
    parser.add_argument("--max-steps", type=int, default=64)
    parser.add_argument("--servers", type=int, default=8)
    parser.add_argument("--device", default="cuda:0")
    parser.add_argument("--scene", type=int, default=1)
    parser.add_argument("--json", help="also write the results here")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--num-envs", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    for m in args.mechanisms.split(","):
        if m and m not in MECHANISMS:
            parser.error(f"--mechanisms: expected names from {', '.join(MECHANISMS)}, got {m!r}")
    if args.child:
        result = child(args)
        print(RESULT + json.dumps(result), flush=True)
        os._exit(0)  # skip Isaac Lab's and Warp's teardown
    start = time.perf_counter()
    results = []
    for n in [int(v) for v in args.sizes.split(",") if v]:
        result = run_child(n, args)
        if result is not None:
            results.append(result)
            if args.json:
                Path(args.json).write_text(json.dumps(results, indent=1))
    text, verdicts = table(results)
    print(text)
    for name, found in verdicts.items():
        print(f"{name}: {decide(found)} ({', '.join(found)})")
    print(f"total {time.perf_counter() - start:.0f} s")
    return 0 if results else 1


if __name__ == "__main__":
    raise SystemExit(main())
