"""Where the task object and its container are, from the two external views (and the wrist view).

Each external image is segmented by colour (:mod:`segmentation`); the centroid of the object's blob in
each view gives one ray per camera, and the two rays are triangulated into a 3-D point (the silhouette
centroid triangulates close to the body's centre, and its height comes for free). The object's planar
orientation comes from its pixels back-projected onto the horizontal plane at that height: a principal
axis for long objects, the fourth angular harmonic for a box. The wrist camera, when the gripper hovers
over the object, gives a closer top-down look used the same way (back-projection onto the plane); the
external views see a box's sides as well as its top, so only the wrist view tells a box's yaw.

:class:`Track` turns these per-call views into estimates a planner can follow: it updates only when both
views see most of the blob (so a gripper occluding the object does not drag the estimate), and can be
frozen (e.g. once the gripper is about to grasp).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from dz_gym.policies.reference.geometry import (
    PinholeCamera,
    intersect_plane_z,
    principal_axis_yaw,
    square_yaw,
    triangulate,
)
from dz_gym.policies.reference.segmentation import Blob, ImagePlanes, find_blob
from dz_gym.policies.reference.tasks import TaskSpec

MAX_RAY_GAP = 0.03  # metres between the two rays; larger means the views saw different things
MIN_AREA = 6  # pixels per view
ELONGATED = 0.45  # elongation above which an object is treated as long (principal axis is meaningful)
MOVED = 0.02  # metres: an estimate jumping this far means the object moved


@dataclass(frozen=True)
class EntityView:
    """One entity seen in both external views at one instant."""

    position: np.ndarray  # (3,) triangulated world point
    gap: float  # distance between the two rays (metres)
    areas: tuple[int, int]  # blob pixels in each view
    yaw: float = 0.0  # planar orientation (rad); meaning depends on ``elongation`` (see Perception.object_yaw)
    elongation: float = 0.0


@dataclass(frozen=True)
class WristView:
    """The object seen by the wrist camera, back-projected onto a horizontal plane."""

    xy: np.ndarray  # (2,) centroid on the plane
    yaw: float
    elongation: float
    area: int
    touches_border: bool


@dataclass(frozen=True)
class Observation:
    """What one call's images show: the object and the container (``None`` when not found)."""

    object: EntityView | None
    container: EntityView | None


class Perception:
    """Colour segmentation + triangulation with a fixed calibration of the two external cameras."""

    def __init__(self, external: tuple[PinholeCamera, PinholeCamera], wrist_K: np.ndarray | None = None):
        self.external = external
        self.wrist_K = wrist_K

    def observe(self, images: tuple[np.ndarray, np.ndarray], task: TaskSpec) -> Observation:
        """Find ``task``'s object and container in the two external images ``(H, W, 3)`` uint8."""
        planes = [ImagePlanes(image) for image in images]
        obj_blobs = [find_blob(p.mask(task.object_colour), min_area=MIN_AREA) for p in planes]
        con_blobs = [
            find_blob(p.mask(task.container_colour), min_area=MIN_AREA, opening=task.container_opening) for p in planes
        ]
        obj = self._locate(obj_blobs, with_shape=True)
        con = self._locate(con_blobs, with_shape=False)
        return Observation(obj, con)

    def _locate(self, blobs: list[Blob | None], *, with_shape: bool) -> EntityView | None:
        if any(b is None for b in blobs):
            return None
        cams = self.external
        dirs = [cam.rays(blob.centroid) for cam, blob in zip(cams, blobs)]
        point, gap = triangulate(cams[0].centre, dirs[0], cams[1].centre, dirs[1])
        if not gap <= MAX_RAY_GAP:
            return None
        areas = (blobs[0].area, blobs[1].area)
        if not with_shape:
            return EntityView(point, gap, areas)
        points = []
        for cam, blob in zip(cams, blobs):
            rays = cam.rays(blob.pixels_uv(max_points=300))
            points.append(intersect_plane_z(cam.centre, rays, float(point[2]))[:, :2])
        xy = np.concatenate(points)
        yaw, elongation = principal_axis_yaw(xy)
        if elongation < ELONGATED:
            yaw = square_yaw(xy)
        return EntityView(point, gap, areas, yaw, elongation)

    def observe_wrist(
        self, image: np.ndarray, world_from_camera: np.ndarray, colour: str, plane_z: float
    ) -> WristView | None:
        """The ``colour`` blob in the wrist image, back-projected onto the plane ``z = plane_z``."""
        if self.wrist_K is None:
            return None
        blob = find_blob(ImagePlanes(image).mask(colour), min_area=30)
        if blob is None:
            return None
        cam = PinholeCamera(self.wrist_K, world_from_camera)
        points = intersect_plane_z(cam.centre, cam.rays(blob.pixels_uv(max_points=600)), plane_z)[:, :2]
        points = points[np.isfinite(points).all(axis=1)]
        if len(points) < 10:
            return None
        yaw, elongation = principal_axis_yaw(points)
        if elongation < ELONGATED:
            yaw = square_yaw(points)
        return WristView(points.mean(axis=0), yaw, elongation, blob.area, blob.touches_border)


@dataclass
class Track:
    """A running estimate of one entity, updated from :class:`EntityView` s under visibility rules.

    ``reference_areas`` holds the largest blob area seen so far in each view; an update needs both views
    to show at least ``min_visible`` of it (a partly occluded blob has a shifted centroid). ``frozen``
    stops updates altogether.
    """

    min_visible: float = 0.6
    position: np.ndarray | None = None
    yaw: float = 0.0
    elongation: float = 0.0
    reference_areas: np.ndarray = field(default_factory=lambda: np.zeros(2))
    frozen: bool = False
    updates: int = 0
    last_view: EntityView | None = None
    shape_from_wrist: bool = False  # yaw/elongation came from the wrist camera (better than the external views)

    def update(self, view: EntityView | None) -> bool:
        """Fold in this call's view; returns whether the estimate changed."""
        self.last_view = view
        if view is None:
            return False
        areas = np.asarray(view.areas, dtype=np.float64)
        self.reference_areas = np.maximum(self.reference_areas, areas)
        if self.frozen:
            return False
        if self.position is not None and np.any(areas < self.min_visible * self.reference_areas):
            return False
        if self.position is not None and np.linalg.norm(view.position[:2] - self.position[:2]) > MOVED:
            self.shape_from_wrist = False  # the object moved: its orientation must be looked at again
        self.position = np.array(view.position, dtype=np.float64)
        if not self.shape_from_wrist:
            self.yaw, self.elongation = view.yaw, view.elongation
        self.updates += 1
        return True

    def update_shape(self, wrist: WristView | None) -> bool:
        """Take the object's orientation from a wrist view (unless frozen); returns whether it did."""
        if wrist is None or self.frozen or wrist.touches_border:
            return False
        self.yaw, self.elongation = wrist.yaw, wrist.elongation
        self.shape_from_wrist = True
        return True

    def reset(self) -> None:
        """Forget everything (a new attempt re-locates from scratch)."""
        self.position = None
        self.reference_areas = np.zeros(2)
        self.frozen = False
        self.updates = 0
        self.last_view = None
        self.shape_from_wrist = False
