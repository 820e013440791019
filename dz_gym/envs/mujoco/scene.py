"""The three DROID-like scenes of the embedded simulator, built with ``MjSpec``, and their randomization.

Every scene is the droid robot (base at the origin, table top at z = 0) plus a table, a floor, lights, the
two fixed external cameras of the sim-evals rig (``cameras.py``), and one object and one container on free
joints:

===== ======================================== ============================ ===============================
scene prompt                                   object                       container
===== ======================================== ============================ ===============================
1     put the cube in the bowl                 red 5 cm cube                green bowl, 16 cm wide, 5.5 cm
2     pick up the can and put it in the mug    magenta can, 4.8 cm x 8 cm   cyan mug, 8 cm wide, 9.5 cm
3     put the banana in the bin                yellow banana, 17 cm arc     blue bin, 30 cm square, 8 cm
===== ======================================== ============================ ===============================

Appearance is part of the contract: each object and container has a saturated, unique colour and the
robot, table and floor are greys and pale wood, so colour thresholding of the images finds only the task
objects. The banana is one rigid body made of overlapping capsules along an arc (a single connected shape).

Randomization (per episode, from the episode seed; see :class:`Randomization`): object and container xy
are uniform within +/- ``object_xy`` / ``container_xy`` (default 10 cm) of their nominal spots, their yaw
uniform within +/- ``object_yaw`` / ``container_yaw`` (default: any yaw), rejecting layouts whose centres
are closer than the scene's minimum separation (footprints never overlap).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import mujoco
import numpy as np

from dz_gym.envs import droid
from dz_gym.envs.episodes import ObjectBox
from dz_gym.envs.mujoco import cameras, robot

# Physics: 33 substeps per 15 Hz control step, so a control step is exactly 1/15 s.
SUBSTEPS = 33
TIMESTEP = droid.STEP_DT / SUBSTEPS

OBJECT_BODY = "object"
CONTAINER_BODY = "container"

# Colours (RGBA). Task objects are saturated and unique; everything else is unsaturated.
COLOURS = {
    "cube": (0.85, 0.08, 0.08, 1.0),
    "bowl": (0.10, 0.72, 0.18, 1.0),
    "can": (0.85, 0.10, 0.75, 1.0),
    "mug": (0.05, 0.75, 0.85, 1.0),
    "banana": (0.95, 0.82, 0.08, 1.0),
    "bin": (0.08, 0.22, 0.85, 1.0),
}
TABLE_RGBA = (0.62, 0.56, 0.49, 1.0)
TABLE_LEG_RGBA = (0.35, 0.33, 0.31, 1.0)
FLOOR_RGBA = (0.40, 0.40, 0.41, 1.0)

# Table: top surface at z = 0, 0.75 m above the floor.
TABLE_HEIGHT = 0.75
TABLE_CENTER_XY = (0.40, 0.0)
TABLE_HALF_XY = (0.55, 0.70)
TABLE_THICKNESS = 0.04


@dataclass(frozen=True)
class SceneLayoutSpec:
    """Nominal placement and footprint of one scene's object and container (metres)."""

    object_nominal: tuple[float, float]
    container_nominal: tuple[float, float]
    object_rest_z: float  # height of the object's body origin when resting on the table
    object_radius: float  # horizontal footprint radius (half the longest extent)
    container_radius: float
    # Where a gripper grasps the object: offset of the grasp centre in the object's body frame.
    grasp_offset: tuple[float, float, float] = (0.0, 0.0, 0.0)


CUBE_HALF = 0.025
CAN_RADIUS, CAN_HALF_HEIGHT = 0.024, 0.04

# Banana: 5 capsules along an arc of radius 11 cm spanning 90 degrees, body x along the chord.
BANANA_ARC_RADIUS = 0.11
BANANA_ARC_HALF_ANGLE = math.pi / 4
BANANA_RADII = (0.013, 0.016, 0.018, 0.016, 0.013)
# Body origin near the arc's centroid (R sin(a)/a), so the body origin is the banana's visual centre.
BANANA_ORIGIN_Y = BANANA_ARC_RADIUS * math.sin(BANANA_ARC_HALF_ANGLE) / BANANA_ARC_HALF_ANGLE
BANANA_MIDDLE_Y = BANANA_ARC_RADIUS * math.cos(BANANA_ARC_HALF_ANGLE / len(BANANA_RADII)) - BANANA_ORIGIN_Y

