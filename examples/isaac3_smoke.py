"""Smoke check of the Isaac Lab 3.0 kit-less DROID task through the isaac backend, on a GPU or on the CPU.

Builds ``DZ-DROID-CubeInBowl-Newton-v0`` (or ``--task``) with N envs, resets with a seed, steps the arm at
the home pose while closing the gripper, and checks what every backend must give: the observation contract
(three ``(N, H, W, 3)`` uint8 views, ``arm_joint_pos (N, 7)``, ``gripper_pos (N, 1)``), the object and the
container where the MuJoCo backend's sampler puts them for the episodes' seeds, the object resting on the
table, the gripper closing, and views that are not blank. It prints the timings (build, first step with
kernel compilation, later steps) and writes the three views of env 0 as a PNG.

Usage::

    python examples/isaac3_smoke.py --device cpu --num-envs 2 --steps 6      # Warp's CPU device
    python examples/isaac3_smoke.py --device cuda:0 --num-envs 64 --png views.png
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np

from dz_gym.extras import require


def main() -> int:
    require("isaac3_smoke.py", "isaaclab", "torch")
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--task", default="DZ-DROID-CubeInBowl-Newton-v0")
    parser.add_argument("--device", default="cuda:0")
    parser.add_argument("--num-envs", type=int, default=2)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--png", default="isaac3_views.png")
    args = parser.parse_args()

    from dz_gym.envs import droid, scenes
    from dz_gym.envs.isaac import make_env
    from dz_gym.envs.mujoco import scene as mujoco_scene
    from dz_gym.preprocess import to_numpy

    t0 = time.perf_counter()
    env = make_env(args.task, num_envs=args.num_envs, device=args.device, seed=args.seed)
    built = time.perf_counter() - t0
    obs, info = env.reset(seed=args.seed)
    policy = obs[droid.POLICY_GROUP]
    n = args.num_envs
    h, w = env.single_observation_space[droid.POLICY_GROUP][droid.CAMERA_KEYS[0]].shape[:2]
    failures = []
    for key in droid.CAMERA_KEYS:
        view = policy[key]
        if tuple(view.shape) != (n, h, w, 3) or str(view.dtype) != "torch.uint8":
            failures.append(f"{key}: {tuple(view.shape)} {view.dtype}")
    for key, dim in ((droid.OBS_JOINT_KEY, 7), (droid.OBS_GRIPPER_KEY, 1)):
        if tuple(policy[key].shape) != (n, dim):
            failures.append(f"{key}: {tuple(policy[key].shape)}")
    scene_id = scenes.task_for(args.task).scene
    state = env._probe.read(env.isaac_env)
    for i, seed in enumerate(info["episode_seed"]):
        layout = mujoco_scene.sample_layout(scene_id, np.random.default_rng(int(seed)), mujoco_scene.Randomization())
        if np.abs(state.object_pos[i, :2] - layout.object_xy).max() > 0.01:
            failures.append(f"env {i}: object at {state.object_pos[i, :2]}, the seed's layout says {layout.object_xy}")
    action = np.zeros((n, droid.ACTION_DIM), dtype=np.float32)
    action[:, : droid.ARM_DOF] = droid.HOME_JOINT_POSITIONS
    action[:, droid.ARM_DOF] = 1.0
    times = []
    for _ in range(args.steps):
        start = time.perf_counter()
        obs, *_ = env.step(action)
        times.append(time.perf_counter() - start)
    policy = obs[droid.POLICY_GROUP]
    state = env._probe.read(env.isaac_env)
    gripper = to_numpy(policy[droid.OBS_GRIPPER_KEY]).reshape(-1)
    if not (gripper > 0.5).all():
        failures.append(f"gripper did not close: {gripper}")
    rest_z = mujoco_scene.LAYOUTS[scene_id].object_rest_z
    if np.abs(state.object_pos[:, 2] - rest_z).max() > 0.01:
        failures.append(f"object not resting on the table: z {state.object_pos[:, 2]} (expected {rest_z})")
    views = [to_numpy(policy[key][0]) for key in droid.VIDEO_STRIP_KEYS]
    if any(float(v.std()) < 5.0 for v in views):
        failures.append("a view is blank")
    import imageio.v3 as iio

    iio.imwrite(args.png, np.concatenate(views, axis=1))
    later = times[1:] or times
    print(
        f"{args.task} on {env.device}: N={n}, views {h}x{w}; build {built:.1f} s, first step {times[0]:.2f} s, "
        f"later steps {1e3 * float(np.mean(later)):.1f} ms ({n * len(later) / sum(later):.1f} env-steps/s); "
        f"gripper {gripper.min():.2f}..{gripper.max():.2f}; views -> {args.png}"
    )
    env.close()
    for failure in failures:
        print("FAIL:", failure)
    print("smoke", "FAILED" if failures else "ok")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
