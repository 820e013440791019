"""The reference server's FLUX flavors (``flux3-bfl``, ``sglang``), driven by a plain websockets client.

Every server binds 127.0.0.1 on a free port and is stopped by its context manager; every receive has a bound.
"""

from __future__ import annotations

import contextlib
import http.client

import numpy as np
import pytest
from websockets.exceptions import ConnectionClosedError
from websockets.sync.client import connect

from dz_gym.protocol import build_infer_request, build_reset_request, packb, parse_infer_response, unpackb
from dz_gym.protocol.profiles import PROFILES, detect_profile
from dz_gym.server import start_server_thread
from dz_gym.server.flux import bfl_observation, sglang_observation

RECV_S = 10.0
BFL, SGLANG = PROFILES["flux3-bfl"], PROFILES["sglang"]


def _views(shape=(360, 640)):
    rng = np.random.default_rng(0)
    return {
        c: rng.integers(0, 256, (*shape, 3), dtype=np.uint8) for c in ("external_cam", "external_cam_2", "wrist_cam")
    }


def _request(profile, *, shape=(360, 640), composite=False, extra=None) -> dict:
    views = _views(shape)
    if composite:
        from dz_gym.bench.payloads import profile_images

        images = profile_images(profile.with_layout("composite"), (views["external_cam"], views["external_cam_2"],
                                                                   views["wrist_cam"]))  # fmt: skip
    else:
        images = {key: views[camera] for camera, key in profile.image_keys}
    return build_infer_request(images=images, joint_position=np.arange(7) / 10, gripper_position=[1.0],
                               prompt="put the cube in the bowl", session_id="episode-1", profile=profile,
                               extra=extra)  # fmt: skip


@contextlib.contextmanager
def _open(url: str):
    with connect(url, open_timeout=RECV_S, max_size=None, compression=None) as ws:
        yield ws, ws.recv(RECV_S)


def _closed_with(ws) -> int:
    with pytest.raises(ConnectionClosedError) as closed:
        ws.recv(RECV_S)
    return closed.value.rcvd.code


@pytest.mark.parametrize("composite", [False, True])
def test_bfl_serves_the_root_path_with_its_handshake_and_action_replies(composite):
    with start_server_thread("hold", flavor="flux3-bfl") as server, _open(server.url) as (ws, first):
        meta = unpackb(first)
        assert set(meta) == {"serving_setup"} and detect_profile(meta, url=server.url).name == "flux3-bfl"
        for _ in range(2):
            ws.send(packb(_request(BFL, composite=composite)))
            reply = unpackb(ws.recv(RECV_S))
            assert set(reply) == {"action", "server_timing"} and reply["action"].shape == (32, 8)
            assert reply["action"].dtype == np.float32 and np.allclose(reply["action"][:, :7], np.arange(7) / 10)
        assert set(reply["server_timing"]) == {"infer_ms", "prev_total_ms"}


@pytest.mark.parametrize(
    ("request_of", "words"),
    [
        (lambda: build_reset_request("episode-1"), "KeyError"),  # a reset frame: no images
        (lambda: _request(BFL, shape=(180, 320)), "Error"),  # DreamZero-sized views: not 540x640 once composed
        (lambda: _request(PROFILES["dreamzero"], shape=(360, 640)), "KeyError"),  # no exterior_image_2_left
    ],
)
def test_bfl_answers_a_bad_frame_with_a_text_traceback_then_1011(request_of, words):
    with start_server_thread("hold", flavor="flux3-bfl") as server, _open(server.url) as (ws, _):
        ws.send(packb(request_of()))
        text = ws.recv(RECV_S)
        assert isinstance(text, str) and "Traceback" in text and words in text
        assert _closed_with(ws) == 1011


def test_bfl_seeds_count_queries_across_connections():
    with start_server_thread("hold", flavor="flux3-bfl") as server:
        with _open(server.url) as (a, _), _open(server.url) as (b, _):
            for ws in (a, b, a):
                ws.send(packb(_request(BFL, extra={"seed": 99})))  # requests cannot set it
                parse_infer_response(ws.recv(RECV_S))
        assert server.server.seeds == [0, 1, 2]


