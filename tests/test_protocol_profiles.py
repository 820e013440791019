"""Server profiles: detection from the handshake, the override, requests per profile (byte for byte for the
DreamZero family), the reply and error shapes of every server, the composite, and the docs table."""

import hashlib
from pathlib import Path

import numpy as np
import pytest

from dz_gym.errors import HandshakeError, ProtocolError, ServerError
from dz_gym.preprocess import resize_with_pad
from dz_gym.protocol import DREAMZERO_METADATA, build_infer_request, packb, parse_infer_response, parse_request
from dz_gym.protocol.composite import compose_views, halve, split_composite
from dz_gym.protocol.observation import request_profile, request_proprio, request_views
from dz_gym.protocol.profiles import PROFILES, SERVER_KINDS, chunk_rows, detect_profile, markdown_table, profile_named
from dz_gym.requests import build_requests
from dz_gym.server.flux import bfl_handshake, sglang_handshake

DOCS = Path(__file__).resolve().parents[1] / "docs" / "server_profiles.md"
VLLM_URL = "ws://127.0.0.1:8000/v1/realtime/robot/openpi"

# sha256 of the frames dz-gym built before server profiles existed (the same batch as _batch below):
# env 0's and env 2's request, packed as a dict and framed from the batch's template.
GOLDEN = {
    0: "368c8427d29e275ab3883c19aca94e4f01bd00454c5a9437775da174c0d22ee1",
    2: "8bdecc236dc3afececd7d13d7e52e2a45835c57102622e26cf52cfcd38a21a32",
}


def _policy_obs(n=3, shape=(36, 64)):
    rng = np.random.default_rng(7)
    return {
        "external_cam": rng.integers(0, 256, (n, *shape, 3), dtype=np.uint8),
        "external_cam_2": rng.integers(0, 256, (n, *shape, 3), dtype=np.uint8),
        "wrist_cam": rng.integers(0, 256, (n, *shape, 3), dtype=np.uint8),
        "arm_joint_pos": rng.normal(size=(n, 7)).astype(np.float32),
        "gripper_pos": rng.random((n, 1)).astype(np.float32),
    }


def _batch(profile=None, resolution=(18, 32), shape=(36, 64)):
    return build_requests(_policy_obs(shape=shape), [0, 2], prompts=["put the cube in the bowl"] * 3,
                          session_ids=["s-0", "s-1", "s-2"], image_resolution=resolution, profile=profile)  # fmt: skip


# ------------------------------------------------------------------------------------------ detection
@pytest.mark.parametrize(
    ("raw", "url", "name"),
    [
        (bfl_handshake(), "ws://h:8000", "flux3-bfl"),
        (sglang_handshake(), "ws://h:30000/openpi/policy", "sglang"),
        ({"policy_family": "flux3_action"}, "ws://h", "sglang"),
        ({"output": {"action_horizon": 32, "action_dim": 8}}, "ws://h", "sglang"),
        (DREAMZERO_METADATA, "ws://h:5000", "dreamzero"),
        (DREAMZERO_METADATA, VLLM_URL, "vllm-omni"),
        (DREAMZERO_METADATA, VLLM_URL + "/", "vllm-omni"),
        ({"action_horizon": 24, "max_sessions": 4}, VLLM_URL, "vllm-omni"),
        ({}, "ws://h:8000", "openpi"),
    ],
)
def test_the_profile_is_chosen_from_the_handshake(raw, url, name):
    assert detect_profile(raw, url=url).name == name


def test_server_kind_overrides_the_handshake_and_auto_detects():
    assert detect_profile({"anything": 1}, url="ws://h", server_kind="openpi").name == "openpi"
    assert detect_profile(DREAMZERO_METADATA, server_kind="sglang").name == "sglang"
    assert detect_profile(bfl_handshake(), server_kind="auto").name == "flux3-bfl"
    assert SERVER_KINDS == ("auto", "dreamzero", "openpi", "vllm-omni", "flux3-bfl", "sglang")
    with pytest.raises(ValueError, match=r"^--server-kind: expected one of auto, dreamzero, .*got 'flux'$"):
        profile_named("flux")


@pytest.mark.parametrize(("raw", "sent"), [({"policy": "mine", "b": 2}, "keys ['b', 'policy']"), ([1, 2], "a list")])
def test_a_handshake_of_no_profile_is_one_line_naming_what_it_sent(raw, sent):
    with pytest.raises(HandshakeError) as caught:
        detect_profile(raw, url="ws://gpu:9000")
    text = str(caught.value)
    assert "\n" not in text and "server ws://gpu:9000" in text and sent in text
    assert "--server-kind dreamzero|openpi|vllm-omni|flux3-bfl|sglang" in text


