"""Check the batched Isaac Lab DROID env against ``num_envs=1``: same scene, same actions, same observations.

For a machine with Isaac Lab 2.2 (or 3.0), sim-evals (with its assets) and an RTX GPU::

    python examples/isaac_check_batched.py --scene 1 --num-envs 4 --steps 60 [Isaac Lab launcher flags]
    python examples/isaac_check_batched.py --task place_spoon_in_sink --num-envs 4 --steps 60   # a MILA task

Isaac Sim starts once per process, so this runs two child processes: the reference with ``num_envs=1`` and
the batched env with ``num_envs=N``. Both reset, then follow the same open-loop action sequence (small
sine offsets around the home pose, the gripper closing and opening), and record per step the joints, the
gripper, the object and container positions (env-local), the success check and the first step of each
milestone (for a MILA task: sim-evals' own milestones), and each camera pooled to at most 45x80 pixels.
Every env of the batched run is then compared with the reference, one line per quantity, and the script
prints PASS (exit 0) or FAIL (exit 1).

What a FAIL points at: ``arm_joint_pos``/``gripper_pos`` differing by env suggests the proprio terms are not
batched; images brighter or darker than the reference suggest lighting that differs per env (the global
sphere light, summed dome lights, or neighbours' lights: try a larger ``--env-spacing``); object positions
differing suggest the env origins are not subtracted; ``success``/``milestones`` differing with equal poses
suggest the task's checks are not batched.
"""

from __future__ import annotations

import argparse
import math
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

from dz_gym.extras import require

HOME = (0.0, -0.2 * math.pi, 0.0, -0.8 * math.pi, 0.0, 0.6 * math.pi, 0.0)
POOLED = (45, 80)
QUANTITIES = ("arm_joint_pos", "gripper_pos", "object_pos", "container_pos", "success", "milestones", "images")
MILESTONES = ("reached", "lifted", "above_target", "placed")
DEFAULT_TOLERANCES = {
    "success": 0.0,  # exactly equal
    "milestones": 0.0,  # first step of each milestone, exactly equal
    "arm_joint_pos": 1e-3,  # rad
    "gripper_pos": 1e-2,  # closure, 0..1
    "object_pos": 5e-3,  # m
    "container_pos": 5e-3,  # m
    "images": 6.0,  # mean absolute difference of the pooled images, 0..255
}


