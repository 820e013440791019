"""The fast msgpack encoder of :func:`dz_gym.protocol.codec.packb`: one buffer, each array copied once (no I/O).

``msgpack.packb`` writes into a buffer it grows by reallocation (each growth may copy all that was written)
and then copies that buffer into the ``bytes`` it returns, so a 0.5 MB request's images are copied several
times. :func:`pack_fast` instead walks the value once, collecting the msgpack headers as small ``bytes`` and
each array as a reference to its own memory, and joins the pieces with ``bytes.join``: that sums the pieces'
sizes, allocates the result once at its exact final size and copies every piece into it once.

The bytes are those of ``msgpack.packb(obj, default=<codec's hook>, use_bin_type=True)`` exactly (the
openpi markers of the codec's docstring; msgpack's smallest-format rules for ints, strings, bins, arrays and
maps; floats as float64). It handles what requests and replies hold: dicts with ``str``/``bytes`` keys,
lists, tuples, ``str``, ``bytes``, ``bytearray``, contiguous ``memoryview``, ``int``, ``float``, ``bool``,
``None``, numpy arrays of the supported kinds and numpy bool/int/float scalars. For anything else (another
type or subclass, an unsupported dtype, an int outside 64 bits, text that is not UTF-8, nesting deeper than
:data:`MAX_FAST_DEPTH`) it returns ``None`` and the caller takes msgpack's general path, which also words
the errors.

>>> import msgpack
>>> value = {"prompt": "pick", "state": np.arange(3, dtype=np.float32), "n": [1, -300, 2.5, None, True]}
>>> pack_fast(value) == msgpack.packb({"prompt": "pick", "state": {b"__ndarray__": True,
...     b"data": np.arange(3, dtype=np.float32).tobytes(), b"dtype": "<f4", b"shape": (3,)},
...     "n": [1, -300, 2.5, None, True]}, use_bin_type=True)
True
>>> pack_fast({"x": np.zeros(2, dtype=complex)}) is None  # the general path refuses it, naming the key
True
"""

from __future__ import annotations

import struct
from typing import Any

import numpy as np

__all__ = ["MAX_FAST_DEPTH", "RELEASING_COPY_BYTES", "fast_parts", "fast_pieces", "fast_template", "join_template",
           "pack_fast", "pieces_of", "pieces_size", "str_bytes", "write_pieces"]  # fmt: skip

MAX_FAST_DEPTH = 64
"""Maps and lists nested deeper than this go to the general path (which refuses past 512)."""
RELEASING_COPY_BYTES = 1 << 16
""":func:`write_pieces` copies a piece at least this long with numpy, which lets go of the interpreter lock
while it copies: several threads then write their requests side by side."""

# Array kinds the fast path writes (the codec's supported kinds less datetimes, which msgpack's path turns
# into bytes its own way); numpy scalar kinds whose ``item()`` is a plain bool, int or float.
_ARRAY_KINDS = frozenset("biufUS")
_SCALAR_KINDS = frozenset("biuf")
_CACHE_LIMIT = 1024
_SHORT = 4096  # fast_pieces joins bytes parts shorter than this with their neighbours

_ND_PREFIX = b"\x84\xc4\x0b__ndarray__\xc3\xc4\x04data"  # fixmap 4, bin "__ndarray__", true, bin "data"
_GEN_PREFIX = b"\x83\xc4\x0d__npgeneric__\xc3\xc4\x04data"  # fixmap 3, bin "__npgeneric__", true, bin "data"
_DTYPE_KEY = b"\xc4\x05dtype"
_SHAPE_KEY = b"\xc4\x05shape"
_NIL, _FALSE, _TRUE = b"\xc0", b"\xc2", b"\xc3"
_FLOAT = struct.Struct(">Bd").pack
_U16, _U32, _U64 = struct.Struct(">BH").pack, struct.Struct(">BI").pack, struct.Struct(">BQ").pack
_I8, _I16, _I32, _I64 = (struct.Struct(f">B{c}").pack for c in "bhiq")
_SMALL_INTS = tuple(bytes((v,)) for v in range(128)) + tuple(bytes((v & 0xFF,)) for v in range(-32, 0))

# map key or dtype string -> its packed bytes (they repeat from request to request; values such as session
# ids do not, and are not kept)
_STR_CACHE: dict[str, bytes] = {}
# (dtype string, shape) -> (the marker up to the data, the marker after it)
_ARRAY_CACHE: dict[tuple[str, tuple[int, ...]], tuple[bytes, bytes]] = {}


class _Fallback(Exception):
    """Internal: a value the fast path leaves to msgpack's general path."""


def _int(v: int) -> bytes:
    if -32 <= v < 128:
        return _SMALL_INTS[v]  # a negative index picks the negative fixints at the end
    if v > 0:
        if v <= 0xFF:
            return bytes((0xCC, v))
        if v <= 0xFFFF:
            return _U16(0xCD, v)
        if v <= 0xFFFFFFFF:
            return _U32(0xCE, v)
        if v <= 0xFFFFFFFFFFFFFFFF:
            return _U64(0xCF, v)
        raise _Fallback
    if v >= -0x80:
        return _I8(0xD0, v)
    if v >= -0x8000:
        return _I16(0xD1, v)
    if v >= -0x80000000:
        return _I32(0xD2, v)
    if v >= -0x8000000000000000:
        return _I64(0xD3, v)
    raise _Fallback


