"""The messages of the OpenPI/DreamZero policy protocol: build requests, parse replies (no I/O here).

Client side: :func:`parse_metadata` (the handshake frame), :func:`build_infer_request`,
:func:`build_reset_request`, :func:`parse_infer_response`, :func:`parse_reset_response`.
Server side: :func:`parse_request`, :func:`encode_error`, :func:`encode_reset_reply`, :func:`encode_metadata`,
:func:`encode_reply`.

Replies differ per server (see the docs): DreamZero and vLLM-Omni send a bare ``(24, 8)`` float32 array,
openpi a dict with ``actions`` and ``server_timing``. Errors come as a binary ``{"type": "error", ...}`` dict
(vLLM-Omni, the connection stays open) or as a text frame with a traceback (openpi/DreamZero, then close
1011); both become :class:`~dz_gym.errors.ServerError` with ``fatal`` set accordingly. Anything that does not
fit the protocol becomes :class:`~dz_gym.errors.ProtocolError` with a one-line message.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from dz_gym.errors import InvalidRequest, ProtocolError, ServerError, SessionRefused
from dz_gym.protocol.codec import packb, unpackb
from dz_gym.protocol.contract import PolicyContract, check_chunk, is_admission_refusal, policy_contract
from dz_gym.protocol.profiles import PROFILES, ServerProfile

DEFAULT_PROFILE = PROFILES["dreamzero"]  # the request dz-gym has always sent
# Every map key that holds a reply's chunk, over the declared servers: "actions" (openpi, SGLang), "action" (BFL).
REPLY_KEYS = tuple(dict.fromkeys(key for p in PROFILES.values() for key in p.reply_keys))

__all__ = [
    "DREAMZERO_METADATA",
    "InferReply",
    "InvalidRequest",
    "JOINT_KEY",
    "CARTESIAN_KEY",
    "GRIPPER_KEY",
    "MAX_VLLM_PAYLOAD_BYTES",
    "RESET_SUCCESSFUL",
    "ServerMetadata",
    "build_infer_request",
    "build_reset_request",
    "encode_error",
    "encode_metadata",
    "encode_reply",
    "encode_reset_reply",
    "is_error_reply",
    "parse_infer_response",
    "parse_metadata",
    "parse_request",
    "parse_reset_response",
    "sampling_fields",
]

RESET_SUCCESSFUL = "reset successful"
MAX_VLLM_PAYLOAD_BYTES = 64 * 1024 * 1024
JOINT_KEY = "observation/joint_position"
CARTESIAN_KEY = "observation/cartesian_position"
GRIPPER_KEY = "observation/gripper_position"

# DreamZero's PolicyServerConfig, as DreamZero's own server and vLLM-Omni's deploy config send it.
DREAMZERO_METADATA: dict[str, Any] = {
    "image_resolution": [180, 320],
    "n_external_cameras": 2,
    "needs_wrist_camera": True,
    "needs_stereo_camera": False,
    "needs_session_id": True,
    "action_space": "joint_position",
}


# ------------------------------------------------------------------------------------------------ helpers
def _decode_binary(frame: Any, what: str) -> Any:
    if isinstance(frame, memoryview):
        frame = frame.tobytes()
    if not isinstance(frame, (bytes, bytearray)):
        raise ProtocolError(f"{what}: expected a binary or text frame, got {type(frame).__name__}")
    return unpackb(frame)


def is_error_reply(obj: Any) -> bool:
    """True for a decoded binary error dict ``{"type": "error", ...}`` (vLLM-Omni's error reply)."""
    return isinstance(obj, dict) and obj.get("type") == "error"


def _raise_error_reply(obj: dict, *, fatal: bool) -> None:
    message = obj.get("message", obj.get("error", "unknown error"))
    code = obj.get("code")
    kind = SessionRefused if is_admission_refusal(code, message) else ServerError
    raise kind(str(message), fatal=fatal, code=str(code) if code is not None else None)


# ------------------------------------------------------------------------------------------------ metadata
@dataclass(frozen=True)
class ServerMetadata:
    """The handshake fields a DreamZero-style server announces; ``raw`` keeps every field as sent and
    ``contract`` the robot policy contract it announces (:mod:`dz_gym.protocol.contract`)."""

    image_resolution: tuple[int, int] | None = None
    n_external_cameras: int | None = None
    needs_wrist_camera: bool | None = None
    needs_stereo_camera: bool | None = None
    needs_session_id: bool | None = None
    action_space: str | None = None
    raw: dict = field(default_factory=dict)
    contract: PolicyContract = field(default_factory=PolicyContract)


def _meta_bool(raw: dict, key: str) -> bool | None:
    value = raw.get(key)
    if value is None:
        return None
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    raise ProtocolError(f"metadata {key}: expected a bool or null, got {value!r}")


def _meta_int(raw: dict, key: str) -> int | None:
    value = raw.get(key)
    if value is None:
        return None
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)) or value < 0:
        raise ProtocolError(f"metadata {key}: expected a non-negative integer or null, got {value!r}")
    return int(value)


