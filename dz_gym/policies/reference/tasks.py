"""What the reference policy knows about each embedded scene, selected by the request's prompt.

The policy is told nothing but the prompt; from it, this table gives the colours to look for, how to
grasp the object, and how high the container's rim is. Heights are in the env-local world frame of the
embedded simulator (table top at z = 0), distances in metres.
"""

from __future__ import annotations

from dataclasses import dataclass

from dz_gym.envs import droid


@dataclass(frozen=True)
class TaskSpec:
    """How to find, grasp and place one scene's object.

    - ``object_colour`` / ``container_colour``: colour classes of :mod:`segmentation`.
    - ``container_opening``: morphological opening (pixels) applied to the container mask, to drop thin
      parts (the mug's handle) that would pull its centroid off the axis.
    - ``grasp_dz``: TCP height above the estimated object centre when closing.
    - ``yaw_mode``: how to turn the gripper for the grasp: ``"square"`` (align with a box's sides),
      ``"axis"`` (close across the object's long axis) or ``"round"`` (keep the current yaw unless the
      object looks elongated, e.g. a can lying on its side).
    - ``rest_height``: height of the object's centre when it rests upright on the table.
    - ``top_above_centre``: its top face above its centre (the plane the wrist view is projected on).
    - ``held_below_tcp``: how far the object's lowest point hangs below the TCP once grasped.
    - ``rim_height``: height of the container's rim; the object is released ``release_clearance`` above it.
    - ``place_radius``: the object counts as placed when its centre is this close (xy) to the container's.
    """

    scene_id: int
    prompt: str
    object_colour: str
    container_colour: str
    container_opening: int
    grasp_dz: float
    yaw_mode: str
    rest_height: float
    top_above_centre: float
    held_below_tcp: float
    rim_height: float
    release_clearance: float
    place_radius: float

    @property
    def release_height(self) -> float:
        """TCP height at which the gripper opens over the container."""
        return self.rim_height + self.held_below_tcp + self.release_clearance


TASKS: dict[int, TaskSpec] = {
    1: TaskSpec(
        1,
        droid.SCENES[1].prompt,
        "red",
        "green",
        0,
        grasp_dz=0.0,
        yaw_mode="square",
        rest_height=0.025,
        top_above_centre=0.025,
        held_below_tcp=0.025,
        rim_height=0.055,
        release_clearance=0.03,
        place_radius=droid.SCENES[1].success.xy_radius * 0.8,
    ),  # fmt: skip
    2: TaskSpec(
        2,
        droid.SCENES[2].prompt,
        "magenta",
        "cyan",
        4,
        grasp_dz=0.012,
        yaw_mode="round",
        rest_height=0.04,
        top_above_centre=0.04,
        held_below_tcp=0.052,
        rim_height=0.095,
        release_clearance=0.015,
        place_radius=droid.SCENES[2].success.xy_radius * 0.8,
    ),  # fmt: skip
    3: TaskSpec(
        3,
        droid.SCENES[3].prompt,
        "yellow",
        "blue",
        0,
        grasp_dz=0.0,
        yaw_mode="axis",
        rest_height=0.018,
        top_above_centre=0.012,
        held_below_tcp=0.02,
        rim_height=0.08,
        release_clearance=0.04,
        place_radius=droid.SCENES[3].success.xy_radius * 0.8,
    ),  # fmt: skip
}


def _normalise(prompt: str) -> str:
    return " ".join(prompt.lower().strip().rstrip(".").split())


_BY_PROMPT = {_normalise(task.prompt): task for task in TASKS.values()}


def task_for_prompt(prompt: object) -> TaskSpec:
    """The task of a request's ``prompt`` (case, surrounding spaces and a final period are ignored)."""
    if not isinstance(prompt, str):
        raise ValueError(f"prompt: expected a string, got {type(prompt).__name__}")
    try:
        return _BY_PROMPT[_normalise(prompt)]
    except KeyError:
        known = "; ".join(repr(task.prompt) for task in TASKS.values())
        raise ValueError(f"prompt: expected one of the embedded scenes' prompts ({known}), got {prompt!r}") from None
