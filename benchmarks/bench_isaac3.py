"""Isaac Lab 3.0 kit-less throughput on one GPU: env-steps/s of ``dz-gym-eval`` at N envs against the bound.

For each N of ``--sizes`` a fresh child process (Isaac Lab builds one simulation per process) runs the
DROID task ``DZ-DROID-CubeInBowl-Newton-v0`` (Newton physics with the MuJoCo-Warp solver and CUDA graph
capture, Newton Warp cameras, three 180x320 views per env) through the isaac backend, against a reference
server in a subprocess (``dz-gym-serve --policy hold --workers N --latency-ms L``), and measures:

- ``R`` (``reset ms``): the simulator's own reset of the batch (:func:`measure_reset`), which the evaluator's
  run of one episode per env holds once besides its steps;
- ``s_N``: seconds per batch step with the evaluator's render pattern (every env's three views rendered at
  the step before a request, one step in 8; none at the others: the kit-less task's lazy camera terms),
  physics and the state probe, after warm-up; ``s_N all``: the same with the views rendered at every step
  (what a simulator benchmark that renders each step, such as ManiSkill3's, measures);
- GPU memory: device memory in use after the env is built and stepped, less what was in use before
  (``torch.cuda.mem_get_info``: it counts Warp's allocations too), in total and per env;
- env-steps/s of :func:`dz_gym.eval.evaluate.evaluate` with N envs and N episodes in three modes, against
  the synchronous bound (:func:`bound`: per T-step episode, the reset, ``ceil(T/8)`` rounds of the server's
  latency, T steps' physics and ``ceil(T/8) - 1`` renders, the first request's views being the reset's; for long
  episodes about bench_eval's ``8N / (ceil(N/W) * L + 8 * s_N)``) and raw (:func:`raw_rate`, the same
  simulator work without the server): *sync* (the reference client's
  semantics), *prefetch* (``--prefetch K``: each reply applied when it arrives) and *locked*
  (``--prefetch K --simulated-delay K``: each reply applied exactly K steps after its request, waited for if
  later). Locked keeps every env's requests at the same step, one in 8, so the renderer, which draws every
  world in one pass, draws once per chunk instead of at each step some env is due; its episodes are also
  reproducible from their seed, whatever the server's latency.

- with ``--profile`` (the default), each mode once more with the per-stage profiler of ``dz-gym-eval
  --profile`` (:mod:`dz_gym.profiling`): physics, rendering, the host copy, encoding, hand-off, waiting,
  scatter, bookkeeping per batch step and per request round, the loop thread's sends and reply parsing, the
  round trip less the server's time, and the client's CPU time per request. The rates come from the runs
  without the profiler (it waits for the GPU at each stage boundary).

The server runs on cores of its own: the child pins itself to the first half of the host's cores and the
server processes to the other half (``os.sched_setaffinity``), so the client's CPU time is its own.
``--servers K`` starts K server processes with N/K workers each (W = N in all, the same bound): one process
decoding 1024 requests of 0.5 MB per round is itself a ceiling that a remote policy server would not put on
the evaluator.

The same run measures the embedded MuJoCo backend (``--mujoco-sizes``, its worker processes on this host's
cores) the same way, as the baseline of the same machine. ``--plan 2:1024,3:1024`` adds scenes 2 and 3.
Targets (64-step episodes, L = 200 ms): prefetch >= 85 % of raw at N = 1024, sync >= 80 % of the bound at
N = 1024, prefetch >= 92 % of the bound at N = 256, N/s_N all >= 4,261 at N = 256.

``--modes`` picks the evaluator modes (``--modes ""``: s_N only), ``--renderer KEY=VALUE`` sets a field of the
three views' ``NewtonWarpRendererCfg`` (tile size, traversal order, block size: each variant compiles its own
render kernels), ``--override env.KEY=VALUE`` any field of the task's config (an Isaac Lab Hydra override,
checked against the config's fields: e.g. ``env.sim.physics.bvh_constructor_geometry=sah``, the mesh BVH the
renderer casts against), ``--transport-processes P`` spreads the evaluator's sessions over P processes (``auto``:
the evaluator's default).

Usage (the GPU host; Isaac Lab 3.0 installed by ``scripts/setup_isaac3.sh``)::

    python benchmarks/bench_isaac3.py --sizes 64,256,1024 --plan 2:1024,3:1024 --mujoco-sizes "" --max-steps 64
    python benchmarks/bench_isaac3.py --sizes 256 --mujoco-sizes "" --modes "" --no-profile \
        --renderer tile_rendering_width=16 --renderer tile_rendering_height=16
"""

