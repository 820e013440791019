"""What the FLUX 3 Action servers do with a request, without the sockets: BFL's ``flux-action serve-robolab``
and SGLang's ``/openpi/policy`` (``docs/server_profiles.md`` says where each fact comes from).

Both read one current frame and the current state per request and hand the model a 540x640 composite (the
wrist view on top, the two exteriors halved below it, left then right), so :func:`bfl_observation` and
:func:`sglang_observation` validate a request as the real server does (a view that is not 360x640, a
composite that is not 540x640, missing keys and non-finite state raise, which the server answers with its
error frame) and give the policy one normalised request: the composite under the server's composite key, the
proprio under its keys, the prompt. :func:`bfl_handshake` and :func:`sglang_handshake` are the first frames;
:func:`flux_reply` the reply maps.

>>> import numpy as np
>>> views = {f"observation.images.{k}": np.zeros((360, 640, 3), np.uint8) for k in ("wrist", "left", "right")}
>>> sorted(sglang_observation({**views, "state": np.zeros(8), "task": "pick"}))
['observation.images.composite', 'prompt', 'state']
>>> sglang_observation({**views, "observation.images.wrist": np.zeros((180, 320, 3), np.uint8), "state": np.zeros(8)})
Traceback (most recent call last):
...
ValueError: image 'wrist': expected 360x640, got (180, 320, 3)
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from dz_gym.protocol.composite import COMPOSITE_SHAPE, VIEW_SHAPE, compose_views
from dz_gym.protocol.observation import last_row
from dz_gym.protocol.profiles import PROFILES

__all__ = [
    "BFL",
    "SGLANG",
    "bfl_handshake",
    "bfl_observation",
    "flux_reply",
    "sglang_handshake",
    "sglang_observation",
]

BFL = PROFILES["flux3-bfl"]
SGLANG = PROFILES["sglang"]
HORIZON, ACTION_DIM = BFL.chunk_shape  # type: ignore[misc]
NUM_INFERENCE_STEPS = 4
SGLANG_PREFIX = "observation.images."
SGLANG_ALIASES = {"wrist_image_left": "wrist", "exterior_image_1_left": "left", "exterior_image_2_left": "right"}


def bfl_handshake() -> dict:
    """``{"serving_setup": {...}}``: BFL's precision and compile settings (no ``policy_server_config`` keys)."""
    return {"serving_setup": {"variant": "base", "precision": "bf16", "compile": False, "batched_cfg": False}}


def sglang_handshake() -> dict:
    """SGLang's ``action.metadata`` map for ``black-forest-labs/flux-3-action-droid``."""
    return {
        "object": "action.metadata",
        "model": "black-forest-labs/flux-3-action-droid",
        "model_path": "black-forest-labs/flux-3-action-droid",
        "policy_family": "flux3_action",
        "input": {
            "image_keys": ["wrist", "left", "right"],
            "camera_aliases": dict(SGLANG_ALIASES),
            "camera_layout": "droid",
            "state_dim": 8,
        },
        "output": {
            "action_type": "continuous",
            "action_horizon": HORIZON,
            "action_dim": ACTION_DIM,
            "padded_action_dim": ACTION_DIM,
            "dtype": "float32",
        },  # fmt: skip
        "defaults": {
            "num_inference_steps": NUM_INFERENCE_STEPS,
            "guidance_scale": 4.0,
            "guidance_scale_action": 1.0,
            "sampler": "unipc",
            "variant": "base",
        },  # fmt: skip
        "capabilities": {
            "realtime_websocket": True,
            "openpi_websocket": True,
            "batch_inputs": False,
            "multiple_candidates": False,
        },  # fmt: skip
    }


def _bfl_uint8(value: Any, key: str) -> np.ndarray:
    """BFL casts any image to uint8 after clipping to 0..255 (floats in [0, 1] come out nearly black)."""
    image = np.asarray(value)
    if image.ndim == 4:
        image = image[-1]
    if image.ndim != 3 or image.shape[-1] != 3:
        raise ValueError(f"{key}: expected (H, W, 3), got {image.shape}")
    return image if image.dtype == np.uint8 else np.clip(image, 0, 255).astype(np.uint8)


def _compose_checked(wrist: np.ndarray, left: np.ndarray, right: np.ndarray) -> np.ndarray:
    for name, view in (("wrist", wrist), ("left", left), ("right", right)):
        if view.shape[:2] != VIEW_SHAPE:
            raise ValueError(f"image {name!r}: expected {VIEW_SHAPE[0]}x{VIEW_SHAPE[1]}, got {view.shape}")
    return compose_views(wrist, left, right)