LAYOUTS: dict[int, SceneLayoutSpec] = {
    1: SceneLayoutSpec((0.52, -0.14), (0.55, 0.16), 0.025, 0.036, 0.08),
    2: SceneLayoutSpec((0.52, -0.14), (0.55, 0.14), 0.040, 0.024, 0.06),
    3: SceneLayoutSpec((0.50, -0.20), (0.58, 0.17), max(BANANA_RADII), 0.09, 0.21, (0.0, BANANA_MIDDLE_Y, 0.0)),
}


@dataclass(frozen=True)
class Randomization:
    """Per-episode placement randomization (metres, radians); every field is a half-range around nominal.

    ``min_separation`` (metres between object and container centres) defaults to the sum of their
    footprint radii plus 3 cm, so they never overlap. Set all ranges to 0 for the nominal layout.
    """

    object_xy: float = 0.10
    container_xy: float = 0.10
    object_yaw: float = math.pi
    container_yaw: float = math.pi
    min_separation: float | None = None

    def __post_init__(self):
        for name in ("object_xy", "container_xy", "object_yaw", "container_yaw"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value >= 0):
                raise ValueError(f"randomization.{name}: expected a finite number >= 0, got {value!r}")
        if self.min_separation is not None and not self.min_separation >= 0:
            raise ValueError(f"randomization.min_separation: expected a number >= 0, got {self.min_separation!r}")


@dataclass(frozen=True)
class Layout:
    """One episode's placement: xy and yaw of the object and the container (env-local, table top z = 0)."""

    object_xy: tuple[float, float]
    object_yaw: float
    container_xy: tuple[float, float]
    container_yaw: float
    extra: dict = field(default_factory=dict, compare=False)


def object_box(scene: int) -> ObjectBox:
    """The bounding box of ``scene``'s object in its body frame (the milestones' reach check)."""
    scene_id = droid.scene_spec(scene).scene_id
    if scene_id == 1:
        return ObjectBox((0.0, 0.0, 0.0), (CUBE_HALF,) * 3)
    if scene_id == 2:
        return ObjectBox((0.0, 0.0, 0.0), (CAN_RADIUS, CAN_RADIUS, CAN_HALF_HEIGHT))
    segments = banana_segments()
    lower = np.min([np.minimum(a, b) - r for a, b, r in segments], axis=0)
    upper = np.max([np.maximum(a, b) + r for a, b, r in segments], axis=0)
    return ObjectBox(tuple(((lower + upper) / 2).tolist()), tuple(((upper - lower) / 2).tolist()))


def min_separation(scene: int, randomization: Randomization) -> float:
    """The minimum centre distance between object and container used when sampling ``scene``."""
    if randomization.min_separation is not None:
        return float(randomization.min_separation)
    spec = LAYOUTS[scene]
    return spec.object_radius + spec.container_radius + 0.03


def sample_layout(scene: int, rng: np.random.Generator, randomization: Randomization, max_tries: int = 200) -> Layout:
    """Draw a layout for ``scene`` with ``rng``; rejection-samples xy until the separation holds."""
    spec = LAYOUTS[droid.scene_spec(scene).scene_id]
    separation = min_separation(scene, randomization)
    object_yaw = float(rng.uniform(-randomization.object_yaw, randomization.object_yaw))
    container_yaw = float(rng.uniform(-randomization.container_yaw, randomization.container_yaw))
    for _ in range(max_tries):
        obj = np.asarray(spec.object_nominal) + rng.uniform(-1, 1, 2) * randomization.object_xy
        con = np.asarray(spec.container_nominal) + rng.uniform(-1, 1, 2) * randomization.container_xy
        if np.linalg.norm(obj - con) >= separation:
            return Layout(tuple(obj.tolist()), object_yaw, tuple(con.tolist()), container_yaw)
    raise ValueError(
        f"randomization: no layout with object-container separation >= {separation:.3f} m found in "
        f"{max_tries} draws; reduce min_separation or the xy ranges"
    )


def yaw_quat(yaw: float) -> np.ndarray:
    """Quaternion (w, x, y, z) of a rotation by ``yaw`` about +z."""
    return np.array([math.cos(yaw / 2), 0.0, 0.0, math.sin(yaw / 2)])


