"""Batched ``resize_with_pad`` for camera views: numpy arrays and torch tensors on any device.

The DreamZero reference client resizes every camera view with openpi-client's
``image_tools.resize_with_pad``: one PIL ``BILINEAR`` resize per image in a Python loop, then a paste onto a
black canvas. This module produces the same images for a whole batch at once, without PIL:

- the geometry is openpi-client's: ``ratio = max(W / width, H / height)``, content of
  ``int(H / ratio) x int(W / ratio)``, pasted on a zero canvas at ``(int((height - h) / 2),
  int((width - w) / 2))`` (floor-centred);
- the filter is PIL's antialiased bilinear resampling (a triangle filter stretched by the downscale
  factor), separable, with PIL's 22-bit fixed-point weights and its rounding of the intermediate image to
  uint8. Pillow 13 runs the vertical pass first when an image loses more than twice as many rows as
  columns (:func:`vertical_first`), earlier Pillow always starts with the horizontal pass; this module
  follows Pillow 13. For resize-with-pad the order only differs for inputs more than twice as tall as
  wide, and then by at most one level.

Three implementations, picked by ``method``:

``"exact"``
    PIL's fixed-point arithmetic reproduced bit for bit. On numpy the two passes are banded matrix
    products (float32 BLAS, with each weight split in a high and a low part so every sum stays an exact
    integer below 2**24); on an accelerator they are gathers and integer multiply-adds. Output is
    identical to openpi-client's (with Pillow 13).
``"torch"``
    torch's own antialiased bilinear kernel (``F.interpolate(..., antialias=True)``). On CPU it runs on uint8: PIL's
    algorithm with 16-bit instead of 22-bit weights, identical output when the scale factors are powers of two
    (720x1280 -> 180x320 among them), at most one level off otherwise, and several times faster than the PIL loop on
    a CPU (``benchmarks/bench_preprocess.py``, benchmarks/README.md). On an accelerator it runs in float32 and
    rounds once (at most one level off).
``"auto"`` (default)
    ``"torch"`` for numpy arrays and CPU tensors when torch is importable, ``"exact"`` otherwise (numpy
    without torch, and tensors on accelerators).

Inputs are ``[..., H, W, 3]`` uint8 (any number of leading dims, including none); anything else raises a
one-line ``ValueError``/``TypeError`` naming the argument (also when no resize is needed, where
openpi-client would pass anything through). An input already at the target size is returned as the same
object, not a copy, as openpi-client does. torch is optional: it is imported only when a tensor is
passed or ``"auto"``/``"torch"`` uses it.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np

PRECISION_BITS = 22  # PIL's fixed-point precision for 8-bit images: 32 - 8 - 2
_HALF = 1 << (PRECISION_BITS - 1)
_SPLIT_BITS = 7  # low bits of each weight computed in a second float32 product (see _band_blocks)
_METHODS = ("auto", "exact", "torch")


# ----------------------------------------------------------------------------------------------------
# Geometry and filter coefficients (pure Python floats, in PIL's order of operations)


def padded_geometry(in_height: int, in_width: int, height: int, width: int) -> tuple[int, int, int, int]:
    """``(content_height, content_width, top, left)`` of openpi-client's resize-with-pad.

    The same float expressions as openpi-client, so the truncations agree for every size.

    >>> padded_geometry(720, 1280, 224, 224)  # a 16:9 view in a square: black bands above and below
    (126, 224, 49, 0)
    """
    ratio = max(in_width / width, in_height / height)
    resized_height = int(in_height / ratio)
    resized_width = int(in_width / ratio)
    top = max(0, int((height - resized_height) / 2))
    left = max(0, int((width - resized_width) / 2))
    return resized_height, resized_width, top, left


@dataclass(frozen=True)
class AxisFilter:
    """PIL's bilinear resampling of one axis from ``in_size`` to ``out_size`` samples.

    Output sample ``i`` is ``sum(x[starts[i] + t] * weights[i, t] for t < counts[i])`` in fixed point
    (weights sum to about ``2**22``), rounded by adding ``2**21`` and shifting right by 22, clipped to
    [0, 255].
    """

    in_size: int
    out_size: int
    starts: np.ndarray  # (out_size,) int64
    counts: np.ndarray  # (out_size,) int64
    weights: np.ndarray  # (out_size, ksize) int64, zero past counts[i]

    @property
    def ksize(self) -> int:
        return int(self.weights.shape[1])


@functools.lru_cache(maxsize=64)
def axis_filter(in_size: int, out_size: int) -> AxisFilter:
    """The coefficients PIL computes for a bilinear resize of one axis (``precompute_coeffs``).

    Doubles in the same order as PIL's C code (sequential weight sums included), then PIL's rounding to
    22-bit fixed point, so the integer weights are PIL's exactly.
    """
    if in_size < 1 or out_size < 1:
        raise ValueError(f"axis sizes: expected >= 1, got in={in_size}, out={out_size}")
    scale = float(in_size) / out_size
    filterscale = max(scale, 1.0)
    support = 1.0 * filterscale  # bilinear support is 1
    ksize = int(np.ceil(support)) * 2 + 1
    inv = 1.0 / filterscale
    starts = np.zeros(out_size, dtype=np.int64)
    counts = np.zeros(out_size, dtype=np.int64)
    weights = np.zeros((out_size, ksize), dtype=np.int64)
    for xx in range(out_size):
        center = (xx + 0.5) * scale
        xmin = max(int(center - support + 0.5), 0)
        xmax = min(int(center + support + 0.5), in_size) - xmin
        taps = []
        total = 0.0
        for x in range(xmax):
            arg = abs((x + xmin - center + 0.5) * inv)
            w = 1.0 - arg if arg < 1.0 else 0.0
            taps.append(w)
            total += w
        for x, w in enumerate(taps):
            if total != 0.0:
                w /= total
            # PIL: (int)(0.5 + w * (1 << PRECISION_BITS)) for w >= 0 (bilinear weights are never negative)
            weights[xx, x] = int(0.5 + w * (1 << PRECISION_BITS))
        starts[xx] = xmin
        counts[xx] = xmax
    for array in (starts, counts, weights):
        array.setflags(write=False)
    return AxisFilter(in_size, out_size, starts, counts, weights)


# ----------------------------------------------------------------------------------------------------
# Exact numpy implementation: banded matrix products in float32 with split weights


@dataclass(frozen=True)
class _Band:
    """One block of consecutive outputs ``[o0, o1)`` that reads inputs ``[s, e)``; ``matrix`` (e-s, 2B)."""

    o0: int
    o1: int
    s: int
    e: int
    matrix: np.ndarray


@functools.lru_cache(maxsize=64)
def _band_blocks(in_size: int, out_size: int, block: int) -> tuple[tuple[_Band, ...], np.dtype]:
    """The filter as a list of dense bands, each ``[hi | lo]`` columns, and the dtype to multiply in.

    A fixed-point weight ``k < 2**23`` is ``hi * 2**7 + lo``. With float32 products, every partial sum of
    ``pixel * hi`` and of ``pixel * lo`` is an integer below ``2**24`` as long as a tap count times
    ``255 * 2**7`` stays below ``2**24``: then BLAS computes both sums exactly, in any order. Filters
    with more taps (downscales beyond ~250x) use float64, where one product is exact.
    """
    filt = axis_filter(in_size, out_size)
    use_f32 = int(filt.counts.max()) * 255 * (1 << _SPLIT_BITS) < (1 << 24)
    dtype = np.dtype(np.float32 if use_f32 else np.float64)
    bands = []
    for o0 in range(0, out_size, block):
        o1 = min(o0 + block, out_size)
        s = int(filt.starts[o0:o1].min())
        e = int((filt.starts[o0:o1] + filt.counts[o0:o1]).max())
        width = o1 - o0
        dense = np.zeros((e - s, width), dtype=np.int64)
        for j, o in enumerate(range(o0, o1)):
            c = int(filt.counts[o])
            start = int(filt.starts[o]) - s
            dense[start : start + c, j] = filt.weights[o, :c]
        if use_f32:
            matrix = np.concatenate([dense >> _SPLIT_BITS, dense & ((1 << _SPLIT_BITS) - 1)], axis=1)
        else:
            matrix = dense
        matrix = np.ascontiguousarray(matrix, dtype=dtype)
        matrix.setflags(write=False)
        bands.append(_Band(o0, o1, s, e, matrix))
    return tuple(bands), dtype


def _fixed_point_to_uint8(hi: np.ndarray, lo: np.ndarray | None) -> np.ndarray:
    """PIL's ``clip8((sum + 2**21) >> 22)`` from the exact partial sums of a band product."""
    if lo is None:  # float64 product: the whole sum, exact
        total = hi.astype(np.int64)
    else:
        total = hi.astype(np.int32)
        total <<= _SPLIT_BITS
        total += lo.astype(np.int32)
    total += _HALF
    total >>= PRECISION_BITS
    np.clip(total, 0, 255, out=total)
    return total.astype(np.uint8)


