"""Shared pieces of the Isaac backend's tests: a small env on the stand-in, and a hold action."""

from __future__ import annotations

import torch

import dz_gym

SMALL = (4, 6)  # camera resolution for the tests (the stand-in renders constant colours)


def make(scene=1, num_envs=2, **kwargs):
    """``make_droid_env(backend="isaac")`` on the installed stand-in: CPU, no GPU check, tiny images."""
    kwargs.setdefault("device", "cpu")
    kwargs.setdefault("check_gpu", False)
    kwargs.setdefault("image_shape", SMALL)
    return dz_gym.make_droid_env(backend="isaac", scene=scene, num_envs=num_envs, **kwargs)


def hold(obs):
    """Actions that keep every env's arm where it is and its gripper as it is."""
    policy = obs["policy"]
    return torch.cat([policy["arm_joint_pos"], (policy["gripper_pos"] > 0.5).float()], dim=1)
