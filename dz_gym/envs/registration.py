"""The Gymnasium ids of every backend's scenes, registered by ``import dz_gym``.

=====================================  =========================================================================
``dz_gym/DROID-CubeInBowl-v0``         the embedded MuJoCo simulator's scenes 1, 2 and 3
``dz_gym/DROID-CanInMug-v0``
``dz_gym/DROID-BananaInBin-v0``
``DZ-DROID-CubeInBowl-Newton-v0`` ...  the Isaac Lab 3.0 kit-less scenes (:mod:`dz_gym.envs.isaac_droid3`, ids
                                       as Isaac Lab users know them)
``dz_gym/Isaac-DROID-CubeInBowl-v0``   sim-evals' tasks on Isaac Lab (DROID scenes and MILA tasks), where
``dz_gym/Isaac-<mila task>-v0``        sim-evals is installed
=====================================  =========================================================================

``gym.make_vec(id, num_envs=N)`` returns the backend's batched env, a ``gymnasium.vector.VectorEnv``
(:class:`~dz_gym.envs.base.BatchedDroidEnv`, through each id's ``vector_entry_point``); ``gym.make(id)`` one
env (:class:`~dz_gym.envs.single.DroidEnv`), which ends and waits for ``reset`` as Gymnasium's single envs do,
so ``gym.make_vec(id, num_envs=N, vectorization_mode="sync")`` runs N of them in Gymnasium's
``SyncVectorEnv``. Keyword arguments go to the backend (``seed``, ``image_shape``, ``max_episode_length``,
...). The ``dz_gym/`` ids' ``spec.max_episode_steps`` is 450 (DROID's 30 s at 15 Hz): ``gym.make`` puts
Gymnasium's ``TimeLimit`` at that many steps, and ``gym.make_vec``'s ``max_episode_steps`` becomes the
batched env's ``max_episode_length`` unless ``max_episode_length`` is given. The Isaac Lab ids import nothing
of Isaac Lab until an env is made; for the kit-less ids ``gym.make(id, cfg=...)`` stays Isaac Lab's own
``ManagerBasedRLEnv`` (a batched env, so their specs set no ``max_episode_steps``: ``gym.make`` would put a
single env's ``TimeLimit`` around it). Every spec is JSON-able (``spec.to_json()``): the entry points are
``module:function`` strings.

>>> import gymnasium as gym
>>> register_envs()
>>> spec = gym.spec("dz_gym/DROID-CubeInBowl-v0")
>>> spec.kwargs, spec.vector_entry_point, spec.max_episode_steps
({'backend': 'mujoco', 'scene': 1}, 'dz_gym.envs.registration:make_vector', 450)
>>> gym.spec("DZ-DROID-CubeInBowl-Newton-v0").vector_entry_point
'dz_gym.envs.registration:make_kitless_vector'
"""

from __future__ import annotations

import importlib.util
from typing import Any

import gymnasium as gym

NAMESPACE = "dz_gym"
EMBEDDED_IDS = {
    1: "dz_gym/DROID-CubeInBowl-v0",
    2: "dz_gym/DROID-CanInMug-v0",
    3: "dz_gym/DROID-BananaInBin-v0",
}
SINGLE_ENTRY_POINT = "dz_gym.envs.single:DroidEnv"
VECTOR_ENTRY_POINT = "dz_gym.envs.registration:make_vector"
# droid.MAX_EPISODE_LENGTH (tests/test_gym_contract.py checks they agree), here so that ``import dz_gym``
# imports nothing of the protocol
MAX_EPISODE_STEPS = 450
KITLESS_VECTOR_ENTRY_POINT = "dz_gym.envs.registration:make_kitless_vector"


def make_vector(num_envs: int = 1, *, backend: str = "mujoco", scene: int | str = 1, **kwargs: Any):
    """``gym.make_vec``'s entry point: the batched env of ``scene`` on ``backend`` (a ``VectorEnv``).

    ``max_episode_steps`` (which ``make_vec`` passes, the spec's when not given) sets ``max_episode_length``
    unless that is given itself.
    """
    from dz_gym.envs import make_droid_env

    steps = kwargs.pop("max_episode_steps", None)
    if steps is not None:
        kwargs.setdefault("max_episode_length", steps)
    return make_droid_env(backend=backend, scene=scene, num_envs=num_envs, **kwargs)


def make_kitless_vector(num_envs: int = 1, *, env_cfg_entry_point: str, **kwargs: Any):
    """``gym.make_vec``'s entry point of the kit-less ids: their batched env on the isaac backend, the id found
    from the spec's ``env_cfg_entry_point`` (Isaac Lab's config lookup, which ``make_vec`` passes)."""
    from dz_gym.envs import isaac_droid3

    scenes = {entry: scene for scene, entry in isaac_droid3.ENV_CFG_ENTRY_POINTS.items()}
    if env_cfg_entry_point not in scenes:
        raise ValueError(f"env_cfg_entry_point: expected one of {sorted(scenes)}, got {env_cfg_entry_point!r}")
    gym_id = isaac_droid3.GYM_IDS[scenes[env_cfg_entry_point]]
    return make_vector(num_envs, backend="isaac", scene=gym_id, **kwargs)


def _register(gym_id: str, **spec: Any) -> None:
    if gym_id not in gym.registry:
        gym.register(id=gym_id, **spec)


def sim_evals_installed() -> bool:
    """Whether sim-evals can be found (nothing is imported: it imports only once Isaac Sim runs)."""
    try:
        return importlib.util.find_spec("sim_evals") is not None
    except (ImportError, ValueError):
        return False


def register_envs() -> None:
    """Register every id of the table above (idempotent)."""
    from dz_gym.envs import isaac_droid3

    for scene_id, gym_id in EMBEDDED_IDS.items():
        _register(
            gym_id,
            entry_point=SINGLE_ENTRY_POINT,
            vector_entry_point=VECTOR_ENTRY_POINT,
            max_episode_steps=MAX_EPISODE_STEPS,
            kwargs={"backend": "mujoco", "scene": scene_id},
        )
    isaac_droid3.register()
    for gym_id in isaac_droid3.GYM_IDS.values():
        spec = gym.registry[gym_id]
        if spec.vector_entry_point is None:  # Isaac Lab's own entry point for gym.make stays as it is
            spec.vector_entry_point = KITLESS_VECTOR_ENTRY_POINT
    if sim_evals_installed():
        from dz_gym.envs import scenes

        for task in scenes.TASKS.values():
            if not task.kitless:
                _register(
                    f"{NAMESPACE}/Isaac-{task.name}-v0",
                    entry_point=SINGLE_ENTRY_POINT,
                    vector_entry_point=VECTOR_ENTRY_POINT,
                    max_episode_steps=MAX_EPISODE_STEPS,
                    kwargs={"backend": "isaac", "scene": task.name},
                )
