"""Client-side cost of one request through dz_gym.transport, against openpi-client as the baseline.

A reference server (``dz-gym-serve --flavor vllm-omni``, hold policy, no model time) runs in a *separate
process*, so this process's CPU time is the client's alone. Every variant sends the same ~0.5 MB DreamZero
request (three 180x320x3 uint8 views, proprio, prompt, session id) over loopback and reports, per request:
client CPU (process time, all threads), minor page faults, and round-trip wall time (median and p90).

Variants:
- ``openpi-client``: ``openpi_client.WebsocketClientPolicy.infer`` (synchronous websockets, its own packer),
  the single-env client most evaluators use today: the baseline;
- ``pool.submit(dict)``: the synchronous facade (what the wrapper uses), encoding in the caller's thread, then
  waiting on the future;
- ``pool.submit(bytes)``: the same with a pre-encoded payload (transport cost only);
- ``session.infer(dict) on loop``: encoding on the event loop thread instead;
- ``submit x8`` (one hand-off per request, the caller encodes) and ``gather x8 (loop encodes)``: a batch of
  8 sessions, per request;
- with ``--round N``, ``submit_many xN``: one round of N distinct requests (views of (N, 180, 320, 3) camera
  batches) to N sessions in one ``submit_many``, as the wrapper sends a batch step's requests, per request.

Run: ``python benchmarks/transport_overhead.py [--requests 200] [--round 256]`` (Linux: it reads ``resource`` page faults). Numbers are noisy on a shared machine;
compare the ratios, which are measured in the same process and the same minute.
"""

from __future__ import annotations

import argparse
import asyncio
import resource
import statistics
import time
from collections.abc import Callable

import numpy as np

from dz_gym.protocol import build_infer_request, packb
from dz_gym.server.launch import start_server_process
from dz_gym.transport import SessionPool, TransportConfig


def make_request(k: int = 0) -> dict:
    rng = np.random.default_rng(k)
    images = {
        key: rng.integers(0, 256, size=(180, 320, 3), dtype=np.uint8)
        for key in (
            "observation/exterior_image_0_left",
            "observation/exterior_image_1_left",
            "observation/wrist_image_left",
        )
    }
    return build_infer_request(
        images=images,
        joint_position=np.zeros(7),
        gripper_position=[0.0],
        prompt="put the marker in the mug",
        session_id=f"bench-session-{k:04d}-0000-0000-000000000000",
    )


def round_requests(num: int) -> list[dict]:
    """``num`` distinct requests whose images are views of (num, 180, 320, 3) batches, as a batched env's."""
    rng = np.random.default_rng(1)
    keys = ("observation/exterior_image_0_left", "observation/exterior_image_1_left", "observation/wrist_image_left")
    batches = [rng.integers(0, 256, size=(num, 180, 320, 3), dtype=np.uint8) for _ in keys]
    return [
        build_infer_request(images={key: batch[i] for key, batch in zip(keys, batches)}, joint_position=np.zeros(7),
                            gripper_position=[0.0], prompt="put the marker in the mug",
                            session_id=f"bench-round-{i:06d}-0000-0000-000000000000")
        for i in range(num)
    ]  # fmt: skip


def measure_round(url: str, num: int, config: TransportConfig, requests: int) -> dict:
    """``submit_many`` of one round of ``num`` requests to ``num`` sessions, per request."""
    batch = round_requests(num)
    with SessionPool(url, num, config) as pool:
        pool.connect()

        def one_round() -> int:
            futures = pool.submit_many(list(enumerate(batch)))
            assert all(f.result(120).ok for f in futures)
            return len(futures)

        return measure(f"submit_many x{num} (one round)", one_round, max(requests, 4 * num), warmup=2)


def once(call: Callable[[], object]) -> Callable[[], int]:
    """Wrap a one-request call so it reports 1 request sent."""

    def run() -> int:
        call()
        return 1

    return run