def test_chunk_rows_come_from_the_profile_or_sglangs_output():
    assert chunk_rows(PROFILES["flux3-bfl"], bfl_handshake()) == 32
    assert chunk_rows(PROFILES["sglang"], {**sglang_handshake(), "output": {"action_horizon": 16}}) == 16
    assert chunk_rows(PROFILES["sglang"], {}) == 32
    assert [chunk_rows(PROFILES[n], DREAMZERO_METADATA) for n in ("dreamzero", "openpi", "vllm-omni")] == [None] * 3


def test_declared_fields_the_simulators_read():
    flux = PROFILES["flux3-bfl"]
    assert (flux.image_resolution, flux.render_resolution, flux.layout, flux.composite) == ((360, 640),) * 2 + (
        "composite",
        True,
    )
    assert (flux.chunk_shape, flux.executed_actions, flux.supports_reset, flux.seed_key) == ((32, 8), 32, False, None)
    sglang = PROFILES["sglang"]
    assert (sglang.layout, sglang.seed_key, sglang.supports_reset, sglang.url_path) == (
        "views", "seed", False, "/openpi/policy")  # fmt: skip
    dz = PROFILES["dreamzero"]
    assert (dz.image_resolution, dz.chunk_shape, dz.executed_actions, dz.layout) == (None, (24, 8), 8, "views")
    assert PROFILES["vllm-omni"].url_path == "/v1/realtime/robot/openpi" and PROFILES["vllm-omni"].seed_key == "seed"
    with pytest.raises(ValueError, match="layout"):
        dz.with_layout("composite")
    assert PROFILES["sglang"].with_layout("composite").image_request_keys == ("observation.images.composite",)


# ------------------------------------------------------------------------------------------ requests
@pytest.mark.parametrize("name", [None, "dreamzero", "openpi", "vllm-omni"])
def test_dreamzero_family_requests_are_byte_for_byte_what_they_were(name):
    batch = _batch(None if name is None else PROFILES[name])
    for env_id, digest in GOLDEN.items():
        assert hashlib.sha256(packb(batch[env_id])).hexdigest() == digest
        assert hashlib.sha256(batch.frame(env_id)).hexdigest() == digest  # the fast framing


def test_bfl_requests_send_a_composite_slash_keys_and_no_endpoint():
    batch = _batch(PROFILES["flux3-bfl"], resolution=(360, 640), shape=(180, 320))
    request = batch[0]
    assert list(request) == ["observation/image", "observation/joint_position", "observation/gripper_position",
                             "prompt", "session_id"]  # fmt: skip
    assert request["observation/image"].shape == (540, 640, 3)
    assert request["observation/joint_position"].dtype == np.float32 and request[
        "observation/gripper_position"
    ].shape == (1,)
    assert packb(request) == batch.frame(0) and packb(batch[2]) == batch.frame(2)
    assert batch.array_bytes() == 2 * 540 * 640 * 3 + 2 * 8 * 4
    wrist, left, right = split_composite(request["observation/image"])
    obs = _policy_obs(shape=(180, 320))
    assert left.shape == (180, 320, 3)
    assert np.array_equal(wrist, resize_with_pad(obs["wrist_cam"][:1], 360, 640)[0])  # the wrist view, resized
    assert np.array_equal(left, halve(resize_with_pad(obs["external_cam"][:1], 360, 640)[0]))


def test_sglang_requests_send_dot_key_views_and_one_state():
    batch = _batch(PROFILES["sglang"], resolution=(360, 640), shape=(180, 320))
    request = batch[2]
    assert list(request) == ["observation.images.left", "observation.images.right", "observation.images.wrist",
                             "state", "prompt", "session_id"]  # fmt: skip
    obs = _policy_obs(shape=(180, 320))
    assert np.array_equal(request["state"], np.concatenate([obs["arm_joint_pos"][2], obs["gripper_pos"][2]]))
    assert request["state"].dtype == np.float32 and request["observation.images.wrist"].shape == (360, 640, 3)
    assert packb(request) == batch.frame(2)


def test_build_infer_request_follows_the_profile_and_its_reserved_keys():
    images = {"observation.images.wrist": np.zeros((2, 2, 3), np.uint8)}
    request = build_infer_request(images=images, joint_position=np.zeros(7), gripper_position=[1.0], prompt="p",
                                  session_id=None, profile=PROFILES["sglang"])  # fmt: skip
    assert set(request) == {"observation.images.wrist", "state", "prompt"} and request["state"][-1] == 1.0
    from dz_gym.errors import InvalidRequest

    with pytest.raises(InvalidRequest, match="reserved"):
        build_infer_request(images={"state": np.zeros((2, 2, 3), np.uint8)}, joint_position=np.zeros(7),
                            gripper_position=[0], prompt="p", session_id=None, profile=PROFILES["sglang"])  # fmt: skip


