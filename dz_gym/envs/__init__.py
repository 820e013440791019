"""Batched DROID environments: the shared contract (droid), the interface (base) and the backends."""

from __future__ import annotations

from typing import Any


def make_droid_env(backend: str = "mujoco", scene: int = 1, num_envs: int = 1, **kwargs: Any):
    """Create a batched DROID env on ``backend`` ("mujoco", "isaac" or "auto").

    "auto" picks Isaac Lab when it is importable, else the embedded MuJoCo simulator.
    Extra keyword arguments go to the backend (e.g. ``seed``, ``image_shape``, ``device``).
    """
    if backend == "auto":
        backend = resolve_backend("auto")
    if backend == "mujoco":
        from dz_gym.envs.mujoco import make_env

        return make_env(scene=scene, num_envs=num_envs, **kwargs)
    if backend == "isaac":
        from dz_gym.envs.isaac import make_env

        return make_env(scene=scene, num_envs=num_envs, **kwargs)
    raise ValueError(f"backend: expected 'mujoco', 'isaac' or 'auto', got {backend!r}")


def resolve_backend(backend: str) -> str:
    """Resolve "auto" to "isaac" when Isaac Lab is importable, else "mujoco"."""
    if backend != "auto":
        return backend
    import importlib.util

    return "isaac" if importlib.util.find_spec("isaaclab") is not None else "mujoco"
