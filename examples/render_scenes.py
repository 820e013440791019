"""Save a rendered frame of every embedded scene from every camera, to look at.

For each scene it writes ``scene<k>_<camera>.png`` (the first frame of seed ``--seed``), plus
``scene<k>_sheet.png``: one row per seed (``--seeds`` of them) with the three views side by side, and a
last row taken while the scripted expert grasps the object (the wrist view then shows the gripper at
work).

    python examples/render_scenes.py [--out renders] [--image-shape 180 320] [--seed 0] [--seeds 4]
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from dz_gym.extras import require

require("render_scenes.py", "mujoco", "PIL")  # before the imports that need them: one line, not a traceback

from PIL import Image  # noqa: E402

from dz_gym.envs import droid  # noqa: E402
from dz_gym.envs.mujoco import make_env  # noqa: E402
from dz_gym.envs.mujoco.expert import ScriptedExpert  # noqa: E402


def grasp_frame(scene: int, seed: int, image_shape) -> dict[str, np.ndarray]:
    """The three views at the moment the expert has closed the gripper on the object."""
    env = make_env(scene=scene, num_envs=1, seed=seed, image_shape=image_shape, num_workers=0)
    try:
        env.reset()
        expert = ScriptedExpert(scene, 1)
        env.set_render_mask(np.zeros(1, dtype=bool))
        obs = None
        for _ in range(200):
            action = expert.act(env.privileged_state())
            if expert.phase_names()[0] == "lift":
                env.set_render_mask(None)
                obs, *_ = env.step(action)
                break
            env.step(action)
        if obs is None:
            env.set_render_mask(None)
            obs, *_ = env.step(expert.act(env.privileged_state()))
        return {name: np.array(obs["policy"][name][0]) for name in droid.CAMERA_KEYS}  # copies: views end with the env
    finally:
        env.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("renders"))
    parser.add_argument("--image-shape", type=int, nargs=2, default=droid.DEFAULT_EMBEDDED_IMAGE_SHAPE)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--seeds", type=int, default=4, help="rows of the contact sheet")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    shape = tuple(args.image_shape)
    for scene in sorted(droid.SCENES):
        env = make_env(scene=scene, num_envs=args.seeds, seed=args.seed, image_shape=shape, num_workers=0)
        try:
            obs, _ = env.reset()
            views = {name: np.array(view) for name, view in obs["policy"].items()}  # copies: views end with the env
        finally:
            env.close()
        for name in droid.CAMERA_KEYS:
            Image.fromarray(views[name][0]).save(args.out / f"scene{scene}_{name}.png")
        rows = [np.concatenate([views[name][i] for name in droid.VIDEO_STRIP_KEYS], axis=1) for i in range(args.seeds)]
        grasp = grasp_frame(scene, args.seed, shape)
        rows.append(np.concatenate([grasp[name] for name in droid.VIDEO_STRIP_KEYS], axis=1))
        Image.fromarray(np.concatenate(rows, axis=0)).save(args.out / f"scene{scene}_sheet.png")
        print(f"scene {scene} ({droid.SCENES[scene].prompt}): wrote {args.out}/scene{scene}_*.png")


if __name__ == "__main__":
    main()
