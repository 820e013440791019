"""RL env-steps/s of the residual env (wrapper + policy client + torch tensors) vs the bare simulator, N=8.

Three loops over the embedded simulator (scene 1, N envs, worker processes), in this process, interleaved
over ``--rounds`` rounds of ``--steps`` steps each (the order rotates from round to round), all executing
the same kind of action (a hold or proposal plus a random residual of the residual env's default scale):

- **bare**: ``MujocoDroidEnv.step`` with hold actions plus a small residual, rendering the envs on the step
  before every 8th (the images a policy server would be sent), nothing else;
- **wrapper**: ``DreamZeroPolicyWrapper.propose()`` + ``step(proposal + residual)`` with the ``hold``
  policy served in process (``MemoryPolicyClient``: the protocol's codec, no sockets);
- **residual env**: ``dz_gym.rl.ResidualEnv.step`` (torch actions in, torch observations, rewards and
  flags out) over the same wrapper.

The wrapper renders exactly the bare loop's pattern (its lazy rendering asks for the images of the envs
that send a request at their next step), so the steps compare like for like. Steps are split into
**cached** steps (no server request, no rendering: the wrapper executes a cached chunk row) and
**request** steps (rendering + one request per env). For each it prints the median wall time and the mean
CPU time per step (this process, where the wrapper, the policy client and torch run, plus the env's worker
processes, from /proc), and their ratios to the bare simulator. On a shared machine both move with the
load by 10-30 % between loops, more than the wrapper costs, so the wrapper loops also time the simulator's
own ``step`` inside them (a timing ``gym.Wrapper`` under the policy wrapper): the rest of each cached step
is the **overhead** (wrapper, policy client, residual env, torch), reported in ms and as a share of the
bare simulator's cached step. Target: overhead < 10 % of the bare step.

    MUJOCO_GL=egl python benchmarks/bench_rl.py [--num-envs 8] [--steps 48] [--rounds 6]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable

import gymnasium as gym
import numpy as np

HORIZON = 8
SCALE = np.array([0.05] * 7 + [0.5], dtype=np.float32)  # ResidualEnv's default residual_scale


def draw_residual(rng: np.random.Generator, n: int) -> np.ndarray:
    """The normalized residual every loop executes: ``U(-0.2, 0.2)`` per dimension."""
    return rng.uniform(-0.2, 0.2, size=(n, 8)).astype(np.float32)


def add_residual(base: np.ndarray, residual: np.ndarray) -> np.ndarray:
    """``base + SCALE * residual`` with the gripper command clipped to [0, 1], as ``ResidualEnv`` executes."""
    action = base + residual * SCALE
    action[:, 7] = np.clip(action[:, 7], 0.0, 1.0)
    return action


class TimedEnv(gym.Wrapper):
    """Times the simulator's own ``step`` inside the wrapper (wall and this process's CPU), so that the
    wrapper's overhead is measured as the rest of the step instead of as a difference of two noisy runs."""

    def __init__(self, env):
        super().__init__(env)
        self.last_wall = self.last_cpu = 0.0

    def step(self, action):
        cpu, wall = time.process_time(), time.perf_counter()
        try:
            return self.env.step(action)
        finally:
            self.last_wall, self.last_cpu = time.perf_counter() - wall, time.process_time() - cpu


class Meter:
    """Wall and CPU time of steps (this process plus ``pids``, from /proc), filed as cached or request steps."""

    def __init__(self, pids: list[int], timed: TimedEnv | None = None):
        self.pids = list(pids)
        self.timed = timed
        self.tick = os.sysconf("SC_CLK_TCK")
        self.wall: dict[str, list[float]] = {"cached": [], "request": []}
        self.cpu: dict[str, list[float]] = {"cached": [], "request": []}
        self.overhead: dict[str, list[float]] = {"cached": [], "request": []}  # wall time outside env.step

    def cpu_seconds(self) -> float:
        total = time.process_time()
        for pid in self.pids:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / self.tick  # utime + stime
        return total

    def measure(self, step: Callable[[], bool]) -> None:
        """Run ``step`` (which returns whether it rendered or sent requests) and file its times."""
        cpu, wall = self.cpu_seconds(), time.perf_counter()
        busy = step()
        kind = "request" if busy else "cached"
        elapsed = time.perf_counter() - wall
        self.wall[kind].append(elapsed)
        self.cpu[kind].append(self.cpu_seconds() - cpu)
        if self.timed is not None:
            self.overhead[kind].append(elapsed - self.timed.last_wall)


def bare_loop(env, meter: Meter, steps: int, rng: np.random.Generator) -> None:
    """The bare simulator, rendering every env on the step before a request step."""
    n = env.num_envs
    everyone, nobody = np.ones(n, dtype=bool), np.zeros(n, dtype=bool)
    state = {"obs": env.reset(seed=0)[0]}
    hold = np.zeros((n, 8), dtype=np.float32)
    for index in range(steps):
        render = index % HORIZON == HORIZON - 1  # the step before a request step renders
        if index % HORIZON == 0:
            hold[:, :7] = state["obs"]["policy"]["arm_joint_pos"]
        action = add_residual(hold, draw_residual(rng, n))

        def step(action=action, render=render) -> bool:
            env.set_render_mask(everyone if render else nobody)
            state["obs"] = env.step(action)[0]
            return render

        meter.measure(step)


