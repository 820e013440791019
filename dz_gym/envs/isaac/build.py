"""Building sim-evals' env config for one task in whichever sim-evals layout is installed.

Called after the app launched (sim-evals imports ``pxr``/``omni``), before ``gym.make``:

- ``run_eval`` layout: ``parse_env_cfg("DROID")`` then ``cfg.set_scene(k)``; the scene's rigid bodies are
  entities already;
- ``per_scene`` layout: ``parse_env_cfg("DROID-CubeInBowl")`` (its factory called ``set_scene``); the
  object and the container are plain prims, so :func:`register_prim_entities` registers each as a
  ``RigidObjectCfg`` on its prim, with the prim's pose in the scene USD as its initial state (as sim-evals'
  own ``run_eval.py``-era ``set_scene`` and its MILA ``_register_rigid_body`` do): their
  ``data.root_pos_w`` are then the prims' world poses, batched over envs, read from the physics;
- MILA tasks: ``import sim_evals.environments.mila``, ``parse_env_cfg("DROID-MILA")``,
  ``cfg.set_task(task_id)`` (which registers the object and the target under their aliases); the
  milestones sim-evals computes (``env._mila_milestones_reached``) are read by a reward term appended
  after sim-evals' ``milestones`` term (:class:`MilestoneProbe`): reward terms run after the termination
  terms and before the in-step reset, so the flags of an episode's last step are seen.
"""

from __future__ import annotations

import importlib
from typing import Any

import numpy as np

from dz_gym.envs.isaac.compat import IsaacLabApi
from dz_gym.envs.isaac.tasks import confirm_layout
from dz_gym.envs.scenes import MILA_GYM_ID, IsaacTask
from dz_gym.preprocess import to_numpy

ENV_NS = "{ENV_REGEX_NS}"
MILESTONE_PROBE_TERM = "dz_gym_milestone_probe"


def parse_task_cfg(
    api: IsaacLabApi, task: IsaacTask, layout: str, *, device: str, num_envs: int
) -> tuple[Any, list[str], str]:
    """The parsed, task-composed sim-evals config of ``task``; returns it, what was done, and the layout it was
    built in: ``layout`` as read from the source before launch, confirmed by the running sim-evals
    (:func:`~dz_gym.envs.isaac.tasks.confirm_layout`)."""
    gym = importlib.import_module("gymnasium")
    if task.is_mila:
        importlib.import_module("sim_evals.environments.mila")  # registers DROID-MILA on import
        cfg = api.parse_env_cfg(MILA_GYM_ID, device=device, num_envs=num_envs)
        cfg.set_task(task.mila_task)
        return cfg, [f"sim-evals MILA task {task.mila_task} ({MILA_GYM_ID}.set_task)"], layout
    layout = confirm_layout(layout, task, gym.registry)
    prims = {task.object_name: task.object_prim, task.container_name: task.container_prim}
    if layout == "per_scene":
        cfg = api.parse_env_cfg(task.gym_id, device=device, num_envs=num_envs)
        names = register_prim_entities(cfg, api, prims)
        return (
            cfg,
            [f"sim-evals scene {task.gym_id}; prims {', '.join(names) or 'none'} registered as rigid objects"],
            layout,
        )
    cfg = api.parse_env_cfg("DROID", device=device, num_envs=num_envs)
    layout = confirm_layout(layout, task, gym.registry, getattr(cfg, "set_scene", None))
    if layout == "droid_by_id":  # set_scene(env_id: str), no objects registered (fea59e52)
        cfg.set_scene(task.gym_id)
        names = register_prim_entities(cfg, api, prims)
        return (
            cfg,
            [f"sim-evals DROID.set_scene({task.gym_id!r}); prims {', '.join(names) or 'none'} registered"],
            layout,
        )
    cfg.set_scene(task.scene)
    return cfg, [f"sim-evals scene {task.scene} (DROID.set_scene)"], layout


def register_prim_entities(cfg: Any, api: IsaacLabApi, prims: dict[str, str]) -> list[str]:
    """Register each ``alias -> prim path under the scene`` as a rigid object, posed as in the scene USD."""
    usd_path = getattr(cfg, "scene_asset_path", None) or cfg.scene.scene.spawn.usd_path
    pxr = importlib.import_module("pxr")
    assets = importlib.import_module("isaaclab.assets")
    stage = pxr.Usd.Stage.Open(str(usd_path))
    if stage is None:
        raise FileNotFoundError(f"sim-evals scene USD: cannot open {usd_path}")
    done = []
    for alias, relative in prims.items():
        if getattr(getattr(cfg.scene, alias, None), "prim_path", None):
            continue  # this sim-evals registered it already
        prim = stage.GetPrimAtPath(f"/World/{relative}")
        if not prim or not pxr.UsdPhysics.RigidBodyAPI(prim):
            raise KeyError(f"scene prim /World/{relative} ({alias}): not a rigid body of {usd_path}")
        transform = pxr.UsdGeom.Xformable(prim).ComputeLocalToWorldTransform(pxr.Usd.TimeCode.Default())
        wxyz = _unit_rotation(transform)
        entity = assets.RigidObjectCfg(prim_path=f"{ENV_NS}/scene/{relative}", spawn=None)
        entity.init_state.pos = tuple(float(v) for v in transform.ExtractTranslation())
        entity.init_state.rot = api.quat_from_wxyz(wxyz)
        setattr(cfg.scene, alias, entity)
        done.append(f"{alias}={relative}")
    return done


