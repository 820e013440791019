"""Residual PPO (rsl_rl) over a weakened reference policy served on the websocket, embedded scene 1.

Starts the reference server (``dz-gym-serve --policy reference:skill=S``, the vision policy made to fail
more often) on a free loopback port, wraps ``--num-envs`` embedded-simulator envs of scene 1 in
``DreamZeroPolicyWrapper`` -> ``dz_gym.rl.ResidualEnv`` -> ``RslRlVecEnv``, then:

1. evaluates the served policy alone (zero residual) on ``--eval-episodes`` seeded episodes;
2. trains a residual policy with rsl_rl's ``OnPolicyRunner`` (PPO) for ``--iterations`` iterations;
3. evaluates the served policy plus the trained residual (the actor's mean) on the same episode seeds.

Success counts an episode that met the placement check at some step (the residual env ends it there);
both evaluations print it with a 95 % Wilson interval, and the paired difference on the shared seeds.

    MUJOCO_GL=egl python examples/residual_ppo.py --num-envs 8 --iterations 20
    MUJOCO_GL=egl python examples/residual_ppo.py --server ws://GPU_HOST:8000/v1/realtime/robot/openpi

Needs ``pip install dz-gym[rl,mujoco]``.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import tempfile
import time

import numpy as np

from dz_gym.extras import require

OPENPI_PATH = "/v1/realtime/robot/openpi"


def build_cfg(args: argparse.Namespace) -> dict:
    """PPO settings in rsl-rl-lib 5.x's format: small networks, a small initial exploration noise."""
    from dz_gym.rl.rsl_rl_env import OBS_GROUPS

    groups = dict(OBS_GROUPS)
    if args.privileged_actor:
        groups["actor"] = ["policy", "privileged"]
    return {
        "num_steps_per_env": args.steps_per_env,
        "save_interval": 10_000,
        "obs_groups": groups,
        "actor": {
            "class_name": "MLPModel",
            "hidden_dims": [128, 128],
            "activation": "elu",
            "obs_normalization": True,
            "distribution_cfg": {"class_name": "GaussianDistribution", "init_std": args.init_std},
        },
        "critic": {"class_name": "MLPModel", "hidden_dims": [128, 128], "activation": "elu", "obs_normalization": True},
        "algorithm": {
            "class_name": "PPO",
            "num_learning_epochs": 5,
            "num_mini_batches": 4,
            "learning_rate": 3e-4,
            "schedule": "adaptive",
            "desired_kl": 0.01,
            "gamma": 0.99,
            "lam": 0.95,
            "entropy_coef": 0.0,
            "clip_param": 0.2,
        },
    }


def evaluate(vec, act, episodes_per_env: int, seed: int) -> np.ndarray:
    """Run every env until it has ended ``episodes_per_env`` episodes; ``(N, k)`` bool success of each env's
    first k episodes (their seeds are ``seed + i + N * j``, the same in every call)."""
    import torch

    n = vec.num_envs
    outcomes: list[list[bool]] = [[] for _ in range(n)]
    obs, _ = vec.reset(seed=seed)
    while min(len(o) for o in outcomes) < episodes_per_env:
        with torch.inference_mode():
            actions = act(obs)
        obs, _, _, _ = vec.step(actions)
        info = vec.last_info
        if "_final_info" in info:
            for i in np.flatnonzero(info["_final_info"]):
                if len(outcomes[i]) < episodes_per_env:
                    outcomes[i].append(bool(info["final_info"]["success_any_step"][i]))
    return np.array(outcomes, dtype=bool)


def report(label: str, outcomes: np.ndarray, seconds: float) -> None:
    from dz_gym.stats import wilson_interval

    k, total = int(outcomes.sum()), int(outcomes.size)
    lo, hi = wilson_interval(k, total)
    print(
        f"{label}: success {k}/{total} = {k / total:.1%} (95% Wilson {lo:.1%}-{hi:.1%}) in {seconds:.0f} s", flush=True
    )


