"""RL env-steps/s of the residual env (wrapper + policy client + torch tensors) vs the bare simulator, N=8.

Three loops over the embedded simulator (scene 1, N envs, worker processes), in this process, interleaved
over ``--rounds`` rounds of ``--steps`` steps each:

- **bare**: ``MujocoDroidEnv.step`` with hold actions plus a small residual, rendering the envs on the step
  before every 8th (the images a policy server would be sent), nothing else;
- **wrapper**: ``DreamZeroPolicyWrapper.propose()`` + ``step(proposal + residual)`` with the ``hold``
  policy served in process (``MemoryPolicyClient``: the protocol's codec, no sockets);
- **residual env**: ``dz_gym.rl.ResidualEnv.step`` (torch actions in, torch observations, rewards and
  flags out) over the same wrapper.

The wrapper renders exactly the bare loop's pattern (its lazy rendering asks for the images of the envs
that send a request at their next step), so the steps compare like for like. Steps are split into
**cached** steps (no server request, no rendering: the wrapper executes a cached chunk row) and
**request** steps (rendering + one request per env); the target is that the wrapper and the residual env
cost < 10 % more than the bare simulator on cached steps. Prints medians and ratios.

    MUJOCO_GL=egl python benchmarks/bench_rl.py [--num-envs 8] [--steps 48] [--rounds 3]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import numpy as np

HORIZON = 8


def bare_loop(env, steps: int, rng: np.random.Generator) -> tuple[list[float], list[float]]:
    """Times of cached (no render) and request (render) steps of the bare simulator."""
    n = env.num_envs
    cached, request = [], []
    everyone, nobody = np.ones(n, dtype=bool), np.zeros(n, dtype=bool)
    obs, _ = env.reset(seed=0)
    hold = np.zeros((n, 8), dtype=np.float32)
    for step in range(steps):
        render = step % HORIZON == HORIZON - 1  # the step before a request step renders
        hold[:, :7] = obs["policy"]["arm_joint_pos"] if step % HORIZON == 0 else hold[:, :7]
        action = hold + rng.uniform(-0.01, 0.01, size=hold.shape).astype(np.float32)
        env.set_render_mask(everyone if render else nobody)
        start = time.perf_counter()
        obs, *_ = env.step(action)
        (request if render else cached).append(time.perf_counter() - start)
    return cached, request


def wrapper_loop(wrapper, client, steps: int, rng: np.random.Generator) -> tuple[list[float], list[float]]:
    """Times of propose + step(action) of the wrapper, split by whether the step rendered / sent requests."""
    n = wrapper.num_envs
    cached, request = [], []
    wrapper.reset(seed=0)
    wrapper.propose()
    for _ in range(steps):
        residual = rng.uniform(-0.01, 0.01, size=(n, 8)).astype(np.float32)
        calls = sum(client.requests)
        start = time.perf_counter()
        action = wrapper.propose() + residual
        _, _, _, _, info = wrapper.step(action)
        wrapper.propose()  # the next step's proposal, as an RL loop reads it before acting
        elapsed = time.perf_counter() - start
        busy = sum(client.requests) > calls or bool(np.asarray(info["images_fresh"]).any())
        (request if busy else cached).append(elapsed)
    return cached, request


def residual_loop(env, client, steps: int, rng: np.random.Generator) -> tuple[list[float], list[float]]:
    """Times of ``ResidualEnv.step`` (torch in and out), split like the wrapper's."""
    import torch

    n = env.num_envs
    cached, request = [], []
    env.reset(seed=0)
    for _ in range(steps):
        action = torch.as_tensor(rng.uniform(-0.2, 0.2, size=(n, 8)), dtype=torch.float32)
        calls = sum(client.requests)
        start = time.perf_counter()
        _, _, _, _, info = env.step(action)
        elapsed = time.perf_counter() - start
        busy = sum(client.requests) > calls or bool(np.asarray(info["images_fresh"]).any())
        (request if busy else cached).append(elapsed)
    return cached, request


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num-envs", type=int, default=8)
    parser.add_argument("--steps", type=int, default=48, help="steps per loop and round (default 48)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--workers", type=int, default=None, help="simulator worker processes (default: cores)")
    args = parser.parse_args(argv)
    if args.num_envs < 1 or args.steps < HORIZON or args.rounds < 1:
        parser.error("expected --num-envs >= 1, --steps >= 8 and --rounds >= 1")

    import torch

    import dz_gym
    from dz_gym.rl.residual import ResidualEnv
    from dz_gym.server.policies import HoldPolicy
    from dz_gym.testing.memory_client import MemoryPolicyClient

    torch.set_num_threads(1)
    n = args.num_envs
    length = args.steps + 2  # one episode per loop and round: no resets inside the timed steps
    make = lambda: dz_gym.make_droid_env(
        backend="mujoco", scene=1, num_envs=n, seed=0, num_workers=args.workers, max_episode_length=length
    )
    bare = make()
    wrapper_client = MemoryPolicyClient(HoldPolicy(), num_envs=n)
    wrapper = dz_gym.DreamZeroPolicyWrapper(make(), client=wrapper_client)
    residual_client = MemoryPolicyClient(HoldPolicy(), num_envs=n)
    residual = ResidualEnv(
        dz_gym.DreamZeroPolicyWrapper(make(), client=residual_client), episode_length=length - 1,
        terminate_on_success=False,
    )  # fmt: skip
    results: dict[str, tuple[list[float], list[float]]] = {"bare": ([], []), "wrapper": ([], []), "residual": ([], [])}
    rng = np.random.default_rng(0)
    try:
        for _ in range(args.rounds):
            for name, run in (
                ("bare", lambda: bare_loop(bare, args.steps, rng)),
                ("wrapper", lambda: wrapper_loop(wrapper, wrapper_client, args.steps, rng)),
                ("residual", lambda: residual_loop(residual, residual_client, args.steps, rng)),
            ):
                cached, request = run()
                results[name][0].extend(cached)
                results[name][1].extend(request)
    finally:
        residual.close()
        wrapper.close()
        bare.close()

    def summary(times: tuple[list[float], list[float]]) -> tuple[float, float, float]:
        cached, request = times
        mean_step = (statistics.median(cached) * (HORIZON - 1) + statistics.median(request)) / HORIZON
        return statistics.median(cached), statistics.median(request), n / mean_step

    base_cached, _, base_rate = summary(results["bare"])
    print(f"N={n}, {args.rounds} rounds x {args.steps} steps per loop, interleaved; medians")
    print(
        f"{'loop':<14} {'cached step ms':>15} {'request step ms':>16} {'env-steps/s':>12} {'cached vs bare':>15} {'rate vs bare':>13}"
    )
    worst = 0.0
    for name in ("bare", "wrapper", "residual"):
        cached, request, rate = summary(results[name])
        ratio = cached / base_cached
        if name != "bare":
            worst = max(worst, ratio)
        print(
            f"{name:<14} {1e3 * cached:>15.2f} {1e3 * request:>16.2f} {rate:>12.1f} {ratio:>14.3f}x {rate / base_rate:>12.3f}x"
        )
    verdict = "met" if worst < 1.10 else "missed"
    print(f"target: cached steps cost < 10% more than the bare simulator's: {verdict} (worst {worst - 1:+.1%})")
    return 0


if __name__ == "__main__":  # required: the simulator's workers start with spawn
    sys.exit(main())
