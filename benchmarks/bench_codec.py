"""Codec speed: encode + decode of one DreamZero infer request, dz_gym.protocol vs openpi_client.msgpack_numpy.

The request is what the reference client sends: three 180x320x3 uint8 views, float64 proprio, the prompt and
a uuid session id (~519 KB). Both codecs run in the same process, interleaved, and the script prints the
median time of each and the ratio (ours / openpi; below 1.0 means faster). Target: not slower.

Usage: python benchmarks/bench_codec.py [--repeats 200] [--rounds 7]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import uuid

import numpy as np

from dz_gym.protocol import build_infer_request, packb, unpackb


def make_request() -> dict:
    rng = np.random.default_rng(0)
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
        gripper_position=[0.0],
        prompt="put the cube in the bowl",
        session_id=str(uuid.uuid4()),
    )


def time_per_call(fn, repeats: int) -> float:
    start = time.perf_counter()
    for _ in range(repeats):
        fn()
    return (time.perf_counter() - start) / repeats


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=200, help="calls per timing")
    parser.add_argument("--rounds", type=int, default=7, help="interleaved timings per codec (median taken)")
    args = parser.parse_args()
    try:
        from openpi_client import msgpack_numpy
    except ImportError:
        print("bench_codec: openpi-client is not installed (pip install --no-deps openpi-client)", file=sys.stderr)
        return 1

    request = make_request()
    frame = packb(request)
    assert frame == msgpack_numpy.packb(request), "frames differ: the codecs are not wire-identical"
    print(f"request: {len(frame)} bytes")

    cases = {
        "encode": (lambda: packb(request), lambda: msgpack_numpy.packb(request)),
        "decode": (lambda: unpackb(frame), lambda: msgpack_numpy.unpackb(frame)),
        "encode+decode": (lambda: unpackb(packb(request)), lambda: msgpack_numpy.unpackb(msgpack_numpy.packb(request))),
    }
    for name, (ours, theirs) in cases.items():
        ours(), theirs()  # warm up
        ours_t, theirs_t = [], []
        for _ in range(args.rounds):
            ours_t.append(time_per_call(ours, args.repeats))
            theirs_t.append(time_per_call(theirs, args.repeats))
        o, t = statistics.median(ours_t), statistics.median(theirs_t)
        print(f"{name:14s} dz_gym {o * 1e6:8.1f} us   openpi_client {t * 1e6:8.1f} us   ratio {o / t:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