def _meta_resolution(raw: dict) -> tuple[int, int] | None:
    value = raw.get("image_resolution")
    if value is None:
        return None
    items = list(value) if isinstance(value, (list, tuple, np.ndarray)) else None
    if (
        items is None
        or len(items) != 2
        or any(isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, np.integer)) or v <= 0 for v in items)
    ):
        raise ProtocolError(f"metadata image_resolution: expected [height, width] positive integers, got {value!r}")
    return int(items[0]), int(items[1])


def parse_metadata(frame: bytes | str) -> ServerMetadata:
    """Parse the server's first frame. A text frame is a handshake error (vLLM-Omni's JSON error, then close)."""
    if isinstance(frame, str):
        try:
            obj = json.loads(frame)
        except ValueError:
            obj = None
        if isinstance(obj, dict) and obj.get("type") == "error":
            message = obj.get("error", obj.get("message", frame))
            code = obj.get("code")
            kind = SessionRefused if is_admission_refusal(code, message) else ServerError
            raise kind(str(message), fatal=True, code=str(code) if code is not None else None)
        raise ServerError(frame, fatal=True)
    raw = _decode_binary(frame, "metadata")
    if not isinstance(raw, dict):
        raise ProtocolError(f"metadata: expected a map, got {type(raw).__name__}")
    if is_error_reply(raw):
        _raise_error_reply(raw, fatal=True)
    space = raw.get("action_space")
    if space is not None and not isinstance(space, str):
        raise ProtocolError(f"metadata action_space: expected a string or null, got {space!r}")
    return ServerMetadata(
        image_resolution=_meta_resolution(raw),
        n_external_cameras=_meta_int(raw, "n_external_cameras"),
        needs_wrist_camera=_meta_bool(raw, "needs_wrist_camera"),
        needs_stereo_camera=_meta_bool(raw, "needs_stereo_camera"),
        needs_session_id=_meta_bool(raw, "needs_session_id"),
        action_space=space,
        raw=raw,
        contract=policy_contract(raw),
    )


# ------------------------------------------------------------------------------------------------ requests
def _vector(value: Any, name: str, size: int) -> np.ndarray:
    try:
        arr = np.asarray(value)
    except Exception:
        raise InvalidRequest(f"{name}: expected {size} numbers, got {type(value).__name__}") from None
    if arr.dtype.kind not in "biuf":
        raise InvalidRequest(f"{name}: expected a numeric array, got dtype {arr.dtype}")
    if arr.size != size or (arr.ndim > 1 and arr.shape[-1] != size):
        raise InvalidRequest(f"{name}: expected shape ({size},), got {arr.shape}")
    out = np.ascontiguousarray(arr.reshape(size), dtype=np.float64)
    if not np.all(np.isfinite(out)):
        raise InvalidRequest(f"{name}: expected finite values, got {out.tolist()}")
    return out


def _image(value: Any, key: str) -> np.ndarray:
    if not isinstance(value, np.ndarray):
        raise InvalidRequest(f"{key}: expected a numpy uint8 array, got {type(value).__name__}")
    if value.dtype != np.uint8:
        raise InvalidRequest(f"{key}: expected dtype uint8, got {value.dtype}")
    if value.ndim not in (3, 4) or value.shape[-1] != 3 or 0 in value.shape:
        raise InvalidRequest(f"{key}: expected shape (H, W, 3) or (T, H, W, 3), got {value.shape}")
    return value


