"""Success rate and cost of the reference policy on the embedded scenes, over the wire.

Part 1 (plain episodes): runs ``dz-gym-eval`` as a user would, with its embedded reference server:
``--num-envs 8 --episodes 24`` per scene, the full 450-step horizon, the simulator's default randomization
(object and container +/-10 cm, any yaw), and prints success at the end of the episode with its Wilson 95 %
interval from the evaluator's ``summary.json``. The acceptance bar is >= 90 % per scene.

Part 2 (perturbed episodes): the same server policy in a server thread of this process, driven by
``DreamZeroPolicyWrapper`` over loopback on an 8-env embedded simulator, with the simulator's ``perturb``:

- ``nudge``: every env's object is slid 5 cm across the table at step 20 (the gripper is on its way down);
- ``drop``: every env's object is taken out of the gripper the first time it is lifted above 12 cm.

Part 3 (cost): the policy's own time per call (median, p99), measured inside the server in part 2 while
the simulator runs on the same cores, against the simulator's own time for the 8 steps one chunk covers
(measured in the same process), and the evaluator's round-trip latency from part 1.

Part 4 (skill, only with ``--skills``): success at the end against the ``skill`` knob
(``--policy reference:skill=S``), one ``dz-gym-eval`` run per value on ``--skill-scenes`` with
``--skill-episodes`` episodes and seeds from 0, with Wilson intervals. ``--skills-only`` runs just this part.

    python benchmarks/bench_reference_policy.py [--episodes 24] [--perturbed-episodes 8] [--scenes 1 2 3]
    python benchmarks/bench_reference_policy.py --skills-only --skills 1 0.6 0.3 0 --skill-episodes 16
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

from dz_gym.envs import droid


def wilson(k: int, n: int, z: float = 1.959964) -> tuple[float, float]:
    """Wilson score interval of k successes in n trials."""
    if n == 0:
        return 0.0, 1.0
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def run_evaluator(scenes: list[int], episodes: int, seed: int, num_envs: int, policy: str | None = None) -> dict:
    """Run ``dz-gym-eval`` in a subprocess (embedded server with ``policy``); returns its summary.json."""
    with tempfile.TemporaryDirectory() as root:
        cmd = [sys.executable, "-m", "dz_gym.eval.cli", "--num-envs", str(num_envs), "--episodes", str(episodes),
               "--seed", str(seed), "--no-video", "--no-progress", "--output-root", root]  # fmt: skip
        if policy is not None:
            cmd += ["--policy", policy]
        for scene in scenes:
            cmd += ["--scene", str(scene)]
        print("$ " + " ".join(cmd[1:]).replace(root, "<tmp>"), flush=True)
        start = time.perf_counter()
        subprocess.run(cmd, check=True, env=dict(os.environ, MUJOCO_GL=os.environ.get("MUJOCO_GL", "egl")))
        wall = time.perf_counter() - start
        summaries = list(Path(root).rglob("summary.json"))
        if len(summaries) != 1:
            raise RuntimeError(f"expected one summary.json under the run root, found {len(summaries)}")
        summary = json.loads(summaries[0].read_text())
        summary["bench_wall_s"] = wall
        return summary


class TimedPolicy:
    """Wraps a policy and records the wall time of each ``infer`` and whether its chunk moves the arm
    (calls after a finished task only hold the home pose, which is cheaper)."""

    def __init__(self, policy):
        self.policy = policy
        self.metadata = policy.metadata
        self.times: list[float] = []
        self.moving: list[bool] = []
        self._lock = threading.Lock()

    def infer(self, request, *, session_id, new_session):
        start = time.perf_counter()
        out = self.policy.infer(request, session_id=session_id, new_session=new_session)
        elapsed = time.perf_counter() - start
        moving = bool(np.ptp(np.asarray(out)[:, : droid.ARM_DOF], axis=0).max() > 1e-6)
        with self._lock:
            self.times.append(elapsed)
            self.moving.append(moving)
        return out

    def reset(self, session_id=None):
        self.policy.reset(session_id)


def run_perturbed(scene: int, kind: str, episodes: int, seed: int, url: str, steps: int) -> tuple[int, int, int]:
    """Episodes of ``scene`` with ``kind`` perturbations; returns (successes, episodes, perturbed)."""
    import dz_gym
    from dz_gym.wrapper import DreamZeroPolicyWrapper

    env = dz_gym.make_droid_env(
        backend="mujoco", scene=scene, num_envs=episodes, seed=seed, max_episode_length=steps + 1
    )
    base = env.unwrapped
    wrapped = DreamZeroPolicyWrapper(env, server=url)
    try:
        wrapped.reset(seed=seed)
        perturbed = np.zeros(episodes, dtype=bool)
        info = None
        for step in range(steps):
            obs, _, _, _, info = wrapped.step()
            state = base.privileged_state()
            for i in range(episodes):
                if perturbed[i]:
                    continue
                if kind == "nudge" and step == 20:
                    perturbed[i] = base.perturb(i, "nudge", 0.05)
                elif kind == "drop" and state["object_pos"][i][2] > 0.12:
                    perturbed[i] = base.perturb(i, "drop")
        success = int(np.asarray(info["success"]).sum())
    finally:
        wrapped.close()
    return success, episodes, int(perturbed.sum())


def sim_step_time(num_envs: int, steps: int = 64) -> float:
    """Mean wall time of one batched step of the embedded simulator (images rendered 1 step in 8)."""
    import dz_gym

    env = dz_gym.make_droid_env(backend="mujoco", scene=1, num_envs=num_envs, seed=0)
    try:
        env.reset(seed=0)
        hold = np.tile(np.append(droid.HOME_JOINT_POSITIONS, 0.0), (num_envs, 1)).astype(np.float32)
        start = time.perf_counter()
        for step in range(steps):
            env.set_render_mask(np.full(num_envs, (step + 1) % 8 == 0))
            env.step(hold)
        return (time.perf_counter() - start) / steps
    finally:
        env.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=24, help="plain episodes per scene (part 1)")
    parser.add_argument("--num-envs", type=int, default=8)
    parser.add_argument(
        "--perturbed-episodes", type=int, default=8, help="episodes per scene and perturbation (part 2)"
    )
    parser.add_argument("--perturbed-steps", type=int, default=450)
    parser.add_argument("--scenes", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--seed", type=int, default=1000)
    parser.add_argument("--skip-eval", action="store_true", help="skip part 1")
    parser.add_argument("--skills", type=float, nargs="*", default=[], help="part 4: skill values to measure")
    parser.add_argument("--skill-episodes", type=int, default=16)
    parser.add_argument("--skill-scenes", type=int, nargs="+", default=[1])
    parser.add_argument("--skills-only", action="store_true", help="run part 4 only")
    args = parser.parse_args()
    os.environ.setdefault("MUJOCO_GL", "egl")
    if args.skills_only:
        run_skills(args)
        return

    rows = []
    latency = None
    if not args.skip_eval:
        print(f"Part 1: dz-gym-eval, {args.episodes} episodes per scene at --num-envs {args.num_envs}, seeds "
              f"{args.seed}..{args.seed + args.episodes - 1}, 450-step horizon, default randomization", flush=True)  # fmt: skip
        summary = run_evaluator(args.scenes, args.episodes, args.seed, args.num_envs)
        latency = summary.get("latency_ms")
        for scene in args.scenes:
            entry = summary[str(scene)]["success_at_end"]
            lo, hi = entry["ci95"]
            rows.append((f"scene {scene}: {droid.SCENES[scene].prompt}", "none", entry["k"], entry["n"], lo, hi))
        print(f"evaluator: {summary.get('env_steps_per_s', float('nan')):.1f} env-steps/s, "
              f"round-trip latency ms {json.dumps(latency)}, wall {summary['bench_wall_s']:.0f} s", flush=True)  # fmt: skip

    from dz_gym.policies.reference import ReferencePolicy
    from dz_gym.server.launch import start_server_thread

    timed = TimedPolicy(ReferencePolicy())
    print(f"Part 2: perturbed episodes over loopback, {args.perturbed_episodes} per scene and kind, "
          f"{args.perturbed_steps} steps", flush=True)  # fmt: skip
    with start_server_thread(timed) as server:
        for scene in args.scenes:
            for kind in ("nudge", "drop"):
                start = time.perf_counter()
                url = server.url + "/v1/realtime/robot/openpi"
                k, n, applied = run_perturbed(
                    scene, kind, args.perturbed_episodes, args.seed + 500, url, args.perturbed_steps
                )
                lo, hi = wilson(k, n)
                rows.append(
                    (f"scene {scene}: {droid.SCENES[scene].prompt}", f"{kind} ({applied}/{n} applied)", k, n, lo, hi)
                )
                print(f"  scene {scene} {kind}: {k}/{n} ({time.perf_counter() - start:.0f} s)", flush=True)

    print()
    print("| scene | perturbation | success at end | Wilson 95% CI |")
    print("|---|---|---|---|")
    for name, kind, k, n, lo, hi in rows:
        print(f"| {name} | {kind} | {k}/{n} ({100 * k / n:.0f}%) | [{100 * lo:.0f}%, {100 * hi:.0f}%] |")

    times = np.asarray(timed.times) * 1e3
    moving = np.asarray(timed.moving, dtype=bool)
    step_s = sim_step_time(args.num_envs)
    chunk_sim_ms = 8 * step_s * 1e3 / args.num_envs  # simulator time one env's chunk covers, per env
    median = float(np.median(times))
    print()
    print("policy time per call (server side, the simulator running on the same cores; target: median < 15 ms):")
    for label, sel in (
        ("all calls", np.ones_like(moving)),
        ("calls that move the arm", moving),
        ("hold calls (task done)", ~moving),
    ):
        if sel.any():
            t = times[sel]
            print(
                f"  {label:24s} n={sel.sum():5d}  median {np.median(t):5.1f} ms  p99 {np.percentile(t, 99):5.1f} ms  max {t.max():5.1f} ms"
            )
    print(f"baseline, same process: the simulator needs {chunk_sim_ms:.1f} ms per env for the 8 steps a chunk "
          f"covers (N={args.num_envs}, images 1 step in 8); policy / simulator = {median / chunk_sim_ms:.2f}")  # fmt: skip
    print(
        f"share of the 8-step control period ({8 * droid.STEP_DT * 1e3:.0f} ms): {median / (8 * droid.STEP_DT * 1e3):.1%}"
    )
    if latency:
        print(
            f"evaluator round trip (part 1): p50 {latency.get('p50', float('nan')):.1f} ms, p99 {latency.get('p99', float('nan')):.1f} ms"
        )
    if args.skills:
        run_skills(args)


def run_skills(args: argparse.Namespace) -> None:
    """Part 4: success at the end against ``reference:skill=S``."""
    if not args.skills:
        raise SystemExit("--skills: give at least one value in [0, 1]")
    print(f"Part 4: success vs skill, {args.skill_episodes} episodes per scene and value, seeds 0.."
          f"{args.skill_episodes - 1}, --num-envs {args.num_envs}", flush=True)  # fmt: skip
    table = []
    for skill in args.skills:
        summary = run_evaluator(
            args.skill_scenes, args.skill_episodes, 0, args.num_envs, policy=f"reference:skill={skill:g}"
        )
        for scene in args.skill_scenes:
            entry = summary[str(scene)]["success_at_end"]
            table.append((scene, skill, entry["k"], entry["n"], *entry["ci95"]))
            print(
                f"  scene {scene} skill {skill:g}: {entry['k']}/{entry['n']} ({summary['bench_wall_s']:.0f} s)",
                flush=True,
            )
    print()
    print("| scene | skill | success at end | Wilson 95% CI |")
    print("|---|---|---|---|")
    for scene, skill, k, n, lo, hi in table:
        print(f"| {scene} | {skill:g} | {k}/{n} ({100 * k / n:.0f}%) | [{100 * lo:.0f}%, {100 * hi:.0f}%] |")


if __name__ == "__main__":
    main()
