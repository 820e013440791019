"""The msgpack-numpy codec: round trips, refusals, bounds, legacy vLLM markers and decoder fuzzing."""

from __future__ import annotations

import msgpack
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from dz_gym.errors import ProtocolError
from dz_gym.protocol import packb, unpackb

SUPPORTED_DTYPES = [
    "|b1",
    "|i1",
    "<i2",
    "<i4",
    "<i8",
    "|u1",
    "<u2",
    "<u4",
    "<u8",
    "<f2",
    "<f4",
    "<f8",
    ">i4",
    ">f8",
    "<U3",
    "|S4",
]


def _roundtrip_equal(a: np.ndarray) -> None:
    out = unpackb(packb({"x": a}))["x"]
    assert isinstance(out, np.ndarray)
    assert out.dtype == a.dtype
    assert out.shape == a.shape
    np.testing.assert_array_equal(out, a)  # nan == nan here


@pytest.mark.parametrize("dtype", SUPPORTED_DTYPES)
@pytest.mark.parametrize("shape", [(), (0,), (5,), (2, 3), (2, 0, 4), (1, 2, 3, 4)])
def test_roundtrip_every_supported_dtype_and_shape(dtype, shape):
    rng = np.random.default_rng(0)
    a = np.asarray(rng.integers(0, 100, size=shape)).astype(dtype)
    _roundtrip_equal(a)


def test_roundtrip_non_contiguous_and_fortran_arrays():
    base = np.arange(60, dtype=np.float32).reshape(3, 4, 5)
    for a in (base[:, ::2, 1:], base.T, np.asfortranarray(base), base[::-1]):
        _roundtrip_equal(a)


def test_roundtrip_nan_inf_unicode_and_scalars():
    a = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0], dtype=np.float64)
    _roundtrip_equal(a)
    _roundtrip_equal(np.array(["héllo", "世界", ""]))
    msg = {"f32": np.float32(1.5), "i8": np.int8(-3), "b": np.bool_(True), "u": np.uint64(2**64 - 1)}
    out = unpackb(packb(msg))
    for key, value in msg.items():
        assert type(out[key]) is type(value) and out[key] == value


def test_tuples_come_back_as_lists_and_plain_values_survive():
    msg = {"t": (1, 2), "s": "x", "b": b"\x00\x01", "n": None, "f": 0.25, "nested": {"l": [1, [2, {"k": True}]]}}
    out = unpackb(packb(msg))
    assert out == {
        "t": [1, 2],
        "s": "x",
        "b": b"\x00\x01",
        "n": None,
        "f": 0.25,
        "nested": {"l": [1, [2, {"k": True}]]},
    }


def test_decoded_arrays_are_read_only_views():
    out = unpackb(packb(np.zeros((2, 2), np.float32)))
    assert not out.flags.writeable
    with pytest.raises(ValueError):
        out[0, 0] = 1


@pytest.mark.parametrize(
    "bad",
    [
        np.zeros(2, complex),
        np.array([object()], dtype=object),
        np.zeros(2, dtype=[("a", "<f4"), ("b", "<i4")]),
        np.complex64(1j),
    ],
)
def test_encoder_refuses_object_complex_structured_naming_the_key(bad):
    with pytest.raises(ProtocolError, match=r"obs\.img: unsupported dtype"):
        packb({"obs": {"img": bad}})


def test_encoder_refuses_unknown_objects_and_huge_ints():
    with pytest.raises(ProtocolError, match=r"^k\[1\]: cannot encode type set"):
        packb({"k": [0, {1}]})
    with pytest.raises(ProtocolError, match=r"^big"):
        packb({"big": 2**70})


def test_contiguous_arrays_pack_without_copy_semantics_change():
    a = np.arange(10, dtype=np.uint8)
    frame = packb(a)
    a[0] = 99  # the frame is bytes: later edits of the source must not leak into it
    assert unpackb(frame)[0] == 0


def _openpi_marker(data, dtype, shape):
    return {b"__ndarray__": True, b"data": data, b"dtype": dtype, b"shape": shape}


@pytest.mark.parametrize(
    "marker, pattern",
    [
        (_openpi_marker(b"\x00" * 8, "<f4", [3]), "needs 12 bytes, data has 8"),
        (_openpi_marker(b"\x00" * 16, "|O", [2]), "unsupported dtype"),
        (_openpi_marker(b"\x00" * 16, "<c8", [2]), "unsupported dtype"),
        (_openpi_marker(b"\x00" * 8, "<f4,<i4", [1]), "unsupported dtype"),
        (_openpi_marker(b"\x00" * 8, "V8", [1]), "unsupported dtype"),
        (_openpi_marker(b"\x00" * 8, "notadtype", [1]), "not a numpy dtype"),
        (_openpi_marker(b"\x00" * 8, "<f4", [-2]), "non-negative"),
        (_openpi_marker(b"\x00" * 8, "<f4", "2"), "shape"),
        (_openpi_marker("text", "<f4", [1]), "expected bytes"),
        ({b"__ndarray__": True, b"data": b""}, "needs data, dtype and shape"),
        ({b"__npgeneric__": True, b"data": [1], b"dtype": "<f4"}, "expected a scalar"),
        ({"nd": True, "type": "<f4", "kind": "i", "shape": [1], "data": b"\x00" * 4}, "does not match"),
        ({"nd": True, "type": "<f4", "kind": "f", "data": b"\x00" * 4}, "needs a shape"),
    ],
)
def test_decoder_refuses_bad_markers(marker, pattern):
    frame = msgpack.packb({"x": marker}, use_bin_type=True)
    with pytest.raises(ProtocolError, match=pattern):
        unpackb(frame)


