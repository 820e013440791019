"""Read a decoded request in any server profile's keys (pure, no I/O): for policies behind the reference server.

A request names its server by its keys (:func:`request_profile`): DreamZero's slash keys with
``exterior_image_0_left``, BFL's slash keys with ``exterior_image_2_left`` or ``observation/image``, SGLang's
dot keys (``observation.images.*``) and ``state``. :func:`request_views` gives the three views whichever the
layout (a composite is split back: the exteriors at half size, as the FLUX servers saw them), the last frame
of a stack; :func:`request_proprio` the 7 joints and the gripper, from two keys or one 8-vector.

>>> import numpy as np
>>> request = {"observation.images.composite": np.zeros((540, 640, 3), np.uint8), "state": np.arange(8.0)}
>>> profile = request_profile(request)
>>> profile.name, {k: v.shape for k, v in request_views(request, profile).items()}["external_cam"]
('sglang', (180, 320, 3))
>>> request_proprio(request, profile)[1]
7.0
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from dz_gym.protocol.composite import split_composite
from dz_gym.protocol.profiles import PROFILES, ServerProfile

__all__ = ["last_row", "request_profile", "request_proprio", "request_views"]

_FAMILIES = ("dreamzero", "flux3-bfl", "sglang")  # openpi and vLLM-Omni take DreamZero's request


def _request_keys(profile: ServerProfile) -> set[str]:
    keys = {key for _, key in profile.image_keys} | set(profile.proprio_keys)
    return keys | ({profile.composite_key} if profile.composite_key else set())


def _distinctive() -> dict[str, set[str]]:
    """Per request family, the keys no other family sends."""
    keys = {name: _request_keys(PROFILES[name]) for name in _FAMILIES}
    return {name: own - set().union(*(keys[o] for o in _FAMILIES if o != name)) for name, own in keys.items()}


_DISTINCTIVE = _distinctive()


def request_profile(request: Mapping[str, Any]) -> ServerProfile:
    """The profile whose request keys ``request`` carries (DreamZero's when none stands out)."""
    for name in ("flux3-bfl", "sglang"):
        if any(key in request for key in _DISTINCTIVE[name]):
            return PROFILES[name]
    return PROFILES["dreamzero"]


def _last_frame(value: Any, key: str) -> np.ndarray:
    image = np.asarray(value)
    if image.ndim == 4:
        image = image[-1]
    if image.dtype != np.uint8 or image.ndim != 3 or image.shape[2] != 3:
        raise ValueError(f"{key}: expected uint8 (H, W, 3) or (T, H, W, 3), got {image.dtype} {np.shape(value)}")
    return image


def request_views(request: Mapping[str, Any], profile: ServerProfile) -> dict[str, np.ndarray]:
    """Camera -> its last ``(H, W, 3)`` uint8 frame (see the module docstring); ``ValueError`` naming a
    missing key."""
    if profile.composite_key is not None and profile.composite_key in request:
        wrist, left, right = split_composite(_last_frame(request[profile.composite_key], profile.composite_key))
        return {"external_cam": left, "external_cam_2": right, "wrist_cam": wrist}
    views = {}
    for camera, key in profile.image_keys:
        if key not in request:
            raise ValueError(f"{key}: missing from the request (expected all three views or a composite)")
        views[camera] = _last_frame(request[key], key)
    return views


def last_row(value: Any, key: str, size: int, dtype: Any = np.float64) -> np.ndarray:
    """``value`` as ``size`` finite numbers of ``dtype``: a vector, or a history whose last row is the current
    one (as the FLUX servers read their state); ``ValueError`` naming ``key`` otherwise."""
    try:
        array = np.asarray(value, dtype=dtype)
    except (TypeError, ValueError):
        raise ValueError(f"{key}: expected {size} numbers, got {type(value).__name__}") from None
    array = array.reshape(-1, array.shape[-1])[-1] if array.ndim > 1 else array.reshape(-1)
    if array.size != size or not np.isfinite(array).all():
        raise ValueError(f"{key}: expected {size} finite numbers, got shape {np.shape(value)}")
    return array


def _values(request: Mapping[str, Any], key: str | None, size: int) -> np.ndarray:
    if key is None or key not in request:
        raise ValueError(f"{key}: missing from the request")
    return last_row(request[key], key, size)


def request_proprio(request: Mapping[str, Any], profile: ServerProfile) -> tuple[np.ndarray, float]:
    """The 7 joint positions and the gripper position of ``request``; ``ValueError`` naming the key."""
    if profile.state_key is not None:
        state = _values(request, profile.state_key, 8)
        return state[:7], float(state[7])
    return _values(request, profile.joint_key, 7), float(_values(request, profile.gripper_key, 1)[0])
