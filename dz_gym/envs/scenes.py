"""The scene/task registry: every scene id a run accepts, on any backend.

A run's scenes are the three DROID scenes (ids 1-3, :mod:`dz_gym.envs.droid`) and sim-evals' named tasks:
:data:`TASKS` names every task ``dz-gym-eval --task`` accepts, the DROID scenes under their per-scene gym
ids (keys 1-3, the scene numbers), the MILA tasks (keys 101-103; the key is what run directories and rows
use as the scene number) and dz-gym's own Isaac Lab 3.0 kit-less DROID scenes (keys 201-203, gym ids
``DZ-DROID-*-Newton-v0``, :mod:`dz_gym.envs.isaac_droid3`). :func:`scene_key`, :func:`scene_prompt` and :func:`task_for` serve MuJoCo runs as
well as Isaac ones. The MILA facts (instruction, ``max_timesteps``, milestone names, entity aliases,
thresholds) are sim-evals' ``mila/tasks.py``; at run time the values sim-evals reports
(``cfg.language_instruction``, the env's ``max_episode_length``, its milestone buffer) win over this table,
which serves before launch (CLI defaults) and as the fallback. The gym ids and prim paths are what the Isaac
backend builds (:mod:`dz_gym.envs.isaac.build`); nothing here imports a simulator.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from dz_gym.envs import droid

MILA_GYM_ID = "DROID-MILA"
GENERIC_MILESTONES = ("reached", "lifted", "above_target", "placed")
MILA_KEY_BASE = 100
NEWTON_KEY_BASE = 200  # dz-gym's Isaac Lab 3.0 kit-less DROID scenes: keys 201-203


@dataclass(frozen=True)
class MilaThresholds:
    """sim-evals' per-task thresholds (metres), for the fallback check when its buffer is absent."""

    reach_distance: float = 0.03
    lift_height: float = 0.05
    target_xy_radius: float = 0.18
    above_target_height: float = 0.08
    in_target_height: float = 0.05
    release_gripper_threshold: float = 0.5


@dataclass(frozen=True)
class IsaacTask:
    """One named task: what to build, the prompt, the horizon and the names of its objects."""

    name: str
    key: int  # scene number in rows and file names
    prompt: str
    max_steps: int
    gym_id: str  # in the per-scene layout
    object_name: str  # entity alias
    container_name: str
    object_prim: str = ""  # prim path under the env's ``scene`` prim (per-scene layout / MILA)
    container_prim: str = ""
    scene: int | None = None  # the DROID scene number (run_eval layout), None for MILA tasks
    mila_task: str | None = None
    milestones: tuple[str, ...] = GENERIC_MILESTONES  # the task's own names, in order
    thresholds: MilaThresholds = MilaThresholds()
    assets: tuple[str, ...] = ()  # files (or folders) under the assets folder that must exist before launch
    package: str = ""  # a dz-gym Isaac Lab 3.0 task: the module that registers ``gym_id`` (no sim-evals)

    @property
    def is_mila(self) -> bool:
        return self.mila_task is not None

    @property
    def kitless(self) -> bool:
        """A dz-gym task on Isaac Lab 3.0 kit-less (Newton physics, Warp cameras), not a sim-evals one."""
        return bool(self.package)

    def scene_spec(self, prompt: str | None = None) -> droid.SceneSpec:
        """The :class:`~dz_gym.envs.droid.SceneSpec` the env exposes as ``env.scene`` (prompt, names)."""
        base = droid.scene_spec(self.scene if self.scene is not None else 1)
        return dataclasses.replace(
            base,
            scene_id=self.key,
            prompt=prompt or self.prompt,
            object_name=self.object_name if self.is_mila else base.object_name,
            container_name=self.container_name if self.is_mila else base.container_name,
            isaac_object=self.object_name,
            isaac_container=self.container_name,
        )


def _droid(scene: int, gym_id: str, object_prim: str, container_prim: str) -> IsaacTask:
    spec = droid.scene_spec(scene)
    return IsaacTask(
        gym_id,
        scene,
        spec.prompt,
        droid.MAX_EPISODE_LENGTH,
        gym_id,
        spec.isaac_object,
        spec.isaac_container,
        object_prim,
        container_prim,
        scene=scene,
        assets=(f"scene{scene}.usd",),
    )


def _newton(scene: int, gym_id: str) -> IsaacTask:
    """A DROID scene as dz-gym's own Isaac Lab 3.0 kit-less task (:mod:`dz_gym.envs.isaac_droid3`)."""
    spec = droid.scene_spec(scene)
    return IsaacTask(
        gym_id,
        NEWTON_KEY_BASE + scene,
        spec.prompt,
        droid.MAX_EPISODE_LENGTH,
        gym_id,
        "object",
        "container",
        scene=scene,
        package="dz_gym.envs.isaac_droid3",
    )