def run(server_url: str, args: argparse.Namespace) -> None:
    import torch
    from rsl_rl.runners import OnPolicyRunner

    from dz_gym.rl import RewardConfig, RslRlVecEnv, make_residual_env
    from dz_gym.stats import PairedCounts, paired_difference_interval

    torch.manual_seed(args.seed)
    # The networks are small: one thread is many times faster than several competing with the simulator's
    # workers for the cores.
    torch.set_num_threads(args.torch_threads)
    env = make_residual_env(
        1, args.num_envs, server=server_url, episode_length=args.episode_length, seed=args.seed,
        reward=RewardConfig(mode=args.reward), residual_scale=args.residual_scale,
    )  # fmt: skip
    vec = RslRlVecEnv(env, seed=args.seed + 10_000)  # training episodes use other seeds than the evaluation
    try:
        per_env = max(1, -(-args.eval_episodes // args.num_envs))
        zero = torch.zeros(args.num_envs, env.num_actions)
        start = time.perf_counter()
        before = evaluate(vec, lambda obs: zero, per_env, args.seed)
        report("served policy alone (zero residual)", before, time.perf_counter() - start)

        with tempfile.TemporaryDirectory() as tmp:
            log_dir = args.log_dir or tmp
            runner = OnPolicyRunner(vec, build_cfg(args), log_dir=log_dir, device="cpu")
            vec.reset(seed=args.seed + 10_000)
            start = time.perf_counter()
            runner.learn(args.iterations)
            train_s = time.perf_counter() - start
            steps = args.iterations * args.steps_per_env * args.num_envs
            print(f"trained {args.iterations} PPO iterations, {steps} env-steps in {train_s:.0f} s", flush=True)
            policy = runner.get_inference_policy()

        start = time.perf_counter()
        after = evaluate(vec, policy, per_env, args.seed)
        report("served policy + trained residual", after, time.perf_counter() - start)
        counts = PairedCounts.from_pairs(zip(before.reshape(-1).tolist(), after.reshape(-1).tolist()))
        lo, hi = paired_difference_interval(counts)
        print(
            f"paired difference (after - before) on the same {counts.n} episode seeds: "
            f"{(counts.b - counts.a) / counts.n:+.1%} (95% Newcombe {lo:+.1%} to {hi:+.1%}; "
            f"only before {counts.a_only}, only after {counts.b_only})",
            flush=True,
        )
    finally:
        vec.close()


def main(argv: list[str] | None = None) -> int:
    require("residual_ppo.py", "torch", "rsl_rl", "mujoco")
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num-envs", type=int, default=8)
    parser.add_argument("--iterations", type=int, default=20, help="PPO iterations (default 20)")
    parser.add_argument("--skill", type=float, default=0.3, help="reference policy skill in [0, 1] (default 0.3)")
    parser.add_argument("--server", help="ws:// URL of a policy server (default: start the reference server)")
    parser.add_argument("--episode-length", type=int, default=150, help="steps per episode (default 150)")
    parser.add_argument("--steps-per-env", type=int, default=24, help="rollout steps per env and iteration")
    parser.add_argument("--eval-episodes", type=int, default=16, help="episodes per evaluation (default 16)")
    parser.add_argument("--reward", choices=("dense", "sparse"), default="dense")
    parser.add_argument("--residual-scale", type=float, default=0.05, help="correction at action 1 (rad)")
    parser.add_argument("--init-std", type=float, default=0.3, help="initial exploration std of the residual")
    parser.add_argument("--privileged-actor", action="store_true", help="give the actor the object poses too")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--torch-threads", type=int, default=1, help="torch intra-op threads (default 1)")
    parser.add_argument("--log-dir", help="keep rsl_rl's logs and model here (default: a temporary directory)")
    args = parser.parse_args(argv)
    for name in ("num_envs", "iterations", "episode_length", "steps_per_env", "eval_episodes"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')}: expected an integer >= 1, got {getattr(args, name)}")
    if not 0.0 <= args.skill <= 1.0:
        parser.error(f"--skill: expected a number in [0, 1], got {args.skill}")
    args.residual_scale = [args.residual_scale] * 7 + [0.5]
    if args.server:
        run(args.server, args)
        return 0
    from dz_gym.server.launch import start_server_process

    serve = ["--policy", f"reference:skill={args.skill}", "--flavor", "vllm-omni", "--quiet"]
    with contextlib.ExitStack() as stack:
        server = stack.enter_context(start_server_process(serve, new_session=True))
        print(f"reference server (skill {args.skill}) at {server.url}", flush=True)
        run(server.url + OPENPI_PATH, args)
    return 0


if __name__ == "__main__":  # required: the simulator's workers start with spawn
    sys.exit(main())
