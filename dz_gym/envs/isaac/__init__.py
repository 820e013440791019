"""The Isaac Lab backend: sim-evals' DROID scenes and named tasks (MILA), batched over N envs, without forking
sim-evals.

- :mod:`~dz_gym.envs.isaac.checks`: packages, scene assets and an RTX GPU, checked before launch;
- :mod:`~dz_gym.envs.isaac.launch`: starts Isaac Sim once per process (2.2 ``AppLauncher``, 3.0
  ``launch_simulation``) and adds Isaac Lab's launcher flags to a command line;
- :mod:`~dz_gym.envs.isaac.compat`: version detection (wheel and source installs) and every Isaac Lab 2.2 vs
  3.0 (release and develop) difference the backend touches;
- :mod:`~dz_gym.envs.isaac.tasks`: which sim-evals layout is installed (the named tasks are
  :mod:`dz_gym.envs.scenes`);
- :mod:`~dz_gym.envs.isaac.build`: the task's config in the installed layout, objects from prims, the MILA
  milestone probe and initial conditions by seed;
- :mod:`~dz_gym.envs.isaac.config`: the multi-env patches to sim-evals' config;
- :mod:`~dz_gym.envs.isaac.mila`: MILA milestone checks from the poses when sim-evals lacks its flags;
- :mod:`~dz_gym.envs.isaac.state`: the task state (object, container, gripper) for the success check;
- :mod:`~dz_gym.envs.isaac.env`: :class:`IsaacDroidEnv`, the batched env itself.

Importing this package imports neither Isaac Lab nor sim-evals.
"""

from __future__ import annotations

from typing import Any

from dz_gym.envs.isaac.launch import add_launcher_args

__all__ = ["add_launcher_args", "make_env"]


def make_env(scene: int | str = 1, num_envs: int = 1, **kwargs: Any):
    """Create an :class:`~dz_gym.envs.isaac.env.IsaacDroidEnv` for a scene (1-3), a task id (101-103) or a task
    name (``"place_spoon_in_sink"``, ``"DROID-CubeInBowl"`` ...); keyword arguments are documented there."""
    from dz_gym.envs.isaac.env import IsaacDroidEnv

    return IsaacDroidEnv(scene=scene, num_envs=num_envs, **kwargs)