def _band_product(a: np.ndarray, band: _Band, dtype: np.dtype, left: bool) -> np.ndarray:
    """uint8 result of one band: ``a[..., s:e] @ M`` (``left=False``) or ``M.T @ a[..., s:e, :]``."""
    width = band.o1 - band.o0
    if left:
        product = np.matmul(band.matrix.T, a[..., band.s : band.e, :])
        hi, lo = product[..., :width, :], product[..., width:, :]
    else:
        product = a[..., band.s : band.e] @ band.matrix
        hi, lo = product[..., :width], product[..., width:]
    return _fixed_point_to_uint8(hi, lo if dtype == np.float32 else None)


# Elements converted to float at a time: small enough to stay in cache, large enough that the per-band
# products are long BLAS calls.
_CHUNK_ELEMENTS = 1 << 20


def band_width(in_size: int, out_size: int) -> int:
    """Outputs per band: about 32 input samples per band (8 outputs at a 4x reduction, 32 when enlarging),
    the size that measured fastest for skinny single-threaded BLAS products."""
    return max(8, min(64, round(32 * out_size / max(in_size, out_size))))


@functools.lru_cache(maxsize=1)
def _blas_controller():
    """threadpoolctl's controller of the loaded BLAS libraries, or None without threadpoolctl."""
    try:
        from threadpoolctl import ThreadpoolController
    except ImportError:
        return None
    return ThreadpoolController()


