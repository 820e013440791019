"""The tester's own ceiling: how fast can dz-gym-bench drive a server that answers at once?

Starts a zero-latency reference server (``dz-gym-serve --latency-ms 0``) in a subprocess on loopback, then
measures in this process, with full-size DreamZero requests (three 180x320 views, ~519 KB):

- the baseline: one synchronous client that encodes every request as it sends it, the way the single-env
  reference client works (openpi-client's ``WebsocketClientPolicy`` when it is installed, and a plain
  ``websockets.sync`` loop with dz-gym's codec);
- dz-gym-bench itself (pre-encoded payloads over transport sessions) at several concurrencies.

It prints requests/s, MB/s sent, the client's CPU time per request and the ratio to the baseline. The target
is >= 200 requests/s on a 2-core machine. Usage::

    python benchmarks/bench_server_ceiling.py [--duration 3] [--rounds 3] [--concurrency 1,4,8] [--json out.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time

from dz_gym.bench.payloads import PayloadSet, new_session_id, synthetic_views
from dz_gym.bench.runner import BenchConfig, run_benchmark
from dz_gym.protocol import build_infer_request, packb, unpackb
from dz_gym.server.launch import start_server_process

TARGET_REQUESTS_PER_S = 200.0


def _requests(count: int) -> list[dict]:
    views = synthetic_views(count, (180, 320), seed=0)
    return [
        build_infer_request(
            images={
                "observation/exterior_image_0_left": ext,
                "observation/exterior_image_1_left": ext2,
                "observation/wrist_image_left": wrist,
            },
            joint_position=[0.0] * 7,
            gripper_position=[0.0],
            prompt="put the cube in the bowl",
            session_id=new_session_id(),
        )
        for ext, ext2, wrist in views
    ]


def _measure_sync(send_recv, requests: list[dict], duration: float) -> dict:
    """Run ``send_recv(request) -> bytes sent`` back to back for ``duration`` s in this thread."""
    for request in requests[:3]:  # warm up
        send_recv(request)
    count = sent = 0
    cpu0, t0 = time.thread_time(), time.perf_counter()
    while time.perf_counter() - t0 < duration:
        sent += send_recv(requests[count % len(requests)])
        count += 1
    wall, cpu = time.perf_counter() - t0, time.thread_time() - cpu0
    return {
        "requests_per_s": count / wall,
        "mb_per_s": sent / 1e6 / wall,
        "client_cpu_ms_per_request": 1e3 * cpu / count,
    }


def baseline_websockets_sync(url: str, requests: list[dict], duration: float) -> dict:
    """A synchronous loop: encode with dz-gym's codec, send, wait for the reply, decode."""
    from websockets.sync.client import connect

    with connect(url, compression=None, max_size=None, open_timeout=10) as ws:
        ws.recv(timeout=10)  # metadata

        def send_recv(request: dict) -> int:
            data = packb(request)
            ws.send(data)
            unpackb(ws.recv(timeout=30))
            return len(data)

        return _measure_sync(send_recv, requests, duration)


def baseline_openpi_client(url: str, requests: list[dict], duration: float) -> dict | None:
    """openpi-client's WebsocketClientPolicy (the reference client's transport), if installed."""
    try:
        import warnings

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            from openpi_client import msgpack_numpy
            from openpi_client.websocket_client_policy import WebsocketClientPolicy
    except ImportError:
        return None
    policy = WebsocketClientPolicy(url, None)
    size = len(msgpack_numpy.packb(requests[0]))

    def send_recv(request: dict) -> int:
        policy.infer(request)
        return size

    try:
        return _measure_sync(send_recv, requests, duration)
    finally:
        policy._ws.close()


def bench_runs(url: str, concurrencies: list[int], duration: float) -> list[dict]:
    config = BenchConfig(servers=[url], concurrencies=concurrencies, duration_s=duration, max_frames=8)
    result = asyncio.run(run_benchmark(config))
    return result["runs"]


def _median_rows(rounds: list[dict[str, dict]]) -> dict[str, dict]:
    rows = {}
    for name in rounds[0]:
        rows[name] = {key: float(statistics.median(r[name][key] for r in rounds)) for key in rounds[0][name]}
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=float, default=3.0, help="seconds per measurement (default 3)")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds; medians are reported (default 3)")
    parser.add_argument("--concurrency", default="1,4,8", help="dz-gym-bench concurrencies (default 1,4,8)")
    parser.add_argument("--json", default=None, help="also write the numbers as JSON")
    args = parser.parse_args(argv)
    concurrencies = [int(c) for c in args.concurrency.split(",")]

    size = len(PayloadSet(synthetic_views(1, (180, 320))).payload(0, new_session_id()))
    print(
        f"cores: {os.cpu_count()}, request size: {size / 1e3:.1f} KB, "
        f"{args.rounds} interleaved rounds of {args.duration:g} s per client (medians)"
    )
    rounds: list[dict[str, dict]] = []
    with start_server_process(["--latency-ms", "0", "--workers", "1"], stderr="capture") as server:
        requests = _requests(8)
        for _ in range(args.rounds):
            rows: dict[str, dict] = {}
            openpi = baseline_openpi_client(server.url, requests, args.duration)
            if openpi is not None:
                rows["baseline: openpi-client WebsocketClientPolicy"] = openpi
            rows["baseline: websockets.sync + packb per request"] = baseline_websockets_sync(
                server.url, requests, args.duration
            )
            for run in bench_runs(server.url, concurrencies, args.duration):
                rows[f"dz-gym-bench C={run['concurrency']}"] = {
                    "requests_per_s": run["requests_per_s"],
                    "mb_per_s": run["mb_per_s"],
                    "client_cpu_ms_per_request": run["client_cpu_ms_per_request"],
                    "p50_ms": run["latency_ms"]["p50"],
                    "failed": run["failed"],
                }
            rounds.append(rows)
    rows = _median_rows(rounds)
    base_name = next(iter(rows))
    base = rows[base_name]["requests_per_s"]
    print(f"{'client':<48}{'req/s':>9}{'MB/s':>9}{'CPU ms/req':>12}{'x base':>8}")
    for name, row in rows.items():
        print(
            f"{name:<48}{row['requests_per_s']:>9.1f}{row['mb_per_s']:>9.1f}"
            f"{row['client_cpu_ms_per_request']:>12.3f}{row['requests_per_s'] / base:>8.2f}"
        )
    ours = {name: row for name, row in rows.items() if name.startswith("dz-gym-bench")}
    best = max(row["requests_per_s"] for row in ours.values())
    cpu = min(row["client_cpu_ms_per_request"] for row in ours.values())
    verdict = "meets" if best >= TARGET_REQUESTS_PER_S else "MISSES"
    print(
        f"ceiling: {best:.0f} requests/s ({verdict} the {TARGET_REQUESTS_PER_S:.0f} req/s target); "
        f"baseline = {base_name}"
    )
    print(
        f"client CPU {cpu:.3f} ms/request: the client alone would saturate one core at ~{1e3 / cpu:.0f} req/s "
        "(the server shares this machine's cores, so the measured rate is a floor)"
    )
    if args.json:
        with open(args.json, "w", encoding="utf-8") as handle:
            json.dump(
                {
                    "request_bytes": size,
                    "duration_s": args.duration,
                    "rows": rows,
                    "rounds": rounds,
                    "baseline": base_name,
                },
                handle,
                indent=2,
            )
    return 0 if best >= TARGET_REQUESTS_PER_S else 1


if __name__ == "__main__":
    sys.exit(main())
