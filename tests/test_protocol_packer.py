"""The fast encoder behind ``packb``: byte-identical to msgpack's general path, one buffer, same refusals.

Every case compares ``packb`` (the fast path where it applies) with ``codec._packb_general`` (``msgpack.packb``
with the marker hook, the encoder before the fast path) and, where openpi-client is installed, with its
``msgpack_numpy.packb``; both decoders must read the result. No speed is asserted: the one-copy claim is
checked on the bytes allocated while encoding (tracemalloc's peak), which does not depend on the machine.
"""

from __future__ import annotations

import tracemalloc
from collections import OrderedDict

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from dz_gym.errors import ProtocolError
from dz_gym.protocol import build_infer_request, codec, packb, unpackb
from dz_gym.protocol.packer import MAX_FAST_DEPTH, pack_fast

try:
    from openpi_client import msgpack_numpy
except ImportError:  # the openpi comparison is skipped; ours still is
    msgpack_numpy = None

DTYPES = ["|b1", "|i1", "<i2", "<i4", "<i8", "|u1", "<u2", "<u4", "<u8", "<f2", "<f4", "<f8", ">i4", ">f8", ">u2",
          "<U1", "<U3", "|S4", "<g"]  # fmt: skip
SHAPES = [(), (0,), (1,), (5,), (2, 3), (2, 0, 4), (1, 2, 3, 4), (180, 320, 3), (1,) * 20, (70000,)]
INT_EDGES = [0, 1, 127, 128, 255, 256, 65535, 65536, 2**32 - 1, 2**32, 2**63 - 1, 2**63, 2**64 - 1,
             -1, -32, -33, -128, -129, -32768, -32769, -(2**31), -(2**31) - 1, -(2**63)]  # fmt: skip
LENGTHS = [0, 1, 15, 16, 31, 32, 255, 256, 65535, 65536]


def assert_same(value) -> bytes:
    """packb(value) equals the general path's bytes (and openpi-client's); returns them."""
    ours = packb(value)
    assert type(ours) is bytes
    assert ours == codec._packb_general(value)
    if msgpack_numpy is not None:
        assert ours == msgpack_numpy.packb(value)
    return ours


def assert_fast(value) -> bytes:
    """``value`` takes the fast path, with the general path's bytes."""
    assert pack_fast(value) is not None, value
    return assert_same(value)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
def test_arrays_of_every_dtype_and_shape(dtype, shape):
    a = np.asarray(np.random.default_rng(0).integers(0, 100, size=shape)).astype(dtype)
    frame = assert_fast({"x": a, "y": [a, (a,)]})
    out = unpackb(frame)
    np.testing.assert_array_equal(out["x"], a)
    assert out["x"].dtype == a.dtype and out["y"][1][0].shape == a.shape


def test_non_contiguous_fortran_reversed_and_broadcast_arrays():
    base = np.arange(2 * 180 * 320 * 3, dtype=np.uint8).reshape(2, 180, 320, 3)
    views = [base[0], base[1, :, :, ::-1], base[:, ::2], base[0].T, np.asfortranarray(base[0]), base[0, :, :, :1],
             np.broadcast_to(np.float32(3), (4, 5)), base[0, :1, :, :].reshape(1, 960)[:, ::3]]  # fmt: skip
    for view in views:
        frame = assert_fast({"observation/image": view})
        np.testing.assert_array_equal(unpackb(frame)["observation/image"], view)


def test_numpy_scalars_and_python_scalar_subclasses():
    scalars = [np.bool_(True), np.bool_(False), np.int8(-5), np.int16(300), np.int32(-70000), np.int64(2**40),
               np.uint8(200), np.uint16(65535), np.uint32(2**32 - 1), np.uint64(2**64 - 1), np.float16(1.5),
               np.float32(-0.25), np.float64(np.pi), np.str_("héllo"), np.bytes_(b"\x00\xff")]  # fmt: skip
    for value in scalars:
        assert_fast({"v": value, "l": [value]})
    assert unpackb(packb({"v": np.int16(300)}))["v"] == np.int16(300)


def test_plain_values_at_every_format_boundary():
    assert_fast(INT_EDGES)
    assert_fast([0.0, -0.0, 1.5, float("nan"), float("inf"), -float("inf"), 1e308, None, True, False])
    for n in LENGTHS:
        assert_fast({"s": "x" * n, "u": "é" * n, "b": b"\x01" * n, "ba": bytearray(n), "l": [1] * n,
                     "t": tuple(range(n)), "m": {f"k{i}": i for i in range(n)}, "mv": memoryview(b"z" * n)})  # fmt: skip
    assert_fast({b"bytes key": 1, "": [], "e": {}, "nested": {"a": {"b": [{"c": (1, [2, {"d": None}])}]}}})
    assert_fast({"mv": memoryview(np.arange(6, dtype=np.float32)), "m2": memoryview(np.zeros((2, 3)))})
    for top_level in ("a string", np.arange(3), 7, [], None):
        assert_fast(top_level)


