"""Success rate of the scripted expert on the embedded scenes: seeded episodes over the full 450-step horizon.

For each scene it runs ``--episodes`` episodes (seeds ``--seed .. --seed + episodes - 1``, one env per
episode, all in one batch) and prints success at the end of the episode, success at any step, and the
steps to first success. Rendering is skipped (the expert reads privileged state), so this measures the
physics and the task geometry, not the cameras. The acceptance bar is >= 90 % per scene.

    python benchmarks/bench_expert.py [--episodes 20] [--seed 0] [--scenes 1 2 3] [--workers N]
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from dz_gym.envs import droid
from dz_gym.envs.mujoco import make_env
from dz_gym.envs.mujoco.expert import ScriptedExpert, run_episodes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--scenes", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--workers", type=int, default=None)
    args = parser.parse_args()
    print(f"{args.episodes} episodes per scene, seeds {args.seed}..{args.seed + args.episodes - 1}, "
          f"{droid.MAX_EPISODE_LENGTH}-step horizon, default randomization (+/-10 cm, any yaw)")  # fmt: skip
    print(
        "| scene | task | success at end | success at any step | steps to success (median, max) | failed seeds | wall s |"
    )
    print("|---|---|---|---|---|---|---|")
    worst = 1.0
    for scene_id in args.scenes:
        spec = droid.scene_spec(scene_id)
        start = time.perf_counter()
        env = make_env(scene=scene_id, num_envs=args.episodes, seed=args.seed, num_workers=args.workers)
        try:
            env.reset()
            result = run_episodes(env, ScriptedExpert(scene_id, args.episodes))
        finally:
            env.close()
        wall = time.perf_counter() - start
        n = args.episodes
        ok, any_ok = int(result["success"].sum()), int(result["success_any_step"].sum())
        steps = result["steps_to_success"][result["steps_to_success"] > 0]
        steps_text = f"{int(np.median(steps))}, {int(steps.max())}" if steps.size else "-"
        failed = result["episode_seed"][~result["success"]].tolist()
        worst = min(worst, ok / n)
        print(f"| {scene_id} | {spec.prompt} | {ok}/{n} ({100 * ok / n:.0f} %) | {any_ok}/{n} | {steps_text} | "
              f"{failed or '-'} | {wall:.0f} |")  # fmt: skip
    print(f"lowest per-scene success: {100 * worst:.0f} % (bar: 90 %) -> {'met' if worst >= 0.9 else 'NOT met'}")


if __name__ == "__main__":
    main()
