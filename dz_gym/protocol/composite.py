"""FLUX 3 Action's composite image (pure numpy, no I/O): three DROID views as one 540x640 picture.

The wrist view (360x640) on top; below it the two exterior views halved to 180x320, side by side, left then
right. Halving is a bilinear 2x downscale with half-pixel centres (``align_corners=False``), which at exactly
half size is the mean of each 2x2 block, truncated to uint8 as BFL's server does.
:func:`compose_views` builds it (batched: ``(..., H, W, 3)``), :func:`split_composite` takes it apart again
(the exteriors come back at half size, as the server saw them).

>>> import numpy as np
>>> views = {k: np.full((2, 360, 640, 3), v, np.uint8) for k, v in (("left", 10), ("right", 20), ("wrist", 30))}
>>> composite = compose_views(views["wrist"], views["left"], views["right"])
>>> composite.shape, int(composite[0, 0, 0, 0]), int(composite[0, 400, 10, 0]), int(composite[0, 400, 600, 0])
((2, 540, 640, 3), 30, 10, 20)
>>> [v.shape for v in split_composite(composite[0])]
[(360, 640, 3), (180, 320, 3), (180, 320, 3)]
"""

from __future__ import annotations

import numpy as np

__all__ = ["COMPOSITE_SHAPE", "VIEW_SHAPE", "compose_views", "halve", "split_composite"]

VIEW_SHAPE = (360, 640)
COMPOSITE_SHAPE = (540, 640)


def halve(images: np.ndarray) -> np.ndarray:
    """``(..., H, W, C)`` uint8 images at half size (H, W even): the floor of each 2x2 block's mean."""
    *lead, height, width, channels = images.shape
    if height % 2 or width % 2:
        raise ValueError(f"halve: expected even height and width, got {height}x{width}")
    blocks = images.reshape(*lead, height // 2, 2, width // 2, 2, channels).astype(np.uint16)
    return (blocks.sum(axis=(-4, -2)) // 4).astype(np.uint8)


def compose_views(wrist: np.ndarray, left: np.ndarray, right: np.ndarray) -> np.ndarray:
    """The composite of three ``(..., 360, 640, 3)`` uint8 views (see the module docstring)."""
    for name, view in (("wrist", wrist), ("left", left), ("right", right)):
        if tuple(view.shape[-3:]) != (*VIEW_SHAPE, 3) or view.dtype != np.uint8:
            raise ValueError(f"{name} view: expected uint8 (..., 360, 640, 3), got {view.dtype} {view.shape}")
    height, width = VIEW_SHAPE
    out = np.empty((*wrist.shape[:-3], *COMPOSITE_SHAPE, 3), dtype=np.uint8)
    out[..., :height, :, :] = wrist
    out[..., height:, : width // 2, :] = halve(left)
    out[..., height:, width // 2 :, :] = halve(right)
    return out


def split_composite(composite: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(wrist 360x640, left 180x320, right 180x320)`` views of one ``(..., 540, 640, 3)`` composite."""
    if tuple(composite.shape[-3:]) != (*COMPOSITE_SHAPE, 3):
        raise ValueError(f"composite: expected (..., 540, 640, 3), got {composite.shape}")
    height, width = VIEW_SHAPE
    return (composite[..., :height, :, :], composite[..., height:, : width // 2, :],
            composite[..., height:, width // 2 :, :])  # fmt: skip