def build_infer_request(
    *,
    images: Mapping[str, np.ndarray],
    joint_position: Any,
    gripper_position: Any,
    prompt: str,
    session_id: str | None,
    cartesian_position: Any = None,
    endpoint: str | None = "infer",
    extra: Mapping[str, Any] | None = None,
    profile: ServerProfile | None = None,
) -> dict:
    """The infer request of a server ``profile`` (default: DreamZero's, the reference client's keys and dtypes).

    Images stay as given (no copy; uint8 ``(H, W, 3)`` or ``(T, H, W, 3)``), keyed by request key such as
    ``observation/exterior_image_0_left`` (the profile's view keys, or its composite key). Proprio goes out
    in the profile's dtype (DreamZero: float64), as joints ``(7,)`` and gripper ``(1,)`` (plus a cartesian
    ``(6,)``, zeros when not given, where the profile sends one) or as one ``(8,)`` state. ``session_id=None``
    and ``endpoint=None`` leave those keys out (openpi servers need neither), as does a profile without them.
    ``extra`` adds keys, which must not collide with the ones built here.
    """
    profile = DEFAULT_PROFILE if profile is None else profile
    if not isinstance(images, Mapping) or not images:
        raise InvalidRequest("images: expected a non-empty mapping of request key -> uint8 image")
    if not isinstance(prompt, str):
        raise InvalidRequest(f"prompt: expected a string, got {type(prompt).__name__}")
    if session_id is not None and (not isinstance(session_id, str) or not session_id):
        raise InvalidRequest(f"session_id: expected a non-empty string or None, got {session_id!r}")
    if endpoint is not None and endpoint not in ("infer", "reset"):
        raise InvalidRequest(f"endpoint: expected 'infer', 'reset' or None, got {endpoint!r}")
    reserved = _reserved_keys(profile)
    request: dict[str, Any] = {}
    for key, image in images.items():
        if not isinstance(key, str) or not key:
            raise InvalidRequest(f"images: expected string request keys, got {key!r}")
        if key in reserved:
            raise InvalidRequest(f"images: key {key!r} is reserved for a non-image field")
        request[key] = _image(image, key)
    dtype = np.dtype(profile.proprio_dtype)
    joints = _vector(joint_position, "joint_position", 7)
    gripper = _vector(gripper_position, "gripper_position", 1)
    if profile.state_key is not None:
        request[profile.state_key] = np.concatenate([joints, gripper]).astype(dtype)
    else:
        request[profile.joint_key] = joints.astype(dtype, copy=False)
        if profile.cartesian_key is not None:
            cartesian = (
                np.zeros(6) if cartesian_position is None else _vector(cartesian_position, "cartesian_position", 6)
            )
            request[profile.cartesian_key] = cartesian.astype(dtype, copy=False)
        request[profile.gripper_key] = gripper.astype(dtype, copy=False)
    request[profile.prompt_key] = prompt
    if session_id is not None and profile.session_key is not None:
        request[profile.session_key] = session_id
    if extra:
        for key, value in extra.items():
            if key in request or key == profile.endpoint_key:
                raise InvalidRequest(f"extra: key {key!r} collides with a request field")
            request[key] = value
    if endpoint is not None and profile.endpoint_key is not None:
        request[profile.endpoint_key] = endpoint
    return request


def _reserved_keys(profile: ServerProfile) -> frozenset[str]:
    keys = (profile.joint_key, profile.gripper_key, profile.state_key, profile.cartesian_key, profile.prompt_key,
            profile.session_key, profile.endpoint_key, "prompt", "session_id", "endpoint")  # fmt: skip
    return frozenset(k for k in keys if k is not None)


def sampling_fields(seed: int | None = None, num_inference_steps: int | None = None) -> dict[str, Any]:
    """The optional request fields vLLM-Omni 0.30 passes on to its engine: ``seed`` (an int; the sampling
    noise of the request) and ``sampling_params: {"num_inference_steps": N}``; absent ones are left out.

    Other servers ignore keys they do not know (DreamZero's own server, openpi); ``build_infer_request``
    takes the result as ``extra``.

    >>> sampling_fields(7, 4)
    {'seed': 7, 'sampling_params': {'num_inference_steps': 4}}
    >>> sampling_fields()
    {}
    """
    fields: dict[str, Any] = {}
    if seed is not None:
        if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or not 0 <= int(seed) < 2**63:
            raise InvalidRequest(f"seed: expected an integer in [0, 2**63), got {seed!r}")
        fields["seed"] = int(seed)
    if num_inference_steps is not None:
        steps = num_inference_steps
        if isinstance(steps, bool) or not isinstance(steps, (int, np.integer)) or int(steps) < 1:
            raise InvalidRequest(f"num_inference_steps: expected an integer >= 1, got {steps!r}")
        fields["sampling_params"] = {"num_inference_steps": int(steps)}
    return fields


def build_reset_request(session_id: str | None = None) -> dict:
    """``{"endpoint": "reset"}`` (plus ``session_id`` when given)."""
    if session_id is not None and (not isinstance(session_id, str) or not session_id):
        raise InvalidRequest(f"session_id: expected a non-empty string or None, got {session_id!r}")
    request: dict[str, Any] = {"endpoint": "reset"}
    if session_id is not None:
        request["session_id"] = session_id
    return request


# ------------------------------------------------------------------------------------------------ replies
@dataclass
class InferReply:
    """One decoded action chunk: ``actions`` is a writable float32 ``(H, D)`` copy."""

    actions: np.ndarray
    server_timing: dict | None = None
    extra: dict = field(default_factory=dict)