# ------------------------------------------------------------------------------------------ replies
def test_every_servers_reply_shape_parses_and_a_batch_of_one_is_squeezed():
    chunk = np.arange(32 * 8, dtype=np.float32).reshape(32, 8)
    bare = parse_infer_response(packb(chunk))
    bfl = parse_infer_response(packb({"action": chunk, "server_timing": {"infer_ms": 1.0}}))
    sglang = parse_infer_response(packb({"request_id": "r", "actions": chunk[None], "timings": {}}))
    for reply in (bare, bfl, sglang):
        assert np.array_equal(reply.actions, chunk) and reply.actions.flags.writeable
    assert bfl.server_timing == {"infer_ms": 1.0} and sglang.extra["request_id"] == "r"
    with pytest.raises(ProtocolError, match="'actions' or 'action'"):
        parse_infer_response(packb({"result": chunk}))


def test_every_servers_error_frame_says_whether_the_connection_is_over():
    text = "Traceback (most recent call last):\n  ...\nKeyError: 'observation/wrist_image_left'"
    with pytest.raises(ServerError) as caught:
        parse_infer_response(text)  # openpi, DreamZero, BFL: then close 1011
    assert caught.value.fatal and "KeyError" in str(caught.value) and "\n" not in str(caught.value)
    with pytest.raises(ServerError) as caught:
        parse_infer_response(packb({"error": text}))  # SGLang: then close 1011
    assert caught.value.fatal and "KeyError" in str(caught.value)
    with pytest.raises(ServerError) as caught:
        parse_infer_response(packb({"type": "error", "message": "Internal inference error"}))  # vLLM-Omni
    assert not caught.value.fatal


# ------------------------------------------------------------------------------------------ composite
def test_the_composite_is_the_wrist_over_the_halved_exteriors_and_splits_back():
    rng = np.random.default_rng(1)
    wrist, left, right = (rng.integers(0, 256, (360, 640, 3), dtype=np.uint8) for _ in range(3))
    composite = compose_views(wrist, left, right)
    assert composite.shape == (540, 640, 3)
    top, bottom_left, bottom_right = split_composite(composite)
    assert np.array_equal(top, wrist) and np.array_equal(bottom_left, halve(left))
    block = left[:2, :2].astype(int).sum(axis=(0, 1)) // 4
    assert np.array_equal(bottom_left[0, 0], block) and np.array_equal(bottom_right, halve(right))
    with pytest.raises(ValueError, match="wrist view"):
        compose_views(wrist[:180], left, right)


def test_requests_of_any_profile_read_back_as_views_and_proprio():
    for name, count in (("dreamzero", 3), ("flux3-bfl", 1), ("sglang", 3)):
        profile = PROFILES[name]
        batch = _batch(profile, resolution=(360, 640), shape=(180, 320))
        request = parse_request(batch.frame(0))
        assert request_profile(request).name == name
        assert sum(key in request for key in profile.image_request_keys) == count
        views = request_views(request, profile)
        assert views["wrist_cam"].shape == (360, 640, 3)
        joints, gripper = request_proprio(request, profile)
        obs = _policy_obs(shape=(180, 320))
        assert np.allclose(joints, obs["arm_joint_pos"][0]) and np.isclose(gripper, obs["gripper_pos"][0, 0])


# ------------------------------------------------------------------------------------------ docs
def test_the_docs_table_is_generated_from_the_profiles():
    table = markdown_table()
    assert table in DOCS.read_text()
    lines = table.splitlines()
    assert lines[0] == "| server | handshake | keys | chunk | executed | reset | errors |"
    assert len(lines) == 2 + len(PROFILES) and "32 of 32" in table and "8 of 24" in table


@pytest.mark.parametrize("name", ["flux3-bfl", "sglang", "dreamzero"])
def test_profiled_requests_follow_the_server_profile(name):
    """``--profile`` times the same requests the wrapper sends: the server's keys, not DreamZero's."""
    from dz_gym.profile_hooks import timed_requests
    from dz_gym.profiling import StageProfiler

    profile = PROFILES[name]
    timed = timed_requests(StageProfiler(), _policy_obs(shape=(360, 640)), [0, 2], prompts=["put the cube in the bowl"] * 3,
                           session_ids=["s-0", "s-1", "s-2"], image_resolution=profile.image_resolution,
                           image_keys=None, profile=profile)  # fmt: skip
    plain = _batch(profile, resolution=profile.image_resolution, shape=(360, 640))
    for i in (0, 2):
        assert sorted(timed[i]) == sorted(plain[i])
        for key in plain[i]:
            assert np.array_equal(np.asarray(timed[i][key]), np.asarray(plain[i][key])), key
