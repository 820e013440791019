"""Stand-in ``isaaclab.envs.mdp`` functions used by sim-evals' config (image, time_out, reset)."""

from __future__ import annotations


def image(env, sensor_cfg, data_type="rgb", normalize=True):
    """2.2's ``mdp.observations.image``: the camera's ``(N,H,W,3)`` uint8 output."""
    if normalize:
        raise AssertionError("sim-evals reads raw uint8 images (normalize=False)")
    return env.scene[sensor_cfg.name].data.output[data_type]


def image_rgb(env, sensor_cfg):
    """3.0's ``mdp.image_rgb``."""
    return env.scene[sensor_cfg.name].data.output["rgb"]


def time_out(env):
    """``episode_length_buf >= max_episode_length``, as Isaac Lab's ``mdp.time_out``."""
    return env.episode_length_buf >= env.max_episode_length


def reset_scene_to_default(env, env_ids):
    """Every asset back to its default state (positions from the config, joints at home)."""
    env.scene.reset_to_default(env_ids)
