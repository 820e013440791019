"""Collection rules for ``pytest --doctest-modules dz_gym`` (the tests under tests/ need none).

Every module of the package is imported to collect its examples, and every module imports without the
optional extras except the few below, which import an optional package at module level because it is
their whole job. Each is left out only where its package is missing, so the run with the test extras
installed (scripts/setup.sh --test) still imports all of them:

- ``dz_gym/rl/rsl_rl_env.py``: rsl_rl's ``VecEnv`` (the ``rl`` extra: rsl-rl-lib, torch, tensordict);
- ``dz_gym/envs/isaac_droid3/env_cfg.py`` and ``mdp.py``: the kit-less DROID task's Isaac Lab 3.0 config and
  terms (``isaaclab_newton`` is 3.0's only; an Isaac Lab 2.2 wheel alone cannot import them).

The Isaac Lab and sim-evals stand-ins are test code (``tests/isaac_stubs/``, ``tests/isaac_kit.py``), not part
of the package, so this collection never sees them.
"""

from __future__ import annotations

import importlib.util

OPTIONAL_MODULES = {
    "dz_gym/rl/rsl_rl_env.py": ("torch", "rsl_rl", "tensordict"),
    "dz_gym/envs/isaac_droid3/env_cfg.py": ("isaaclab", "isaaclab_newton"),
    "dz_gym/envs/isaac_droid3/mdp.py": ("isaaclab", "isaaclab_newton"),
}


def _missing(packages: tuple[str, ...]) -> bool:
    return any(importlib.util.find_spec(name) is None for name in packages)


collect_ignore = [path for path, packages in OPTIONAL_MODULES.items() if _missing(packages)]
