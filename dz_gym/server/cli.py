"""``dz-gym-serve``: run the reference policy server from the command line.

Prints one ready line on stdout once it listens (``dz-gym-serve ready on ws://HOST:PORT (flavor=...,
policy=..., workers=...)``), logs one line per request on stderr, stops cleanly on SIGINT/SIGTERM and then
prints a summary line with the request count, busy time and utilization (a signal ignored at start, as SIGINT
is for a background job of a script, stays ignored). With ``--parent-pid`` it also stops when the process that
started it is gone (:mod:`dz_gym.lifeline`). A bad flag is one line on stderr and exit status 2. The
flags are declared in :mod:`dz_gym.server.flags`.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import sys

from dz_gym.lifeline import hold_to_parent
from dz_gym.server.app import PolicyServer
from dz_gym.server.flags import build_parser, config_of
from dz_gym.server.policies import load_policy, parse_policy_args

__all__ = ["build_parser", "main"]


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
    config = config_of(parser, args)
    logging.basicConfig(
        level=logging.WARNING if args.quiet else logging.INFO,
        format="%(asctime)s %(name)s %(levelname)s %(message)s",
        stream=sys.stderr,
    )
    logging.getLogger("websockets").setLevel(logging.WARNING)
    if args.parent_pid is not None:  # before the policy loads: a launcher that dies meanwhile is seen
        hold_to_parent(args.parent_pid, "dz-gym-serve")
    try:
        policy = load_policy(args.policy, parse_policy_args(args.policy_arg))
    except ValueError as exc:
        parser.error(str(exc))
    try:
        asyncio.run(_run(PolicyServer(policy, config, policy_name=args.policy)))
    except OSError as exc:  # e.g. the port is taken
        print(f"dz-gym-serve: error: cannot serve on {config.host}:{config.port}: {exc}", file=sys.stderr)
        return 1
    return 0
