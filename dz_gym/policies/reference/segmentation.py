"""Colour segmentation and blob extraction on camera images, in integer maths (no float HSV image).

The embedded scenes give every task object a saturated, unique colour (red, green, blue, yellow, cyan,
magenta) and keep the robot, table and floor unsaturated. A pixel belongs to a colour class when

- it is saturated: ``max - min >= min_chroma`` and ``(max - min) / max >= min_saturation``, and
- its hue lies in the class's 60-degree sector. With ``mid = min + (max - min) / 2``, a channel is "high"
  when it is above ``mid``; red, green and blue are the pixels where only that channel is high, yellow,
  cyan and magenta the pixels where exactly that pair is high. This is HSV hue sectoring centred on the
  primaries and secondaries, computed with a handful of int16 operations per pixel.

A blob is the largest group of class pixels, where pixels are grouped on a coarse grid of cells and
cells less than ``link_radius`` cells apart belong to the same group; so a blob split by a thin occluder
(a gripper finger) stays one blob, while stray pixels elsewhere are dropped. Its centroid is computed
from the full-resolution pixels, in the calibration's pixel convention: (u, v) = (column, row), (0, 0)
the centre of the top-left pixel.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

R, G, B = 0, 1, 2
# Which channels are "high" for each colour class.
COLOUR_CHANNELS: dict[str, tuple[int, ...]] = {
    "red": (R,),
    "green": (G,),
    "blue": (B,),
    "yellow": (R, G),
    "cyan": (G, B),
    "magenta": (R, B),
}
MIN_CHROMA = 40  # of 255
MIN_SATURATION_PERCENT = 45


class ImagePlanes:
    """The int16 channel planes of one RGB image and its chroma, shared by every colour test on it."""

    def __init__(
        self, image: np.ndarray, *, min_chroma: int = MIN_CHROMA, min_saturation: int = MIN_SATURATION_PERCENT
    ):
        image = np.asarray(image)
        if image.dtype != np.uint8 or image.ndim != 3 or image.shape[2] != 3:
            raise ValueError(f"image: expected uint8 (H, W, 3), got {image.dtype} {image.shape}")
        planes = image.astype(np.int16)
        self.shape = image.shape[:2]
        self.channels = (planes[..., 0], planes[..., 1], planes[..., 2])
        r, g, b = self.channels
        self.maximum = np.maximum(np.maximum(r, g), b)
        self.minimum = np.minimum(np.minimum(r, g), b)
        self.chroma = self.maximum - self.minimum
        self.saturated = (self.chroma >= min_chroma) & (self.chroma * 100 >= min_saturation * self.maximum)
        # 2 * (channel - min) > chroma  <=>  the channel is above the mid level of the pixel.
        self._high = [2 * (c - self.minimum) > self.chroma for c in self.channels]

    def mask(self, colour: str) -> np.ndarray:
        """Boolean ``(H, W)`` mask of the pixels of ``colour`` (a key of :data:`COLOUR_CHANNELS`)."""
        try:
            high = COLOUR_CHANNELS[colour]
        except KeyError:
            raise ValueError(f"colour: expected one of {sorted(COLOUR_CHANNELS)}, got {colour!r}") from None
        out = self.saturated.copy()
        for channel in (R, G, B):
            if channel in high:
                out &= self._high[channel]
            else:
                out &= ~self._high[channel]
        return out


def colour_mask(image: np.ndarray, colour: str) -> np.ndarray:
    """Boolean ``(H, W)`` mask of the pixels of ``colour`` in an RGB uint8 ``image``."""
    return ImagePlanes(image).mask(colour)


@dataclass(frozen=True)
class Blob:
    """One colour blob in one image: its pixels and their summary (pixel convention in the module doc)."""

    rows: np.ndarray  # (n,) int row index of every pixel
    cols: np.ndarray  # (n,) int column index of every pixel
    image_shape: tuple[int, int]

    @property
    def area(self) -> int:
        """Number of pixels."""
        return int(self.rows.size)

    @property
    def centroid(self) -> np.ndarray:
        """Mean pixel position (u, v) = (column, row)."""
        return np.array([self.cols.mean(), self.rows.mean()])

    @property
    def bbox(self) -> tuple[int, int, int, int]:
        """(row_min, row_max, col_min, col_max), inclusive."""
        return int(self.rows.min()), int(self.rows.max()), int(self.cols.min()), int(self.cols.max())

    @property
    def touches_border(self) -> bool:
        """Whether the blob reaches the image edge (it may then be cut off)."""
        r0, r1, c0, c1 = self.bbox
        height, width = self.image_shape
        return r0 == 0 or c0 == 0 or r1 == height - 1 or c1 == width - 1

    def pixels_uv(self, max_points: int | None = None) -> np.ndarray:
        """``(n, 2)`` pixel positions (u, v), evenly subsampled to at most ``max_points``."""
        uv = np.stack([self.cols, self.rows], axis=1).astype(np.float64)
        if max_points is not None and len(uv) > max_points:
            uv = uv[:: -(-len(uv) // max_points)]
        return uv


def _cell_counts(mask: np.ndarray, cell: int) -> np.ndarray:
    height, width = mask.shape
    ph, pw = -height % cell, -width % cell
    if ph or pw:
        mask = np.pad(mask, ((0, ph), (0, pw)))
    h, w = mask.shape
    # Strided slices added one by one: far faster than a sum over non-contiguous axes.
    cols = np.ascontiguousarray(mask).view(np.uint8).reshape(h, w // cell, cell)
    rows = cols[:, :, 0].astype(np.int32)
    for k in range(1, cell):
        rows += cols[:, :, k]
    rows = rows.reshape(h // cell, cell, w // cell)
    counts = rows[:, 0, :].copy()
    for k in range(1, cell):
        counts += rows[:, k, :]
    return counts


def _groups(cells: np.ndarray, radius: int) -> list[list[tuple[int, int]]]:
    """Groups of occupied cells, linking cells up to ``radius`` apart (Chebyshev distance)."""
    occupied = {(int(r), int(c)) for r, c in zip(*np.nonzero(cells))}
    offsets = [(dr, dc) for dr in range(-radius, radius + 1) for dc in range(-radius, radius + 1) if dr or dc]
    groups = []
    while occupied:
        seed = occupied.pop()
        group, frontier = [seed], [seed]
        while frontier:
            r, c = frontier.pop()
            for dr, dc in offsets:
                neighbour = (r + dr, c + dc)
                if neighbour in occupied:
                    occupied.remove(neighbour)
                    group.append(neighbour)
                    frontier.append(neighbour)
        groups.append(group)
    return groups


def opened(mask: np.ndarray, size: int) -> np.ndarray:
    """Morphological opening of ``mask`` with a ``size`` x ``size`` square: drops parts thinner than it."""
    if size <= 1:
        return mask
    height, width = mask.shape
    if height < size or width < size:
        return np.zeros_like(mask)

    def erode(m: np.ndarray, axis: int) -> np.ndarray:
        # Window [k, k + size) fully set <=> its sum equals size; the result is anchored at the window start.
        csum = np.cumsum(m, axis=axis, dtype=np.int32)
        csum = np.concatenate([np.zeros_like(np.take(csum, [0], axis=axis)), csum], axis=axis)
        n = m.shape[axis]
        hi = np.take(csum, np.arange(size, n + 1), axis=axis)
        lo = np.take(csum, np.arange(0, n - size + 1), axis=axis)
        return (hi - lo) == size

    def dilate(m: np.ndarray, axis: int, n: int) -> np.ndarray:
        # Each anchored window start k marks pixels [k, k + size).
        out_shape = list(m.shape)
        out_shape[axis] = n
        out = np.zeros(out_shape, dtype=bool)
        for shift in range(size):
            index = [slice(None)] * 2
            index[axis] = slice(shift, shift + m.shape[axis])
            out[tuple(index)] |= m
        return out

    eroded = erode(erode(mask, 0), 1)
    return dilate(dilate(eroded, 0, height), 1, width)


def find_blob(
    mask: np.ndarray,
    *,
    cell: int = 4,
    min_cell_pixels: int = 2,
    link_radius: int = 2,
    min_area: int = 6,
    opening: int = 0,
) -> Blob | None:
    """The largest blob of ``mask`` (with its near neighbours), or ``None`` when under ``min_area`` pixels.

    ``opening`` > 1 first removes structures thinner than that many pixels (e.g. a mug's handle).
    """
    mask = np.asarray(mask, dtype=bool)
    if mask.ndim != 2:
        raise ValueError(f"mask: expected a 2-D boolean array, got shape {mask.shape}")
    if opening > 1:
        mask = _opened_in_box(mask, opening)
    counts = _cell_counts(mask, cell)
    cells = counts >= min_cell_pixels
    if not cells.any():
        return None
    groups = _groups(cells, link_radius)
    best = max(groups, key=lambda g: sum(int(counts[r, c]) for r, c in g))
    keep = np.zeros_like(cells)
    rows_idx, cols_idx = zip(*best)
    keep[list(rows_idx), list(cols_idx)] = True
    # Full-resolution pixels inside the kept cells, restricted to their bounding box.
    r0, r1 = min(rows_idx) * cell, (max(rows_idx) + 1) * cell
    c0, c1 = min(cols_idx) * cell, (max(cols_idx) + 1) * cell
    crop = mask[r0:r1, c0:c1]
    cell_mask = np.repeat(np.repeat(keep[r0 // cell : r1 // cell, c0 // cell : c1 // cell], cell, 0), cell, 1)
    rows, cols = np.nonzero(crop & cell_mask[: crop.shape[0], : crop.shape[1]])
    if rows.size < min_area:
        return None
    return Blob(rows + r0, cols + c0, mask.shape)


def _opened_in_box(mask: np.ndarray, size: int) -> np.ndarray:
    """:func:`opened`, computed only inside the bounding box of the set pixels (plus a margin)."""
    rows = np.flatnonzero(mask.any(axis=1))
    if rows.size == 0:
        return mask
    cols = np.flatnonzero(mask.any(axis=0))
    r0, r1 = max(rows[0] - size, 0), min(rows[-1] + size + 1, mask.shape[0])
    c0, c1 = max(cols[0] - size, 0), min(cols[-1] + size + 1, mask.shape[1])
    out = np.zeros_like(mask)
    out[r0:r1, c0:c1] = opened(mask[r0:r1, c0:c1], size)
    return out