def _mila(
    key, task_id, prompt, steps, milestones, obj, target, obj_prim, target_prim, scene_usd, **thresholds
) -> IsaacTask:
    return IsaacTask(
        task_id,
        MILA_KEY_BASE + key,
        prompt,
        steps,
        MILA_GYM_ID,
        obj,
        target,
        obj_prim,
        target_prim,
        mila_task=task_id,
        milestones=milestones,
        thresholds=MilaThresholds(**thresholds),
        # the folder only: sim-evals versions place a task's scene differently (Task1/Task2); set_task names
        # the file it cannot open
        assets=("mila",),
    )


TASKS: dict[str, IsaacTask] = {
    task.name: task
    for task in (
        _droid(1, "DROID-CubeInBowl", "rubiks_cube", "_24_bowl"),
        _droid(2, "DROID-CanInMug", "_10_potted_meat_can", "_25_mug"),
        _droid(3, "DROID-BananaInBin", "_11_banana", "Magenta_Box"),
        _newton(1, "DZ-DROID-CubeInBowl-Newton-v0"),
        _newton(2, "DZ-DROID-CanInMug-Newton-v0"),
        _newton(3, "DZ-DROID-BananaInBin-Newton-v0"),
        _mila(
            1,
            "place_spoon_in_sink",
            "Pick up the spoon and place it in the sink.",
            300,
            ("reached_spoon", "lifted_up_spoon", "above_sink", "completely_in_sink"),
            "spoon",
            "sink",
            "Spoon054/Spoon054",
            "Sink081/Sink081",
            "Task2/Scene.usd",
        ),
        _mila(
            2,
            "place_spoon_in_utensil_holder",
            "Pick up the spoon and place it in the utensil holder.",
            400,
            ("reached_spoon", "lifted_up_spoon", "above_utensil_holder", "released_in_utensil_holder"),
            "spoon",
            "utensil_holder",
            "Spoon054/Spoon054",
            "Cup082/Cup082",
            "place_spoon_in_utensil_holder.usd",
            target_xy_radius=0.16,
            above_target_height=0.10,
            in_target_height=0.12,
        ),
        _mila(
            3,
            "stack_red_bowl_into_grey_bowl",
            "Pick up the red bowl and place it in the grey bowl.",
            600,
            ("reached_red_bowl", "lifted_up_red_bowl", "above_grey_bowl", "placed_in_grey_bowl"),
            "red_bowl",
            "grey_bowl",
            "Bowl061/Bowl061",
            "Bowl062/Bowl062",
            "Task1/Scene.usd",
        ),
    )
}
BY_KEY = {task.key: task for task in TASKS.values()}


def task_for(scene_or_name: int | str) -> IsaacTask:
    """The task of a scene number (1-3), a task key (101-103, 201-203) or a task name; a one-line error otherwise."""
    if isinstance(scene_or_name, str) and not scene_or_name.isdigit():
        try:
            return TASKS[scene_or_name]
        except KeyError:
            raise ValueError(f"task: expected one of {', '.join(TASKS)}, got {scene_or_name!r}") from None
    try:
        return BY_KEY[int(scene_or_name)]
    except (KeyError, ValueError):
        raise ValueError(f"scene: expected one of {sorted(BY_KEY)} (or a task name), got {scene_or_name!r}") from None


def scene_key(scene: int | str) -> int:
    """A run's scene id: a DROID scene number (1-3) or a named task's key (101-103, 201-203); a one-line error."""
    if isinstance(scene, bool):
        raise ValueError(f"expected one of {sorted(BY_KEY)}, got {scene!r}")  # noqa: TRY004 (a usage error)
    try:
        key = int(scene)
    except (TypeError, ValueError):
        return task_for(scene).key
    if key in droid.SCENES:
        return droid.scene_spec(key).scene_id
    if key in BY_KEY:
        return key
    raise ValueError(
        f"expected one of {sorted(BY_KEY)} (DROID scenes 1-3, MILA tasks 101-103, kit-less 201-203), got {scene!r}"
    )


def scene_prompt(scene: int) -> str:
    """The prompt of a scene id (the DreamZero client's for scenes 1-3, the task's instruction for 101+)."""
    key = scene_key(scene)
    return droid.scene_spec(key).prompt if key in droid.SCENES else BY_KEY[key].prompt


def tasks_from_names(names) -> list[IsaacTask]:
    """The tasks of ``--task`` values, in order, without repeats; a one-line ``ValueError`` naming the flag."""
    out: list[IsaacTask] = []
    for name in names or ():
        try:
            task = TASKS[str(name)]
        except KeyError:
            raise ValueError(f"--task: expected one of {', '.join(TASKS)}, got {name!r}") from None
        if task not in out:
            out.append(task)
    return out
