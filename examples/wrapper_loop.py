"""Drive the embedded DROID simulator with a policy server through DreamZeroPolicyWrapper.

Starts the reference server (the classical vision policy) on a free loopback port unless ``--server`` names
one, runs one episode wave of ``--num-envs`` envs and prints, per env, whether the placement succeeded, how many
chunks it asked for and their latencies. The loop is the one a user writes around the wrapper in their own
RL or evaluation code; ``--residual`` shows ``propose()`` + ``step(action)``: the policy's proposal plus
your own correction.

    MUJOCO_GL=egl python examples/wrapper_loop.py --num-envs 4 --steps 200
    MUJOCO_GL=egl python examples/wrapper_loop.py --server ws://GPU_HOST:8000/v1/realtime/robot/openpi
"""

from __future__ import annotations

import argparse

import numpy as np

import dz_gym
from dz_gym.extras import require
from dz_gym.server.launch import start_server_process


def run(server_url: str, args: argparse.Namespace) -> None:
    env = dz_gym.make_droid_env(backend="mujoco", scene=args.scene, num_envs=args.num_envs, seed=args.seed)
    env = dz_gym.DreamZeroPolicyWrapper(env, server=server_url)
    try:
        obs, info = env.reset(seed=args.seed)
        success_any = np.zeros(env.num_envs, dtype=bool)
        latencies: list[float] = []
        rng = np.random.default_rng(args.seed)
        for _ in range(args.steps):
            if args.residual:
                # What the policy would do this step, plus your own correction (here: at most 1 mrad of noise).
                action = env.propose()
                action[:, :7] += rng.uniform(-1e-3, 1e-3, size=(env.num_envs, 7)).astype(np.float32)
                obs, reward, terminated, truncated, info = env.step(action)
            else:
                obs, reward, terminated, truncated, info = env.step()
            success_any |= np.asarray(info["success"], dtype=bool)
            latencies += [v for v in info["chunk_latency_s"] if np.isfinite(v)]
        for i in range(env.num_envs):
            stats = env.episode_stats(i)  # the current episode of env i, as the wrapper saw it
            print(
                f"env {i}: success so far {bool(success_any[i])}, chunks {stats.chunks} in {stats.steps} steps, "
                f"reconnects {stats.reconnects}, session {stats.session_id[:8]}"
            )
        if latencies:
            print(f"chunk latency: median {1e3 * np.median(latencies):.1f} ms, max {1e3 * np.max(latencies):.1f} ms")
    finally:
        env.close()


def main() -> None:
    require("wrapper_loop.py", "mujoco")
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--server", help="ws:// URL of a policy server (default: start the reference server)")
    parser.add_argument("--scene", type=int, default=1)
    parser.add_argument("--num-envs", type=int, default=4)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--residual", action="store_true", help="execute your own actions via step(action)")
    args = parser.parse_args()
    if args.server:
        run(args.server, args)
        return
    with start_server_process(["--policy", "reference", "--quiet"]) as server:
        run(server.url + "/v1/realtime/robot/openpi", args)


if __name__ == "__main__":  # required: the simulator's workers start with spawn
    main()