from __future__ import annotations

import argparse
import contextlib
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

TASKS = {1: "DZ-DROID-CubeInBowl-Newton-v0", 2: "DZ-DROID-CanInMug-Newton-v0", 3: "DZ-DROID-BananaInBin-Newton-v0"}
TASK = TASKS[1]
PATH = bench_eval.PATH
HORIZON = bench_eval.HORIZON
RESULT = "BENCH_RESULT "


def split_step(step_s: float, step_all_s: float) -> tuple[float, float]:
    """(seconds of a batch step without rendering, seconds of one render of every view) from s_N (the views
    rendered one step in 8) and s_N all (every step): s_all = phys + render, s_N = phys + render / 8."""
    render = max(0.0, (step_all_s - step_s) * HORIZON / (HORIZON - 1))
    return max(0.0, step_s - render / HORIZON), render


def episode_sim_s(steps: int, step_s: float, step_all_s: float) -> float:
    """The simulator's seconds for one batch of ``steps``-step episodes as the evaluator steps them: every
    step's physics and a render of every view before each request but the first (whose views are the
    reset's): ``ceil(T/8) - 1`` renders, since nothing is rendered for a request after the episode's end."""
    phys, render = split_step(step_s, step_all_s)
    return steps * phys + (math.ceil(steps / HORIZON) - 1) * render


def bound(
    n: int, workers: int, latency_s: float, step_s: float, step_all_s: float, steps: int, reset_s: float = 0.0
) -> float:
    """The synchronous bound in env-steps/s: ``N T / (R + ceil(T/8) ceil(N/W) L + T s_phys + (ceil(T/8) - 1)
    s_render)`` for N envs of T-step episodes: the server's latency and the simulator only, R being the
    simulator's own reset of the batch (:func:`measure_reset`), which the evaluator's span of a one-episode
    run holds too (0, the default, leaves it out, as older tables did). For long episodes it approaches
    ``8N / (ceil(N/W) L + 8 s_N)``, the per-round bound of the older tables in benchmarks/journal/isaac3.md, which counted a
    render per request, also the one after the episode's end that the evaluator does not take (a 16-step run
    of the embedded backend read 110.9 % of it)."""
    rounds = math.ceil(steps / HORIZON)
    sim_s = reset_s + episode_sim_s(steps, step_s, step_all_s)
    return n * steps / (rounds * math.ceil(n / workers) * latency_s + sim_s)


def raw_rate(n: int, step_s: float, step_all_s: float, steps: int, reset_s: float = 0.0) -> float:
    """raw: the simulator alone, env-steps/s, resetting the batch (``reset_s``) and stepping T-step episodes
    with the evaluator's renders."""
    return n * steps / (reset_s + episode_sim_s(steps, step_s, step_all_s))


