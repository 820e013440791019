"""``dz-gym-serve``: run the reference policy server from the command line.

Prints one ready line on stdout once it listens (``dz-gym-serve ready on ws://HOST:PORT (flavor=...,
policy=..., workers=...)``), logs one line per request on stderr, stops cleanly on SIGINT/SIGTERM and then
prints a summary line with the request count, busy time and utilization (a signal ignored at start, as SIGINT
is for a background job of a script, stays ignored). A bad flag is one line on stderr and exit status 2.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys

from dz_gym.cli_types import OneLineErrorParser
from dz_gym.server.app import FLAVORS, PolicyServer, ServerConfig
from dz_gym.server.policies import BUILTIN_POLICIES, load_policy, parse_policy_args

__all__ = ["build_parser", "main"]


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineErrorParser(
        prog="dz-gym-serve",
        description="Reference OpenPI/DreamZero websocket policy server (for tests, demos and throughput work).",
    )
    parser.add_argument("--flavor", choices=FLAVORS, default="vllm-omni", help="which real server to behave like")
    parser.add_argument("--host", default="127.0.0.1", help="bind address (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=8000, help="port; 0 picks a free one (default 8000)")
    parser.add_argument(
        "--policy",
        default="hold",
        help=f"built-in policy ({', '.join(sorted(BUILTIN_POLICIES))}) or module:factory (default hold)",
    )
    parser.add_argument(
        "--policy-arg",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="keyword argument for the policy factory (repeatable; JSON values, else strings)",
    )
    parser.add_argument("--workers", type=int, default=1, help="independent inference workers (emulated GPUs)")
    parser.add_argument("--latency-ms", type=float, default=0.0, help="minimum model time per inference")
    parser.add_argument("--jitter-ms", type=float, default=0.0, help="uniform +/- jitter on the model time")
    parser.add_argument("--fail-every", type=int, default=0, metavar="N", help="every N-th inference raises (0: never)")
    parser.add_argument(
        "--idle-timeout",
        type=float,
        default=0.0,
        metavar="S",
        help="vllm-omni: close a connection idle for S seconds (0 disables; the real server uses 30)",
    )
    parser.add_argument("--max-payload-mib", type=float, default=64.0, help="largest request accepted (MiB)")
    parser.add_argument(
        "--no-robot-policy",
        action="store_true",
        help="vllm-omni: answer every handshake with the 'Robot policy not available' text error and close",
    )
    parser.add_argument(
        "--max-sessions",
        type=int,
        default=None,
        metavar="K",
        help="vllm-omni: keep at most K sessions resident and refuse new ones beyond (SessionAdmissionError) "
        "until one is freed by a reset, a session switch or a disconnect (default: no cap)",
    )
    parser.add_argument("--seed", type=int, default=None, help="seed of the latency jitter")
    parser.add_argument("--quiet", action="store_true", help="no per-request log lines")
    return parser


def _config(args: argparse.Namespace) -> ServerConfig:
    return ServerConfig(
        flavor=args.flavor,
        host=args.host,
        port=args.port,
        workers=args.workers,
        latency_ms=args.latency_ms,
        jitter_ms=args.jitter_ms,
        fail_every=args.fail_every,
        idle_timeout_s=args.idle_timeout,
        max_payload_bytes=int(args.max_payload_mib * 1024 * 1024),
        robot_policy_available=not args.no_robot_policy,
        seed=args.seed,
        max_sessions=args.max_sessions,
    )


async def _run(server: PolicyServer) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        if signal.getsignal(sig) is not signal.SIG_IGN:  # started with it ignored (a background job): keep so
            loop.add_signal_handler(sig, stop.set)
    await server.start()
    print(server.ready_line(), flush=True)
    await server.serve_until(stop)
    line = f"dz-gym-serve stopped: {server.stats().summary()} connections={server.connections}"
    print(f"{line} {server.sessions_line()}", flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.workers < 1:
        parser.error(f"--workers: expected >= 1, got {args.workers}")
    if args.latency_ms < 0 or args.jitter_ms < 0:
        parser.error("--latency-ms/--jitter-ms: expected >= 0")
    if args.fail_every < 0:
        parser.error(f"--fail-every: expected >= 0, got {args.fail_every}")
    logging.basicConfig(
        level=logging.WARNING if args.quiet else logging.INFO,
        format="%(asctime)s %(name)s %(levelname)s %(message)s",
        stream=sys.stderr,
    )
    logging.getLogger("websockets").setLevel(logging.WARNING)
    try:
        config = _config(args)
        policy = load_policy(args.policy, parse_policy_args(args.policy_arg))
    except ValueError as exc:
        parser.error(str(exc))
    try:
        asyncio.run(_run(PolicyServer(policy, config, policy_name=args.policy)))
    except OSError as exc:  # e.g. the port is taken
        print(f"dz-gym-serve: error: cannot serve on {args.host}:{args.port}: {exc}", file=sys.stderr)
        return 1
    return 0
