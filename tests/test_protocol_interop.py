"""Wire compatibility with the PyPI ``openpi-client`` codec (both directions, byte-identical requests)."""

from __future__ import annotations

import uuid

import numpy as np
import pytest

from dz_gym.protocol import build_infer_request, packb, parse_infer_response, unpackb

msgpack_numpy = pytest.importorskip("openpi_client.msgpack_numpy")


def _request():
    rng = np.random.default_rng(1)
    images = {
        key: rng.integers(0, 256, (180, 320, 3), dtype=np.uint8)
        for key in (
            "observation/exterior_image_0_left",
            "observation/exterior_image_1_left",
            "observation/wrist_image_left",
        )
    }
    return build_infer_request(
        images=images,
        joint_position=rng.normal(size=7),
        gripper_position=[0.2],
        prompt="put the cube in the bowl",
        session_id=str(uuid.uuid4()),
    )


def test_dreamzero_request_is_byte_identical_to_openpi_client():
    req = _request()
    ours = packb(req)
    assert ours == msgpack_numpy.packb(req)
    assert 510_000 < len(ours) < 530_000  # ~519 KB, as measured on the real protocol


def test_openpi_decodes_ours_and_we_decode_openpi():
    req = _request()
    theirs = msgpack_numpy.unpackb(packb(req))
    back = unpackb(msgpack_numpy.packb(req))
    for key, value in req.items():
        if isinstance(value, np.ndarray):
            np.testing.assert_array_equal(theirs[key], value)
            np.testing.assert_array_equal(back[key], value)
            assert theirs[key].dtype == back[key].dtype == value.dtype
        else:
            assert theirs[key] == back[key] == value


@pytest.mark.parametrize(
    "value",
    [
        np.arange(24 * 8, dtype=np.float32).reshape(24, 8),
        np.arange(12.0).reshape(3, 4)[:, ::2],
        np.array(7, dtype=np.int16),
        np.array(["a", "bc"]),
        np.array([True, False]),
        np.float32(2.5),
        np.int64(-4),
        {"actions": np.ones((24, 8)), "server_timing": {"infer_ms": 1.0}},
    ],
)
def test_values_are_byte_identical_and_cross_decode(value):
    assert packb(value) == msgpack_numpy.packb(value)
    ours = unpackb(msgpack_numpy.packb(value))
    theirs = msgpack_numpy.unpackb(packb(value))
    if isinstance(value, dict):
        np.testing.assert_array_equal(ours["actions"], theirs["actions"])
    else:
        np.testing.assert_array_equal(ours, theirs)
        assert type(ours) is type(theirs)


def test_openpi_encoded_bare_reply_parses():
    chunk = np.random.default_rng(2).normal(size=(24, 8)).astype(np.float32)
    reply = parse_infer_response(msgpack_numpy.packb(chunk), horizon=24)
    np.testing.assert_array_equal(reply.actions, chunk)


def test_both_refuse_complex():
    from dz_gym.errors import ProtocolError

    with pytest.raises(ValueError):
        msgpack_numpy.packb(np.zeros(2, complex))
    with pytest.raises(ProtocolError):
        packb(np.zeros(2, complex))


# ------------------------------------------------------------------------------------------- openpi-server
class _DummyPolicy:
    """An openpi-style policy: dict in, dict out; raises when asked to."""

    def infer(self, obs):
        if obs.get("boom"):
            raise ValueError("dummy policy failure")
        return {"actions": np.full((10, 8), 0.5, np.float32)}

    def reset(self):
        pass


def test_our_parsers_read_the_real_openpi_server():
    """openpi-server's own handler (served on a free loopback port): metadata, dict replies, fatal errors."""
    import asyncio
    import threading

    server_mod = pytest.importorskip("openpi_server.websocket_policy_server")
    from websockets.asyncio.server import serve
    from websockets.exceptions import ConnectionClosedError
    from websockets.sync.client import connect

    from dz_gym.errors import ServerError
    from dz_gym.protocol import parse_metadata

    policy_server = server_mod.WebsocketPolicyServer(_DummyPolicy(), host="127.0.0.1", port=0, metadata={"m": 1})
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()

    async def start():
        return await serve(
            policy_server._handler,
            "127.0.0.1",
            0,
            compression=None,
            max_size=None,
            process_request=server_mod._health_check,
        )

    server = asyncio.run_coroutine_threadsafe(start(), loop).result(10)
    port = server.sockets[0].getsockname()[1]
    try:
        with connect(f"ws://127.0.0.1:{port}", max_size=None, open_timeout=10) as ws:
            assert parse_metadata(ws.recv(10)).raw == {"m": 1}
            ws.send(packb(_request()))
            reply = parse_infer_response(ws.recv(10), horizon=10)
            assert np.all(reply.actions == 0.5) and "infer_ms" in reply.server_timing
            ws.send(packb({**_request(), "boom": True}))
            with pytest.raises(ServerError) as info:
                parse_infer_response(ws.recv(10))
            assert info.value.fatal and "dummy policy failure" in str(info.value)
            with pytest.raises(ConnectionClosedError) as closed:
                ws.recv(10)
            assert closed.value.rcvd.code == 1011
    finally:

        async def stop():
            server.close()
            await server.wait_closed()

        asyncio.run_coroutine_threadsafe(stop(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()
