"""Benchmark: batched resize-with-pad of 8 envs x 3 camera views, 720x1280 -> 180x320.

Compares every implementation of ``dz_gym.preprocess`` with openpi-client's ``image_tools.resize_with_pad``
(one PIL call per view, the reference client's way), measured in the same process on the same images.
For each implementation it prints the median time of one batch, the speed-up over the PIL loop, and the
largest per-pixel difference from openpi-client's output (with the share of values that differ).

On a CUDA machine it also times the GPU paths, from a batch already on the GPU (as Isaac Lab returns
it), both for the resize alone and through ``resize_with_pad_to_numpy`` (the host copy included); the
baseline there is what the reference client does: copy the full-size views to the host, then the PIL loop.

Usage: python benchmarks/bench_preprocess.py [--envs 8] [--views 3] [--repeat 15] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dz_gym import preprocess  # noqa: E402

HEIGHT, WIDTH = 180, 320


def scene_images(n: int, height: int, width: int, seed: int = 0) -> np.ndarray:
    """Camera-like test views: lit wall, textured table in perspective, shaded balls, sensor noise."""
    rng = np.random.default_rng(seed)
    v, u = np.mgrid[0:height, 0:width].astype(np.float32)
    v, u = v / height, u / width
    out = np.empty((n, height, width, 3), dtype=np.uint8)
    for i in range(n):
        horizon = np.float32(0.4 + 0.05 * rng.standard_normal())
        depth = np.maximum(v - horizon, 1e-3)
        grain = 0.5 + 0.5 * np.sin(9.0 * (u - 0.5) / depth) * np.cos(1.3 / depth)
        img = np.where(
            (v > horizon)[..., None],
            np.stack([0.45 + 0.2 * grain, 0.3 + 0.15 * grain, 0.18 + 0.08 * grain], axis=-1),
            np.stack([0.75 - 0.2 * v, 0.78 - 0.15 * v, 0.82 - 0.1 * v + 0.05 * u], axis=-1),
        )
        for _ in range(3):
            cu, cv, radius = rng.uniform(0.2, 0.8), rng.uniform(horizon + 0.1, 0.9), rng.uniform(0.05, 0.12)
            du, dv = (u - cu) * width / height, v - cv
            r2 = (du**2 + dv**2) / radius**2
            shade = np.clip(0.3 + 0.7 * (0.5 * np.sqrt(np.clip(1 - r2, 0, 1)) - 0.4 * du / radius), 0.05, 1)
            img = np.where((r2 < 1)[..., None], rng.uniform(0.1, 1.0, 3).astype(np.float32) * shade[..., None], img)
        img = img * 255 + rng.normal(0, 2.0, img.shape).astype(np.float32)
        out[i] = np.clip(img, 0, 255).astype(np.uint8)
    return out


def timed(fn, repeat: int, sync=None) -> float:
    """Median wall time of ``fn()`` in milliseconds, after one warm-up call."""
    fn()
    if sync:
        sync()
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        if sync:
            sync()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def compare(ours, ref: np.ndarray) -> tuple[int, float]:
    """(max abs difference, share of differing values) of ``ours`` against the reference output."""
    ours = preprocess.resize_with_pad_to_numpy(ours, HEIGHT, WIDTH) if not isinstance(ours, np.ndarray) else ours
    diff = np.abs(ours.astype(np.int16) - ref.astype(np.int16))
    return int(diff.max()), float((diff > 0).mean())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--envs", type=int, default=8)
    parser.add_argument("--views", type=int, default=3)
    parser.add_argument("--repeat", type=int, default=15)
    parser.add_argument("--in-height", type=int, default=720)
    parser.add_argument("--in-width", type=int, default=1280)
    parser.add_argument("--json", type=Path, default=None, help="also write the results to this file")
    args = parser.parse_args()

    count = args.envs * args.views
    images = scene_images(count, args.in_height, args.in_width, seed=1).reshape(
        args.envs, args.views, args.in_height, args.in_width, 3
    )
    try:
        from openpi_client import image_tools
    except ImportError:
        image_tools = None
        print("openpi-client is not installed: no PIL-loop baseline (pip install --no-deps openpi-client)")

    results = []

    def record(name: str, ms: float, out, baseline_ms: float | None) -> None:
        diff, share = compare(out, ref)
        ratio = baseline_ms / ms if baseline_ms else float("nan")
        results.append({"name": name, "ms": ms, "speedup": ratio, "max_diff": diff, "share_differing": share})
        print(f"{name:<48} {ms:9.2f} ms {ratio:8.2f}x   max|diff| {diff}  ({share:.2%} of values differ)")

    print(f"{count} views {args.in_height}x{args.in_width} -> {HEIGHT}x{WIDTH}, median of {args.repeat}")
    print(f"python {platform.python_version()}, numpy {np.__version__}, machine {platform.machine()}")
    if image_tools is not None:
        ref = np.asarray(image_tools.resize_with_pad(images, HEIGHT, WIDTH))
        base = timed(lambda: image_tools.resize_with_pad(images, HEIGHT, WIDTH), args.repeat)
        record("openpi-client resize_with_pad (PIL loop)", base, ref, base)
    else:
        ref = preprocess.resize_with_pad(images, HEIGHT, WIDTH, method="exact")
        base = None

    def bench(name: str, fn, baseline_ms: float | None, sync=None) -> None:
        record(name, timed(fn, args.repeat, sync), fn(), baseline_ms)

    def resize(batch, method: str):
        return lambda: preprocess.resize_with_pad(batch, HEIGHT, WIDTH, method=method)

    bench("dz_gym numpy exact", resize(images, "exact"), base)
    try:
        import torch
    except ImportError:
        torch = None
        print("torch is not installed: torch paths skipped")
    if torch is not None:
        print(f"torch {torch.__version__}, {torch.get_num_threads()} CPU threads")
        bench("dz_gym auto, numpy in (torch uint8 kernel)", resize(images, "auto"), base)
        cpu = torch.from_numpy(images)
        bench("dz_gym torch CPU tensor, torch kernel", resize(cpu, "torch"), base)
        bench("dz_gym torch CPU tensor, exact", resize(cpu, "exact"), base)
        if torch.cuda.is_available():
            gpu = cpu.cuda()
            sync = torch.cuda.synchronize
            print(f"CUDA device: {torch.cuda.get_device_name(0)}")
            host_base = None
            if image_tools is not None:

                def pil_from_gpu():
                    return image_tools.resize_with_pad(gpu.cpu().numpy(), HEIGHT, WIDTH)

                host_base = timed(pil_from_gpu, args.repeat, sync)
                record("reference: GPU->host copy + PIL loop", host_base, pil_from_gpu(), host_base)
            bench("dz_gym CUDA exact (integer gathers)", resize(gpu, "exact"), host_base, sync)
            bench("dz_gym CUDA torch float32 kernel", resize(gpu, "torch"), host_base, sync)
            for method in ("exact", "torch"):

                def to_host(method=method):
                    return preprocess.resize_with_pad_to_numpy(gpu, HEIGHT, WIDTH, method=method)

                bench(f"dz_gym CUDA {method} + host copy (to_numpy)", to_host, host_base, sync)
    if args.json:
        args.json.write_text(json.dumps({"views": count, "results": results}, indent=2))


if __name__ == "__main__":
    main()
