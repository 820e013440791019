"""Evaluator throughput: env-steps/s of ``dz-gym-eval`` at N envs vs the reference client's one-env loop.

Both run on the embedded MuJoCo simulator against the same reference server (``dz-gym-serve`` in a
subprocess, ``--latency-ms L``), once with ``--workers 1`` and once with ``--workers 8``, in one process:

- *one-env loop*: the single-env reference client's rollout (one env, one websocket, one synchronous request
  every 8 steps, the same request payload), re-implemented here on this package's codec. It renders only the
  observations it sends (the same render-mask hook the evaluator uses), which makes this baseline faster than
  the original client, so the ratios below are conservative;
- *evaluator*: :func:`dz_gym.eval.evaluate.evaluate` with N envs, no videos, its own ``env_steps_per_s``.

It prints, per server, the evaluator's env-steps/s, the one-env loop's, their ratio, and the synchronous bound
``8N / (ceil(N/W) * L + 8 * s_N)``: every 8 steps each env needs a chunk, the W server workers serve the N
requests in ceil(N/W) rounds of L, and the simulator takes s_N per batch step (measured here, with the
evaluator's render pattern: every env's views rendered at the step before a request, none otherwise).
Targets: evaluator >= 90 % of the bound; with 8 workers >= 3x the one-env loop.

With a one-worker server it also runs the evaluator with ``--prefetch K`` (latency hiding) and prints its
env-steps/s against the synchronous run and the server's utilization (the union of the intervals with a
request outstanding, over the wall time). Targets: >= 1.3x synchronous, utilization >= 90 %.

Usage::

    MUJOCO_GL=egl python benchmarks/bench_eval.py [--num-envs 8] [--latency-ms 200] [--max-steps 64]
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import sys
import tempfile
import time
import uuid

import numpy as np

os.environ.setdefault("MUJOCO_GL", "egl")

from dz_gym.envs import droid  # noqa: E402
from dz_gym.requests import hold_actions  # noqa: E402

PATH = "/v1/realtime/robot/openpi"
HORIZON = droid.DEFAULT_OPEN_LOOP_HORIZON


def make_env(num_envs: int, max_steps: int, scene: int):
    from dz_gym.envs import make_droid_env

    return make_droid_env(backend="mujoco", scene=scene, num_envs=num_envs, seed=0, max_episode_length=max_steps)


def measure_batch_step(env, cycles: int = 3, every_step: bool = False) -> float:
    """s_N: mean seconds per batch step of ``env`` with the evaluator's render pattern (every env's views
    rendered at the step before a request, none otherwise), or with ``every_step`` every view at every step
    (no render mask), holding the arms still."""
    num_envs = env.unwrapped.num_envs
    env.set_render_mask(None)
    obs, _ = env.reset(seed=0)
    action = hold_actions(obs[droid.POLICY_GROUP])
    for _ in range(HORIZON):  # warm-up cycle
        env.step(action)
    start = time.perf_counter()
    for k in range(cycles * HORIZON):
        if not every_step:
            env.set_render_mask(np.full(num_envs, (k + 1) % HORIZON == 0))
        env.step(action)
    return (time.perf_counter() - start) / (cycles * HORIZON)


def one_env_loop(url: str, episodes: int, max_steps: int, scene: int) -> tuple[float, float]:
    """The reference client's rollout on one env; returns (env-steps/s, mean chunk latency in s)."""
    from websockets.sync.client import connect

    from dz_gym.protocol import build_infer_request, packb, parse_infer_response, parse_metadata

    stack = contextlib.ExitStack()
    env = make_env(1, max_steps, scene)
    prompt = droid.scene_spec(scene).prompt
    latencies = []
    steps = 0
    try:
        ws = stack.enter_context(connect(url, compression=None, max_size=None, ping_interval=60, ping_timeout=600))
        parse_metadata(ws.recv())
        start = time.perf_counter()
        for episode in range(episodes):
            env.set_episode_seeds([0], [episode])
            env.set_render_mask(None)
            obs, _ = env.reset()
            session = str(uuid.uuid4())
            chunk = None
            for t in range(max_steps):
                policy = obs[droid.POLICY_GROUP]
                if t % HORIZON == 0:
                    request = build_infer_request(
                        images={droid.REQUEST_IMAGE_KEYS[c]: policy[c][0] for c in droid.CAMERA_KEYS},
                        joint_position=policy[droid.OBS_JOINT_KEY][0].astype(np.float64),
                        gripper_position=policy[droid.OBS_GRIPPER_KEY][0].astype(np.float64),
                        prompt=prompt,
                        session_id=session,
                    )
                    sent = time.perf_counter()
                    ws.send(packb(request))
                    chunk = np.array(parse_infer_response(ws.recv()).actions, dtype=np.float32)
                    latencies.append(time.perf_counter() - sent)
                action = chunk[t % HORIZON].copy()
                action[-1] = float(action[-1] > droid.GRIPPER_CLOSE_THRESHOLD)
                env.set_render_mask(np.array([(t + 1) % HORIZON == 0]))
                obs, _, terminated, truncated, _ = env.step(action[None])
                steps += 1
                if terminated[0] or truncated[0]:
                    break
        elapsed = time.perf_counter() - start
    finally:
        stack.close()
        env.close()
    return steps / elapsed, float(np.mean(latencies))


def mean_latency_ms(rows) -> float:
    """Mean chunk latency seen by the client (request sent to reply received) over every request of ``rows``."""
    values = [v for r in rows for v in r.get("latencies_ms", [])]
    return sum(values) / len(values) if values else float("nan")