def _single_threaded_blas():
    """Context in which BLAS runs on one thread.

    The band products are many medium-sized calls; with its own threads OpenBLAS spins between them, and
    on a busy machine (a simulator and a server sharing the cores) that made the numpy path many times slower.
    The work is split over our own threads instead (:func:`_parallel`), which block rather than spin.
    """
    controller = _blas_controller()
    if controller is None:
        return contextlib.nullcontext()
    return controller.limit(limits=1, user_api="blas")


@functools.lru_cache(maxsize=1)
def _workers() -> ThreadPoolExecutor | None:
    count = min(4, os.cpu_count() or 1)
    return ThreadPoolExecutor(max_workers=count, thread_name_prefix="dz-resize") if count > 1 else None


def _parallel(task, total: int, step: int) -> None:
    """Run ``task(start, stop)`` over ``range(0, total, step)`` chunks, spread over the worker threads."""
    starts = list(range(0, total, step))
    pool = _workers()
    if pool is None or len(starts) < 2:
        for start in starts:
            task(start, min(start + step, total))
        return
    count = pool._max_workers
    groups = [starts[i::count] for i in range(count)]

    def run_group(group):
        for start in group:
            task(start, min(start + step, total))

    for future in [pool.submit(run_group, group) for group in groups if group]:
        future.result()


