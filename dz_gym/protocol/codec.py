"""msgpack with numpy arrays, as the OpenPI/DreamZero policy servers speak it (no I/O here).

Encoding writes the openpi markers of ``openpi_client.msgpack_numpy``, byte for byte:

- an ``np.ndarray`` becomes a map with *bytes* keys ``__ndarray__`` (True), ``data`` (C-order bytes),
  ``dtype`` (``dtype.str``, e.g. ``<f4``) and ``shape``;
- a numpy scalar that is not already a Python scalar subclass becomes ``__npgeneric__``/``data``/``dtype``
  (``np.float64`` and ``np.str_`` subclass ``float``/``str`` and are packed as plain msgpack values, as the
  reference encoder does).

Decoding reads those markers and also vLLM-Omni's legacy markers (a map with ``nd``, ``type`` (the dtype
string), ``kind`` (``dtype.kind``, checked), ``data`` (raw bytes) and, for arrays, ``shape``; ``nd`` false means
a scalar whose ``data`` holds one item). Object, structured/void and complex dtypes are refused both ways: the
wire never carries pickles. Every malformed input (garbage, truncation, wrong marker fields, a shape that does not
match the data, nesting or sizes past the bounds) raises :class:`~dz_gym.errors.ProtocolError` with one line.

Decoded arrays are read-only views of the message buffer; copy before writing into them.

Example: a request round trip, and a refused dtype::

    >>> import numpy as np
    >>> frame = packb({"prompt": "pick", "state": np.arange(3, dtype=np.float32)})
    >>> message = unpackb(frame, max_bytes=1 << 20)
    >>> message["prompt"], message["state"].dtype.str, message["state"].tolist()
    ('pick', '<f4', [0.0, 1.0, 2.0])
    >>> message["state"].flags.writeable
    False
    >>> packb({"x": np.zeros(2, dtype=complex)})
    Traceback (most recent call last):
    ...
    dz_gym.errors.ProtocolError: x: unsupported dtype '<c16' (kind 'c'); expected bool, integer, float or string dtypes
    >>> unpackb(frame[:-3])  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    dz_gym.errors.ProtocolError: message: ...
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Mapping
from typing import Any

import msgpack
import numpy as np

from dz_gym.errors import ProtocolError
from dz_gym.protocol.packer import fast_pieces, pack_fast

__all__ = [
    "DEFAULT_MAX_DEPTH",
    "SUPPORTED_DTYPE_KINDS",
    "packb",
    "packb_pieces",
    "unpackb",
]

# bool, signed/unsigned ints, floats, fixed-width unicode/bytes strings, datetimes/timedeltas.
SUPPORTED_DTYPE_KINDS = frozenset("biufUSMm")
# Maps and lists nested deeper than this are refused (a request is two levels deep).
DEFAULT_MAX_DEPTH = 32
_MAX_NDIM = 32
_MAX_DTYPE_CHARS = 64

_ND_KEY = b"__ndarray__"
_GEN_KEY = b"__npgeneric__"


# ----------------------------------------------------------------------------------------------- encoding
def _check_dtype_for_encoding(dtype: np.dtype) -> None:
    if dtype.kind not in SUPPORTED_DTYPE_KINDS:
        raise _UnsupportedDtype(dtype)


class _UnsupportedDtype(Exception):
    """Internal: raised inside the msgpack hook, turned into a ProtocolError that names the key."""

    def __init__(self, dtype: np.dtype):
        super().__init__(str(dtype))
        self.dtype = dtype


def _encode_hook(obj: Any) -> Any:
    if isinstance(obj, np.ndarray):
        _check_dtype_for_encoding(obj.dtype)
        if obj.flags.c_contiguous and obj.dtype.kind not in "Mm":
            # Zero-copy: msgpack reads the array's own buffer.
            data: Any = memoryview(obj)
        else:
            data = obj.tobytes()  # C order, one copy
        return {_ND_KEY: True, b"data": data, b"dtype": obj.dtype.str, b"shape": obj.shape}
    if isinstance(obj, np.generic):
        _check_dtype_for_encoding(obj.dtype)
        return {_GEN_KEY: True, b"data": obj.item(), b"dtype": obj.dtype.str}
    raise TypeError(f"can not serialize {type(obj).__name__!r} object")


def _describe(obj: Any) -> str:
    if isinstance(obj, (np.ndarray, np.generic)):
        return f"dtype {obj.dtype.str!r} (kind {obj.dtype.kind!r})"
    return f"type {type(obj).__name__}"


def _find_bad_path(obj: Any, path: str = "", depth: int = 0) -> tuple[str, Any] | None:
    """Locate the first value that cannot go on the wire; used only to word an error."""
    if depth > 256:
        return (path or "<root>", obj)
    if isinstance(obj, (np.ndarray, np.generic)):
        return None if obj.dtype.kind in SUPPORTED_DTYPE_KINDS else (path or "<root>", obj)
    if obj is None or isinstance(obj, (bool, int, float, str, bytes, bytearray, memoryview)):
        if isinstance(obj, memoryview) and not obj.c_contiguous:
            return (path or "<root>", obj)
        if isinstance(obj, int) and not isinstance(obj, bool) and not (-(2**63) <= obj < 2**64):
            return (path or "<root>", obj)
        return None
    if isinstance(obj, Mapping):
        for key, value in obj.items():
            if not isinstance(key, (str, bytes)):
                return (f"{path}[{key!r}]" if path else repr(key), key)
            name = key.decode("utf-8", "replace") if isinstance(key, bytes) else key
            found = _find_bad_path(value, f"{path}.{name}" if path else name, depth + 1)
            if found:
                return found
        return None
    if isinstance(obj, (list, tuple)):
        for index, value in enumerate(obj):
            found = _find_bad_path(value, f"{path}[{index}]", depth + 1)
            if found:
                return found
        return None
    return (path or "<root>", obj)


def packb(obj: Any) -> bytes:
    """Encode ``obj`` (maps, lists, scalars, numpy arrays and scalars) as openpi-compatible msgpack.

    The common values (see :mod:`dz_gym.protocol.packer`) are written into one buffer of the exact final
    size, each array's bytes copied once; anything else takes msgpack's own packer, with C-contiguous arrays
    passed as buffers. The bytes are the same either way. Raises ProtocolError naming the offending key for
    object/structured/complex dtypes and for values msgpack cannot carry.
    """
    packed = pack_fast(obj)
    if packed is not None:
        return packed
    return _packb_general(obj)


def packb_pieces(obj: Any) -> list[memoryview]:
    """:func:`packb`'s bytes as flat byte views to be written one after the other
    (:func:`dz_gym.protocol.packer.write_pieces`), for a caller that packs into memory of its own: the fast
    path's pieces (each array's own memory), or the general path's bytes as one piece. Same errors as
    :func:`packb`."""
    pieces = fast_pieces(obj)
    if pieces is not None:
        return pieces
    return [memoryview(_packb_general(obj))]


def _packb_general(obj: Any) -> bytes:
    """:func:`packb` through ``msgpack.packb`` with the marker hook (every value it can carry)."""
    try:
        return msgpack.packb(obj, default=_encode_hook, use_bin_type=True)
    except (_UnsupportedDtype, TypeError, ValueError, OverflowError, BufferError) as exc:
        found = _find_bad_path(obj)
        if found is None:
            raise ProtocolError(f"cannot encode message: {exc}") from None
        path, value = found
        if isinstance(value, (np.ndarray, np.generic)):
            raise ProtocolError(
                f"{path}: unsupported {_describe(value)}; expected bool, integer, float or string dtypes"
            ) from None
        raise ProtocolError(f"{path}: cannot encode {_describe(value)} ({exc})") from None


# ----------------------------------------------------------------------------------------------- decoding
def _text(value: Any, field: str) -> str:
    if isinstance(value, bytes):
        try:
            value = value.decode("ascii")
        except UnicodeDecodeError:
            raise ProtocolError(f"array marker {field}: expected an ASCII dtype string") from None
    if not isinstance(value, str) or not value or len(value) > _MAX_DTYPE_CHARS:
        raise ProtocolError(f"array marker {field}: expected a dtype string, got {type(value).__name__}")
    return value


def _parse_dtype(value: Any, field: str = "dtype") -> np.dtype:
    text = _text(value, field)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # deprecated aliases ('a') are refused, not warned about
            dtype = np.dtype(text)
    except Exception:
        raise ProtocolError(f"array marker {field}: {text!r} is not a numpy dtype") from None
    if dtype.kind not in SUPPORTED_DTYPE_KINDS or dtype.fields is not None or dtype.subdtype is not None:
        raise ProtocolError(
            f"array marker {field}: unsupported dtype {text!r} (kind {dtype.kind!r}); object, structured and "
            "complex dtypes are refused"
        )
    if dtype.itemsize == 0:
        raise ProtocolError(f"array marker {field}: dtype {text!r} has no item size")
    return dtype


def _parse_shape(value: Any) -> tuple[int, ...]:
    if type(value) is not list and type(value) is not tuple or len(value) > _MAX_NDIM:
        raise ProtocolError(f"array marker shape: expected a list of at most {_MAX_NDIM} sizes")
    for size in value:
        if type(size) is not int or size < 0:  # bool is not accepted either
            raise ProtocolError(f"array marker shape: expected non-negative integers, got {list(value)!r}")
    return tuple(value)


_DTYPE_CACHE: dict[str, np.dtype] = {}


def _cached_dtype(value: Any, field: str = "dtype") -> np.dtype:
    """``_parse_dtype`` memoized on the dtype string (a message repeats a handful of dtypes)."""
    dtype = _DTYPE_CACHE.get(value) if type(value) is str else None
    if dtype is None:
        dtype = _parse_dtype(value, field)
        if type(value) is str and len(_DTYPE_CACHE) < 256:
            _DTYPE_CACHE[value] = dtype
    return dtype


def _array_from(data: Any, dtype: np.dtype, shape: tuple[int, ...], max_array_bytes: int | None) -> np.ndarray:
    if type(data) is not bytes:
        raise ProtocolError(f"array marker data: expected bytes, got {type(data).__name__}")
    expected = math.prod(shape) * dtype.itemsize
    if expected != len(data):
        raise ProtocolError(
            f"array marker: shape {shape} of dtype {dtype.str!r} needs {expected} bytes, data has {len(data)}"
        )
    if max_array_bytes is not None and expected > max_array_bytes:
        raise ProtocolError(f"array marker data: {expected} bytes exceeds the limit of {max_array_bytes}")
    try:
        return np.ndarray(shape, dtype, buffer=data)  # a read-only view of the frame's bytes
    except Exception as exc:  # e.g. datetime payloads numpy refuses
        raise ProtocolError(f"array marker: cannot build array of dtype {dtype.str!r}: {exc}") from None


_MISSING = object()


def _get(obj: dict, key: str) -> Any:
    """Marker field lookup: bytes keys (openpi) or str keys (msgspec/vLLM)."""
    value = obj.get(key.encode(), _MISSING)
    if value is _MISSING:
        value = obj.get(key, _MISSING)
    return value


def _has(obj: dict, key: str) -> bool:
    return key.encode() in obj or key in obj


def _decode_marker(obj: dict, max_array_bytes: int | None) -> Any:
    """Every marker form, str or bytes keys (the slow, general path)."""
    if _has(obj, "__ndarray__"):
        data, dtype, shape = _get(obj, "data"), _get(obj, "dtype"), _get(obj, "shape")
        if data is _MISSING or dtype is _MISSING or shape is _MISSING:
            raise ProtocolError("array marker: __ndarray__ needs data, dtype and shape")
        return _array_from(data, _cached_dtype(dtype), _parse_shape(shape), max_array_bytes)
    if _has(obj, "__npgeneric__"):
        data, dtype = _get(obj, "data"), _get(obj, "dtype")
        if data is _MISSING or dtype is _MISSING:
            raise ProtocolError("scalar marker: __npgeneric__ needs data and dtype")
        dtype = _cached_dtype(dtype)
        if isinstance(data, (dict, list)):
            raise ProtocolError(f"scalar marker data: expected a scalar, got {type(data).__name__}")
        try:
            # 1e300 as float32 is refused, not silently made inf; numpy < 2 only warns on an out-of-range int
            with np.errstate(all="raise"), warnings.catch_warnings():
                warnings.simplefilter("error", DeprecationWarning)
                return dtype.type(data)
        except Exception:
            raise ProtocolError(f"scalar marker: {data!r} is not a valid {dtype.str!r} value") from None
    if _has(obj, "nd") and _has(obj, "type") and _has(obj, "kind") and _has(obj, "data"):
        # vLLM-Omni's legacy marker.
        dtype = _cached_dtype(_get(obj, "type"), "type")
        kind = _text(_get(obj, "kind"), "kind")
        if dtype.kind != kind:
            raise ProtocolError(f"array marker kind: {kind!r} does not match dtype {dtype.str!r}")
        data = _get(obj, "data")
        if _get(obj, "nd"):
            shape = _get(obj, "shape")
            if shape is _MISSING:
                raise ProtocolError("array marker: nd marker needs a shape")
            return _array_from(data, dtype, _parse_shape(shape), max_array_bytes)
        return _array_from(data, dtype, (), max_array_bytes)[()]
    return obj


_MARKER_KEYS = (b"__npgeneric__", "__ndarray__", "__npgeneric__", "nd", b"nd")


# (dtype string, shape) -> (dtype, shape, byte size) for layouts already validated: a stream of requests
# repeats the same few layouts, so the fast path below skips re-validating them. (A shape such as [2.0]
# hashes like [2] and may hit the entry of the validated (2,): the array is still built from that.)
_LAYOUT_CACHE: dict[tuple[str, tuple[int, ...]], tuple[np.dtype, tuple[int, ...], int]] = {}


def _make_object_hook(max_array_bytes: int | None):
    def hook(obj: dict) -> Any:
        if _ND_KEY in obj:  # fast path: openpi's own array marker
            data, dtype, shape = obj.get(b"data"), obj.get(b"dtype"), obj.get(b"shape")
            if type(data) is bytes and type(dtype) is str and type(shape) is list:
                key = (dtype, tuple(shape))
                layout = _LAYOUT_CACHE.get(key)
                if layout is None:
                    parsed_dtype = _cached_dtype(dtype)
                    parsed_shape = _parse_shape(shape)
                    layout = (parsed_dtype, parsed_shape, math.prod(parsed_shape) * parsed_dtype.itemsize)
                    if len(_LAYOUT_CACHE) < 1024:
                        _LAYOUT_CACHE[key] = layout
                if layout[2] == len(data) and (max_array_bytes is None or layout[2] <= max_array_bytes):
                    try:
                        return np.ndarray(layout[1], layout[0], buffer=data)
                    except Exception:
                        pass  # the general path words the error
                return _array_from(data, layout[0], layout[1], max_array_bytes)
            return _decode_marker(obj, max_array_bytes)
        if len(obj) <= 8:  # markers have at most 5 fields; big maps (requests) are not markers
            for key in _MARKER_KEYS:
                if key in obj:
                    return _decode_marker(obj, max_array_bytes)
        return obj

    return hook


_DEFAULT_HOOK = _make_object_hook(None)


def _refuse_ext(code: int, data: bytes) -> Any:
    raise ProtocolError(f"message: msgpack extension type {code} is not part of the protocol")


def _check_depth(obj: Any, max_depth: int) -> None:
    if type(obj) is dict and max_depth >= 2:  # fast path: a flat request map
        for value in obj.values():
            if type(value) is dict or type(value) is list:
                break
        else:
            return
    stack = [(obj, 1)]
    while stack:
        node, depth = stack.pop()
        if depth > max_depth:
            raise ProtocolError(f"message: nesting deeper than {max_depth} levels")
        if isinstance(node, dict):
            children = node.values()
        elif isinstance(node, list):
            children = node
        else:
            continue
        for child in children:
            if isinstance(child, (dict, list)):
                stack.append((child, depth + 1))


def unpackb(
    data: bytes | bytearray | memoryview,
    *,
    max_bytes: int | None = None,
    max_depth: int = DEFAULT_MAX_DEPTH,
    max_array_bytes: int | None = None,
) -> Any:
    """Decode one msgpack message, turning openpi and legacy vLLM array markers into numpy arrays.

    Bounds: ``max_bytes`` caps the frame, ``max_depth`` the nesting of maps/lists, ``max_array_bytes`` one
    array's payload (arrays can never exceed the frame: their bytes are inside it). Maps must have string
    or bytes keys. Any failure raises ProtocolError.
    """
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise ProtocolError(f"message: expected a binary frame (bytes), got {type(data).__name__}")
    size = len(data) if type(data) is bytes else memoryview(data).nbytes
    if size == 0:
        raise ProtocolError("message: empty frame")
    if max_bytes is not None and size > max_bytes:
        raise ProtocolError(f"message: {size} bytes exceeds the limit of {max_bytes}")
    try:
        obj = msgpack.unpackb(
            data,
            object_hook=_DEFAULT_HOOK if max_array_bytes is None else _make_object_hook(max_array_bytes),
            raw=False,
            strict_map_key=True,
            use_list=True,
            ext_hook=_refuse_ext,
        )
    except ProtocolError:
        raise
    except msgpack.ExtraData:
        raise ProtocolError("message: trailing bytes after the msgpack object") from None
    except (ValueError, msgpack.UnpackException) as exc:
        kind = type(exc).__name__
        detail = str(exc).splitlines()[0] if str(exc) else kind
        raise ProtocolError(f"message: not valid msgpack ({detail})") from None
    except Exception as exc:  # msgpack may raise TypeError/RecursionError on hostile input
        raise ProtocolError(f"message: not valid msgpack ({type(exc).__name__})") from None
    _check_depth(obj, max_depth)
    return obj