def measure(name: str, call: Callable[[], int], requests: int, warmup: int = 10) -> dict:
    """Run ``call`` (which sends ``n`` requests and returns n) until ``requests`` requests were sent."""
    for _ in range(warmup):
        call()
    walls: list[float] = []
    sent = 0
    faults0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    cpu0 = time.process_time()
    while sent < requests:
        t0 = time.perf_counter()
        n = call()
        walls.append((time.perf_counter() - t0) / n)
        sent += n
    cpu = (time.process_time() - cpu0) / sent
    faults = (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults0) / sent
    walls.sort()
    return {
        "name": name,
        "cpu_ms": cpu * 1e3,
        "page_faults": faults,
        "wall_p50_ms": statistics.median(walls) * 1e3,
        "wall_p90_ms": walls[int(0.9 * (len(walls) - 1))] * 1e3,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=200, help="requests per variant (default 200)")
    parser.add_argument("--round", type=int, default=0, help="also send rounds of N requests to N sessions")
    args = parser.parse_args()

    request = make_request()
    batch = {i: make_request(i) for i in range(8)}
    config = TransportConfig(request_timeout=30)

    server = start_server_process(["--flavor", "vllm-omni", "--workers", "8", "--quiet"], timeout=60)
    rows = []
    try:
        try:
            from openpi_client.websocket_client_policy import WebsocketClientPolicy
        except ImportError:
            WebsocketClientPolicy = None
        if WebsocketClientPolicy is not None:
            baseline = WebsocketClientPolicy(host=server.url)
            rows.append(measure("openpi-client (baseline)", once(lambda: baseline.infer(request)), args.requests))
            baseline._ws.close()
        # Encoded after the baseline ran: the heap state an encoder leaves behind changes how often the
        # baseline's own buffers fault in (glibc adapts its mmap threshold to the buffers freed).
        payload = packb(request)
        print(f"request: {len(payload) / 1e3:.0f} kB encoded")

        with SessionPool(server.url, 8, config) as pool:
            pool.connect()

            def one(body: dict | bytes) -> Callable[[], int]:
                def run() -> int:
                    outcome = pool.submit(0, body).result(30)
                    assert outcome.ok, outcome.error
                    return 1

                return run

            rows.append(measure("pool.submit(dict)", one(request), args.requests))
            rows.append(measure("pool.submit(bytes)", one(payload), args.requests))
            session = pool.session(0)
            rows.append(
                measure(
                    "session.infer(dict) on loop",
                    once(lambda: pool.loop.run(session.infer(request), 30)),
                    args.requests,
                )
            )

            async def gather_on_loop() -> int:
                replies = await asyncio.gather(*(pool.session(i).infer(r) for i, r in batch.items()))
                return len(replies)

            def submit_each() -> int:
                futures = [pool.submit(i, r) for i, r in batch.items()]
                assert all(f.result(30).ok for f in futures)
                return len(futures)

            rows.append(measure("submit x8 (one hand-off each)", submit_each, args.requests))
            rows.append(measure("gather x8 (loop encodes)", lambda: pool.loop.run(gather_on_loop(), 30), args.requests))
        if args.round:
            rows.append(measure_round(server.url, args.round, TransportConfig(request_timeout=120), args.requests))
    finally:
        server.stop(10)

    base = rows[0] if WebsocketClientPolicy is not None else None
    print(
        f"{'variant':34s} {'client CPU ms/req':>18s} {'CPU vs base':>12s} {'page faults/req':>16s} "
        f"{'wall p50 ms':>12s} {'wall p90 ms':>12s}"
    )
    for row in rows:
        ratio = f"{row['cpu_ms'] / base['cpu_ms']:.2f}x" if base else "-"
        print(
            f"{row['name']:34s} {row['cpu_ms']:18.3f} {ratio:>12s} {row['page_faults']:16.1f} "
            f"{row['wall_p50_ms']:12.3f} {row['wall_p90_ms']:12.3f}"
        )


if __name__ == "__main__":
    main()