def _add_table_and_floor(spec: mujoco.MjSpec) -> None:
    # A plain, infinite floor: no texture or skybox to fill (software rendering pays per pixel), and
    # a uniform grey that colour thresholding ignores.
    world = spec.worldbody
    world.add_geom(
        name="floor",
        type=mujoco.mjtGeom.mjGEOM_PLANE,
        size=(0.0, 0.0, 0.05),
        pos=(0.0, 0.0, -TABLE_HEIGHT),
        rgba=FLOOR_RGBA,
    )
    cx, cy = TABLE_CENTER_XY
    hx, hy = TABLE_HALF_XY
    world.add_geom(
        name="table_top", type=mujoco.mjtGeom.mjGEOM_BOX, size=(hx, hy, TABLE_THICKNESS / 2),
        pos=(cx, cy, -TABLE_THICKNESS / 2), rgba=TABLE_RGBA,
    )  # fmt: skip
    leg_half = (TABLE_HEIGHT - TABLE_THICKNESS) / 2
    for sx in (-1, 1):
        for sy in (-1, 1):
            world.add_geom(
                type=mujoco.mjtGeom.mjGEOM_BOX, size=(0.03, 0.03, leg_half), rgba=TABLE_LEG_RGBA,
                pos=(cx + sx * (hx - 0.06), cy + sy * (hy - 0.06), -TABLE_THICKNESS - leg_half),
                contype=0, conaffinity=0,
            )  # fmt: skip


def _add_lights(spec: mujoco.MjSpec) -> None:
    spec.visual.headlight.ambient = (0.35, 0.35, 0.35)
    spec.visual.headlight.diffuse = (0.45, 0.45, 0.45)
    spec.visual.headlight.specular = (0.1, 0.1, 0.1)
    spec.worldbody.add_light(
        name="top", type=mujoco.mjtLightType.mjLIGHT_DIRECTIONAL, pos=(0.4, 0.0, 2.0), dir=(0.0, 0.0, -1.0),
        diffuse=(0.45, 0.45, 0.45), specular=(0.1, 0.1, 0.1), castshadow=False,
    )  # fmt: skip


def _free_body(spec: mujoco.MjSpec, name: str, z: float) -> mujoco.MjsBody:
    body = spec.worldbody.add_body(name=name, pos=(0.0, 0.0, z))
    body.add_freejoint(name=f"{name}_free")
    return body


def _add_ring(body, n: int, radius_bottom: float, radius_top: float, z_bottom: float, z_top: float,
              thickness: float, rgba, mass: float) -> None:  # fmt: skip
    """A ring of ``n`` boxes forming a (possibly flared) wall between two radii and heights."""
    dr, dz = radius_top - radius_bottom, z_top - z_bottom
    length = math.hypot(dr, dz)
    tilt = math.atan2(dr, dz)  # outward lean from vertical
    r_mid, z_mid = (radius_bottom + radius_top) / 2, (z_bottom + z_top) / 2
    half_width = math.pi * (r_mid + thickness / 2) / n * 1.08  # slight overlap between neighbours
    for k in range(n):
        phi = 2 * math.pi * k / n
        # Box frame: x radial (thickness), y tangential, z along the wall; rotate by phi about z, then lean.
        qz = np.array([math.cos(phi / 2), 0.0, 0.0, math.sin(phi / 2)])
        qy = np.array([math.cos(tilt / 2), 0.0, math.sin(tilt / 2), 0.0])
        quat = np.zeros(4)
        mujoco.mju_mulQuat(quat, qz, qy)
        body.add_geom(
            type=mujoco.mjtGeom.mjGEOM_BOX, size=(thickness / 2, half_width, length / 2),
            pos=(r_mid * math.cos(phi), r_mid * math.sin(phi), z_mid), quat=quat, rgba=rgba, mass=mass / n,
        )  # fmt: skip


def _add_cube_and_bowl(spec: mujoco.MjSpec) -> None:
    cube = _free_body(spec, OBJECT_BODY, LAYOUTS[1].object_rest_z)
    cube.add_geom(
        name="cube", type=mujoco.mjtGeom.mjGEOM_BOX, size=(CUBE_HALF,) * 3, rgba=COLOURS["cube"], mass=0.08, condim=4
    )
    bowl = _free_body(spec, CONTAINER_BODY, 0.0)
    bowl.add_geom(
        name="bowl_base", type=mujoco.mjtGeom.mjGEOM_CYLINDER, size=(0.052, 0.005), pos=(0, 0, 0.005),
        rgba=COLOURS["bowl"], mass=0.12,
    )  # fmt: skip
    _add_ring(bowl, 20, 0.052, 0.08, 0.008, 0.055, 0.006, COLOURS["bowl"], 0.12)