def measure_reset(env, repeats: int = 3) -> float:
    """R: the simulator's own reset of every env of ``env`` (every view rendered, as the evaluator's first
    reset renders them; on Isaac Lab the hold step after it included), the median of ``repeats`` resets after
    the env has stepped: what the evaluator's span of a run holds besides its steps. The next reset's seeds
    are queued as the evaluator queues them."""
    from dz_gym.profile_hooks import device_sync

    base, sync = env.unwrapped, device_sync(env)  # a GPU backend's work is queued until something waits
    times = []
    for k in range(repeats):
        base.set_episode_seeds(list(range(base.num_envs)), [k] * base.num_envs)
        base.set_render_mask(None)
        start = time.perf_counter()
        env.reset()
        if sync is not None:
            sync()
        times.append(time.perf_counter() - start)
    return float(sorted(times)[len(times) // 2])


def _gpu_used() -> int:
    try:
        import torch

        if not torch.cuda.is_available():
            return 0
        free, total = torch.cuda.mem_get_info()
        return int(total - free)
    except ImportError:
        return 0


def renderer_overrides(settings: list[str]) -> list[str]:
    """Hydra overrides that set each ``key=value`` of ``settings`` on the three views' renderer configs
    (``NewtonWarpRendererCfg``: ``tile_rendering_width``, ``render_order``, ``kernel_block_dim`` ...)."""
    from dz_gym.envs import droid

    return [f"env.scene.{camera}.renderer_cfg.{item}" for item in settings for camera in droid.CAMERA_KEYS]


def _isaac_env(
    num_envs: int,
    max_steps: int,
    device: str,
    scene: int = 1,
    renderer: list[str] | None = None,
    overrides: list[str] | None = None,
):
    from dz_gym.envs.isaac import make_env

    env = make_env(TASKS[scene], num_envs=num_envs, device=device, seed=0, close_app_on_close=False,
                   cfg_overrides=renderer_overrides(renderer or []) + list(overrides or []))  # fmt: skip
    env.max_episode_length = max_steps
    return env


def child(args) -> dict:
    """One backend at one N: s_N, memory, and the evaluator's rates (synchronous and prefetching)."""
    from dz_gym.server.launch import start_server_process

    n, backend = args.num_envs, args.child
    client_cores, server_cores = _split_cores()
    if client_cores:
        os.sched_setaffinity(0, client_cores)
    before = _gpu_used()
    start = time.perf_counter()
    if backend == "isaac":
        env = _isaac_env(n, args.max_steps, args.device, args.scene, args.renderer, args.override)
        scene = env.task.key
    else:
        env = bench_eval.make_env(n, args.max_steps, args.scene)
        scene = args.scene
    built_s = time.perf_counter() - start
    step_s = bench_eval.measure_batch_step(env, cycles=args.cycles)
    step_all_s = bench_eval.measure_batch_step(env, cycles=args.cycles, every_step=True)
    reset_s = measure_reset(env)
    memory = _gpu_used() - before
    out = {"backend": backend, "n": n, "scene": args.scene, "build_s": built_s, "step_s": step_s,
           "step_all_s": step_all_s, "reset_s": reset_s, "gpu_bytes": memory, "runs": {}, "profiles": {},
           "cores": [len(client_cores), len(server_cores)]}  # fmt: skip

    def factory(scene_id, config, **_):
        env.max_episode_length = config.plan.max_steps
        return env

    env.close = lambda: None  # both runs use this env (Isaac Lab builds one simulation per process)

    count = max(1, min(args.servers, n))
    workers = math.ceil(n / count)  # W = N in all: the bound is the same with any count
    serve = ["--policy", "hold", "--workers", str(workers), "--latency-ms", str(args.latency_ms), "--quiet"]
    out["servers"] = count
    with contextlib.ExitStack() as stack:
        servers = [stack.enter_context(start_server_process(serve, timeout=120.0)) for _ in range(count)]
        for server in servers:
            if server_cores:
                os.sched_setaffinity(server.pid, server_cores)
        urls = [server.url + PATH for server in servers]
        for mode in _modes(args):
            for profile in (False, True) if args.profile else (False,):
                summary, rows, report = _evaluate(scene, n, args, mode, profile, backend, urls, factory)
                if profile:
                    out["profiles"][mode] = report
                    continue
                out["runs"][mode] = {
                    "rate": summary["env_steps_per_s"],
                    "latency_ms": bench_eval.mean_latency_ms(rows),
                    "episodes": len(rows),
                    "errored": sum(1 for r in rows if r.get("error")),
                }
    out["gpu_bytes_after_runs"] = _gpu_used() - before
    return out


def _split_cores() -> tuple[list[int], list[int]]:
    """The host's cores in two halves: the client's (this process) and the server's; ([], []) where there
    are fewer than 4 or affinity cannot be set."""
    if not hasattr(os, "sched_getaffinity"):
        return [], []
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < 4:
        return [], []
    half = len(cores) // 2
    return cores[:half], cores[half:]


MODES = ("sync", "prefetch", "locked")


def _modes(args) -> list[str]:
    modes = [m for m in args.modes.split(",") if m]
    for mode in modes:
        if mode not in MODES:
            raise SystemExit(f"--modes: expected names from {', '.join(MODES)}, got {mode!r}")
    return modes


def _mode_settings(mode: str, args) -> tuple[int, int | None]:
    """(prefetch, simulated_delay) of a mode."""
    return {"sync": (0, None), "prefetch": (args.prefetch, None), "locked": (args.prefetch, args.prefetch)}[mode]


def _evaluate(scene, n, args, mode, profile, backend, urls, factory):
    """One evaluator run of N episodes on the bench's env: (summary, rows, profile report or None)."""
    from dz_gym.eval.config import EvalConfig
    from dz_gym.eval.evaluate import evaluate
    from dz_gym.eval.profile_run import PROFILE_FILE
    from dz_gym.eval.rundir import RunDir

    prefetch, delay = _mode_settings(mode, args)
    config = EvalConfig(
        scenes=[scene], episodes=n, num_envs=n, max_steps=args.max_steps, video=False, report=False,
        prefetch=prefetch, simulated_delay=delay, backend=backend, profile=profile,
        transport_processes=None if args.transport_processes == "auto" else args.transport_processes,
    )  # fmt: skip
    with tempfile.TemporaryDirectory() as root:
        run_dir = RunDir.create(root, config)
        summary = evaluate(config, run_dir, urls, env_factory=factory, progress=False, log=lambda _: None)
        rows = run_dir.read_rows()
        report = None
        if profile:
            report = next(iter(json.loads((run_dir.path / PROFILE_FILE).read_text())["scenes"].values()))
    return summary, rows, report


def run_child(backend: str, n: int, args, scene: int = 1) -> dict | None:
    command = [sys.executable, __file__, "--child", backend, "--num-envs", str(n), "--latency-ms", str(args.latency_ms),
               "--max-steps", str(args.max_steps), "--prefetch", str(args.prefetch), "--cycles", str(args.cycles),
               "--device", args.device, "--scene", str(scene), "--servers", str(args.servers), "--modes", args.modes,
               "--transport-processes", str(args.transport_processes), "--profile" if args.profile else "--no-profile"]  # fmt: skip
    for item in args.renderer:
        command += ["--renderer", item]
    for item in args.override:
        command += ["--override", item]
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


BREAKDOWN = ("env_step", "physics", "render", "gpu_to_host", "build", "encode", "submit", "wait", "scatter",
             "wrapper_info", "bookkeeping")  # fmt: skip


def report(results: list[dict], args) -> bool | None:
    """The throughput table and the targets: against s_N (the evaluator's render pattern: the bound the
    evaluator can reach) and, for the anchor and as a simulator benchmark measures it, against s_N all (every view
    at every step). The prefetch targets are checked on the better of the two prefetching modes run. None
    when no run has targets (only scene 1 at N = 256 and 1024 has)."""
    latency = args.latency_ms / 1000.0
    modes = _modes(args)
    print()
    print(f"L={args.latency_ms:.0f} ms, {args.max_steps}-step episodes, policy hold, W=N server workers, prefetch "
          f"K={args.prefetch} (locked: --simulated-delay K too); raw = the simulator alone: the batch's reset and "
          f"the episode's steps with the evaluator's renders (ceil(T/8) - 1 an episode), raw all = N/s_N all (every view every step); transport processes "
          f"{args.transport_processes}; renderer "
          f"{' '.join(args.renderer) or 'defaults'}; overrides {' '.join(args.override) or 'none'}")  # fmt: skip
    cols = ["s_N ms", "s_all ms", "reset ms", "raw", "raw all", "GPU MiB", "bound"]
    for mode in modes:
        cols += [mode, "of bnd", "of raw"]
    cols += ["errors", "build s"]
    print(f"{'backend':>7} {'scene':>5} {'N':>5} " + " ".join(f"{c:>8}" for c in cols))
    ok, checked = True, False
    for r in results:
        n, s = r["n"], r["step_s"]
        s_all, reset_s = r.get("step_all_s", s), r.get("reset_s", 0.0)
        b, raw, raw_all = (
            bound(n, n, latency, s, s_all, args.max_steps, reset_s),
            raw_rate(n, s, s_all, args.max_steps, reset_s),
            n / s_all,
        )
        rates = {mode: r["runs"][mode]["rate"] for mode in modes if mode in r["runs"]}
        errors = sum(run.get("errored", 0) for run in r["runs"].values())
        mib = r["gpu_bytes_after_runs"] / 2**20
        cells = [f"{1e3 * s:.1f}", f"{1e3 * s_all:.1f}", f"{1e3 * reset_s:.0f}", f"{raw:.0f}", f"{raw_all:.0f}",
                 f"{mib:.0f}", f"{b:.0f}"]  # fmt: skip
        for mode in modes:
            rate = rates.get(mode)
            cells += (
                ["-"] * 3 if rate is None else [f"{rate:.0f}", f"{100 * rate / b:.1f}%", f"{100 * rate / raw:.1f}%"]
            )
        cells += [f"{errors}", f"{r['build_s']:.1f}"]
        print(f"{r['backend']:>7} {r.get('scene', 1):>5} {n:>5} " + " ".join(f"{c:>8}" for c in cells))
        if r["backend"] == "isaac" and r.get("scene", 1) == 1:
            sync = rates.get("sync", 0.0)
            pre = max(rates.get("prefetch", 0.0), rates.get("locked", 0.0))
            ok &= errors == 0
            if n == 1024:
                ok &= pre >= 0.85 * raw and sync >= 0.80 * b
            if n == 256:
                ok &= pre >= 0.92 * b and raw_all >= 4261
            checked |= n in (256, 1024)
    print("(env-steps/s; bound = N T / (R + ceil(T/8) ceil(N/W) L + T s_phys + (ceil(T/8) - 1) s_render), from "
          "the reset R, s_N and s_N all; raw the same without L; targets at scene 1: N=1024 prefetch >= 85% of raw "
          "and sync >= 80% of bound; N=256 prefetch >= 92% of bound and raw all >= 4261; prefetch = the better of "
          "prefetch and locked)")  # fmt: skip
    profiled = [(r, mode, rep) for r in results for mode, rep in r.get("profiles", {}).items() if rep]
    if profiled:
        print()
        print(
            "per-stage breakdown, ms per request round (8 batch steps) unless said; send and the round trip less "
            "the server's time (net) are per request, off the caller's thread"
        )
        head = " ".join(f"{name[:9]:>9}" for name in BREAKDOWN)
        print(f"{'backend':>7} {'sc':>2} {'N':>5} {'mode':>8} {head} {'send/rq':>8} {'net/rq':>8} {'cpu/rq':>7} "
              f"{'loop/rq':>7} {'unacct':>7} {'rounds':>6}")  # fmt: skip
        for r, mode, rep in profiled:
            st = rep["stages"]
            cells = " ".join(f"{st[name]['per_round_ms']:>9.1f}" for name in BREAKDOWN)
            per_round_unaccounted = 1e3 * rep["unaccounted_s"] / max(1, rep["rounds"])
            print(f"{r['backend']:>7} {r.get('scene', 1):>2} {r['n']:>5} {mode:>8} "
                  f"{cells} {st['send']['per_request_ms']:>8.3f} {st['network']['per_request_ms']:>8.1f} "
                  f"{rep['cpu_ms_per_request'] or 0:>7.2f} {rep['loop_cpu_ms_per_request'] or 0:>7.2f} "
                  f"{per_round_unaccounted:>7.1f} {rep['rounds']:>6}")  # fmt: skip
        for r, mode, rep in profiled:  # rounds whose requests the caller packed itself, and why
            for why, count in (rep.get("batches_as_dicts") or {}).items():
                print(f"{r['backend']} N={r['n']} {mode}: {count} batch(es) sent as dicts ({why})")
            if rep.get("collector"):  # the garbage collector's full passes during the stepping
                passes, seconds = rep["collector"]["passes"], rep["collector"]["seconds"]
                print(f"{r['backend']} N={r['n']} {mode}: collector {passes[2]} full pass(es), "
                      f"{1e3 * seconds[2]:.1f} ms; {passes[0] + passes[1]} young, {1e3 * (seconds[0] + seconds[1]):.1f} ms")  # fmt: skip
    return ok if checked else None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="8,64,256,1024", help="isaac N values (comma-separated)")
    parser.add_argument("--mujoco-sizes", default="64,256", help="embedded MuJoCo N values ('' for none)")
    parser.add_argument("--latency-ms", type=float, default=200.0)
    parser.add_argument("--max-steps", type=int, default=64, help="steps per episode (multiple of 8)")
    parser.add_argument("--prefetch", type=int, default=4, help="K of the prefetch and locked modes")
    parser.add_argument(
        "--modes", default=",".join(MODES), help=f"evaluator modes to run, comma-separated, of {', '.join(MODES)}"
    )
    parser.add_argument(
        "--transport-processes",
        type=lambda text: text if text == "auto" else int(text),
        default=0,
        help="the evaluator's transport processes (0, the default here: in-process; auto: the evaluator's own "
        "default, chosen from N and the cores)",
    )
    parser.add_argument("--cycles", type=int, default=3, help="8-step cycles timed for s_N")
    parser.add_argument("--device", default="cuda:0")
    parser.add_argument("--child-timeout", type=float, default=900.0)
    parser.add_argument(
        "--servers", type=int, default=1, help="server processes (env i talks to server i %% K), W = N workers in all"
    )
    parser.add_argument("--plan", default="", help="more isaac runs as SCENE:N,... (e.g. 2:1024,3:1024)")
    parser.add_argument(
        "--profile",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="also run each mode with the per-stage profiler",
    )
    parser.add_argument(
        "--renderer",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a setting of the three views' NewtonWarpRendererCfg (repeatable), e.g. tile_rendering_width=16",
    )
    parser.add_argument(
        "--override",
        action="append",
        default=[],
        metavar="env.KEY=VALUE",
        help="an Isaac Lab Hydra override of the task's config (repeatable), e.g. "
        "env.sim.physics.bvh_constructor_geometry=sah",
    )
    parser.add_argument("--json", help="also write the results here")
    parser.add_argument("--scene", type=int, default=1, help=argparse.SUPPRESS)
    parser.add_argument("--child", choices=("isaac", "mujoco"), help=argparse.SUPPRESS)
    parser.add_argument("--num-envs", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        result = child(args)  # (the evaluator applies its own host-process settings)
        print(RESULT + json.dumps(result), flush=True)
        os._exit(0)  # skip Isaac Lab's and Warp's teardown
    t0 = time.perf_counter()
    results = []
    plan = [("isaac", 1, int(v)) for v in args.sizes.split(",") if v]
    plan += [("isaac", int(item.split(":")[0]), int(item.split(":")[1])) for item in args.plan.split(",") if item]
    plan += [("mujoco", 1, int(v)) for v in args.mujoco_sizes.split(",") if v]
    for backend, scene, n in plan:
        result = run_child(backend, n, args, scene)
        if result is not None:
            results.append(json.loads(json.dumps(result)))  # the run keys as strings, as read back
            print(
                f"{backend} scene {scene} N={n}: s_N {1e3 * result['step_s']:.1f} ms, {result['wall_s']:.0f} s",
                flush=True,
            )
            if args.json:
                Path(args.json).write_text(json.dumps(results, indent=1))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    ok = report(results, args)
    verdict = "no targets (none at scene 1, N = 256 or 1024)" if ok is None else f"targets {'met' if ok else 'NOT met'}"
    print(f"{verdict}; total {time.perf_counter() - t0:.0f} s")
    return 0 if ok is not False else 1


if __name__ == "__main__":
    sys.exit(main())