@pytest.mark.parametrize("composite", [False, True])
def test_sglang_serves_its_route_with_action_metadata_and_actions_replies(composite):
    with start_server_thread("hold", flavor="sglang") as server, _open(server.url + SGLANG.url_path) as (ws, first):
        meta = unpackb(first)
        assert meta["policy_family"] == "flux3_action" and meta["output"]["action_horizon"] == 32
        assert detect_profile(meta).name == "sglang"
        ws.send(packb(_request(SGLANG, composite=composite)))
        reply = unpackb(ws.recv(RECV_S))
        assert {"request_id", "actions", "parameters", "timings", "cache", "server_timing"} <= set(reply)
        assert reply["actions"].shape == (32, 8) and np.allclose(reply["actions"][:, :7], np.arange(7) / 10)
        ws.send(packb(_request(SGLANG, extra={"seed": 5})))
        parse_infer_response(ws.recv(RECV_S))
        assert server.server.seeds == [0, 5]  # 0 on every request that sends none


def test_sglang_has_no_other_route():
    with start_server_thread("hold", flavor="sglang") as server:
        connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=RECV_S)
        try:
            connection.request("GET", "/v1/realtime/robot/openpi")
            assert connection.getresponse().status == 404
        finally:
            connection.close()


@pytest.mark.parametrize(
    ("request_of", "words"),
    [
        (lambda: _request(SGLANG, shape=(180, 320)), "expected 360x640"),
        (lambda: _request(BFL), "missing images"),  # slash keys are not read
        (lambda: build_reset_request("episode-1"), "missing images"),
    ],
)
def test_sglang_answers_a_bad_frame_with_a_binary_error_then_1011(request_of, words):
    with start_server_thread("hold", flavor="sglang") as server, _open(server.url + SGLANG.url_path) as (ws, _):
        ws.send(packb(request_of()))
        frame = ws.recv(RECV_S)
        assert isinstance(frame, bytes)
        error = unpackb(frame)
        assert set(error) == {"error"} and "Traceback" in error["error"] and words in error["error"]
        assert _closed_with(ws) == 1011


@pytest.mark.parametrize("flavor", ["flux3-bfl", "sglang"])
def test_an_injected_failure_is_the_flavors_error_frame_and_close(flavor):
    profile = PROFILES[flavor]
    with start_server_thread("hold", flavor=flavor, fail_every=2) as server:
        with _open(server.url + profile.url_path) as (ws, _):
            ws.send(packb(_request(profile)))
            assert parse_infer_response(ws.recv(RECV_S)).actions.shape == (32, 8)
            ws.send(packb(_request(profile)))
            frame = ws.recv(RECV_S)
            assert isinstance(frame, str if flavor == "flux3-bfl" else bytes) and "InjectedFailure" in str(
                frame if isinstance(frame, str) else unpackb(frame)
            )
            assert _closed_with(ws) == 1011


def test_the_observation_readers_validate_as_the_real_servers():
    views = _views()
    floats = {f"observation.images.{n}": v.astype(np.float32) / 255 for n, v in
              zip(("left", "right", "wrist"), views.values())}  # fmt: skip
    read = sglang_observation({**floats, "observation.state": np.zeros(8), "task": "t"})
    assert read["prompt"] == "t" and read["observation.images.composite"].shape == (540, 640, 3)
    aliases = {f"observation.images.{n}": v for n, v in
               zip(("exterior_image_1_left", "exterior_image_2_left", "wrist_image_left"), views.values())}  # fmt: skip
    assert np.array_equal(sglang_observation({**aliases, "state": np.zeros(8)})["observation.images.composite"],
                          read["observation.images.composite"])  # fmt: skip
    with pytest.raises(ValueError, match="finite"):
        sglang_observation({**aliases, "state": np.full(8, np.nan)})
    bfl = bfl_observation({**{key: views[c] for c, key in BFL.image_keys}, BFL.joint_key: np.zeros((3, 7)),
                           BFL.gripper_key: 0.5})  # fmt: skip
    assert bfl["prompt"] == "" and bfl[BFL.gripper_key].tolist() == [0.5] and bfl[BFL.joint_key].shape == (7,)
    with pytest.raises(AssertionError):
        bfl_observation({BFL.composite_key: np.zeros((360, 640, 3), np.uint8), BFL.joint_key: np.zeros(7),
                         BFL.gripper_key: 0.0})  # fmt: skip
