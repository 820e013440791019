"""Codec speed: encode + decode of one DreamZero infer request, dz_gym.protocol vs openpi_client.msgpack_numpy.

The request is what the reference client sends: three 180x320x3 uint8 views, float64 proprio, the prompt and
a uuid session id (~519 KB). Both codecs run in the same process, interleaved, and the script prints the
median time of each and the ratio (ours / openpi; below 1.0 means faster). Target: not slower. One more row
compares ``packb`` with msgpack's own packer and dz_gym's array hook (``packb``'s general path, which was all
of it before the fast path of :mod:`dz_gym.protocol.packer`).

``--round N`` instead encodes N distinct requests (views of (N, 180, 320, 3) camera batches, as a batched env
gives them) and keeps them all, as one ``SessionPool.submit_many`` round does, with the process's heap as
glibc sets it (dz-gym sets no heap thresholds), and prints the median per-request time and the page faults per
request of each encoder. Each encoder runs its rounds in a block of its own: interleaved, one encoder's
leftovers pin the heap's top and hide the trimming.

Usage: python benchmarks/bench_codec.py [--repeats 200] [--rounds 7] [--round 1024]
"""

from __future__ import annotations

import argparse
import resource
import statistics
import sys
import time
import uuid

import msgpack
import numpy as np

from dz_gym.protocol import build_infer_request, codec, packb, unpackb

CAMERAS = ("observation/exterior_image_0_left", "observation/exterior_image_1_left", "observation/wrist_image_left")


def msgpack_path(obj) -> bytes:
    """msgpack's packer with dz_gym's array hook: packb's general path (all of packb before its fast path)."""
    return msgpack.packb(obj, default=codec._encode_hook, use_bin_type=True)


def make_request() -> dict:
    rng = np.random.default_rng(0)
    images = {key: rng.integers(0, 256, (180, 320, 3), dtype=np.uint8) for key in CAMERAS}
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


def encode_round(num: int, rounds: int) -> None:
    """Per-request time and page faults of encoding a round of ``num`` distinct requests, all kept at once."""
    rng = np.random.default_rng(1)
    batches = [rng.integers(0, 256, (num, 180, 320, 3), dtype=np.uint8) for _ in CAMERAS]
    requests = [
        build_infer_request(images={key: batch[i] for key, batch in zip(CAMERAS, batches)}, joint_position=np.zeros(7),
                            gripper_position=[0.0], prompt="put the cube in the bowl", session_id=f"s-{i:06d}")
        for i in range(num)
    ]  # fmt: skip
    size = len(packb(requests[0]))
    print(f"round of {num} requests ({num * size / 2**20:.0f} MiB)")
    times: dict[str, list[float]] = {"packb": [], "msgpack path": []}
    faults: dict[str, list[float]] = {"packb": [], "msgpack path": []}
    for name, encode in (("packb", packb), ("msgpack path", msgpack_path)):  # not interleaved: see below
        for _ in range(rounds + 1):
            faults0, start = resource.getrusage(resource.RUSAGE_SELF).ru_minflt, time.perf_counter()
            frames = [encode(request) for request in requests]
            times[name].append((time.perf_counter() - start) / num)
            faults[name].append((resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults0) / num)
            del frames
    for name in times:  # the first round (the heap growing) is left out
        t, f = statistics.median(times[name][1:]), statistics.median(faults[name][1:])
        print(f"round encode   {name:13s} {t * 1e6:8.1f} us per request   {f:6.1f} page faults per request")
    print(
        f"round ratio packb / msgpack path {statistics.median(times['packb'][1:]) / statistics.median(times['msgpack path'][1:]):.2f}"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=200, help="calls per timing")
    parser.add_argument("--rounds", type=int, default=7, help="interleaved timings per codec (median taken)")
    parser.add_argument("--round", type=int, default=0, help="encode rounds of N distinct requests instead")
    args = parser.parse_args()
    if args.round:  # alone: the heap its rounds leave would change the openpi baseline's page faults
        encode_round(args.round, args.rounds)
        return 0
    try:
        from openpi_client import msgpack_numpy
    except ImportError:
        print("bench_codec: openpi-client is not installed (pip install --no-deps openpi-client)", file=sys.stderr)
        return 1

    request = make_request()
    frame = packb(request)
    assert frame == msgpack_numpy.packb(request) == msgpack_path(request), "frames differ: not wire-identical"
    print(f"request: {len(frame)} bytes")

    cases = {
        "encode": (lambda: packb(request), lambda: msgpack_numpy.packb(request)),
        "decode": (lambda: unpackb(frame), lambda: msgpack_numpy.unpackb(frame)),
        "encode+decode": (lambda: unpackb(packb(request)), lambda: msgpack_numpy.unpackb(msgpack_numpy.packb(request))),
        # last: msgpack's growing buffer changes glibc's heap state, which the openpi rows above depend on
        "encode vs msgpack path": (lambda: packb(request), lambda: msgpack_path(request)),
    }
    for name, (ours, theirs) in cases.items():
        ours(), theirs()  # warm up
        ours_t, theirs_t = [], []
        for _ in range(args.rounds):
            ours_t.append(time_per_call(ours, args.repeats))
            theirs_t.append(time_per_call(theirs, args.repeats))
        o, t = statistics.median(ours_t), statistics.median(theirs_t)
        other = "msgpack path " if name == "encode vs msgpack path" else "openpi_client"
        print(f"{name:22s} dz_gym {o * 1e6:8.1f} us   {other} {t * 1e6:8.1f} us   ratio {o / t:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