def action_sequence(steps: int) -> np.ndarray:
    """``(steps, 8)`` actions: joints 1, 2, 4 and 6 swing +-0.15 rad around home; the gripper closes mid-way."""
    t = np.arange(steps, dtype=np.float64)
    actions = np.tile(np.append(np.asarray(HOME), 0.0), (steps, 1))
    for joint, phase in ((0, 0.0), (1, 1.0), (3, 2.0), (5, 3.0)):
        actions[:, joint] += 0.15 * np.sin(2 * math.pi * t / 60.0 + phase)
    actions[(t >= steps // 3) & (t < 2 * steps // 3), 7] = 1.0
    return actions


def pooled_images(policy) -> np.ndarray:
    """The three cameras of every env, average-pooled to at most 45x80, ``(N, 3, h, w, 3)`` uint8."""
    import torch
    import torch.nn.functional as F

    views = []
    for key in ("external_cam", "external_cam_2", "wrist_cam"):
        images = policy[key].permute(0, 3, 1, 2).to(torch.float32)
        size = (min(POOLED[0], images.shape[2]), min(POOLED[1], images.shape[3]))
        views.append(F.adaptive_avg_pool2d(images, size).round().to(torch.uint8).permute(0, 2, 3, 1))
    return torch.stack(views, dim=1).cpu().numpy()


def record(env, steps: int) -> dict[str, np.ndarray]:
    """Reset, follow :func:`action_sequence` (the same for every env), keep what :data:`QUANTITIES` names."""
    import torch

    # every env runs the episode of seed 0 (the same initial conditions where the task has several)
    env.set_episode_seeds(np.arange(env.num_envs), np.zeros(env.num_envs, dtype=np.int64))
    obs, info = env.reset()
    rows: dict[str, list] = {name: [] for name in QUANTITIES}
    for action in action_sequence(steps):
        batch = torch.as_tensor(np.tile(action, (env.num_envs, 1)), dtype=torch.float32, device=env.device)
        obs, _, _, _, info = env.step(batch)
        policy = obs["policy"]
        rows["arm_joint_pos"].append(policy["arm_joint_pos"].cpu().numpy())
        rows["gripper_pos"].append(policy["gripper_pos"].cpu().numpy())
        rows["object_pos"].append(np.asarray(info["object_pos"]))
        rows["container_pos"].append(np.asarray(info["container_pos"]))
        rows["success"].append(np.asarray(info["success"], dtype=np.float64))
        milestones = info.get("milestones") or {}
        rows["milestones"].append(
            np.stack([np.asarray(milestones.get(name, np.full(env.num_envs, -1))) for name in MILESTONES], axis=1)
        )
        rows["images"].append(pooled_images(policy))
    return {name: np.stack(values) for name, values in rows.items()}  # (steps, N, ...)


def compare(reference: dict, batched: dict, tolerances: dict | None = None) -> list[tuple[str, float, float, bool]]:
    """Per quantity: the largest difference of any batched env from the single env, its tolerance, and ok."""
    tolerances = {**DEFAULT_TOLERANCES, **(tolerances or {})}
    results = []
    for name in QUANTITIES:
        ref = reference[name][:, :1].astype(np.float64)
        got = batched[name].astype(np.float64)
        if ref.shape[0] != got.shape[0] or ref.shape[2:] != got.shape[2:]:
            results.append((name, math.inf, tolerances[name], False))
            continue
        diff = np.abs(got - ref)
        if name == "images":
            worst = float(diff.mean(axis=tuple(range(2, diff.ndim))).max())  # per step and env
        else:
            worst = float(diff.max())
        results.append((name, worst, tolerances[name], worst <= tolerances[name]))
    return results


def report(results, num_envs: int) -> bool:
    """Print one line per quantity and the verdict; True on PASS."""
    print(f"batched (num_envs={num_envs}) vs single env: largest difference of any env")
    for name, worst, tolerance, ok in results:
        print(f"  {name:<14} {worst:10.4g}  (tolerance {tolerance:g})  {'ok' if ok else 'DIFFERS'}")
    passed = all(ok for *_, ok in results)
    print("PASS" if passed else "FAIL")
    return passed


def run_role(args, role: str, out: Path, **env_kwargs) -> None:
    """One child's work: build the env (1 or N envs), record, save to ``out``."""
    import dz_gym

    num_envs = 1 if role == "reference" else args.num_envs
    kwargs = dict(app_args=args, check_gpu=not args.skip_gpu_check)
    if args.env_spacing is not None:
        kwargs["env_spacing"] = args.env_spacing
    kwargs.update(env_kwargs)
    scene = args.task if args.task is not None else args.scene
    env = dz_gym.make_droid_env(backend="isaac", scene=scene, num_envs=num_envs, **kwargs)
    try:
        data = record(env, args.steps)
    finally:
        env.close()
    np.savez(out, **data)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    from dz_gym.envs.scenes import TASKS

    parser.add_argument("--scene", type=int, default=1, choices=(1, 2, 3))
    parser.add_argument(
        "--task", choices=tuple(TASKS), help="a sim-evals task by name instead of --scene (MILA tasks too)"
    )
    parser.add_argument("--num-envs", type=int, default=4)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--env-spacing", type=float, default=None, help="metres between envs (default: the backend's)")
    parser.add_argument("--skip-gpu-check", action="store_true", help="do not refuse GPUs without RT cores")
    parser.add_argument("--role", choices=("reference", "batched"), help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    from dz_gym.envs.isaac import add_launcher_args

    add_launcher_args(parser)
    return parser


def main(argv: list[str] | None = None) -> int:
    require("isaac_check_batched.py", "isaaclab", "torch")
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    if args.role is not None:
        run_role(args, args.role, args.out)
        return 0
    with tempfile.TemporaryDirectory() as folder:
        outputs = {}
        for role in ("reference", "batched"):
            outputs[role] = Path(folder) / f"{role}.npz"
            print(f"running the {role} env in a new process ...", flush=True)
            code = subprocess.call([sys.executable, __file__, *argv, "--role", role, "--out", str(outputs[role])])
            if code != 0:
                print(f"FAIL: the {role} run exited with {code}")
                return 1
        reference = dict(np.load(outputs["reference"]))
        batched = dict(np.load(outputs["batched"]))
    return 0 if report(compare(reference, batched), args.num_envs) else 1


if __name__ == "__main__":
    sys.exit(main())
