"""FLUX 3 Action's composite image (pure numpy, no I/O): three DROID views as one 540x640 picture.

The wrist view (360x640) on top; below it the two exterior views halved to 180x320, side by side, left then
right. Halving is a bilinear 2x downscale with half-pixel centres (``align_corners=False``), which at exactly
half size is the mean of each 2x2 block, truncated to uint8 as BFL's server does.
:func:`compose_views` builds it (batched: ``(..., H, W, 3)``), :func:`split_composite` takes it apart again
(the exteriors come back at half size, as the server saw them). Both take numpy arrays or torch tensors.

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

__all__ = ["COMPOSITE_SHAPE", "VIEW_SHAPE", "compose_views", "composite_of", "halve", "split_composite"]

VIEW_SHAPE = (360, 640)
COMPOSITE_SHAPE = (540, 640)


def _is_torch(images) -> bool:
    return type(images).__module__.split(".")[0] == "torch"


def halve(images):
    """``(..., H, W, C)`` uint8 images at half size (H, W even): the floor of each 2x2 block's mean. Integer
    arithmetic, so numpy arrays and torch tensors (on any device, which they stay on) give the same bytes."""
    *lead, height, width, channels = images.shape
    if height % 2 or width % 2:
        raise ValueError(f"halve: expected even height and width, got {height}x{width}")
    shape = (*lead, height // 2, 2, width // 2, 2, channels)
    if _is_torch(images):
        import torch

        blocks = images.reshape(shape).to(torch.int32)
        return torch.div(blocks.sum(dim=(-4, -2)), 4, rounding_mode="floor").to(torch.uint8)
    return (np.asarray(images).reshape(shape).astype(np.uint16).sum(axis=(-4, -2)) // 4).astype(np.uint8)


def compose_views(wrist, left, right):
    """The composite of three ``(..., 360, 640, 3)`` uint8 views (see the module docstring): numpy arrays, or
    torch tensors on one device (the composite stays there). One-line ``ValueError`` naming the view for
    another shape or dtype."""
    height, width = VIEW_SHAPE
    for name, view in (("wrist", wrist), ("left", left), ("right", right)):
        if tuple(view.shape[-3:]) != (height, width, 3) or "uint8" not in str(view.dtype):
            raise ValueError(f"{name} view: expected uint8 (..., {height}, {width}, 3), got {view.dtype} "
                             f"{tuple(view.shape)}")  # fmt: skip
    if _is_torch(wrist):
        import torch

        return torch.cat([wrist, torch.cat([halve(left), halve(right)], dim=-2)], dim=-3)
    out = np.empty((*wrist.shape[:-3], *COMPOSITE_SHAPE, 3), dtype=np.uint8)
    out[..., :height, :, :] = wrist
    out[..., height:, : width // 2, :] = halve(left)
    out[..., height:, width // 2 :, :] = halve(right)
    return out


def composite_of(views):
    """:func:`compose_views` of ``views`` keyed by DROID camera (``wrist_cam`` on top, ``external_cam`` the left
    exterior and ``external_cam_2`` the right one below), as the request adapter and the bench hold them."""
    return compose_views(views["wrist_cam"], views["external_cam"], views["external_cam_2"])


def split_composite(composite: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(wrist 360x640, left 180x320, right 180x320)`` views of one ``(..., 540, 640, 3)`` composite."""
    if tuple(composite.shape[-3:]) != (*COMPOSITE_SHAPE, 3):
        raise ValueError(f"composite: expected (..., 540, 640, 3), got {composite.shape}")
    height, width = VIEW_SHAPE
    return (composite[..., :height, :, :], composite[..., height:, : width // 2, :],
            composite[..., height:, width // 2 :, :])  # fmt: skip