def _horizontal_pass(planar: np.ndarray, out_w: int) -> np.ndarray:
    """Resample the last axis of ``planar`` ``(n, H, 3, W)`` (any strides) to ``out_w``; planar uint8 out."""
    n, in_h, channels, in_w = planar.shape
    bands, dtype = _band_blocks(in_w, out_w, band_width(in_w, out_w))
    lines = planar.reshape(n * in_h, channels, in_w)  # a view for planar and for transposed NHWC input
    out = np.empty((n * in_h, channels, out_w), dtype=np.uint8)
    step = max(1, _CHUNK_ELEMENTS // (channels * in_w))

    def task(r0: int, r1: int) -> None:
        rows = lines[r0:r1].astype(dtype).reshape(-1, in_w)
        out_rows = out[r0:r1].reshape(-1, out_w)
        for band in bands:
            out_rows[:, band.o0 : band.o1] = _band_product(rows, band, dtype, left=False)

    _parallel(task, n * in_h, step)
    return out.reshape(n, in_h, channels, out_w)


def _vertical_pass(planar: np.ndarray, out_h: int) -> np.ndarray:
    """Resample axis 1 of ``planar`` ``(n, H, 3, W)`` (any strides) to ``out_h``; planar uint8 out."""
    n, in_h, channels, in_w = planar.shape
    bands, dtype = _band_blocks(in_h, out_h, band_width(in_h, out_h))
    out = np.empty((n, out_h, channels * in_w), dtype=np.uint8)
    # Chunks of whole images, or of column ranges within an image when one image is already large.
    step = max(1, _CHUNK_ELEMENTS // (in_h * channels * in_w))
    columns = planar.reshape(n, in_h, channels * in_w) if planar.flags.c_contiguous else None

    def task(i0: int, i1: int) -> None:
        planes = columns[i0:i1] if columns is not None else planar[i0:i1]
        planes = planes.astype(dtype).reshape(i1 - i0, in_h, channels * in_w)
        for band in bands:
            out[i0:i1, band.o0 : band.o1, :] = _band_product(planes, band, dtype, left=True)

    _parallel(task, n, step)
    return out.reshape(n, out_h, channels, in_w)


def vertical_first(in_h: int, in_w: int, out_h: int, out_w: int) -> bool:
    """Whether PIL resamples rows before columns for this resize.

    Pillow 13 does the vertical pass first when the image loses more than twice as many rows as columns
    (``in_h - out_h > max(0, 2 * (in_w - out_w))``); earlier Pillow always went horizontal first. Only
    a resize that changes both axes is affected, and the order changes results by at most one level.
    """
    lost_rows = in_h - out_h
    return lost_rows > 0 and lost_rows > 2 * (in_w - out_w)


def _resize_numpy_exact(images: np.ndarray, out_h: int, out_w: int) -> np.ndarray:
    """Resize ``(N, H, W, 3)`` uint8 to ``(N, out_h, out_w, 3)`` exactly as PIL's bilinear."""
    _, in_h, in_w, _ = images.shape
    planar = images.transpose(0, 1, 3, 2)  # (N, H, 3, W) view; the first pass converts it
    passes = [("h", out_w != in_w), ("v", out_h != in_h)]
    if vertical_first(in_h, in_w, out_h, out_w):
        passes.reverse()
    with _single_threaded_blas():
        for axis, needed in passes:
            if needed:
                planar = _horizontal_pass(planar, out_w) if axis == "h" else _vertical_pass(planar, out_h)
    return planar.transpose(0, 1, 3, 2)


# ----------------------------------------------------------------------------------------------------
# torch implementations (imported lazily)


@functools.lru_cache(maxsize=1)
def torch_available() -> bool:
    """Whether torch can be imported (checked once, without importing it)."""
    return importlib.util.find_spec("torch") is not None


def is_torch_tensor(value: Any) -> bool:
    """True for a torch tensor, without importing torch."""
    return type(value).__module__.startswith("torch") and hasattr(value, "detach")


def to_numpy(value: Any) -> np.ndarray:
    """``value`` as a host numpy array: a tensor (any device) is detached and copied to the host; numpy
    arrays, lists and scalars go through ``np.asarray`` (no copy for an array). The one tensor-to-numpy
    conversion of the package.

    >>> to_numpy([1, 2]).tolist()
    [1, 2]
    >>> a = np.zeros(3); to_numpy(a) is a
    True
    """
    if is_torch_tensor(value):
        return value.detach().cpu().numpy()
    return np.asarray(value)


@functools.lru_cache(maxsize=64)
def _torch_taps(in_size: int, out_size: int, device: str):
    """Gather indices ``(out, ksize)`` (clamped in range) and int32 weights of an axis, on ``device``."""
    import torch

    filt = axis_filter(in_size, out_size)
    index = filt.starts[:, None] + np.arange(filt.ksize)[None, :]
    index = np.minimum(index, in_size - 1)  # padding taps carry weight 0
    return (
        torch.tensor(index.reshape(-1), dtype=torch.long, device=device),
        torch.tensor(np.array(filt.weights), dtype=torch.int32, device=device),
    )


def _torch_pass_exact(x, dim: int, out_size: int):
    """One exact fixed-point pass of ``x`` (uint8, 4-D NHWC) along ``dim`` (1: rows, 2: columns)."""
    import torch

    in_size = x.shape[dim]
    if in_size == out_size:
        return x
    index, weights = _torch_taps(in_size, out_size, str(x.device))
    ksize = weights.shape[1]
    gathered = torch.index_select(x, dim, index)  # (..., out*ksize, ...) uint8
    shape = list(x.shape)
    shape[dim : dim + 1] = [out_size, ksize]
    gathered = gathered.view(shape)
    w_shape = [1] * len(shape)
    w_shape[dim], w_shape[dim + 1] = out_size, ksize
    total = (gathered.to(torch.int32) * weights.view(w_shape)).sum(dim=dim + 1, dtype=torch.int32)
    total += _HALF
    total >>= PRECISION_BITS
    return total.clamp_(0, 255).to(torch.uint8)


def _resize_torch_exact(images, out_h: int, out_w: int):
    """PIL's fixed-point bilinear on a torch device: ``(N, H, W, 3)`` uint8 -> ``(N, out_h, out_w, 3)``."""
    # Bound the int32 temporaries (N x out x ksize x ...) by resizing in slices of the batch.
    n, in_h, in_w, channels = images.shape
    ksize_w = axis_filter(in_w, out_w).ksize if out_w != in_w else 1
    per_image = in_h * out_w * ksize_w * channels * 4
    step = max(1, int((256 << 20) // max(per_image, 1)))
    dims = [(2, out_w), (1, out_h)]
    if vertical_first(in_h, in_w, out_h, out_w):
        dims.reverse()
    outs = []
    for i in range(0, n, step):
        part = images[i : i + step]
        for dim, size in dims:
            part = _torch_pass_exact(part, dim, size)
        outs.append(part)
    if len(outs) == 1:
        return outs[0]
    import torch

    return torch.cat(outs, dim=0)


def _resize_torch_kernel(images, out_h: int, out_w: int):
    """torch's antialiased bilinear: ``(N, H, W, 3)`` uint8 -> ``(N, out_h, out_w, 3)`` uint8.

    On CPU it runs on uint8 directly (torch's vectorized port of PIL's algorithm, 16-bit weights). Other
    devices have no uint8 bilinear kernel: there it runs in float32 and rounds once at the end (PIL
    rounds after each pass), so a pixel can differ from PIL's by one level.
    """
    import torch
    import torch.nn.functional as F

    nchw = images.permute(0, 3, 1, 2)  # channels-last strides: the layout torch's fast uint8 path wants
    if images.device.type == "cpu":
        out = F.interpolate(nchw, size=(out_h, out_w), mode="bilinear", align_corners=False, antialias=True)
    else:
        out = F.interpolate(
            nchw.to(torch.float32), size=(out_h, out_w), mode="bilinear", align_corners=False, antialias=True
        )
        out = out.round_().clamp_(0, 255).to(torch.uint8)
    return out.permute(0, 2, 3, 1)


# ----------------------------------------------------------------------------------------------------
# Public API


def _check(images: Any, height: int, width: int, method: str) -> tuple[bool, tuple[int, ...]]:
    """Validate the arguments; return (is_torch, shape)."""
    if method not in _METHODS:
        raise ValueError(f"method: expected one of {_METHODS}, got {method!r}")
    for name, value in (("height", height), ("width", width)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
            raise ValueError(f"{name}: expected an integer >= 1, got {value!r}")
    is_torch = is_torch_tensor(images)
    if not is_torch and not isinstance(images, np.ndarray):
        raise TypeError(f"images: expected a numpy array or torch tensor, got {type(images).__name__}")
    shape = tuple(int(d) for d in images.shape)
    if len(shape) < 3 or shape[-1] != 3 or shape[-2] < 1 or shape[-3] < 1:
        raise ValueError(f"images: expected shape [..., H, W, 3] with H, W >= 1, got {shape}")
    dtype = str(images.dtype)
    if dtype not in ("uint8", "torch.uint8"):
        raise TypeError(f"images: expected dtype uint8, got {dtype}")
    if method == "torch" and not torch_available():
        raise ValueError("method: 'torch' needs torch installed (pip install torch), or use 'exact'")
    return is_torch, shape


def _torch_view_of(array: np.ndarray):
    """A CPU tensor sharing ``array``'s memory (copied first if torch cannot share it)."""
    import torch

    if not array.flags.writeable or any(stride < 0 for stride in array.strides):
        array = np.array(array, copy=True)
    return torch.from_numpy(array)


def _resize_content(batch: Any, is_torch: bool, new_h: int, new_w: int, method: str) -> Any:
    """The resized content ``(N, new_h, new_w, 3)`` of ``batch`` ``(N, H, W, 3)``, same kind as ``batch``."""
    if is_torch:
        on_cpu = batch.device.type == "cpu"
        if method == "torch" or (method == "auto" and on_cpu):
            return _resize_torch_kernel(batch, new_h, new_w)
        if on_cpu:  # exact on CPU: the numpy implementation, on the tensor's memory
            import torch

            return torch.from_numpy(np.ascontiguousarray(_resize_numpy_exact(batch.numpy(), new_h, new_w)))
        return _resize_torch_exact(batch, new_h, new_w)
    if method == "torch" or (method == "auto" and torch_available()):
        return _resize_torch_kernel(_torch_view_of(batch), new_h, new_w).numpy()
    return _resize_numpy_exact(batch, new_h, new_w)


def resize_with_pad(images: Any, height: int, width: int, *, method: str = "auto") -> Any:
    """Resize ``[..., H, W, 3]`` uint8 images to ``[..., height, width, 3]`` keeping the aspect ratio.

    Same result as openpi-client's ``image_tools.resize_with_pad``: identical with ``method="exact"``,
    within one intensity level with ``"torch"`` (identical at power-of-two scale factors on CPU). Returns
    the same kind as the input: a numpy array for numpy, a tensor on the input's device for a tensor. An
    input already ``height x width`` is returned as is (the same object, not a copy).

    >>> views = np.full((2, 3, 720, 1280, 3), 200, dtype=np.uint8)  # (envs, cameras, H, W, RGB)
    >>> out = resize_with_pad(views, 224, 224, method="exact")
    >>> out.shape, out.dtype.name
    ((2, 3, 224, 224, 3), 'uint8')
    >>> int(out[0, 0, 0, 0, 0]), int(out[0, 0, 112, 112, 0])  # padding, content
    (0, 200)
    >>> resize_with_pad(out, 224, 224) is out
    True
    """
    is_torch, shape = _check(images, height, width, method)
    in_h, in_w = shape[-3], shape[-2]
    if (in_h, in_w) == (height, width):
        return images
    new_h, new_w, top, left = padded_geometry(in_h, in_w, height, width)
    if new_h < 1 or new_w < 1:
        raise ValueError(
            f"images: a {in_h}x{in_w} image fitted into {height}x{width} keeps no rows or columns ({new_h}x{new_w})"
        )
    lead = shape[:-3]
    batch = images.reshape(-1, in_h, in_w, 3)
    if (new_h, new_w) == (in_h, in_w):
        content = batch  # only padding: PIL copies the image unchanged
    else:
        content = _resize_content(batch, is_torch, new_h, new_w, method)
    return _pad(content, is_torch, height, width, top, left).reshape(*lead, height, width, 3)


def _pad(content: Any, is_torch: bool, height: int, width: int, top: int, left: int) -> Any:
    """``content`` ``(N, h, w, 3)`` pasted on a black ``(N, height, width, 3)`` canvas at (top, left)."""
    n, new_h, new_w, _ = content.shape
    if (new_h, new_w) == (height, width):
        return content.contiguous() if is_torch else np.ascontiguousarray(content)
    if is_torch and content.device.type != "cpu":
        import torch

        out = torch.zeros((n, height, width, 3), dtype=torch.uint8, device=content.device)
        out[:, top : top + new_h, left : left + new_w] = content
        return out
    # CPU: numpy fills and copies on the calling thread (torch's parallel fill contends on a busy CPU).
    out = np.zeros((n, height, width, 3), dtype=np.uint8)
    out[:, top : top + new_h, left : left + new_w] = content.numpy() if is_torch else content
    if is_torch:
        import torch

        return torch.from_numpy(out)
    return out


def resize_with_pad_to_numpy(images: Any, height: int, width: int, *, method: str = "auto") -> np.ndarray:
    """:func:`resize_with_pad`, returned as a host numpy array.

    A tensor on an accelerator is resized there and only the small result is copied to the host (16x fewer
    bytes than 720x1280 views at 180x320). A CPU tensor or numpy input already at the target size comes
    back as a view of the same memory, not a copy.
    """
    return to_numpy(resize_with_pad(images, height, width, method=method))
