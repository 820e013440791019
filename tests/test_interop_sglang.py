"""SGLang 0.5.23's real ``/openpi/policy`` route (PyPI wheel, its FastAPI router under uvicorn) on loopback,
driven by a raw websockets client: the ``action.metadata`` handshake, dot keys in, ``actions`` out, and a bad
request answered by a binary ``{"error"}`` frame and close 1011. The model is stood in for by dz-gym's
reference policy (:mod:`dz_gym.testing.sglang_real` says what is stood in for and why)."""

from __future__ import annotations

import numpy as np
import pytest

from dz_gym.protocol.codec import packb, unpackb

sglang_real = pytest.importorskip("dz_gym.testing.sglang_real")
if sglang_real.installed_version() != sglang_real.SGLANG_VERSION:
    pytest.skip(f"needs sglang=={sglang_real.SGLANG_VERSION} (installed --no-deps)", allow_module_level=True)
pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")

from websockets.exceptions import ConnectionClosed  # noqa: E402
from websockets.sync.client import connect  # noqa: E402

pytestmark = pytest.mark.timeout(120)
BOUND_S = 30.0


@pytest.fixture(scope="module")
def views():
    """The embedded scene 1's views at FLUX's 360x640, and its joints and gripper."""
    from dz_gym.envs import droid
    from dz_gym.envs.mujoco.env import make_env

    env = make_env(scene=1, num_envs=1, seed=3, image_shape=sglang_real.VIEW_SHAPE, num_workers=0)
    try:
        obs, _ = env.reset(seed=3)
        policy = obs[droid.POLICY_GROUP]
        out = {k: np.asarray(policy[k])[0] for k in (*droid.CAMERA_KEYS, droid.OBS_JOINT_KEY, droid.OBS_GRIPPER_KEY)}
    finally:
        env.close()
    return out


@pytest.fixture
def server():
    with sglang_real.serve() as running:
        yield running


def request(views, **extra):
    from dz_gym.envs import droid

    state = np.concatenate([views[droid.OBS_JOINT_KEY], np.reshape(views[droid.OBS_GRIPPER_KEY], -1)[:1]])
    return {
        "observation.images.wrist": views["wrist_cam"],
        "observation.images.left": views["external_cam"],
        "observation.images.right": views["external_cam_2"],
        "state": state.astype(np.float32),
        "prompt": "put the cube in the bowl",
        "session_id": "episode-0",
        **extra,
    }


def test_the_real_route_answers_dot_keys_with_a_32_row_chunk(server, views):
    with connect(server.url, open_timeout=BOUND_S, max_size=None) as ws:
        metadata = unpackb(ws.recv(timeout=BOUND_S))
        assert metadata["object"] == "action.metadata" and metadata["policy_family"] == "flux3_action"
        assert metadata["input"]["image_keys"] == ["wrist", "left", "right"]
        assert metadata["output"]["action_horizon"] == 32 and metadata["output"]["action_dim"] == 8
        assert "policy_server_config" not in metadata

        ws.send(packb(request(views, seed=7)))
        reply = ws.recv(timeout=BOUND_S)
        assert isinstance(reply, bytes)
        reply = unpackb(reply)
        actions = reply["actions"]
        assert actions.dtype == np.float32 and actions.shape == (32, 8) and np.isfinite(actions).all()
        assert reply["server_timing"]["infer_ms"] >= 0 and reply["parameters"]["num_inference_steps"] == 4
        assert "action" not in reply  # SGLang's key is the plural one

        ws.send(packb(request(views, action_horizon=16)))  # a shorter chunk, on request; prev_total_ms now
        reply = unpackb(ws.recv(timeout=BOUND_S))
        assert reply["actions"].shape == (16, 8) and reply["server_timing"]["prev_total_ms"] > 0


@pytest.mark.parametrize(
    "bad, says",
    [
        ({"state": np.zeros(7, dtype=np.float32)}, "state must be 8 finite values"),
        ({"observation.images.wrist": np.zeros((180, 320, 3), dtype=np.uint8)}, "360x640"),
        ({"action_horizon": 33}, "action_horizon 33 exceeds the policy chunk 32"),
    ],
)
def test_a_bad_request_gets_a_binary_error_frame_then_close_1011(server, views, bad, says):
    with connect(server.url, open_timeout=BOUND_S, max_size=None) as ws:
        unpackb(ws.recv(timeout=BOUND_S))
        ws.send(packb(request(views, **bad)))
        frame = ws.recv(timeout=BOUND_S)
        assert isinstance(frame, bytes)  # binary msgpack, not openpi's text traceback
        error = unpackb(frame)
        assert set(error) == {"error"} and says in error["error"] and "Traceback" in error["error"]
        with pytest.raises(ConnectionClosed) as closed:
            ws.recv(timeout=BOUND_S)
        assert closed.value.rcvd.code == 1011


def test_an_injected_failure_closes_only_its_connection(views):
    with sglang_real.serve(sglang_real.ReferencePipeline(fail_every=2)) as running:
        with (
            connect(running.url, open_timeout=BOUND_S, max_size=None) as a,
            connect(running.url, open_timeout=BOUND_S, max_size=None) as b,
        ):
            unpackb(a.recv(timeout=BOUND_S)), unpackb(b.recv(timeout=BOUND_S))
            a.send(packb(request(views, seed=1)))
            assert unpackb(a.recv(timeout=BOUND_S))["actions"].shape == (32, 8)  # call 1
            b.send(packb(request(views, seed=2)))
            assert "injected failure of call 2" in unpackb(b.recv(timeout=BOUND_S))["error"]
            with pytest.raises(ConnectionClosed):
                b.recv(timeout=BOUND_S)
            a.send(packb(request(views, seed=1)))  # the other connection is untouched
            assert unpackb(a.recv(timeout=BOUND_S))["actions"].shape == (32, 8)
        assert running.pipeline.calls == 3
        with pytest.raises(RuntimeError, match="already runs"), sglang_real.serve():
            pass


def test_slash_keys_are_not_read(server, views):
    """SGLang reads dot keys only: the reference client's slash keys leave the cameras missing."""
    from dz_gym.envs import droid

    slash = {droid.REQUEST_IMAGE_KEYS[k]: views[k] for k in droid.CAMERA_KEYS}
    body = {**slash, "state": request(views)["state"], "prompt": "put the cube in the bowl"}
    with connect(server.url, open_timeout=BOUND_S, max_size=None) as ws:
        unpackb(ws.recv(timeout=BOUND_S))
        ws.send(packb(body))
        assert "observation lacks cameras" in unpackb(ws.recv(timeout=BOUND_S))["error"]
