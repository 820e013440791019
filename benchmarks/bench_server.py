"""Reference-server throughput: N clients against one FIFO queue with K workers and emulated model time.

Each client holds one connection and sends DreamZero requests back to back (three 180x320x3 views). With
``--latency-ms L`` and ``--workers K`` the ideal rate is K / L chunks per second once N >= K clients keep the
queue full; the script prints the measured rate, that ideal, their ratio (1.0 = no server overhead) and the
server's own utilization. It also runs a single client at latency 0 to show the per-request overhead of the
protocol path (encode, loopback, decode, reply).

Usage: python benchmarks/bench_server.py [--latency-ms 50] [--requests 20] [--flavor vllm-omni]
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
import uuid

import numpy as np
from websockets.sync.client import connect

from dz_gym.protocol import build_infer_request, packb, parse_infer_response
from dz_gym.server import start_server_thread

KEYS = ("observation/exterior_image_0_left", "observation/exterior_image_1_left", "observation/wrist_image_left")


def client(url: str, requests: int, endpoint: str | None, errors: list) -> None:
    rng = np.random.default_rng()
    images = {key: rng.integers(0, 256, (180, 320, 3), dtype=np.uint8) for key in KEYS}
    frame = packb(
        build_infer_request(
            images=images,
            joint_position=np.zeros(7),
            gripper_position=[0.0],
            prompt="put the cube in the bowl",
            session_id=str(uuid.uuid4()),
            endpoint=endpoint,
        )
    )
    try:
        with connect(url, max_size=None, compression=None, open_timeout=30) as ws:
            ws.recv(30)
            for _ in range(requests):
                ws.send(frame)
                parse_infer_response(ws.recv(60), horizon=24)
    except Exception as exc:  # reported, not raised from a thread
        errors.append(exc)


def run(flavor: str, clients: int, workers: int, latency_ms: float, requests: int) -> tuple[float, float]:
    endpoint = None if flavor == "openpi" else "infer"
    with start_server_thread("hold", flavor=flavor, workers=workers, latency_ms=latency_ms) as server:
        errors: list = []
        threads = [
            threading.Thread(target=client, args=(server.url, requests, endpoint, errors)) for _ in range(clients)
        ]
        start = time.perf_counter()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        elapsed = time.perf_counter() - start
        stats = server.stats()
    if errors:
        raise RuntimeError(f"client failed: {errors[0]!r}")
    return clients * requests / elapsed, stats.utilization


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--flavor", default="vllm-omni", choices=("vllm-omni", "dreamzero", "openpi"))
    parser.add_argument("--latency-ms", type=float, default=50.0)
    parser.add_argument("--requests", type=int, default=20, help="requests per client")
    args = parser.parse_args()

    rate, _ = run(args.flavor, 1, 1, 0.0, args.requests * 5)
    print(f"latency 0, 1 client: {rate:8.1f} chunks/s ({1000 / rate:.2f} ms per request round trip)")
    ideal_one = 1000.0 / args.latency_ms
    for clients, workers in ((1, 1), (4, 1), (8, 1), (4, 2), (8, 4)):
        rate, util = run(args.flavor, clients, workers, args.latency_ms, args.requests)
        ideal = ideal_one * min(clients, workers)
        print(
            f"latency {args.latency_ms:.0f} ms, {clients} clients, {workers} workers: {rate:7.1f} chunks/s, "
            f"ideal {ideal:6.1f}, ratio {rate / ideal:.2f}, server utilization {util:.2f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