def _unit_rotation(transform: Any) -> tuple[float, float, float, float]:
    """The rotation of a world transform as a unit w-x-y-z quaternion.

    ``ExtractRotationQuat`` reads the upper 3x3 block as it is: under a non-unit ``xformOp:scale`` (sim-evals'
    scene USDs have them) that gives a wrong, non-unit quaternion, which Isaac Lab would write back at every
    reset. The scale and shear are taken out first (``RemoveScaleShear``), then the result is normalised.
    """
    quat = transform.RemoveScaleShear().ExtractRotationQuat()
    wxyz = np.array([quat.GetReal(), *tuple(quat.GetImaginary())], dtype=np.float64)
    norm = float(np.linalg.norm(wxyz))
    if not norm > 0:
        raise ValueError("scene prim: its transform has no rotation (a zero scale?)")
    return tuple(float(v) for v in wxyz / norm)


class MilestoneProbe:
    """A reward term (weight 1, value 0) that copies sim-evals' MILA milestone flags to the host each step."""

    def __init__(self, names: tuple[str, ...]):
        self.names = tuple(names)
        self.latest: np.ndarray | None = None  # (N, M) bool, the flags after the last step's reward terms

        def term(env):
            flags = getattr(env, "_mila_milestones_reached", None)
            self.latest = None if flags is None else _host_bool(flags)
            import torch

            return torch.zeros(env.num_envs, device=env.device)

        self.term = term

    def install(self, cfg: Any) -> str:
        managers = importlib.import_module("isaaclab.managers")
        setattr(cfg.rewards, MILESTONE_PROBE_TERM, managers.RewardTermCfg(func=self.term, weight=1.0))
        return f"rewards.{MILESTONE_PROBE_TERM}: copies sim-evals' milestone flags (value 0)"

    def read(self, env: Any) -> np.ndarray | None:
        """The flags now (after a reset, where no reward term ran)."""
        flags = getattr(env, "_mila_milestones_reached", None)
        return None if flags is None else _host_bool(flags)


def _host_bool(tensor) -> np.ndarray:
    """Milestone flags as a host bool array (a copy; a wrapper with a ``.torch`` view is unwrapped)."""
    return to_numpy(getattr(tensor, "torch", tensor)).astype(bool)


class InitialConditions:
    """sim-evals' ``reset_initial_conditions`` event term, dealt by episode seed instead of round-robin.

    Upstream deals the next pose sets of its ``initial_conditions.json`` to the envs being reset, in reset
    order, so which initial condition an episode gets depends on ``num_envs`` and on the double reset at
    start-up. Before every reset dz-gym gives the term, for the envs ``ids`` (ascending, as Isaac Lab
    passes them) with the next episodes' seeds, the list ``[poses[seed % L] for seed in seeds]`` and
    ``current_index = 0``; after the reset its own list and counter are restored. Episode ``k`` (seed
    ``seed + k``) thus starts from pose set ``(seed + k) % L`` whatever ``num_envs``.

    Isaac Lab may instantiate class terms only on their first use; until then (the first of the two
    start-up resets, which the second one overrides) the term deals as upstream does.
    """

    TERM_NAME = "reset_initial_conditions"

    def __init__(self, manager: Any, name: str):
        self.manager = manager
        self.name = name
        self._saved: tuple[Any, Any, int] | None = None  # (term, its list, its counter)

    @classmethod
    def find(cls, env: Any) -> InitialConditions | None:
        """sim-evals' term in ``env``'s event manager (by name, or by its ``initial_conditions`` list)."""
        manager = getattr(env, "event_manager", None)
        try:
            names = list(manager.active_terms.get("reset", []))
        except AttributeError:
            return None
        for name in names:
            func = getattr(manager.get_term_cfg(name), "func", None)
            if name == cls.TERM_NAME or (hasattr(func, "initial_conditions") and hasattr(func, "current_index")):
                return cls(manager, name)
        return None

    @property
    def term(self) -> Any:
        """The term instance, or None while Isaac Lab has not instantiated the class yet."""
        func = getattr(self.manager.get_term_cfg(self.name), "func", None)
        return func if hasattr(func, "initial_conditions") and hasattr(func, "current_index") else None

    def deal(self, seeds) -> None:
        """The envs about to reset (ascending ids) get the pose sets of their episodes' ``seeds``."""
        term = self.term if self._saved is None else self._saved[0]
        if term is None:
            return
        poses = term.initial_conditions if self._saved is None else self._saved[1]
        if not poses:
            return
        if self._saved is None:
            self._saved = (term, term.initial_conditions, term.current_index)
        term.initial_conditions = [poses[int(seed) % len(poses)] for seed in np.asarray(seeds).reshape(-1)]
        term.current_index = 0

    def restore(self) -> None:
        if self._saved is not None:
            term, term.initial_conditions, term.current_index = self._saved[0], self._saved[1], self._saved[2]
            self._saved = None
