"""Chunk geometry and latency-honest runs: requests per episode and env-steps/s, DreamZero vs FLUX 3 Action.

Four runs of :func:`dz_gym.eval.evaluate.evaluate` on the embedded MuJoCo simulator, in one process, each against
the reference server (``dz-gym-serve --policy reference`` in a subprocess, ``--latency-ms L``, one worker):

- *DreamZero geometry*: 24-row chunks, 8 executed before the next request (the server's default);
- *FLUX geometry*: 32-row chunks, all 32 executed. FLUX's own servers (360x640 views, other keys) are not
  needed for the geometry: the same reference server is started with ``--policy-arg horizon=32
  --policy-arg open_loop_horizon=32`` (its planner rolls out 32 rows meant to be executed whole) and the
  evaluator runs with ``--open-loop-horizon 32``; the views stay 180x320, so only the geometry differs;
- *FLUX on SGLang's flavor*: the whole FLUX profile as ``dz-gym-serve --flavor sglang`` speaks it (found from
  its handshake: 360x640 views rendered at that size, dot keys, the 8-vector state, 32 of 32 executed), so
  the cost of FLUX's larger views shows beside the geometry alone;

each synchronous (every env waits for its chunk and the world stands still), latency-honest
(``--latency-honest``: each chunk applied ``ceil(latency x 15 Hz)`` steps after its request, the arm holding its
pose meanwhile) and latency-honest with ``--prefetch 4`` (the next request leaves 4 actions before the window
ends and the arm runs on its chunk meanwhile, as an asynchronous robot client does). It prints per run the success rate, the requests per episode, the mean request delay in steps,
env-steps/s, and the ratios: FLUX over DreamZero (requests per episode and env-steps/s, per mode) and
each latency-honest mode over synchronous (per geometry). Every episode runs to ``--max-steps`` or its success.

Usage::

    MUJOCO_GL=egl python benchmarks/bench_geometry.py [--num-envs 4] [--episodes 4] [--max-steps 160]
        [--latency-ms 100] [--scene 1]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

os.environ.setdefault("MUJOCO_GL", "egl")

PATH = "/v1/realtime/robot/openpi"
# name: (the server's extra arguments, its route, the evaluator's open-loop horizon (None: the profile's), the
# embedded simulator's render shape (None: its default 180x320))
GEOMETRIES = {
    "DreamZero 24x8, 8 executed": ([], PATH, 8, None),
    "FLUX 32x8, 32 executed": (["--policy-arg", "horizon=32", "--policy-arg", "open_loop_horizon=32"], PATH, 32, None),
    "FLUX on SGLang, 360x640": (["--flavor", "sglang"], "/openpi/policy", None, [360, 640]),
}
MODES = {"sync": (False, 0), "latency-honest": (True, 0), "honest, prefetch 4": (True, 4)}  # (honest, prefetch)


def run(url: str, args, horizon: int | None, render_shape: list | None, honest: bool, prefetch: int) -> dict:
    """One evaluator run; its summary's rate and what its rows say."""
    from dz_gym.eval.config import EvalConfig
    from dz_gym.eval.evaluate import evaluate
    from dz_gym.eval.rundir import RunDir

    config = EvalConfig(scenes=[args.scene], episodes=args.episodes, num_envs=args.num_envs, backend="mujoco",
                        max_steps=args.max_steps, video=False, report=False, open_loop_horizon=horizon,
                        latency_honest=honest, prefetch=prefetch,
                        render_shape=render_shape)  # fmt: skip
    with tempfile.TemporaryDirectory() as root:
        run_dir = RunDir.create(root, config)
        summary = evaluate(config, run_dir, [url], progress=False, log=lambda _: None)
        rows = run_dir.read_rows()
    delays = [d for r in rows for d in r.get("request_delays", [])]
    return {
        "success": sum(bool(r["success_at_end"]) for r in rows) / len(rows),
        "requests": sum(r["server_calls"] for r in rows) / len(rows),
        "steps": sum(r["steps"] for r in rows) / len(rows),
        "delay": sum(delays) / len(delays) if delays else 0.0,
        "rate": summary["env_steps_per_s"],
        "errors": sum(r.get("error") is not None for r in rows),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--num-envs", type=int, default=4)
    parser.add_argument("--episodes", type=int, default=4, help="episodes per run (scene 1, seeds 0..E-1)")
    parser.add_argument("--max-steps", type=int, default=160)
    parser.add_argument("--latency-ms", type=float, default=100.0, help="the server's emulated model time")
    parser.add_argument("--scene", type=int, default=1)
    args = parser.parse_args()

    from dz_gym.server.launch import start_server_process

    t0 = time.perf_counter()
    results: dict[tuple[str, str], dict] = {}
    for name, (extra, route, horizon, render_shape) in GEOMETRIES.items():
        serve = ["--policy", "reference", *extra, "--workers", "1", "--latency-ms", str(args.latency_ms), "--quiet"]
        with start_server_process(serve) as server:
            for mode, (honest, prefetch) in MODES.items():
                results[(name, mode)] = run(server.url + route, args, horizon, render_shape, honest, prefetch)

    print(f"N={args.num_envs}, {args.episodes} episodes per run, scene {args.scene}, up to {args.max_steps} steps, "
          f"L={args.latency_ms:.0f} ms (one server worker), 15 Hz")  # fmt: skip
    print(
        f"{'geometry':<28} {'mode':<18} {'success':>7} {'req/ep':>7} {'steps/ep':>8} {'delay':>6} {'env-steps/s':>11}"
    )
    for (name, mode), r in results.items():
        print(f"{name:<28} {mode:<18} {r['success']:>7.2f} {r['requests']:>7.1f} {r['steps']:>8.1f} "
              f"{r['delay']:>6.2f} {r['rate']:>11.1f}" + (f"  ({r['errors']} errored)" if r["errors"] else ""))  # fmt: skip
    print()
    dz, *fluxes = GEOMETRIES
    for flux in fluxes:
        for mode in MODES:
            a, b = results[(dz, mode)], results[(flux, mode)]
            print(f"{flux:<28} {mode:<18} / DreamZero: requests per episode {b['requests'] / a['requests']:.2f}x, "
                  f"requests per step {(b['requests'] / b['steps']) / (a['requests'] / a['steps']):.2f}x, "
                  f"env-steps/s {b['rate'] / a['rate']:.2f}x")  # fmt: skip
    for name in GEOMETRIES:
        s = results[(name, "sync")]
        for mode in list(MODES)[1:]:
            h = results[(name, mode)]
            print(f"{name:<28} {mode} / sync: env-steps/s {h['rate'] / s['rate']:.2f}x, "
                  f"success {h['success']:.2f} vs {s['success']:.2f}")  # fmt: skip
    print(f"\ntotal {time.perf_counter() - t0:.0f} s")
    return 0 if not any(r["errors"] for r in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