def test_a_request_matches_and_both_decoders_read_it():
    rng = np.random.default_rng(1)
    images = {f"observation/{k}": rng.integers(0, 256, (180, 320, 3), dtype=np.uint8) for k in ("a", "b", "c")}
    request = build_infer_request(images=images, joint_position=rng.normal(size=7), gripper_position=[0.5],
                                  prompt="put the cube in the bowl", session_id="s-1", extra={"seed": 3})  # fmt: skip
    frame = assert_fast(request)
    ours = unpackb(frame)
    for key, image in images.items():
        np.testing.assert_array_equal(ours[key], image)
    if msgpack_numpy is not None:
        theirs = msgpack_numpy.unpackb(frame)
        assert theirs["prompt"] == "put the cube in the bowl" and theirs["seed"] == 3
        np.testing.assert_array_equal(theirs["observation/a"], images["observation/a"])


def test_values_the_fast_path_leaves_to_msgpack_keep_their_bytes():
    nested: list = []
    for _ in range(MAX_FAST_DEPTH + 5):
        nested = [nested]
    left = [OrderedDict(a=1), {"x": np.datetime64("2024-01-02")}, {"x": np.arange(3).astype("M8[s]")},
            {"x": np.array([1, 2], dtype="m8[ms]")}, {"x": memoryview(np.arange(6)).cast("B")[::2]}, {1: "an int key"}, nested]  # fmt: skip
    for value in left:
        assert pack_fast(value) is None
        try:
            packed = packb(value)
        except ProtocolError as exc:  # msgpack cannot carry it either: the same error both ways
            with pytest.raises(ProtocolError) as general:
                codec._packb_general(value)
            assert str(general.value) == str(exc) and "\n" not in str(exc)
        else:
            assert packed == codec._packb_general(value)
    assert packb(left[0]) == packb({"a": 1})


class _Thing:
    pass


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ({"x": np.zeros(2, dtype=complex)}, "x: unsupported dtype '<c16'"),
        ({"a": {"b": np.array([object()])}}, "a.b: unsupported dtype '|O'"),
        ({"x": np.zeros(2, dtype=[("a", "<f4")])}, "x: unsupported dtype"),
        ({"x": np.complex64(1j)}, "x: unsupported dtype '<c8'"),
        ({"x": [1, {2, 3}]}, "x[1]: cannot encode type set"),
        ({"x": 2**64}, "x: cannot encode type int"),
        ({"x": -(2**63) - 1}, "x: cannot encode type int"),
        ({"x": _Thing()}, "x: cannot encode type _Thing"),
        ({"x": "\ud800"}, "cannot encode"),
    ],
)
def test_unsupported_values_give_the_same_one_line_error(value, message):
    assert pack_fast(value) is None
    with pytest.raises(ProtocolError) as ours:
        packb(value)
    with pytest.raises(ProtocolError) as general:
        codec._packb_general(value)
    assert str(ours.value) == str(general.value) and "\n" not in str(ours.value)
    assert message in str(ours.value)


def test_one_buffer_of_the_final_size_is_allocated():
    """The fast path allocates about the frame once (its pieces are views or a few hundred header bytes); the
    general path holds its growing buffer and the copy it returns at once."""
    rng = np.random.default_rng(2)
    request = {f"observation/{k}": rng.integers(0, 256, (180, 320, 3), dtype=np.uint8) for k in "abc"}
    request["prompt"] = "pick"
    size = len(packb(request))

    def peak(encode) -> int:
        tracemalloc.start()
        try:
            encode(request)
            return tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()

    assert size <= peak(packb) < size + 64 * 1024
    assert peak(codec._packb_general) > 1.5 * size


ARRAYS = hnp.arrays(
    dtype=st.sampled_from([np.dtype(d) for d in DTYPES[:-1]]),
    shape=hnp.array_shapes(min_dims=0, max_dims=4, min_side=0, max_side=5),
)
LEAVES = st.one_of(
    st.none(), st.booleans(), st.integers(min_value=-(2**63), max_value=2**64 - 1), st.floats(),
    st.text(max_size=40), st.binary(max_size=300), ARRAYS, ARRAYS.map(lambda a: a.T[::-1] if a.ndim else a),
    st.sampled_from([np.int8(-3), np.uint64(7), np.float32(0.5), np.bool_(True), np.float64(2.0)]),
)  # fmt: skip
VALUES = st.recursive(
    LEAVES,
    lambda children: st.one_of(
        st.lists(children, max_size=20),
        st.lists(children, max_size=5).map(tuple),
        st.dictionaries(st.one_of(st.text(max_size=10), st.binary(max_size=10)), children, max_size=20),
    ),
    max_leaves=60,
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(VALUES)
def test_fuzz_fast_path_matches_the_general_path(value):
    assert_fast(value)