def _actions(value: Any, action_dim: int | None, horizon: int | None) -> np.ndarray:
    if isinstance(value, list):
        try:
            value = np.asarray(value)
        except Exception:
            raise ProtocolError("reply actions: expected a numeric 2-D array, got a ragged list") from None
    if not isinstance(value, np.ndarray):
        raise ProtocolError(f"reply actions: expected a numeric 2-D array, got {type(value).__name__}")
    if value.dtype.kind not in "iuf":
        raise ProtocolError(f"reply actions: expected a numeric dtype, got {value.dtype}")
    if value.ndim == 3 and value.shape[0] == 1:  # a batch of one (vLLM-Omni's offline path sent (1, H, D))
        value = value[0]
    check_chunk(value, action_dim=action_dim, horizon=horizon)
    actions = np.array(value, dtype=np.float32, copy=True, order="C")
    if not np.all(np.isfinite(actions)):
        bad = int(np.count_nonzero(~np.isfinite(actions)))
        raise ProtocolError(f"reply actions: expected finite values, got {bad} non-finite")
    return actions


def parse_infer_response(frame: bytes | str, *, action_dim: int | None = 8, horizon: int | None = None) -> InferReply:
    """Decode an infer reply of any declared server (:mod:`dz_gym.protocol.profiles`): a bare ``(H,
    action_dim)`` array (DreamZero, vLLM-Omni) or a map with ``actions`` (openpi, SGLang) or ``action`` (BFL),
    plus ``server_timing``; a leading batch dimension of 1 is squeezed.

    Errors: a text frame (a traceback; the server closes with 1011) and a binary ``{"error": ...}`` map
    (SGLang's traceback, then close 1011) are fatal :class:`~dz_gym.errors.ServerError`; a binary ``{"type":
    "error"}`` (vLLM-Omni) is not (the connection stays open). The chunk must be a finite numeric 2-D array
    with at least one row; ``action_dim`` (DreamZero's 8 by default; None: any width) and ``horizon`` (None:
    any) are checked by :func:`~dz_gym.protocol.contract.check_chunk`.
    """
    if isinstance(frame, str):
        raise ServerError(frame, fatal=True)
    obj = _decode_binary(frame, "reply")
    if isinstance(obj, dict):
        if is_error_reply(obj):
            _raise_error_reply(obj, fatal=False)
        key = next((k for k in REPLY_KEYS if k in obj), None)
        if key is None:
            if "error" in obj:
                raise ServerError(str(obj["error"]), fatal=True)
            keys = sorted(str(k) for k in obj)[:8]
            wanted = " or ".join(repr(k) for k in REPLY_KEYS)
            raise ProtocolError(f"reply: expected an action array or a map with {wanted}, got keys {keys}")
        timing = obj.get("server_timing")
        if timing is not None and not isinstance(timing, dict):
            raise ProtocolError(f"reply server_timing: expected a map, got {type(timing).__name__}")
        extra = {k: v for k, v in obj.items() if k not in (key, "server_timing")}
        return InferReply(_actions(obj[key], action_dim, horizon), timing, extra)
    return InferReply(_actions(obj, action_dim, horizon))


def parse_reset_response(frame: bytes | str) -> str:
    """Decode a reset reply: text ``"reset successful"`` (DreamZero) or binary ``{"status": ...}`` (vLLM-Omni)."""
    if isinstance(frame, str):
        if frame.strip() == RESET_SUCCESSFUL:
            return RESET_SUCCESSFUL
        raise ServerError(frame, fatal=True)
    obj = _decode_binary(frame, "reset reply")
    if isinstance(obj, dict):
        if is_error_reply(obj):
            _raise_error_reply(obj, fatal=False)
        status = obj.get("status")
        if isinstance(status, str):
            return status
    if isinstance(obj, str):
        return obj
    raise ProtocolError(f"reset reply: expected {{'status': str}} or text, got {type(obj).__name__}")


# ------------------------------------------------------------------------------------------------ server side
def parse_request(frame: bytes, *, max_bytes: int | None = None) -> dict:
    """Decode a client request (server side): a map with string keys. ``endpoint`` is left in place."""
    obj = unpackb(frame, max_bytes=max_bytes)
    if not isinstance(obj, dict):
        raise ProtocolError(f"request: expected a map, got {type(obj).__name__}")
    for key in obj:
        if not isinstance(key, str):
            raise ProtocolError(f"request: expected string keys, got {key!r}")
    return obj


def encode_error(message: str) -> bytes:
    """vLLM-Omni's binary error reply ``{"type": "error", "message": message}``."""
    return packb({"type": "error", "message": str(message)})


def encode_reset_reply(status: str = RESET_SUCCESSFUL) -> bytes:
    """vLLM-Omni's binary reset reply ``{"status": "reset successful"}``."""
    return packb({"status": status})


def encode_metadata(metadata: Mapping[str, Any]) -> bytes:
    """The handshake frame: the metadata map as msgpack."""
    return packb(dict(metadata))


def encode_reply(reply: Any) -> bytes:
    """An infer reply (bare array or dict) as msgpack."""
    return packb(reply)
