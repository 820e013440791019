"""A trajectory's ``.npz`` file as bytes, built in one pass (pure): what ``np.load`` reads, for little work.

The episode writer used ``np.savez_compressed``, which goes through :mod:`zipfile` member by member (a file object
per member, headers written and rewritten, a zip64 extra each) and deflates every member of a trajectory's 15 small
arrays, most of it Python holding the interpreter lock: at N = 1024 envs ending on the same step the stepping loop
waited for the lock or, at the end of a run, for the writer (benchmarks/journal/bookkeeping-and-geometry.md). The
arrays are floats that hardly compress (8.9 KB deflated, 12.2 KB stored, for 64 steps), so :func:`npz_bytes` stores
them: per array its ``.npy`` bytes (the header of :func:`numpy.lib.format.write_array`, cached per dtype and shape,
then the C-order data) behind a plain zip local header, then the central directory, a fraction of the work
(``benchmarks/bench_bookkeeping.py``). Every member carries the zip format's earliest date (1980-01-01 00:00), not
the time of writing, so a file depends only on its arrays. ``np.load`` and :mod:`zipfile` read it as they read
``np.savez``'s files (the report and every reader use ``np.load``).

>>> import io
>>> import numpy as np
>>> data = npz_bytes({"seed": np.int64(7), "reward": np.zeros(3, np.float32)})
>>> with np.load(io.BytesIO(data)) as f:
...     sorted(f.files), f["seed"].item(), f["reward"].dtype.name
(['reward', 'seed'], 7, 'float32')
"""

from __future__ import annotations

import io
import struct
import zlib
from collections.abc import Mapping

import numpy as np

__all__ = ["npz_bytes"]

_LOCAL = struct.Struct("<4sHHHHHIIIHH")  # local file header
_CENTRAL = struct.Struct("<4sHHHHHHIIIHHHHHII")  # central directory entry
_END = struct.Struct("<4sHHHHIIH")  # end of central directory
_VERSION = 20  # 2.0, what zipfile writes for a stored member
_DOS_DATE = (0 << 9) | (1 << 5) | 1  # 1980-01-01, the earliest date the format holds
_DOS_TIME = 0
_LIMIT = 0xFFFFFFFF  # past it an archive needs zip64: never for a trajectory
_HEADERS: dict[tuple[str, tuple[int, ...]], bytes] = {}  # (dtype, shape) -> .npy header
_MAX_HEADERS = 1024


def _header(array: np.ndarray) -> bytes:
    """The ``.npy`` header of the C-contiguous ``array``, as ``np.lib.format.write_array`` writes it."""
    key = (array.dtype.str, array.shape)
    header = _HEADERS.get(key)
    if header is None:
        buffer = io.BytesIO()
        np.lib.format.write_array(buffer, array, allow_pickle=False)
        header = buffer.getvalue()[: buffer.tell() - array.nbytes]
        if len(_HEADERS) >= _MAX_HEADERS:
            _HEADERS.clear()
        _HEADERS[key] = header
    return header


def npz_bytes(arrays: Mapping[str, np.ndarray]) -> bytes:
    """The ``.npz`` archive of ``arrays`` (key -> array; member ``key.npy``, stored). One-line ``ValueError`` for
    an object array or an archive too large for plain zip headers."""
    parts: list[bytes] = []
    central: list[bytes] = []
    offset = 0
    for key, value in arrays.items():
        array = np.asarray(value)
        if not array.flags.c_contiguous:
            array = array.copy(order="C")  # (np.ascontiguousarray would make a scalar 1-d)
        if array.dtype.hasobject:
            raise ValueError(f"npz: {key!r} expected an array of numbers or strings, got dtype object")
        name = f"{key}.npy".encode()
        header, data = _header(array), array.tobytes()
        size = len(header) + len(data)
        if offset + size > _LIMIT:
            raise ValueError(f"npz: {key!r} makes the archive larger than 4 GiB (expected a trajectory's arrays)")
        crc = zlib.crc32(data, zlib.crc32(header))
        local = _LOCAL.pack(b"PK\x03\x04", _VERSION, 0, 0, _DOS_TIME, _DOS_DATE, crc, size, size, len(name), 0)
        central.append(_CENTRAL.pack(b"PK\x01\x02", _VERSION, _VERSION, 0, 0, _DOS_TIME, _DOS_DATE, crc, size, size,
                                     len(name), 0, 0, 0, 0, 0, offset) + name)  # fmt: skip
        parts += (local, name, header, data)
        offset += len(local) + len(name) + size
    directory = b"".join(central)
    end = _END.pack(b"PK\x05\x06", 0, 0, len(central), len(central), len(directory), offset, 0)
    return b"".join(parts) + directory + end