def bfl_observation(request: Mapping[str, Any]) -> dict:
    """BFL's reading of ``request``: ``observation/image`` (540x640), else all three slash-key views (each
    360x640: the exteriors are halved and the result must be 540x640); joints (7) and gripper (last value),
    float32 and finite; ``prompt`` (default ""). A request without images (a reset frame) raises KeyError."""
    if BFL.composite_key in request:
        composite = _bfl_uint8(request[BFL.composite_key], BFL.composite_key)
        if composite.shape[:2] != COMPOSITE_SHAPE:
            raise AssertionError(f"composite: expected {COMPOSITE_SHAPE}, got {composite.shape}")
    else:
        left, right, wrist = (_bfl_uint8(request[key], key) for _, key in BFL.image_keys)
        composite = _compose_checked(wrist, left, right)
    gripper = np.asarray(request[BFL.gripper_key], dtype=np.float32).reshape(-1)[-1:]
    return {
        BFL.composite_key: composite,
        BFL.joint_key: last_row(request[BFL.joint_key], BFL.joint_key, 7, np.float32),
        BFL.gripper_key: last_row(gripper, BFL.gripper_key, 1, np.float32),
        "prompt": str(request.get("prompt", "")),
    }


def _sglang_image(value: Any, name: str, shape: tuple[int, int]) -> np.ndarray:
    if isinstance(value, list):
        value = np.asarray(value)
    if not isinstance(value, np.ndarray):
        raise ValueError(f"image {name!r}: expected an HWC array, got {type(value).__name__}")
    if value.dtype.kind == "f":
        value = np.clip(np.rint(value * 255.0), 0, 255).astype(np.uint8)
    elif value.dtype != np.uint8:
        raise ValueError(f"image {name!r}: expected uint8 or float in [0, 1], got {value.dtype}")
    if value.ndim != 3 or value.shape[:2] != shape or value.shape[2] != 3:
        raise ValueError(f"image {name!r}: expected {shape[0]}x{shape[1]}, got {value.shape}")
    return value


def sglang_observation(request: Mapping[str, Any]) -> dict:
    """SGLang's reading of ``request``: images from ``observation.images.{wrist,left,right}`` (or the
    aliases after the prefix, or an ``images`` map), each 360x640, or a 540x640 ``composite``; slash keys are
    not read. ``state`` (or ``observation.state``): 8 finite values. ``prompt``, else ``task``."""
    images = dict(request["images"]) if isinstance(request.get("images"), Mapping) else {}
    for key, value in request.items():
        if isinstance(key, str) and key.startswith(SGLANG_PREFIX):
            images[key[len(SGLANG_PREFIX) :]] = value
    images = {SGLANG_ALIASES.get(name, name): value for name, value in images.items()}
    if "composite" in images:
        composite = _sglang_image(images["composite"], "composite", COMPOSITE_SHAPE)
    else:
        missing = [name for name in ("wrist", "left", "right") if name not in images]
        if missing:
            raise ValueError(
                f"missing images {missing}: expected observation.images.{{wrist,left,right}} or a composite"
            )
        composite = compose_views(*(_sglang_image(images[n], n, VIEW_SHAPE) for n in ("wrist", "left", "right")))
    state = request.get("state", request.get("observation.state"))
    if state is None:
        raise ValueError("state: missing (expected 8 values: 7 joints and the gripper)")
    return {
        SGLANG.composite_key: composite,
        SGLANG.state_key: last_row(state, "state", 8, np.float32),
        "prompt": str(request.get("prompt") or request.get("task") or ""),
    }


def flux_reply(flavor: str, actions: np.ndarray, *, request_id: str, infer_ms: float) -> dict:
    """The reply map of ``flavor`` (before ``server_timing``): BFL ``{"action"}``; SGLang ``{"request_id",
    "actions", "parameters", "timings", "cache"}``."""
    actions = np.asarray(actions, dtype=np.float32)
    if flavor == BFL.name:
        return {"action": actions}
    return {
        "request_id": request_id,
        "actions": actions,
        "parameters": {"num_inference_steps": NUM_INFERENCE_STEPS},
        "timings": {"total_ms": infer_ms},
        "cache": {"enabled": False, "hit": False, "scope": "none", "mode": "off"},
    }