def _head(n: int, fix: int, fix_limit: int, codes: tuple[int, int, int]) -> bytes:
    """The header of a str/bin (``fix`` 0 for bin: no fix form), array or map of ``n`` items."""
    if n < fix_limit:
        return bytes((fix | n,))
    if codes[0] and n <= 0xFF:
        return bytes((codes[0], n))
    if n <= 0xFFFF:
        return _U16(codes[1], n)
    if n <= 0xFFFFFFFF:
        return _U32(codes[2], n)
    raise _Fallback


def _str_head(n: int) -> bytes:
    return _head(n, 0xA0, 32, (0xD9, 0xDA, 0xDB))


def _bin_head(n: int) -> bytes:
    return _head(n, 0, 0, (0xC4, 0xC5, 0xC6))


def _array_head(n: int) -> bytes:
    return _head(n, 0x90, 16, (0, 0xDC, 0xDD))


def _map_head(n: int) -> bytes:
    return _head(n, 0x80, 16, (0, 0xDE, 0xDF))


def _str(v: str) -> bytes:
    try:
        data = v.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate: msgpack refuses it, the general path words the error
        raise _Fallback from None
    return _str_head(len(data)) + data


def _key(v: str) -> bytes:
    """:func:`_str`, remembered."""
    packed = _STR_CACHE.get(v)
    if packed is None:
        packed = _str(v)
        if len(_STR_CACHE) < _CACHE_LIMIT:
            _STR_CACHE[v] = packed
    return packed


def _array_marker(a: np.ndarray) -> tuple[bytes, bytes]:
    """The bytes of the openpi array marker before and after its data, for ``a``'s dtype and shape."""
    dtype = a.dtype.str
    key = (dtype, a.shape)
    marker = _ARRAY_CACHE.get(key)
    if marker is None:
        if a.dtype.kind not in _ARRAY_KINDS or a.dtype.fields is not None or a.dtype.subdtype is not None:
            raise _Fallback
        shape = _array_head(len(a.shape)) + b"".join(_int(size) for size in a.shape)
        marker = (_ND_PREFIX + _bin_head(a.nbytes), _DTYPE_KEY + _key(dtype) + _SHAPE_KEY + shape)
        if len(_ARRAY_CACHE) < _CACHE_LIMIT:
            _ARRAY_CACHE[key] = marker
    return marker


def _pack_array(a: np.ndarray, parts: list) -> None:
    before, after = _array_marker(a)
    parts.append(before)
    # C-contiguous: bytes.join reads the array's own memory (the one copy); otherwise C-order bytes first
    parts.append(a if a.flags.c_contiguous else a.tobytes())
    parts.append(after)


def _pack_scalar(v: np.generic, parts: list) -> None:
    """A numpy scalar that is no Python scalar subclass: the ``__npgeneric__`` marker of its ``item()``."""
    if v.dtype.kind not in _SCALAR_KINDS:
        raise _Fallback
    item = v.item()
    kind = type(item)
    if kind is bool:
        data = _TRUE if item else _FALSE
    elif kind is int:
        data = _int(item)
    elif kind is float:
        data = _FLOAT(0xCB, item)
    else:  # e.g. a long double that has no Python float
        raise _Fallback
    parts.append(_GEN_PREFIX)
    parts.append(data)
    parts.append(_DTYPE_KEY)
    parts.append(_key(v.dtype.str))


def _pack(v: Any, parts: list, depth: int) -> None:
    """Append ``v``'s msgpack pieces to ``parts``; :class:`_Fallback` for what the fast path leaves."""
    kind = type(v)
    if kind is np.ndarray:
        _pack_array(v, parts)
    elif kind is str or kind is np.str_:
        parts.append(_str(v))
    elif kind is dict:
        if depth >= MAX_FAST_DEPTH:
            raise _Fallback
        parts.append(_map_head(len(v)))
        for key, value in v.items():
            key_kind = type(key)
            if key_kind is str:
                parts.append(_key(key))
            elif key_kind is bytes:
                parts.append(_bin_head(len(key)))
                parts.append(key)
            else:
                raise _Fallback
            _pack(value, parts, depth + 1)
    elif kind is float or kind is np.float64:
        parts.append(_FLOAT(0xCB, v))
    elif kind is int:
        parts.append(_int(v))
    elif v is None:
        parts.append(_NIL)
    elif kind is bool:
        parts.append(_TRUE if v else _FALSE)
    elif kind is list or kind is tuple:
        if depth >= MAX_FAST_DEPTH:
            raise _Fallback
        parts.append(_array_head(len(v)))
        for item in v:
            _pack(item, parts, depth + 1)
    elif kind is bytes or kind is bytearray or kind is np.bytes_:
        parts.append(_bin_head(len(v)))
        parts.append(v)
    elif kind is memoryview:
        if not v.c_contiguous:
            raise _Fallback
        parts.append(_bin_head(v.nbytes))
        parts.append(v)
    elif isinstance(v, np.generic) and not isinstance(v, (bool, int, float, str, bytes)):
        _pack_scalar(v, parts)
    else:
        raise _Fallback


