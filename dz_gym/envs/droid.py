"""The DROID evaluation contract shared by every backend, the wrapper and the evaluator.

One place for the facts that must agree everywhere: observation keys and shapes, the 8-D action, the
control rate and episode length, the per-scene prompts and entities, the mapping from camera names to
request keys, and the success semantics. Backends (embedded MuJoCo, Isaac Lab) produce exactly this
contract; nothing here does I/O or imports a simulator.

Success semantics (same for every backend): the object counts as placed in the container when
  - its centre is within ``xy_radius`` of the container's centre horizontally,
  - its centre height above the container's origin lies in ``[z_min, z_max]``,
  - it is at rest (linear speed below ``max_speed``), and
  - it is released: the gripper's tool centre point is at least ``release_distance`` away from the object
    centre (an object still held in a closed gripper above the bowl does not count).
"At end" is this check on the final state of an episode; "at any step" is its logical OR over the steps.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dz_gym.protocol import messages as protocol_messages

CONTROL_HZ = 15
STEP_DT = 1.0 / CONTROL_HZ
EPISODE_SECONDS = 30.0
MAX_EPISODE_LENGTH = 450  # ceil(30 s / (8 / 120 s)), as in sim-evals
ARM_DOF = 7
ACTION_DIM = 8  # 7 absolute joint-position targets (rad) + gripper command (> 0.5 closes)
ACTION_HORIZON = 24  # rows in a DreamZero chunk
DEFAULT_OPEN_LOOP_HORIZON = 8
GRIPPER_CLOSE_THRESHOLD = 0.5

# DROID home pose (rad): the sim-evals initial pose and the embedded robot's keyframe.
HOME_JOINT_POSITIONS = (0.0, -0.2 * np.pi, 0.0, -0.8 * np.pi, 0.0, 0.6 * np.pi, 0.0)

# Observation group and terms (obs["policy"][term]). The request keys of the wire protocol are the
# REQUEST_* names below (``dz_gym.protocol.JOINT_KEY`` is the request's joint key, a different string).
POLICY_GROUP = "policy"
CAMERA_KEYS = ("external_cam", "external_cam_2", "wrist_cam")
OBS_JOINT_KEY = "arm_joint_pos"
OBS_GRIPPER_KEY = "gripper_pos"
ISAAC_IMAGE_SHAPE = (720, 1280)
DEFAULT_EMBEDDED_IMAGE_SHAPE = (180, 320)

# Request keys of the DreamZero protocol, per camera (the reference client's mapping).
REQUEST_IMAGE_KEYS = {
    "external_cam": "observation/exterior_image_0_left",
    "external_cam_2": "observation/exterior_image_1_left",
    "wrist_cam": "observation/wrist_image_left",
}
REQUEST_JOINT_KEY = protocol_messages.JOINT_KEY
REQUEST_CARTESIAN_KEY = protocol_messages.CARTESIAN_KEY
REQUEST_GRIPPER_KEY = protocol_messages.GRIPPER_KEY

# Video strip order, as in the reference client: right external | wrist | left external.
VIDEO_STRIP_KEYS = ("external_cam", "wrist_cam", "external_cam_2")


@dataclass(frozen=True)
class SuccessCriteria:
    """Geometric thresholds of the placement check (metres, metres per second)."""

    xy_radius: float
    z_min: float
    z_max: float
    max_speed: float = 0.05
    release_distance: float = 0.06


@dataclass(frozen=True)
class MilestoneCriteria:
    """Thresholds of the task milestones (metres), as in sim-evals' MILA tasks (see ``dz_gym.envs.episodes``).

    ``reach_distance``: tool centre point to the object's box; ``lift_height``: object centre above its
    height at the episode's start; ``above_height``: object centre above the container's origin, within
    the success check's ``xy_radius`` of the container's centre.
    """

    reach_distance: float = 0.03
    lift_height: float = 0.05
    above_height: float = 0.08


@dataclass(frozen=True)
class SceneSpec:
    """One DROID scene: its prompt, the object to move and the container, in both backends' names."""

    scene_id: int
    prompt: str
    object_name: str
    container_name: str
    isaac_object: str
    isaac_container: str
    success: SuccessCriteria
    milestones: MilestoneCriteria = MilestoneCriteria()


# Container sizes follow the sim-evals assets (YCB bowl ~16 cm wide, YCB mug ~8 cm, a ~30 cm bin);
# the embedded scenes build containers of the same size so one set of thresholds serves both.
SCENES: dict[int, SceneSpec] = {
    1: SceneSpec(
        1,
        "put the cube in the bowl",
        "cube",
        "bowl",
        "rubiks_cube",
        "_24_bowl",
        SuccessCriteria(xy_radius=0.07, z_min=-0.02, z_max=0.08),
    ),
    2: SceneSpec(
        2,
        "pick up the can and put it in the mug",
        "can",
        "mug",
        "_10_potted_meat_can",
        "_25_mug",
        SuccessCriteria(xy_radius=0.05, z_min=-0.02, z_max=0.12),
    ),
    3: SceneSpec(
        3,
        "put the banana in the bin",
        "banana",
        "bin",
        "_11_banana",
        "Magenta_Box",
        SuccessCriteria(xy_radius=0.13, z_min=-0.02, z_max=0.12),
    ),
}


def scene_spec(scene: int) -> SceneSpec:
    """The spec of ``scene``; a clear error for an unknown id.

    >>> scene_spec(2).prompt
    'pick up the can and put it in the mug'
    """
    try:
        return SCENES[int(scene)]
    except (KeyError, TypeError, ValueError):
        raise ValueError(f"scene: expected one of {sorted(SCENES)}, got {scene!r}") from None


def placement_success(
    criteria: SuccessCriteria,
    object_pos: np.ndarray,
    container_pos: np.ndarray,
    object_speed: np.ndarray,
    tcp_pos: np.ndarray,
) -> np.ndarray:
    """Batched success check, ``(N,)`` bool, from env-local positions ``(N,3)`` and speeds ``(N,)``.

    >>> bowl = np.zeros((2, 3))
    >>> cube = np.array([[0.01, 0.0, 0.03], [0.01, 0.0, 0.03]])
    >>> tcp = np.array([[0.0, 0.0, 0.3], [0.01, 0.0, 0.04]])  # the second still holds the cube
    >>> placement_success(scene_spec(1).success, cube, bowl, np.zeros(2), tcp).tolist()
    [True, False]
    """
    object_pos = np.asarray(object_pos, dtype=np.float64).reshape(-1, 3)
    container_pos = np.asarray(container_pos, dtype=np.float64).reshape(-1, 3)
    tcp_pos = np.asarray(tcp_pos, dtype=np.float64).reshape(-1, 3)
    object_speed = np.asarray(object_speed, dtype=np.float64).reshape(-1)
    delta = object_pos - container_pos
    inside_xy = np.hypot(delta[:, 0], delta[:, 1]) <= criteria.xy_radius
    inside_z = (delta[:, 2] >= criteria.z_min) & (delta[:, 2] <= criteria.z_max)
    resting = object_speed <= criteria.max_speed
    released = np.linalg.norm(tcp_pos - object_pos, axis=1) >= criteria.release_distance
    return inside_xy & inside_z & resting & released
