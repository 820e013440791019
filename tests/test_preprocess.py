"""Tests of dz_gym.preprocess against openpi-client's ``image_tools.resize_with_pad`` (PIL)."""

from __future__ import annotations

import functools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dz_gym import preprocess
from dz_gym.preprocess import axis_filter, padded_geometry, resize_with_pad, resize_with_pad_to_numpy

image_tools = pytest.importorskip("openpi_client.image_tools")
PIL = pytest.importorskip("PIL")
from PIL import Image  # noqa: E402

# Pillow 13 resamples rows first when an image loses more than twice as many rows as columns; older
# Pillow always starts with columns. Our "exact" follows Pillow 13, so compare bit for bit only there.
PILLOW_MAJOR = int(PIL.__version__.split(".")[0])


def cached(make):
    """Generate each test image set once per session (a fresh copy per call)."""
    cache = functools.lru_cache(maxsize=None)(make)

    @functools.wraps(make)
    def wrapper(n: int, height: int, width: int, seed: int = 0) -> np.ndarray:
        return cache(n, height, width, seed).copy()

    return wrapper


@cached
def synthetic_images(n: int, height: int, width: int, seed: int = 0) -> np.ndarray:
    """Gradients + noise + saturated blocks: every intensity, hard edges and clipping."""
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:height, 0:width].astype(np.float64)
    out = np.empty((n, height, width, 3), dtype=np.uint8)
    for i in range(n):
        base = np.stack(
            [xx * 255 / max(width - 1, 1), yy * 255 / max(height - 1, 1), (xx + 2 * yy + 37 * i) % 256], axis=-1
        )
        img = base + rng.normal(0, 25, base.shape)
        img[height // 5 : height // 3, width // 7 : width // 2] = 255
        img[height // 2 : height // 2 + max(1, height // 9), width // 3 :] = 0
        img[::7, ::5] = rng.integers(0, 256, img[::7, ::5].shape)
        out[i] = np.clip(img, 0, 255).astype(np.uint8)
    return out


@cached
def natural_images(n: int, height: int, width: int, seed: int = 0) -> np.ndarray:
    """Rendered-looking scenes: a lit wall and a textured table in perspective, shaded balls, soft
    shadows, smooth colour gradients and mild sensor noise."""
    rng = np.random.default_rng(seed)
    v, u = np.mgrid[0:height, 0:width].astype(np.float64)
    v, u = v / height, u / width
    out = np.empty((n, height, width, 3), dtype=np.uint8)
    for i in range(n):
        horizon = 0.42 + 0.05 * rng.standard_normal()
        wall = np.stack([0.75 - 0.2 * v, 0.78 - 0.15 * v, 0.82 - 0.1 * v + 0.05 * u], axis=-1)
        depth = np.maximum(v - horizon, 1e-3)
        tu, tv = (u - 0.5) / depth, 1.0 / depth
        grain = 0.5 + 0.5 * np.sin(9.0 * tu + 0.7 * np.sin(2.0 * tv)) * np.cos(1.3 * tv)
        table = np.stack([0.45 + 0.2 * grain, 0.3 + 0.15 * grain, 0.18 + 0.08 * grain], axis=-1)
        img = np.where((v > horizon)[..., None], table, wall)
        for _ in range(4):
            cu, cv = rng.uniform(0.15, 0.85), rng.uniform(horizon + 0.1, 0.9)
            radius = rng.uniform(0.04, 0.12)
            colour = rng.uniform(0.1, 1.0, 3)
            du, dv = (u - cu) * width / height, v - cv
            shadow = np.exp(-((du - 0.03) ** 2 + (dv - 0.5 * radius) ** 2 * 4) / (radius**2))
            img *= (1.0 - 0.35 * shadow)[..., None]
            r2 = (du**2 + dv**2) / radius**2
            inside = r2 < 1.0
            nz = np.sqrt(np.clip(1.0 - r2, 0.0, 1.0))
            shade = np.clip(0.3 + 0.7 * (0.5 * nz - 0.4 * du / radius - 0.5 * dv / radius), 0.05, 1.0)
            highlight = np.clip(nz - 0.85, 0, None) * 4
            ball = colour * shade[..., None] + highlight[..., None]
            img = np.where(inside[..., None], ball, img)
        img = img * 255 + rng.normal(0, 2.0, img.shape)
        out[i] = np.clip(np.round(img), 0, 255).astype(np.uint8)
    return out


def reference(images: np.ndarray, height: int, width: int) -> np.ndarray:
    """openpi-client's result (a fresh array even when nothing changes)."""
    return np.array(image_tools.resize_with_pad(images, height, width))


def max_diff(a, b) -> int:
    return int(np.abs(np.asarray(a, dtype=np.int32) - np.asarray(b, dtype=np.int32)).max())


def bitwise_expected(in_h: int, in_w: int, height: int, width: int) -> bool:
    """Whether openpi-client's result must equal ours bit for bit under the installed Pillow."""
    new_h, new_w, _, _ = padded_geometry(in_h, in_w, height, width)
    return PILLOW_MAJOR >= 13 or not preprocess.vertical_first(in_h, in_w, new_h, new_w)


SIZES = [
    ((720, 1280), (180, 320)),  # sim-evals cameras -> DreamZero: exact 4x, no padding
    ((480, 640), (180, 320)),  # 4:3 -> 16:9: black bars left and right
    ((224, 224), (180, 320)),  # square
    ((101, 77), (33, 25)),  # odd sizes, non-integer factors
    ((37, 53), (180, 257)),  # upscale with padding
    ((90, 160), (180, 320)),  # exact 2x upscale
    ((500, 100), (180, 320)),  # tall: Pillow 13 resamples rows first
    ((181, 320), (180, 320)),  # one row too many
]


@pytest.mark.parametrize("make", [synthetic_images, natural_images], ids=["synthetic", "natural"])
@pytest.mark.parametrize(("in_size", "out_size"), SIZES, ids=[f"{a[0]}x{a[1]}-{b[0]}x{b[1]}" for a, b in SIZES])
def test_exact_matches_openpi_client(make, in_size, out_size):
    images = make(2, *in_size, seed=in_size[0])
    ours = resize_with_pad(images, *out_size, method="exact")
    ref = reference(images, *out_size)
    assert ours.shape == ref.shape and ours.dtype == np.uint8
    if bitwise_expected(*in_size, *out_size):
        np.testing.assert_array_equal(ours, ref)
    else:
        assert max_diff(ours, ref) <= 1


@pytest.mark.parametrize("make", [synthetic_images, natural_images], ids=["synthetic", "natural"])
@pytest.mark.parametrize(("in_size", "out_size"), SIZES, ids=[f"{a[0]}x{a[1]}-{b[0]}x{b[1]}" for a, b in SIZES])
def test_torch_kernel_within_one_level(make, in_size, out_size):
    pytest.importorskip("torch")
    images = make(2, *in_size, seed=in_size[0])
    ref = reference(images, *out_size)
    for method in ("auto", "torch"):
        ours = resize_with_pad(images, *out_size, method=method)
        assert isinstance(ours, np.ndarray) and ours.shape == ref.shape
        assert max_diff(ours, ref) <= 1, method


def test_power_of_two_downscale_is_bit_exact_on_every_method():
    torch = pytest.importorskip("torch")
    images = np.concatenate([natural_images(2, 720, 1280, seed=720), synthetic_images(2, 720, 1280, seed=720)])
    ref = reference(images, 180, 320)
    for method in ("auto", "exact", "torch"):
        np.testing.assert_array_equal(resize_with_pad(images, 180, 320, method=method), ref)
        np.testing.assert_array_equal(resize_with_pad(torch.from_numpy(images), 180, 320, method=method).numpy(), ref)


def test_leading_dims_are_kept():
    images = synthetic_images(6, 96, 128, seed=3).reshape(2, 3, 96, 128, 3)
    ours = resize_with_pad(images, 45, 80, method="exact")
    assert ours.shape == (2, 3, 45, 80, 3)
    np.testing.assert_array_equal(ours, reference(images, 45, 80))
    single = resize_with_pad(images[1, 2], 45, 80, method="exact")
    assert single.shape == (45, 80, 3)
    np.testing.assert_array_equal(single, ours[1, 2])


def test_padding_is_black_and_floor_centred():
    images = np.full((1, 480, 640, 3), 200, dtype=np.uint8)
    out = resize_with_pad(images, 180, 320, method="exact")[0]
    # 480x640 -> 180x240 content, (320 - 240) / 2 = 40 px bars
    assert (out[:, :40] == 0).all() and (out[:, 280:] == 0).all()
    assert (out[:, 40:280] == 200).all()
    new_h, new_w, top, left = padded_geometry(37, 53, 180, 257)
    assert (new_h, new_w) == (int(37 / (53 / 257)), 257) and left == 0
    assert top == int((180 - new_h) / 2)


def test_target_size_returns_same_object():
    images = synthetic_images(2, 180, 320)
    assert resize_with_pad(images, 180, 320) is images
    assert resize_with_pad_to_numpy(images, 180, 320) is images


def test_torch_cpu_tensors_keep_kind_and_device():
    torch = pytest.importorskip("torch")
    images = natural_images(3, 240, 320, seed=9)
    tensor = torch.from_numpy(images)
    ref = reference(images, 180, 320)
    for method in ("auto", "exact", "torch"):
        out = resize_with_pad(tensor, 180, 320, method=method)
        assert isinstance(out, torch.Tensor) and out.device == tensor.device and out.dtype == torch.uint8
        assert tuple(out.shape) == (3, 180, 320, 3)
        assert max_diff(out.numpy(), ref) <= (0 if method == "exact" else 1)
    host = resize_with_pad_to_numpy(tensor, 180, 320, method="exact")
    assert isinstance(host, np.ndarray)
    np.testing.assert_array_equal(host, ref)
    same = torch.from_numpy(synthetic_images(1, 180, 320))
    assert resize_with_pad(same, 180, 320) is same
    assert np.shares_memory(resize_with_pad_to_numpy(same, 180, 320), same.numpy())


def test_torch_exact_gather_path_matches_numpy():
    # The accelerator path (integer gathers) checked on CPU tensors, where it is slow but identical.
    torch = pytest.importorskip("torch")
    images = synthetic_images(2, 150, 200, seed=4)
    for shape in [(60, 80), (150, 90), (40, 200), (300, 250), (50, 20)]:
        expected = preprocess._resize_numpy_exact(images, *shape)
        got = preprocess._resize_torch_exact(torch.from_numpy(images), *shape)
        np.testing.assert_array_equal(got.numpy(), expected)
    tall = synthetic_images(1, 400, 30, seed=8)
    np.testing.assert_array_equal(
        preprocess._resize_torch_exact(torch.from_numpy(tall), 50, 20).numpy(),
        preprocess._resize_numpy_exact(tall, 50, 20),
    )


def test_non_writable_and_negative_stride_arrays():
    images = synthetic_images(2, 120, 160, seed=2)
    ref = reference(np.ascontiguousarray(images[:, ::-1]), 90, 160)
    flipped = images[:, ::-1]
    frozen = images.copy()
    frozen.setflags(write=False)
    for method in ("auto", "exact"):
        np.testing.assert_array_equal(resize_with_pad(flipped, 90, 160, method=method), ref)
        assert max_diff(resize_with_pad(frozen, 90, 160, method=method), reference(images, 90, 160)) <= 1


def test_without_torch_auto_uses_exact_numpy(monkeypatch):
    monkeypatch.setattr(preprocess, "torch_available", lambda: False)
    images = natural_images(2, 224, 224, seed=11)
    np.testing.assert_array_equal(resize_with_pad(images, 180, 320), reference(images, 180, 320))
    with pytest.raises(ValueError, match="method: 'torch' needs torch"):
        resize_with_pad(images, 180, 320, method="torch")


@settings(max_examples=60, deadline=None)
@given(
    in_h=st.integers(1, 90),
    in_w=st.integers(1, 90),
    out_h=st.integers(1, 120),
    out_w=st.integers(1, 120),
    seed=st.integers(0, 2**16),
)
def test_two_pass_resample_equals_pil(in_h, in_w, out_h, out_w, seed):
    """The plain resize (no padding) equals PIL's ``Image.resize(BILINEAR)`` for any pair of sizes."""
    image = np.random.default_rng(seed).integers(0, 256, (in_h, in_w, 3), dtype=np.uint8)
    pil = np.asarray(Image.fromarray(image).resize((out_w, out_h), Image.BILINEAR))
    if (out_h, out_w) == (in_h, in_w):
        ours = image
    else:
        ours = preprocess._resize_numpy_exact(image[None], out_h, out_w)[0]
    if PILLOW_MAJOR >= 13 or not preprocess.vertical_first(in_h, in_w, out_h, out_w):
        np.testing.assert_array_equal(ours, pil)
    else:
        assert max_diff(ours, pil) <= 1


def test_huge_downscale_uses_float64_and_stays_exact():
    image = synthetic_images(1, 3, 1500, seed=1)
    _, dtype = preprocess._band_blocks(1500, 2, 32)
    assert dtype == np.float64
    pil = np.asarray(Image.fromarray(image[0]).resize((2, 3), Image.BILINEAR))
    np.testing.assert_array_equal(preprocess._resize_numpy_exact(image, 3, 2)[0], pil)


def test_axis_filter_weights():
    for in_size, out_size in [(1280, 320), (640, 240), (53, 257), (7, 3), (100, 100)]:
        filt = axis_filter(in_size, out_size)
        assert filt.starts.shape == (out_size,) and filt.weights.shape[0] == out_size
        assert (filt.starts >= 0).all() and (filt.starts + filt.counts <= in_size).all()
        sums = filt.weights.sum(axis=1)
        assert (np.abs(sums - (1 << 22)) <= filt.counts).all()
    exact4 = axis_filter(1280, 320)
    # A 4x reduction is the triangle (1, 3, 5, 7, 7, 5, 3, 1) / 32 in 22-bit fixed point.
    assert exact4.weights[10, :8].tolist() == [k << 17 for k in (1, 3, 5, 7, 7, 5, 3, 1)]


def test_vertical_first_rule():
    assert not preprocess.vertical_first(720, 1280, 180, 320)
    assert preprocess.vertical_first(500, 100, 180, 36)
    assert not preprocess.vertical_first(90, 160, 180, 320)  # upscale: rows are never first
    assert preprocess.vertical_first(400, 400, 100, 800)


@pytest.mark.parametrize(
    ("images", "height", "width", "method", "error", "match"),
    [
        (np.zeros((4, 4, 3), np.float32), 2, 2, "auto", TypeError, "images: expected dtype uint8, got float32"),
        (np.zeros((4, 4), np.uint8), 2, 2, "auto", ValueError, r"images: expected shape \[\.\.\., H, W, 3\]"),
        (np.zeros((4, 4, 4), np.uint8), 2, 2, "auto", ValueError, "images: expected shape"),
        (np.zeros((0, 4, 3), np.uint8), 2, 2, "auto", ValueError, "images: expected shape"),
        ([[[0, 0, 0]]], 2, 2, "auto", TypeError, "images: expected a numpy array or torch tensor, got list"),
        (np.zeros((4, 4, 3), np.uint8), 0, 2, "auto", ValueError, "height: expected an integer >= 1"),
        (np.zeros((4, 4, 3), np.uint8), 2, 2.5, "auto", ValueError, "width: expected an integer >= 1"),
        (np.zeros((4, 4, 3), np.uint8), 2, 2, "pil", ValueError, "method: expected one of"),
        (np.zeros((1, 1000, 3), np.uint8), 10, 10, "exact", ValueError, "keeps no rows or columns"),
    ],
)
def test_errors(images, height, width, method, error, match):
    with pytest.raises(error, match=match):
        resize_with_pad(images, height, width, method=method)


def test_torch_dtype_error():
    torch = pytest.importorskip("torch")
    with pytest.raises(TypeError, match="images: expected dtype uint8, got torch.float32"):
        resize_with_pad(torch.zeros((4, 4, 3)), 2, 2)


def test_numpy_path_without_threadpoolctl_or_worker_threads(monkeypatch):
    monkeypatch.setattr(preprocess, "_blas_controller", lambda: None)
    monkeypatch.setattr(preprocess, "_workers", lambda: None)
    images = synthetic_images(3, 120, 200, seed=12)
    np.testing.assert_array_equal(resize_with_pad(images, 90, 160, method="exact"), reference(images, 90, 160))


def test_cuda_paths():
    """On a CUDA machine: the exact path is bit-identical, the float kernel within one level."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    images = np.concatenate([natural_images(2, 720, 1280, seed=720), synthetic_images(2, 720, 1280, seed=720)])
    for in_size, out_size in [((720, 1280), (180, 320)), ((480, 640), (180, 320)), ((500, 100), (180, 320))]:
        batch = images[:, : in_size[0], : in_size[1]]
        ref = reference(batch, *out_size)
        gpu = torch.from_numpy(np.ascontiguousarray(batch)).cuda()
        exact = resize_with_pad(gpu, *out_size, method="exact")
        assert exact.device == gpu.device and exact.dtype == torch.uint8
        got = exact.cpu().numpy()
        if bitwise_expected(*in_size, *out_size):
            np.testing.assert_array_equal(got, ref)
        assert max_diff(resize_with_pad_to_numpy(gpu, *out_size, method="torch"), ref) <= 1
        assert max_diff(resize_with_pad_to_numpy(gpu, *out_size), ref) <= 1
