"""Batched DROID environments: the shared contract (droid), the interface (base), the scene registry (scenes)
and the backends (their traits: backends)."""

from __future__ import annotations

from typing import Any


def make_droid_env(backend: str = "mujoco", scene: int = 1, num_envs: int = 1, **kwargs: Any):
    """Create a batched DROID env on ``backend`` ("mujoco", "isaac" or "auto").

    "auto" picks Isaac Lab when it is importable, else the embedded MuJoCo simulator.
    Extra keyword arguments go to the backend (e.g. ``seed``, ``image_shape``, ``device``).
    """
    from dz_gym.envs import backends

    return backends.traits(backends.resolve(backend)).make_env(scene, num_envs, **kwargs)


def resolve_backend(backend: str) -> str:
    """Resolve "auto" to "isaac" when Isaac Lab is importable, else "mujoco" (see :mod:`dz_gym.envs.backends`)."""
    from dz_gym.envs import backends

    return backends.resolve(backend)
