"""The Isaac Lab backend: sim-evals' DROID scenes, batched over N envs, without forking sim-evals.

- :mod:`~dz_gym.envs.isaac.checks`: packages, scene assets and an RTX GPU, checked before launch;
- :mod:`~dz_gym.envs.isaac.launch`: starts Isaac Sim once per process (2.2 ``AppLauncher``, 3.0
  ``launch_simulation``) and adds Isaac Lab's launcher flags to a command line;
- :mod:`~dz_gym.envs.isaac.compat`: every Isaac Lab 2.2 vs 3.0 difference the backend touches;
- :mod:`~dz_gym.envs.isaac.config`: the multi-env patches to sim-evals' config;
- :mod:`~dz_gym.envs.isaac.state`: the task state (object, container, gripper) for the success check;
- :mod:`~dz_gym.envs.isaac.env`: :class:`IsaacDroidEnv`, the batched env itself.

Importing this package imports neither Isaac Lab nor sim-evals.
"""

from __future__ import annotations

from typing import Any

from dz_gym.envs.isaac.launch import add_launcher_args

__all__ = ["add_launcher_args", "make_env"]


def make_env(scene: int = 1, num_envs: int = 1, **kwargs: Any):
    """Create an :class:`~dz_gym.envs.isaac.env.IsaacDroidEnv` (keyword arguments are documented there)."""
    from dz_gym.envs.isaac.env import IsaacDroidEnv

    return IsaacDroidEnv(scene=scene, num_envs=num_envs, **kwargs)