def wrapper_loop(wrapper, client, meter: Meter, steps: int, rng: np.random.Generator) -> None:
    """``propose()`` + ``step(proposal + residual)`` + the next ``propose()``, as an RL loop runs them."""
    n = wrapper.num_envs
    wrapper.reset(seed=0)
    wrapper.propose()
    for _ in range(steps):
        residual = draw_residual(rng, n)

        def step(residual=residual) -> bool:
            calls = sum(client.requests)
            _, _, _, _, info = wrapper.step(add_residual(wrapper.propose(), residual))
            wrapper.propose()
            return sum(client.requests) > calls or bool(np.asarray(info["images_fresh"]).any())

        meter.measure(step)


def residual_loop(env, client, meter: Meter, steps: int, rng: np.random.Generator) -> None:
    """``ResidualEnv.step`` with torch actions."""
    import torch

    env.reset(seed=0)
    for _ in range(steps):
        action = torch.as_tensor(draw_residual(rng, env.num_envs))

        def step(action=action) -> bool:
            calls = sum(client.requests)
            _, _, _, _, info = env.step(action)
            return sum(client.requests) > calls or bool(np.asarray(info["images_fresh"]).any())

        meter.measure(step)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num-envs", type=int, default=8)
    parser.add_argument("--steps", type=int, default=48, help="steps per loop and round (default 48)")
    parser.add_argument("--rounds", type=int, default=6)
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

    def make():
        return dz_gym.make_droid_env(
            backend="mujoco", scene=1, num_envs=n, seed=0, num_workers=args.workers, max_episode_length=length
        )

    bare = make()
    wrapper_client = MemoryPolicyClient(HoldPolicy(), num_envs=n)
    wrapper_timed = TimedEnv(make())
    wrapper = dz_gym.DreamZeroPolicyWrapper(wrapper_timed, client=wrapper_client)
    residual_client = MemoryPolicyClient(HoldPolicy(), num_envs=n)
    residual_timed = TimedEnv(make())
    residual = ResidualEnv(
        dz_gym.DreamZeroPolicyWrapper(residual_timed, client=residual_client),
        episode_length=length - 1,
        terminate_on_success=False,
    )
    meters = {
        "bare": Meter(bare.worker_pids),
        "wrapper": Meter(wrapper.unwrapped.worker_pids, wrapper_timed),
        "residual": Meter(residual.wrapper.unwrapped.worker_pids, residual_timed),
    }
    rng = np.random.default_rng(0)
    try:
        loops = [
            ("bare", lambda: bare_loop(bare, meters["bare"], args.steps, rng)),
            ("wrapper", lambda: wrapper_loop(wrapper, wrapper_client, meters["wrapper"], args.steps, rng)),
            ("residual", lambda: residual_loop(residual, residual_client, meters["residual"], args.steps, rng)),
        ]
        for round_index in range(args.rounds):
            shift = round_index % len(loops)  # rotate the order, so no loop always runs first or last
            for _, run in loops[shift:] + loops[:shift]:
                run()
    finally:
        residual.close()
        wrapper.close()
        bare.close()

    def summary(meter: Meter) -> dict[str, float]:
        wall_cached, wall_request = (statistics.median(meter.wall[k]) for k in ("cached", "request"))
        cpu_cached, cpu_request = (statistics.fmean(meter.cpu[k]) for k in ("cached", "request"))
        mean_wall = (wall_cached * (HORIZON - 1) + wall_request) / HORIZON
        overhead = statistics.median(meter.overhead["cached"]) if meter.overhead["cached"] else 0.0
        return {"wall": wall_cached, "cpu": cpu_cached, "cpu_request": cpu_request, "rate": n / mean_wall,
                "overhead": overhead}  # fmt: skip

    base = summary(meters["bare"])
    cached_steps = len(meters["bare"].wall["cached"])
    print(f"N={n}, {args.rounds} rounds x {args.steps} steps per loop ({cached_steps} cached), interleaved")
    print(
        f"{'loop':<10} {'cached wall ms':>15} {'cached CPU ms':>14} {'request CPU ms':>15} {'env-steps/s':>12} "
        f"{'CPU vs bare':>12} {'wall vs bare':>13} {'overhead ms':>12} {'overhead/bare':>14}"
    )
    worst = 0.0
    for name, meter in meters.items():
        row = summary(meter)
        share = row["overhead"] / base["wall"]
        worst = max(worst, share)
        print(
            f"{name:<10} {1e3 * row['wall']:>15.2f} {1e3 * row['cpu']:>14.2f} {1e3 * row['cpu_request']:>15.1f} "
            f"{row['rate']:>12.1f} {row['cpu'] / base['cpu']:>11.3f}x {row['wall'] / base['wall']:>12.3f}x "
            f"{1e3 * row['overhead']:>12.3f} {share:>13.1%}"
        )
    verdict = "met" if worst < 0.10 else "missed"
    print(
        "overhead: a cached step's wall time outside the simulator's own step (median), over the bare step's.\n"
        f"target: the wrapper costs < 10% on cached steps: {verdict} (worst {worst:.1%})"
    )
    return 0


if __name__ == "__main__":  # required: the simulator's workers start with spawn
    sys.exit(main())
