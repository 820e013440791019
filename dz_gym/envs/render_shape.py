"""The size the embedded simulator renders its views at, for what a server asks (pure, no simulator import).

The embedded simulator renders each camera at ``image_shape`` (default ``(180, 320)``, DreamZero's request
size, so its requests go out without a resize). A server that wants other views gets them rendered at its
size instead of resized: :func:`render_shape_for` maps a server's per-view ``image_resolution`` to the render
shape. A 16:9 resolution (the cameras' aspect) is rendered as asked: 180x320 for DreamZero, 360x640 for FLUX 3
Action's views; FLUX's 540x640 composite is built from three 360x640 views, so it renders those. Any other
aspect (openpi's 224x224) keeps the default render, which the request adapter resizes with pad as the
reference client does: rendering a square image would change the cameras' field of view, not just the
pixels. Isaac Lab renders its own 720x1280, which :mod:`dz_gym.requests` resizes (exactly 2x for 360x640).

>>> render_shape_for(None), render_shape_for((180, 320)), render_shape_for((360, 640))
((180, 320), (180, 320), (360, 640))
>>> render_shape_for((540, 640)), render_shape_for((224, 224))
((360, 640), (180, 320))
>>> check_render_shape([360, 640]), check_render_shape((8, 8))
Traceback (most recent call last):
...
ValueError: image_shape: expected (height, width) integers within 16..2160 x 16..3840, got (8, 8)
"""

from __future__ import annotations

from collections.abc import Sequence

from dz_gym.envs import droid
from dz_gym.protocol.composite import COMPOSITE_SHAPE, VIEW_SHAPE

__all__ = ["COMPOSITE_SHAPE", "COMPOSITE_VIEW_SHAPE", "MAX_RENDER_SHAPE", "check_render_shape", "render_shape_for"]

MAX_RENDER_SHAPE = (2160, 3840)
COMPOSITE_VIEW_SHAPE = VIEW_SHAPE  # the size of each view FLUX 3 Action's composite is composed from


def check_render_shape(value: Sequence[int], name: str = "image_shape") -> tuple[int, int]:
    """``value`` as ``(height, width)`` integers the renderer takes, else a one-line ``ValueError`` naming
    ``name``."""
    try:
        height, width = (int(v) for v in value)
        ok = all(float(v) == int(v) for v in value)
    except (TypeError, ValueError):
        ok = False
    if not ok or not (16 <= height <= MAX_RENDER_SHAPE[0] and 16 <= width <= MAX_RENDER_SHAPE[1]):
        raise ValueError(
            f"{name}: expected (height, width) integers within 16..{MAX_RENDER_SHAPE[0]} x "
            f"16..{MAX_RENDER_SHAPE[1]}, got {value!r}"
        )
    return height, width


def render_shape_for(image_resolution: Sequence[int] | None) -> tuple[int, int]:
    """The embedded simulator's render shape for a server asking views of ``image_resolution`` ``(H, W)``
    (None: the server does not say): see the module docstring."""
    default = tuple(droid.DEFAULT_EMBEDDED_IMAGE_SHAPE)
    if image_resolution is None:
        return default
    height, width = (int(v) for v in image_resolution)
    if (height, width) == COMPOSITE_SHAPE:
        return COMPOSITE_VIEW_SHAPE
    if height * 16 != width * 9:
        return default
    try:
        return check_render_shape((height, width))
    except ValueError:
        return default
