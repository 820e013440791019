"""Which sim-evals layout is installed (the task table itself is :mod:`dz_gym.envs.scenes`).

Two layouts of sim-evals exist (:func:`detect_layout`, read from the checkout's files before launch):

- ``"run_eval"`` (up to 3a6b0e8): one gym id ``DROID``; ``cfg.set_scene(k)`` with ``k`` in 1..3 registers
  the scene's rigid bodies as entities;
- ``"per_scene"`` (711ff04 and later): one gym id per scene (``DROID-CubeInBowl`` ...) whose config
  factory already called ``set_scene(env_id)``; the objects are plain prims of the scene USD. With
  ``environments/mila/`` it also has the MILA tasks under ``DROID-MILA`` (``cfg.set_task(task_id)``).
"""

from __future__ import annotations

from pathlib import Path

LAYOUTS = ("run_eval", "per_scene")


def detect_layout(package_dir: Path) -> tuple[str, bool]:
    """``(layout, has_mila)`` of the sim-evals package at ``package_dir`` (``.../src/sim_evals``), from its
    files (nothing is imported: sim-evals can only be imported once the app runs)."""
    environments = Path(package_dir) / "environments"
    per_scene = (environments / "droid").is_dir()
    has_mila = (environments / "mila").is_dir()
    return ("per_scene" if per_scene else "run_eval"), has_mila