def test_decoder_reads_legacy_vllm_markers_with_str_or_bytes_keys():
    a = np.arange(6, dtype="<i2").reshape(2, 3)
    legacy = {"nd": True, "type": a.dtype.str, "kind": a.dtype.kind, "shape": list(a.shape), "data": a.tobytes()}
    legacy_b = {k.encode(): v for k, v in legacy.items()}
    scalar = {"nd": False, "type": "<f8", "kind": "f", "data": np.float64(2.5).tobytes()}
    out = unpackb(msgpack.packb({"a": legacy, "b": legacy_b, "s": scalar}, use_bin_type=True))
    np.testing.assert_array_equal(out["a"], a)
    np.testing.assert_array_equal(out["b"], a)
    assert out["s"] == 2.5 and isinstance(out["s"], np.float64)


def test_decoder_reads_str_keyed_openpi_markers():
    a = np.arange(4, dtype="<f4")
    frame = msgpack.packb({"__ndarray__": True, "data": a.tobytes(), "dtype": "<f4", "shape": [4]})
    np.testing.assert_array_equal(unpackb(frame), a)


def test_decoder_bounds_frame_size_depth_and_array_bytes():
    frame = packb({"x": np.zeros(1000, np.uint8)})
    with pytest.raises(ProtocolError, match="exceeds the limit"):
        unpackb(frame, max_bytes=100)
    with pytest.raises(ProtocolError, match="array marker data: 1000 bytes exceeds"):
        unpackb(frame, max_array_bytes=999)
    deep: object = 1
    for _ in range(40):
        deep = [deep]
    with pytest.raises(ProtocolError, match="nesting deeper than 32"):
        unpackb(packb(deep))
    assert unpackb(packb(deep), max_depth=41) == deep
    with pytest.raises(ProtocolError, match="not valid msgpack"):
        unpackb(b"\x91" * 100_000 + b"\x00")


@pytest.mark.parametrize(
    "frame, pattern",
    [
        (b"", "empty frame"),
        (b"\xc1", "not valid msgpack"),
        (packb({"a": 1})[:-1], "not valid msgpack"),
        (packb({"a": 1}) + b"\x00", "trailing bytes"),
        (msgpack.packb({1: 2}), "not valid msgpack"),
        (msgpack.packb(msgpack.ExtType(5, b"x")), "extension type 5"),
    ],
)
def test_decoder_refuses_garbage(frame, pattern):
    with pytest.raises(ProtocolError, match=pattern):
        unpackb(frame)


def test_decoder_refuses_text():
    with pytest.raises(ProtocolError, match="expected a binary frame"):
        unpackb("hello")  # type: ignore[arg-type]


# ------------------------------------------------------------------------------------------------ fuzzing
@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=256))
def test_fuzz_arbitrary_bytes_only_raise_protocol_error(data):
    try:
        unpackb(data)
    except ProtocolError:
        pass


_marker_values = st.one_of(
    st.booleans(),
    st.integers(-3, 3),
    st.binary(max_size=16),
    st.text(max_size=6),
    st.lists(st.integers(-2, 5), max_size=4),
    st.sampled_from(["<f4", "|u1", "O", "<U2", "V4", "<c8", "f8", "?"]),
)


def test_fuzz_mutated_valid_frames_only_raise_protocol_error():
    frame = packb({"a": np.arange(10, dtype="<f4"), "b": np.float32(1), "s": "x", "l": [np.int8(3), {"k": None}]})
    rng = np.random.default_rng(0)
    for _ in range(3000):
        mutated = bytearray(frame)
        for _ in range(int(rng.integers(1, 4))):
            mutated[int(rng.integers(len(mutated)))] = int(rng.integers(256))
        cut = int(rng.integers(1, len(mutated) + 1))
        for candidate in (bytes(mutated), bytes(mutated[:cut])):
            try:
                unpackb(candidate)
            except ProtocolError:
                pass


def test_scalar_marker_out_of_range_is_refused():
    frame = msgpack.packb({b"__npgeneric__": True, b"data": 1e300, b"dtype": "<f4"}, use_bin_type=True)
    with pytest.raises(ProtocolError, match="not a valid '<f4' value"):
        unpackb(frame)
    frame = msgpack.packb({b"__npgeneric__": True, b"data": 300, b"dtype": "|i1"}, use_bin_type=True)
    with pytest.raises(ProtocolError, match="not a valid"):
        unpackb(frame)


@settings(max_examples=300, deadline=None)
@given(
    st.dictionaries(
        st.sampled_from(
            [b"__ndarray__", b"__npgeneric__", b"data", b"dtype", b"shape", "nd", "type", "kind", "shape", "data"]
        ),
        _marker_values,
        max_size=6,
    )
)
def test_fuzz_marker_like_maps_only_raise_protocol_error(marker):
    try:
        unpackb(msgpack.packb({"x": marker}, use_bin_type=True))
    except ProtocolError:
        pass


@settings(max_examples=150, deadline=None)
@given(
    st.one_of(
        hnp.arrays(
            dtype=st.one_of(
                hnp.integer_dtypes(),
                hnp.unsigned_integer_dtypes(),
                hnp.floating_dtypes(),
                hnp.boolean_dtypes(),
                hnp.unicode_string_dtypes(max_len=4),
                hnp.byte_string_dtypes(max_len=4),
            ),
            shape=hnp.array_shapes(min_dims=0, max_dims=4, min_side=0, max_side=5),
        ),
    )
)
def test_fuzz_array_roundtrip(a):
    _roundtrip_equal(a)
    # a non-contiguous view of the same data round-trips too
    if a.ndim >= 1 and a.shape[0] > 1:
        _roundtrip_equal(a[::2])
