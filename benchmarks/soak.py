"""Soak test of the client transport: many sessions for a long time, with network and server faults.

64 sessions (``--sessions``) of one :class:`~dz_gym.transport.SessionPool` run closed loops against the
reference server (``dz-gym-serve``, vllm-omni flavor, in its own process) for ``--minutes`` minutes. Between
them sits the loopback fault proxy (:mod:`dz_gym.testing.proxy`, in a third process so that its sockets
and memory are not counted as the client's). The soak's own bookkeeping is a few counters, so what
grows with the request count is the transport's alone. Every ``--fault-every`` requests one live connection gets a
fault, in turn: a reset mid-frame, a stall mid-frame, a half-open link, added latency (stalled and
half-open links are reset, and latency is removed, after 3 request timeouts), and an idle gap (a session
pauses longer than the server's 5 s idle timeout, so the server closes its connection cleanly and the next
request is re-sent on a fresh connection); the server also
answers every ``5 x --fault-every``-th inference with an error (retried once: ``retry_server_errors=1``).
A session whose request failed on a broken connection reconnects, as the evaluator's wrapper does.

Every request is stamped; the server's :class:`~dz_gym.testing.servers.StampPolicy` echoes how many times it
processed each stamp, so a request processed twice shows up in its reply.

It prints, every ``--sample-s`` seconds: elapsed time, requests, errors, reconnects, client RSS (MB), client
open file descriptors and the server's open sockets; at the end the RSS and fd slopes after the warm-up
(least squares, per 10 minutes) and these checks:

- RSS slope after warm-up < 1 MB per 10 min; open fds flat (slope < 1 per 10 min);
- no row lost: one row per request sent;
- no request processed twice;
- the server's open sockets back to the baseline (before the pool connected) once the pool closed.

Exit status 0 when every check passes, 1 otherwise. Run:
``python benchmarks/soak.py --minutes 20`` (about 25 minutes in all; ``--minutes 1`` for a smoke run).
"""

from __future__ import annotations

import argparse
import collections
import concurrent.futures
import math
import multiprocessing
import os
import random
import sys
import time
from typing import Any

import numpy as np

from dz_gym.protocol import JOINT_KEY
from dz_gym.server.launch import start_server_process
from dz_gym.testing.servers import STAMP_KEY
from dz_gym.transport import SessionPool, TransportConfig

FAULTS = ("reset", "stall", "half_open", "latency", "idle")
IDLE_TIMEOUT_S = 5.0  # the server's idle timeout; an "idle" fault pauses a session 1.5 times as long


# ------------------------------------------------------------------------------------------------ proxy process
def _proxy_main(conn: Any, target_port: int, seed: int) -> None:
    """The fault proxy in its own process, driven over a pipe: ``("fault", kind)`` arms ``kind`` on a random
    live connection and answers its index (or -1); ``("release", index)``; ``("stop",)``."""
    from dz_gym.testing.proxy import Fault, FaultProxy

    rng = random.Random(seed)
    with FaultProxy(target_port) as proxy:
        conn.send(proxy.port)
        while True:
            command = conn.recv()
            if command[0] == "stop":
                conn.send("stopped")
                return
            if command[0] in ("release", "clear"):
                (proxy.release if command[0] == "release" else proxy.clear)(command[1])
                conn.send(None)
                continue
            kind = command[1]
            live = proxy.active()
            if not live:
                conn.send(-1)
                continue
            index = rng.choice(live)
            fault = {
                "reset": Fault("reset", after_bytes=rng.randrange(0, 600)),
                "stall": Fault("stall", after_bytes=rng.randrange(1, 600)),
                "half_open": Fault("half_open"),
                "latency": Fault("latency", latency_s=0.2),
            }[kind]
            proxy.inject(index, fault)
            conn.send(index)


class ProxyProcess:
    def __init__(self, target_port: int, seed: int):
        context = multiprocessing.get_context("spawn")
        self._conn, child = context.Pipe()
        self.process = context.Process(target=_proxy_main, args=(child, target_port, seed), daemon=True)
        self.process.start()
        if not self._conn.poll(30):
            raise RuntimeError("the fault proxy did not start within 30 s")
        self.port = self._conn.recv()

    def call(self, *command: Any) -> Any:
        self._conn.send(command)
        if not self._conn.poll(10):
            raise RuntimeError(f"the fault proxy did not answer {command[0]!r} within 10 s")
        return self._conn.recv()

    def stop(self) -> None:
        try:
            self.call("stop")
        finally:
            self.process.join(10)
            if self.process.is_alive():
                self.process.kill()


