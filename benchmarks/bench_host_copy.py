"""The GPU-to-host copy of one request round's views: into PyTorch's page-locked memory (the baseline) vs into a
:class:`~dz_gym.transport.workers.views.HostViews` block (shared memory, page-locked with ``cudaHostRegister``,
what a :class:`~dz_gym.transport.ProcessSessionPool`'s workers read directly) vs into pageable memory.

Each is :func:`dz_gym.requests._to_host` of N envs' three 180x320x3 uint8 views on the GPU (as the wrapper calls
it), timed over ``--repeats`` calls after two warm-ups, median ms per round and GB/s, with the ratio to the
baseline. Needs a CUDA GPU.

Usage: python benchmarks/bench_host_copy.py [--num-envs 256 1024] [--repeats 10]
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from dz_gym.requests import _to_host
from dz_gym.transport.workers.segments import create_segment
from dz_gym.transport.workers.views import HostViews

CAMERAS = ("external_cam", "external_cam_2", "wrist_cam")


def timed(call, repeats: int) -> float:
    """Median seconds of ``call()`` after two warm-ups."""
    for _ in range(2):
        call()
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        call()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def measure(num: int, views: HostViews, device: str, repeats: int) -> None:
    """Print the three rows of N = ``num``."""
    import torch

    parts = {c: [torch.randint(0, 255, (num, 180, 320, 3), dtype=torch.uint8, device=device)] for c in CAMERAS}
    nbytes = sum(p[0].numel() for p in parts.values())
    expected = {c: p[0].cpu().numpy() for c, p in parts.items()}
    for camera, array in _to_host(parts, views.alloc).items():  # the shared path lands the same bytes
        np.testing.assert_array_equal(array, expected[camera])
    pageable = np.empty(nbytes, np.uint8)
    shared = "shared, registered" if views.pinned else "shared, not registered"
    arms = {
        "torch pinned": lambda: _to_host(parts),
        shared: lambda: _to_host(parts, views.alloc),
        "pageable": lambda: _to_host(parts, lambda n: pageable),
    }
    base = None
    for name, call in arms.items():
        seconds = timed(call, repeats)
        base = seconds if base is None else base
        print(f"| {num} | {nbytes / 1e6:.0f} | {name} | {seconds * 1e3:.1f} | {nbytes / seconds / 1e9:.1f} "
              f"| {base / seconds:.2f}x |")  # fmt: skip


def main() -> None:
    import torch

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--num-envs", type=int, nargs="+", default=[256, 1024])
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--device", default="cuda:0")
    args = parser.parse_args()
    torch.cuda.init()
    views = HostViews(create_segment, lambda k, name: None)
    print("| N | MB per round | into | ms | GB/s | vs torch pinned |")
    print("|---|---|---|---|---|---|")
    try:
        for num in args.num_envs:
            measure(num, views, args.device, args.repeats)
    finally:
        views.close()


if __name__ == "__main__":
    main()
