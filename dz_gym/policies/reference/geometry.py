"""Pinhole-camera geometry: pixel rays, two-view triangulation, ray-plane intersection, planar axes.

Cameras follow the OpenCV convention (x right, y down, z forward; pixel (u, v) = (column, row) with (0, 0)
the centre of the top-left pixel, ``[u, v, 1]^T ~ K p_cam``) and are given by intrinsics ``K`` and a 4x4
world-from-camera pose. Pure numpy; no simulator.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class PinholeCamera:
    """Intrinsics and world-from-camera pose of one camera (see the module docstring)."""

    K: np.ndarray  # (3, 3)
    world_from_camera: np.ndarray  # (4, 4)

    @property
    def centre(self) -> np.ndarray:
        """Optical centre in world coordinates."""
        return self.world_from_camera[:3, 3]

    def rays(self, uv: np.ndarray) -> np.ndarray:
        """Unit world directions ``(..., 3)`` of the rays through pixels ``uv`` ``(..., 2)``."""
        uv = np.asarray(uv, dtype=np.float64)
        fx, fy, cx, cy = self.K[0, 0], self.K[1, 1], self.K[0, 2], self.K[1, 2]
        cam = np.stack([(uv[..., 0] - cx) / fx, (uv[..., 1] - cy) / fy, np.ones(uv.shape[:-1])], axis=-1)
        world = cam @ self.world_from_camera[:3, :3].T
        return world / np.linalg.norm(world, axis=-1, keepdims=True)

    def project(self, points: np.ndarray) -> np.ndarray:
        """Pixels ``(..., 2)`` of world points ``(..., 3)`` (points behind the camera give NaN)."""
        points = np.asarray(points, dtype=np.float64)
        rotation, translation = self.world_from_camera[:3, :3], self.world_from_camera[:3, 3]
        cam = (points - translation) @ rotation
        uvw = cam @ self.K.T
        with np.errstate(divide="ignore", invalid="ignore"):
            uv = uvw[..., :2] / uvw[..., 2:3]
        return np.where(cam[..., 2:3] > 0, uv, np.nan)


def triangulate(
    origin_a: np.ndarray, dir_a: np.ndarray, origin_b: np.ndarray, dir_b: np.ndarray
) -> tuple[np.ndarray, float]:
    """Midpoint of the closest approach of two rays, and the distance between them there (metres).

    Nearly parallel rays give ``(nan * 3, inf)``.
    """
    w0 = origin_a - origin_b
    a, b, c = dir_a @ dir_a, dir_a @ dir_b, dir_b @ dir_b
    d, e = dir_a @ w0, dir_b @ w0
    denom = a * c - b * b
    if denom < 1e-9:
        return np.full(3, np.nan), float("inf")
    s = (b * e - c * d) / denom
    t = (a * e - b * d) / denom
    pa, pb = origin_a + s * dir_a, origin_b + t * dir_b
    return (pa + pb) / 2, float(np.linalg.norm(pa - pb))


def intersect_plane_z(origin: np.ndarray, dirs: np.ndarray, z: float) -> np.ndarray:
    """Points ``(n, 3)`` where rays from ``origin`` along ``dirs`` ``(n, 3)`` meet the plane at height ``z``.

    Rays parallel to the plane or pointing away from it give NaN rows.
    """
    dirs = np.asarray(dirs, dtype=np.float64).reshape(-1, 3)
    with np.errstate(divide="ignore", invalid="ignore"):
        t = (z - origin[2]) / dirs[:, 2]
    t = np.where(t > 0, t, np.nan)
    return origin + t[:, None] * dirs


def principal_axis_yaw(points_xy: np.ndarray) -> tuple[float, float]:
    """Yaw (rad, in (-pi/2, pi/2]) of the main axis of planar points, and its elongation in [0, 1].

    Elongation is ``1 - minor/major`` of the covariance's eigenvalues: 0 for a round or square cloud,
    close to 1 for a long thin one.
    """
    points_xy = np.asarray(points_xy, dtype=np.float64).reshape(-1, 2)
    points_xy = points_xy[np.isfinite(points_xy).all(axis=1)]
    if len(points_xy) < 3:
        return 0.0, 0.0
    centred = points_xy - points_xy.mean(axis=0)
    cov = centred.T @ centred / len(centred)
    evals, evecs = np.linalg.eigh(cov)
    major = evecs[:, 1]
    yaw = float(np.arctan2(major[1], major[0]))
    if yaw <= -np.pi / 2:
        yaw += np.pi
    elif yaw > np.pi / 2:
        yaw -= np.pi
    elongation = 1.0 - float(np.sqrt(max(evals[0], 0.0) / max(evals[1], 1e-12)))
    return yaw, elongation


def square_yaw(points_xy: np.ndarray) -> float:
    """Yaw (rad, in [-pi/4, pi/4)) of a square's sides from its planar points (4-fold symmetry).

    Uses the fourth angular harmonic of the centred points: a square's corners sit at its side
    directions + 45 degrees, so ``arg(sum (x + iy)^4) = 4 * yaw + pi``.
    """
    points_xy = np.asarray(points_xy, dtype=np.float64).reshape(-1, 2)
    points_xy = points_xy[np.isfinite(points_xy).all(axis=1)]
    if len(points_xy) < 4:
        return 0.0
    z = (points_xy[:, 0] - points_xy[:, 0].mean()) + 1j * (points_xy[:, 1] - points_xy[:, 1].mean())
    angle = (np.angle(np.sum(z**4)) - np.pi) / 4
    return float((angle + np.pi / 4) % (np.pi / 2) - np.pi / 4)