def pack_fast(obj: Any) -> bytes | None:
    """``obj``'s msgpack bytes (see the module docstring), or ``None`` where the general path must encode it."""
    parts: list = []
    try:
        _pack(obj, parts, 0)
        return b"".join(parts)
    except (_Fallback, BufferError, TypeError, ValueError):
        return None


def fast_parts(obj: Any) -> list | None:
    """``obj``'s msgpack bytes as the parts the fast path collects, in order: ``bytes`` (headers and short
    values), other bytes-like values, and each C-contiguous numpy array itself (its bytes where it lies);
    ``None`` where the general path must encode it. Joined, they are :func:`pack_fast`'s bytes."""
    parts: list = []
    try:
        _pack(obj, parts, 0)
    except (_Fallback, BufferError, TypeError, ValueError):
        return None
    return parts


def fast_pieces(obj: Any) -> list[memoryview] | None:
    """``obj``'s msgpack bytes as pieces to be written one after the other (what :func:`pack_fast` joins),
    each a flat byte view; ``None`` where the general path must encode it. With :func:`pieces_size` and
    :func:`write_pieces` a caller packs into memory of its own (a shared-memory arena) with one copy of each
    array: the bytes written are those of :func:`pack_fast`."""
    parts = fast_parts(obj)
    return None if parts is None else pieces_of(parts)


def pieces_of(parts: list) -> list[memoryview] | None:
    """:func:`fast_parts`' parts as flat byte views, neighbouring short ``bytes`` joined into one (fewer,
    larger copies); ``None`` where a part exports no flat view."""
    try:
        pieces: list[memoryview] = []
        run: list[bytes] = []
        for part in parts:
            if type(part) is bytes and len(part) < _SHORT:
                run.append(part)
                continue
            if run:
                pieces.append(memoryview(b"".join(run)))
                run = []
            pieces.append(memoryview(part).cast("B"))
        if run:
            pieces.append(memoryview(b"".join(run)))
        return pieces
    except (BufferError, TypeError, ValueError):
        return None


def pieces_size(pieces: list[memoryview]) -> int:
    """The bytes :func:`write_pieces` writes."""
    return sum(piece.nbytes for piece in pieces)


def write_pieces(pieces: list[memoryview], buffer: Any, offset: int = 0) -> int:
    """Copy ``pieces`` into the writable ``buffer`` from ``offset`` on; the end offset. ``ValueError`` when
    they do not fit."""
    view = memoryview(buffer).cast("B")
    end = offset + pieces_size(pieces)
    if offset < 0 or end > view.nbytes:
        raise ValueError(f"buffer: expected room for {end - offset} bytes at offset {offset}, has {view.nbytes}")
    position = offset
    for piece in pieces:
        size = piece.nbytes
        if size >= RELEASING_COPY_BYTES:  # numpy copies without the interpreter lock; a slice store holds it
            np.copyto(np.frombuffer(view, np.uint8, size, position), np.frombuffer(piece, np.uint8))
        else:
            view[position : position + size] = piece
        position += size
    return position


def str_bytes(value: str) -> bytes | None:
    """``value`` packed as a msgpack str (header and UTF-8 bytes); None for text that is not UTF-8."""
    try:
        return _str(value)
    except _Fallback:
        return None


def fast_template(obj: dict, slots: dict[str, int]) -> list[bytes | int] | None:
    """``obj``'s msgpack bytes (a dict, as :func:`pack_fast` writes it) as a template: ``bytes``, and in
    place of the value of each top-level key named in ``slots`` its slot number (an ``int``) -- for a numpy
    array its data only (the array's marker stays in the template), for anything else its whole packed bytes.
    :func:`join_template` fills the slots: requests of one shape differ only in the slots' bytes, so a
    batch of them is packed once. Neighbouring bytes are joined; None where the fast path leaves ``obj``."""
    if type(obj) is not dict:
        return None
    parts: list = []
    try:
        parts.append(_map_head(len(obj)))
        for key, value in obj.items():
            if type(key) is not str:
                return None
            parts.append(_key(key))
            slot = slots.get(key)
            if slot is None:
                _pack(value, parts, 1)
            elif type(value) is np.ndarray:
                before, after = _array_marker(value)
                parts += [before, int(slot), after]
            else:
                parts.append(int(slot))
    except (_Fallback, BufferError, TypeError, ValueError):
        return None
    template: list[bytes | int] = []
    run: list = []
    for part in parts:
        if type(part) is int:
            if run:
                template.append(b"".join(run))
                run = []
            template.append(part)
        else:
            run.append(part)
    if run:
        template.append(b"".join(run))
    return template


def join_template(template: list, fields: list) -> bytes:
    """The bytes of a :func:`fast_template` with slot ``s`` filled by ``fields[s]`` (bytes-like: an array's
    data, or a value's packed bytes such as :func:`str_bytes`)."""
    return b"".join([fields[part] if type(part) is int else part for part in template])
