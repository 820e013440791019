"""Request building and reply parsing of the DreamZero protocol (client and server sides)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from dz_gym.errors import ProtocolError, ServerError
from dz_gym.protocol import (
    DREAMZERO_METADATA,
    InvalidRequest,
    build_infer_request,
    build_reset_request,
    encode_error,
    encode_metadata,
    encode_reset_reply,
    packb,
    parse_infer_response,
    parse_metadata,
    parse_request,
    parse_reset_response,
    unpackb,
)

KEYS = ("observation/exterior_image_0_left", "observation/exterior_image_1_left", "observation/wrist_image_left")


def _images(shape=(180, 320, 3)):
    return {key: np.full(shape, i, np.uint8) for i, key in enumerate(KEYS)}


def test_infer_request_has_the_reference_keys_order_and_dtypes():
    req = build_infer_request(
        images=_images(),
        joint_position=np.arange(7, dtype=np.float32),
        gripper_position=0.5,
        prompt="put the cube in the bowl",
        session_id="abc",
    )
    assert list(req) == [
        *KEYS,
        "observation/joint_position",
        "observation/cartesian_position",
        "observation/gripper_position",
        "prompt",
        "session_id",
        "endpoint",
    ]
    assert req["observation/joint_position"].dtype == np.float64 and req["observation/joint_position"].shape == (7,)
    assert req["observation/gripper_position"].tolist() == [0.5]
    assert req["observation/cartesian_position"].tolist() == [0.0] * 6
    assert req["endpoint"] == "infer" and req["session_id"] == "abc"


def test_infer_request_keeps_images_without_copy_and_accepts_frame_stacks():
    images = _images((4, 180, 320, 3))
    req = build_infer_request(
        images=images,
        joint_position=np.zeros((1, 7)),
        gripper_position=[0.0],
        prompt="p",
        session_id=None,
        endpoint=None,
        extra={"seed": 3},
    )
    assert req[KEYS[0]] is images[KEYS[0]]
    assert "session_id" not in req and "endpoint" not in req and req["seed"] == 3


@pytest.mark.parametrize(
    "kwargs, pattern",
    [
        ({"images": {KEYS[0]: np.zeros((180, 320, 3), np.float32)}}, "exterior_image_0_left: expected dtype uint8"),
        ({"images": {KEYS[0]: np.zeros((180, 320), np.uint8)}}, r"expected shape \(H, W, 3\)"),
        ({"images": {KEYS[0]: [[0]]}}, "expected a numpy uint8 array"),
        ({"images": {}}, "images: expected a non-empty mapping"),
        ({"joint_position": np.zeros(6)}, r"joint_position: expected shape \(7,\)"),
        ({"joint_position": np.full(7, np.nan)}, "joint_position: expected finite"),
        ({"joint_position": ["a"] * 7}, "joint_position: expected a numeric array"),
        ({"gripper_position": [0.0, 1.0]}, r"gripper_position: expected shape \(1,\)"),
        ({"cartesian_position": np.zeros(5)}, r"cartesian_position: expected shape \(6,\)"),
        ({"prompt": 3}, "prompt: expected a string"),
        ({"session_id": ""}, "session_id: expected a non-empty string"),
        ({"endpoint": "predict"}, "endpoint: expected"),
        ({"extra": {"prompt": "x"}}, "extra: key 'prompt' collides"),
    ],
)
def test_infer_request_validation_errors_are_one_line(kwargs, pattern):
    base = dict(images=_images(), joint_position=np.zeros(7), gripper_position=[0.0], prompt="p", session_id="s")
    base.update(kwargs)
    with pytest.raises(InvalidRequest, match=pattern) as info:
        build_infer_request(**base)
    assert "\n" not in str(info.value)
    assert isinstance(info.value, ProtocolError) and isinstance(info.value, ValueError)


def test_reset_request():
    assert build_reset_request() == {"endpoint": "reset"}
    assert build_reset_request("s1") == {"endpoint": "reset", "session_id": "s1"}


def test_metadata_dreamzero_fields_and_unknown_fields_kept():
    meta = parse_metadata(encode_metadata({**DREAMZERO_METADATA, "model": "dz"}))
    assert meta.image_resolution == (180, 320)
    assert meta.n_external_cameras == 2 and meta.needs_wrist_camera is True and meta.needs_stereo_camera is False
    assert meta.needs_session_id is True and meta.action_space == "joint_position"
    assert meta.raw["model"] == "dz"
    empty = parse_metadata(packb({}))  # openpi servers often send {}
    assert empty.image_resolution is None and empty.raw == {}


@pytest.mark.parametrize(
    "field, value, pattern",
    [
        ("image_resolution", [180], "image_resolution: expected"),
        ("image_resolution", "180x320", "image_resolution: expected"),
        ("n_external_cameras", True, "n_external_cameras: expected"),
        ("n_external_cameras", -1, "n_external_cameras: expected"),
        ("needs_wrist_camera", 1, "needs_wrist_camera: expected a bool"),
        ("action_space", 3, "action_space: expected a string"),
    ],
)
def test_metadata_type_errors(field, value, pattern):
    with pytest.raises(ProtocolError, match=pattern):
        parse_metadata(packb({**DREAMZERO_METADATA, field: value}))


def test_metadata_text_frame_is_a_fatal_server_error_with_code():
    text = json.dumps({"type": "error", "error": "Robot policy not available", "code": "unsupported"})
    with pytest.raises(ServerError) as info:
        parse_metadata(text)
    assert info.value.fatal and info.value.code == "unsupported"
    assert "Robot policy not available" in str(info.value)
    with pytest.raises(ProtocolError, match="metadata: expected a map"):
        parse_metadata(packb([1, 2]))


def test_infer_response_bare_array_and_openpi_dict():
    chunk = np.arange(24 * 8, dtype=np.float32).reshape(24, 8)
    reply = parse_infer_response(packb(chunk), horizon=24)
    assert reply.actions.flags.writeable and reply.actions.dtype == np.float32
    np.testing.assert_array_equal(reply.actions, chunk)
    assert reply.server_timing is None and reply.extra == {}
    frame = packb({"actions": chunk.astype(np.float64), "server_timing": {"infer_ms": 3.0}, "policy_timing": {}})
    reply = parse_infer_response(frame)
    assert reply.actions.dtype == np.float32 and reply.server_timing == {"infer_ms": 3.0}
    assert reply.extra == {"policy_timing": {}}


@pytest.mark.parametrize(
    "payload, pattern",
    [
        (np.zeros((24,), np.float32), r"expected shape \(H, 8\)"),
        (np.zeros((24, 7), np.float32), "expected last dim 8"),
        (np.zeros((16, 8), np.float32), "expected horizon 24"),
        (np.zeros((0, 8), np.float32), "at least one row"),
        (np.full((24, 8), np.inf, np.float32), "expected finite values"),
        (np.array([["a"] * 8] * 24), "expected a numeric dtype"),
        ({"status": "ok"}, "expected an action array or a map with 'actions'"),
        ("just text", "expected a numeric 2-D array"),
    ],
)
def test_infer_response_errors(payload, pattern):
    with pytest.raises(ProtocolError, match=pattern):
        parse_infer_response(packb(payload), horizon=24)


def test_infer_response_server_errors():
    with pytest.raises(ServerError) as info:
        parse_infer_response(encode_error("Internal inference error"))
    assert not info.value.fatal and "Internal inference error" in str(info.value)
    tb = "Traceback (most recent call last):\n  File x\nKeyError: 'endpoint'\n"
    with pytest.raises(ServerError) as info:
        parse_infer_response(tb)
    assert info.value.fatal and str(info.value) == "server error: KeyError: 'endpoint'"
    assert info.value.message == tb


def test_reset_response_both_forms():
    assert parse_reset_response("reset successful") == "reset successful"
    assert parse_reset_response(encode_reset_reply()) == "reset successful"
    with pytest.raises(ServerError) as info:
        parse_reset_response("Traceback ...\nRuntimeError: boom")
    assert info.value.fatal
    with pytest.raises(ServerError):
        parse_reset_response(encode_error("Invalid request payload"))
    with pytest.raises(ProtocolError, match="reset reply"):
        parse_reset_response(packb({"x": 1}))


def test_server_side_request_parsing():
    req = build_infer_request(
        images=_images(), joint_position=np.zeros(7), gripper_position=[0.0], prompt="p", session_id="s"
    )
    decoded = parse_request(packb(req))
    assert decoded["endpoint"] == "infer" and decoded["observation/joint_position"].shape == (7,)
    with pytest.raises(ProtocolError, match="request: expected a map"):
        parse_request(packb([1]))
    with pytest.raises(ProtocolError, match="request: expected string keys"):
        parse_request(packb({b"k": 1}))
    with pytest.raises(ProtocolError, match="exceeds the limit"):
        parse_request(packb(req), max_bytes=1000)
    assert unpackb(encode_error("m")) == {"type": "error", "message": "m"}