def _add_can_and_mug(spec: mujoco.MjSpec) -> None:
    can = _free_body(spec, OBJECT_BODY, LAYOUTS[2].object_rest_z)
    can.add_geom(
        name="can",
        type=mujoco.mjtGeom.mjGEOM_CYLINDER,
        size=(CAN_RADIUS, CAN_HALF_HEIGHT),
        rgba=COLOURS["can"],
        mass=0.12,
        condim=4,
    )
    mug = _free_body(spec, CONTAINER_BODY, 0.0)
    mug.add_geom(
        name="mug_base", type=mujoco.mjtGeom.mjGEOM_CYLINDER, size=(0.04, 0.004), pos=(0, 0, 0.004),
        rgba=COLOURS["mug"], mass=0.1,
    )  # fmt: skip
    _add_ring(mug, 18, 0.037, 0.037, 0.006, 0.095, 0.006, COLOURS["mug"], 0.15)
    # Handle: three capsules forming a loop on the +x side.
    for a, b in (
        ((0.04, 0, 0.075), (0.062, 0, 0.072)),
        ((0.062, 0, 0.072), (0.062, 0, 0.03)),
        ((0.062, 0, 0.03), (0.04, 0, 0.027)),
    ):
        mug.add_geom(
            type=mujoco.mjtGeom.mjGEOM_CAPSULE, fromto=(*a, *b), size=(0.006, 0, 0), rgba=COLOURS["mug"], mass=0.01
        )


def banana_segments() -> list[tuple[np.ndarray, np.ndarray, float]]:
    """The banana's capsules in its body frame: (start, end, radius), along an arc bending toward +y."""
    n = len(BANANA_RADII)
    angles = np.linspace(-BANANA_ARC_HALF_ANGLE, BANANA_ARC_HALF_ANGLE, n + 1)
    points = [
        np.array([BANANA_ARC_RADIUS * math.sin(a), BANANA_ARC_RADIUS * math.cos(a) - BANANA_ORIGIN_Y, 0.0])
        for a in angles
    ]
    return [(points[k], points[k + 1], BANANA_RADII[k]) for k in range(n)]


def _add_banana_and_bin(spec: mujoco.MjSpec) -> None:
    banana = _free_body(spec, OBJECT_BODY, LAYOUTS[3].object_rest_z)
    for k, (start, end, radius) in enumerate(banana_segments()):
        banana.add_geom(
            name=f"banana_{k}", type=mujoco.mjtGeom.mjGEOM_CAPSULE, fromto=(*start, *end), size=(radius, 0, 0),
            rgba=COLOURS["banana"], mass=0.024, condim=4,
        )  # fmt: skip
    bin_body = _free_body(spec, CONTAINER_BODY, 0.0)
    half, wall, height = 0.15, 0.006, 0.08
    bin_body.add_geom(
        name="bin_floor", type=mujoco.mjtGeom.mjGEOM_BOX, size=(half, half, 0.005), pos=(0, 0, 0.005),
        rgba=COLOURS["bin"], mass=0.3,
    )  # fmt: skip
    for sx, sy in ((1, 0), (-1, 0), (0, 1), (0, -1)):
        size = (wall, half, height / 2) if sx else (half, wall, height / 2)
        pos = (sx * (half - wall), sy * (half - wall), height / 2)
        bin_body.add_geom(type=mujoco.mjtGeom.mjGEOM_BOX, size=size, pos=pos, rgba=COLOURS["bin"], mass=0.1)


_BUILDERS = {1: _add_cube_and_bowl, 2: _add_can_and_mug, 3: _add_banana_and_bin}


def build_spec(
    scene: int, image_shape: tuple[int, int] = droid.DEFAULT_EMBEDDED_IMAGE_SHAPE, multisamples: int = 0
) -> mujoco.MjSpec:
    """The ``MjSpec`` of ``scene``: robot, table, floor, lights, cameras, object and container.

    ``multisamples`` is the offscreen anti-aliasing (MSAA) sample count; 0 (the default) halves the
    software rendering cost at 180x320 for slightly harder edges.
    """
    scene_id = droid.scene_spec(scene).scene_id
    height, width = image_shape
    spec = robot.load_robot_spec()
    spec.modelname = f"dz_gym_droid_scene{scene_id}"
    spec.option.timestep = TIMESTEP
    spec.visual.global_.offwidth = max(int(width), 64)
    spec.visual.global_.offheight = max(int(height), 64)
    spec.visual.quality.shadowsize = 0
    spec.visual.quality.offsamples = int(multisamples)
    _add_table_and_floor(spec)
    _add_lights(spec)
    cameras.add_external_cameras(spec)
    _BUILDERS[scene_id](spec)
    return spec


def build_model(
    scene: int, image_shape: tuple[int, int] = droid.DEFAULT_EMBEDDED_IMAGE_SHAPE, multisamples: int = 0
) -> mujoco.MjModel:
    """The compiled model of ``scene``."""
    return build_spec(scene, image_shape, multisamples).compile()