# ------------------------------------------------------------------------------------------------ measurements
def rss_mb(pid: int | str = "self") -> float:
    with open(f"/proc/{pid}/statm", encoding="ascii") as handle:
        return int(handle.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 1e6


def open_fds(pid: int | str = "self") -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def open_sockets(pid: int) -> int:
    count = 0
    for name in os.listdir(f"/proc/{pid}/fd"):
        try:
            count += os.readlink(f"/proc/{pid}/fd/{name}").startswith("socket:")
        except OSError:  # closed meanwhile
            pass
    return count


def slope_per_10_min(samples: list[tuple[float, float]]) -> float:
    """Least-squares slope of (seconds, value) samples, in value per 10 minutes."""
    if len(samples) < 2:
        return float("nan")
    t = np.array([s[0] for s in samples])
    v = np.array([s[1] for s in samples])
    return float(np.polyfit(t, v, 1)[0] * 600.0)


def make_request(session: int, count: int, image: np.ndarray) -> dict:
    return {
        "observation/exterior_image_0_left": image,
        JOINT_KEY: np.full(7, 0.001 * (count % 100)),
        "observation/gripper_position": np.zeros(1),
        "prompt": "put the marker in the mug",
        "session_id": f"soak-{session:03d}",
        "endpoint": "infer",
        STAMP_KEY: f"{session}-{count}",
    }


# ------------------------------------------------------------------------------------------------ the soak
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=20.0, help="duration of the loaded phase (default 20)")
    parser.add_argument("--sessions", type=int, default=64, help="concurrent sessions (default 64)")
    parser.add_argument("--fault-every", type=int, default=100, help="requests between two faults (default 100)")
    parser.add_argument("--warmup-minutes", type=float, default=None, help="excluded from the slopes (default: 20%%)")
    parser.add_argument("--sample-s", type=float, default=30.0, help="seconds between two samples (default 30)")
    parser.add_argument("--latency-ms", type=float, default=40.0, help="the server's model time (default 40)")
    parser.add_argument("--workers", type=int, default=4, help="the server's workers (default 4)")
    parser.add_argument("--request-timeout", type=float, default=2.0, help="per request (default 2 s)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if args.minutes <= 0 or args.sessions < 1 or args.fault_every < 1:
        parser.error("--minutes > 0, --sessions >= 1 and --fault-every >= 1 expected")
    duration = args.minutes * 60.0
    warmup = (args.warmup_minutes * 60.0) if args.warmup_minutes is not None else 0.2 * duration

    server = start_server_process(
        ["--flavor", "vllm-omni", "--workers", str(args.workers), "--latency-ms", str(args.latency_ms), "--quiet",
         "--idle-timeout", str(IDLE_TIMEOUT_S),
         "--fail-every", str(5 * args.fault_every), "--policy", "dz_gym.testing.servers:StampPolicy"],
        timeout=60,
    )  # fmt: skip
    proxy: ProxyProcess | None = None
    try:
        proxy = ProxyProcess(server.port, args.seed)
        result = _soak(args, server, proxy, duration)
    finally:
        if proxy is not None:
            proxy.stop()
        server.stop(10)
    return _report(args, result, warmup)


def _soak(args: argparse.Namespace, server: Any, proxy: ProxyProcess, duration: float) -> dict:
    server_baseline = open_sockets(server.pid)
    config = TransportConfig(
        open_timeout=5, request_timeout=args.request_timeout, close_timeout=1.0, connect_retries=2,
        retry_backoff=0.1, retry_backoff_max=1.0, retry_server_errors=1, ping_interval=20.0, ping_timeout=20.0,
    )  # fmt: skip
    rng = np.random.default_rng(args.seed)
    image = rng.integers(0, 256, size=(96, 128, 3), dtype=np.uint8)
    counts = collections.Counter()
    errors = collections.Counter()
    rows = collections.Counter()  # one row per finished request: "rows", "ok", "reconnects", "retries" summed
    duplicates = 0
    faults_armed = collections.Counter()
    to_release: list[tuple[float, str, int]] = []  # (when, "release" or "clear", proxy connection)
    samples: list[tuple[float, float, int, int]] = []
    print(
        f"soak: {args.sessions} sessions, {args.minutes:g} min, a fault every {args.fault_every} requests, "
        f"server pid {server.pid} ({args.workers} workers, {args.latency_ms:g} ms), proxy pid {proxy.process.pid}",
        flush=True,
    )
    print(
        f"{'t_s':>7} {'requests':>9} {'errors':>7} {'reconn':>7} {'rss_mb':>8} {'fds':>5} {'srv_sockets':>11}",
        flush=True,
    )
    pool = SessionPool(f"ws://127.0.0.1:{proxy.port}", args.sessions, config)
    try:
        pool.connect()
        start = time.monotonic()
        next_sample = start
        sent = 0
        per_session = [0] * args.sessions
        pending: dict[concurrent.futures.Future, int] = {}
        pause_next: set[int] = set()  # sessions that sit idle after their current request
        paused: dict[int, float] = {}  # session -> when it sends again

        def submit(i: int) -> None:
            nonlocal sent
            if not pool.is_connected(i):
                try:
                    pool.reconnect(i)
                    counts["session_reconnects"] += 1
                except Exception as exc:  # noqa: BLE001 - recorded; the session tries again next time
                    errors[f"reconnect:{type(exc).__name__}"] += 1
            per_session[i] += 1
            pending[pool.submit(i, make_request(i, per_session[i], image))] = i
            sent += 1
            if sent % args.fault_every == 0:
                kind = FAULTS[(sent // args.fault_every) % len(FAULTS)]
                if kind == "idle":
                    pause_next.add(int(rng.integers(args.sessions)))
                    faults_armed[kind] += 1
                    return
                index = proxy.call("fault", kind)
                if index >= 0:
                    faults_armed[kind] += 1
                    action = "clear" if kind == "latency" else "release" if kind in ("stall", "half_open") else None
                    if action is not None:  # a stalled link is held until then; added latency ends then
                        to_release.append((time.monotonic() + 3 * args.request_timeout, action, index))

        for i in range(args.sessions):
            submit(i)
        while pending or paused:
            wake = min(paused.values(), default=math.inf) - time.monotonic()
            done, _ = concurrent.futures.wait(
                list(pending),
                timeout=max(0.0, min(config.request_bound(), wake)),
                return_when=concurrent.futures.FIRST_COMPLETED,
            )
            now = time.monotonic()
            if not done and wake > config.request_bound():
                raise RuntimeError(f"no request finished within {config.request_bound():g} s")
            for i in [i for i, when in paused.items() if when <= now]:
                del paused[i]
                submit(i)
            for future in done:
                i = pending.pop(future)
                outcome = future.result()
                rows.update(rows=1, ok=outcome.ok, reconnects=outcome.reconnects, retries=outcome.retries)
                if outcome.ok:
                    duplicates += float(outcome.reply.actions[0, 7]) != 1.0
                else:
                    errors[type(outcome.error).__name__] += 1
                if now - start >= duration:
                    continue
                if i in pause_next:
                    pause_next.discard(i)
                    paused[i] = now + 1.5 * IDLE_TIMEOUT_S
                else:
                    submit(i)
            while to_release and to_release[0][0] <= now:
                _, action, index = to_release.pop(0)
                proxy.call(action, index)
            if now >= next_sample:
                samples.append((now - start, rss_mb(), open_fds(), open_sockets(server.pid)))
                t, rss, fds, srv = samples[-1]
                reconnects = rows["reconnects"] + counts["session_reconnects"]
                print(
                    f"{t:7.0f} {rows['rows']:9d} {sum(errors.values()):7d} {reconnects:7d} {rss:8.1f} {fds:5d} {srv:11d}",
                    flush=True,
                )
                next_sample = now + args.sample_s
        elapsed = time.monotonic() - start
    finally:
        pool.close()
        for _, action, index in to_release:
            proxy.call(action, index)
    # The server closes connections whose peer went away within its ping bounds (20 s + 20 s by default).
    deadline = time.monotonic() + 90
    server_after = open_sockets(server.pid)
    while server_after > server_baseline and time.monotonic() < deadline:
        time.sleep(1.0)  # a benchmark's wait for the server's own cleanup; bounded
        server_after = open_sockets(server.pid)
    return {
        "rows": rows, "sent": sent, "elapsed": elapsed, "errors": errors, "duplicates": duplicates,
        "faults": faults_armed, "session_reconnects": counts["session_reconnects"], "samples": samples,
        "server_baseline": server_baseline, "server_after": server_after,
    }  # fmt: skip


def _report(args: argparse.Namespace, result: dict, warmup: float) -> int:
    rows, elapsed = result["rows"], result["elapsed"]
    steady = [s for s in result["samples"] if s[0] >= warmup]
    rss_slope = slope_per_10_min([(s[0], s[1]) for s in steady])
    fd_slope = slope_per_10_min([(s[0], s[2]) for s in steady])
    ok_rows, total = rows["ok"], rows["rows"]
    print()
    print(
        f"requests: {total} in {elapsed:.0f} s ({total / elapsed:.1f}/s), {ok_rows} ok, errors {dict(result['errors'])}"
    )
    print(
        f"faults: {dict(result['faults'])}; re-sends on fresh connections: {rows['reconnects']}, "
        f"server-error retries: {rows['retries']}, session reconnects: {result['session_reconnects']}"
    )
    if steady:
        print(
            f"after the {warmup / 60:.1f} min warm-up: RSS {steady[0][1]:.1f} -> {steady[-1][1]:.1f} MB, "
            f"slope {rss_slope:+.2f} MB per 10 min; fds {steady[0][2]} -> {steady[-1][2]}, "
            f"slope {fd_slope:+.2f} per 10 min"
        )
    baseline = result["server_baseline"]
    checks = {
        "RSS slope < 1 MB per 10 min": rss_slope < 1.0,
        "open fds flat (slope < 1 per 10 min)": abs(fd_slope) < 1.0,
        "no row lost (one row per request sent)": total == result["sent"],
        "no request processed twice": result["duplicates"] == 0,
        f"server sockets back to baseline ({baseline}; now {result['server_after']})": result["server_after"]
        <= baseline,
        "most requests succeeded (> 90 %)": ok_rows > 0.9 * total,
    }
    exit_code = 0
    for name, passed in checks.items():
        print(f"{'PASS' if passed else 'FAIL'} {name}")
        exit_code |= not passed
    return exit_code


if __name__ == "__main__":
    sys.exit(main())
