"""DROID scenes 1-3 as an Isaac Lab 3.0 task, kit-less: Newton physics and Newton's Warp ray-cast cameras.

The embedded simulator's scenes (same robot, table, objects, layout ranges, cameras, prompts, 450 steps at
15 Hz) as manager-based Isaac Lab env configs (:mod:`~dz_gym.envs.isaac_droid3.env_cfg`), with their USD
assets converted from the vendored MJCF (:mod:`~dz_gym.envs.isaac_droid3.assets`) and the task's own terms
(:mod:`~dz_gym.envs.isaac_droid3.mdp`). Importing this package registers one gym id per scene
(:data:`GYM_IDS`) and imports nothing of Isaac Lab, so Isaac Lab users can::

    import dz_gym.envs.isaac_droid3  # registers the ids
    from isaaclab_tasks.utils import parse_env_cfg
    cfg = parse_env_cfg("DZ-DROID-CubeInBowl-Newton-v0", device="cuda:0", num_envs=64)
    env = gym.make("DZ-DROID-CubeInBowl-Newton-v0", cfg=cfg)  # inside launch_simulation(cfg)

and ``dz-gym-eval --backend isaac --task DZ-DROID-CubeInBowl-Newton-v0`` runs it through the isaac backend.
"""

from __future__ import annotations

import gymnasium as gym

GYM_IDS = {
    1: "DZ-DROID-CubeInBowl-Newton-v0",
    2: "DZ-DROID-CanInMug-Newton-v0",
    3: "DZ-DROID-BananaInBin-Newton-v0",
}
ENTRY_POINT = "isaaclab.envs:ManagerBasedRLEnv"
# Isaac Lab's config lookup (``parse_env_cfg``) of each scene, the ``env_cfg_entry_point`` of its spec
ENV_CFG_ENTRY_POINTS = {scene_id: f"{__name__}.env_cfg:DroidScene{scene_id}EnvCfg" for scene_id in GYM_IDS}


def register() -> None:
    """Register the three gym ids (idempotent)."""
    for scene_id, gym_id in GYM_IDS.items():
        if gym_id not in gym.registry:
            gym.register(
                id=gym_id,
                entry_point=ENTRY_POINT,
                disable_env_checker=True,
                kwargs={"env_cfg_entry_point": ENV_CFG_ENTRY_POINTS[scene_id]},
            )


register()