def evaluator(
    url: str, num_envs: int, episodes: int, max_steps: int, scene: int, prefetch: int = 0
) -> tuple[dict, float]:
    """The evaluator's summary, and s_N measured on its own env right before the run (same processes)."""
    from dz_gym.eval.config import EvalConfig
    from dz_gym.eval.evaluate import evaluate
    from dz_gym.eval.rundir import RunDir

    measured = []

    def factory(scene_id, config, **_):
        env = make_env(config.plan.num_envs, config.plan.max_steps, scene_id)
        env.max_episode_length = 10_000  # the measurement must not hit a time-out
        measured.append(measure_batch_step(env))
        env.max_episode_length = config.plan.max_steps
        return env

    config = EvalConfig(
        scenes=[scene], episodes=episodes, num_envs=num_envs, max_steps=max_steps, video=False, prefetch=prefetch
    )
    with tempfile.TemporaryDirectory() as root:
        run_dir = RunDir.create(root, config)
        summary = evaluate(config, run_dir, [url], env_factory=factory, progress=False, log=lambda _: None)
        rows = run_dir.read_rows()
    steps = sum(r["steps"] for r in rows) or 1
    summary["stale_share"] = sum(r.get("stale_steps", 0) for r in rows) / steps
    summary["wait_share"] = sum(r.get("wait_steps", 0) for r in rows) / steps
    summary["chunk_latency_ms"] = mean_latency_ms(rows)
    return summary, measured[0]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--num-envs", type=int, default=8)
    parser.add_argument("--latency-ms", type=float, default=200.0)
    parser.add_argument("--max-steps", type=int, default=64, help="steps per episode (multiple of 8)")
    parser.add_argument("--baseline-episodes", type=int, default=2)
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--policy", default="hold", help="the server's policy (hold keeps the server's CPU use tiny)")
    parser.add_argument("--scene", type=int, default=1)
    parser.add_argument("--prefetch", type=int, default=4, help="K of the prefetch row (one-worker server); 0 skips it")
    args = parser.parse_args()

    from dz_gym.server.launch import start_server_process

    n, latency = args.num_envs, args.latency_ms / 1000.0
    t0 = time.perf_counter()
    rows = []
    for workers in args.workers:
        serve = ["--policy", args.policy, "--workers", str(workers), "--latency-ms", str(args.latency_ms), "--quiet"]
        with start_server_process(serve) as server:
            url = server.url + PATH
            base, base_latency = one_env_loop(url, args.baseline_episodes, args.max_steps, args.scene)
            summary, s_n = evaluator(url, n, n, args.max_steps, args.scene)
            if workers == 1 and args.prefetch:
                prefetched, _ = evaluator(url, n, n, args.max_steps, args.scene, prefetch=args.prefetch)
        print(f"workers={workers}: s_{n} = {1e3 * s_n:.1f} ms per batch step (measured on the evaluator's env)")
        ours = summary["env_steps_per_s"]
        bound = HORIZON * n / (math.ceil(n / workers) * latency + HORIZON * s_n)
        rows.append((workers, ours, base, bound, base_latency, summary["latency_ms"]["mean"] / 1e3))
        if workers == 1 and args.prefetch:
            sync_summary = summary
    print()
    print(f"N={n}, L={args.latency_ms:.0f} ms, {args.max_steps}-step episodes, policy {args.policy}")
    header = f"{'workers':>7}  {'evaluator':>10}  {'one-env':>8}  {'ratio':>6}  {'bound':>7}  {'of bound':>8}  {'L one-env':>9}  {'L eval':>7}"
    print(header)
    ok = True
    for workers, ours, base, bound, base_latency, eval_latency in rows:
        print(
            f"{workers:>7}  {ours:>10.1f}  {base:>8.1f}  {ours / base:>5.2f}x  {bound:>7.1f}  {100 * ours / bound:>7.1f}%"
            f"  {1e3 * base_latency:>7.0f}ms  {1e3 * eval_latency:>5.0f}ms"
        )
        ok &= ours >= 0.9 * bound
        if workers >= 8:
            ok &= ours >= 3 * base
    print(
        "(env-steps/s; bound = 8N / (ceil(N/W) * L + 8 * s_N); targets: >= 90% of bound, >= 3x one-env with 8 workers)"
    )
    if 1 in args.workers and args.prefetch:
        sync_rate, pre_rate = sync_summary["env_steps_per_s"], prefetched["env_steps_per_s"]
        sync_util, pre_util = sync_summary["server_utilization"], prefetched["server_utilization"]
        print()
        print(f"prefetch (one-worker server, N={n}, L={args.latency_ms:.0f} ms): env-steps/s and server utilization")
        print(f"  synchronous        {sync_rate:7.1f}   utilization {100 * sync_util:5.1f}%")
        print(
            f"  --prefetch {args.prefetch:<7} {pre_rate:7.1f}   utilization {100 * pre_util:5.1f}%   "
            f"{pre_rate / sync_rate:.2f}x synchronous (targets: >= 1.3x, utilization >= 90%)"
        )
        print(
            f"  with prefetch, {100 * prefetched['stale_share']:.0f}% of steps ran on rows past their chunk's window "
            f"(the server is the bottleneck) and {100 * prefetched['wait_share']:.0f}% waited"
        )
        ok &= pre_rate >= 1.3 * sync_rate and pre_util >= 0.9
    print(f"targets {'met' if ok else 'NOT met'}; total {time.perf_counter() - t0:.0f} s")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
