"""``dz-gym-bench``: throughput and latency of OpenPI/DreamZero policy servers under realistic DROID load.

Examples::

    dz-gym-bench --server ws://127.0.0.1:8000 --concurrency 8 --num-requests 400
    dz-gym-bench --server ws://HOST:8000/v1/realtime/robot/openpi --sweep 1,2,4,8 --duration 60 \\
        --json sweep.json --plot sweep.png
    dz-gym-bench --server ws://127.0.0.1:8000 --request-rate 5 --arrival poisson --duration 60

Exit status: 0 when the benchmark ran (failed requests are counted and reported, not fatal), 1 when it could
not run or had to stop (server never ready, server gone, nothing but errors, ``--timeout``), 2 for bad flags.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import math
import sys
import time
from collections.abc import Sequence

from dz_gym.bench.load import ARRIVALS
from dz_gym.bench.report import build_document, format_run, format_sweep, plot_sweep, write_json, write_records
from dz_gym.bench.runner import BenchConfig, run_benchmark
from dz_gym.cli_types import non_negative_float, non_negative_int, positive_float, positive_int
from dz_gym.envs import droid
from dz_gym.errors import DzGymError
from dz_gym.transport import validate_url

__all__ = ["build_parser", "config_from_args", "main"]

DEFAULT_DURATION_S = 30.0
CANCEL_GRACE_S = 15.0  # after --timeout: time for the sessions to close (each close is itself bounded)


def _sweep(text: str) -> list[int]:
    try:
        values = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated integers >= 1 such as 1,2,4,8, got {text!r}"
        ) from None
    if not values or any(v < 1 for v in values):
        raise argparse.ArgumentTypeError(f"expected comma-separated integers >= 1 such as 1,2,4,8, got {text!r}")
    return values


def _url(text: str) -> str:
    try:
        return validate_url(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="dz-gym-bench",
        description="Throughput and latency of OpenPI/DreamZero policy servers under realistic DROID load.",
        epilog="Exit status: 0 ran, 1 could not run or had to stop, 2 bad flags.",
    )
    parser.add_argument(
        "--server",
        action="append",
        type=_url,
        required=True,
        metavar="URL",
        help="ws:// or wss:// URL of a policy server; repeat to spread sessions round-robin",
    )

    load = parser.add_argument_group("load shape (closed loop by default)")
    shape = load.add_mutually_exclusive_group()
    shape.add_argument(
        "--concurrency",
        type=positive_int,
        default=None,
        metavar="C",
        help="C sessions, one connection each, each sending its next request when a reply comes (default 1)",
    )
    shape.add_argument(
        "--sweep",
        type=_sweep,
        default=None,
        metavar="C1,C2,...",
        help="run each concurrency in turn and print the scaling table, e.g. 1,2,4,8,16",
    )
    shape.add_argument(
        "--request-rate",
        type=positive_float,
        default=None,
        metavar="R",
        help="open loop: R requests/s on a schedule, whatever the replies do",
    )
    load.add_argument("--arrival", choices=ARRIVALS, default="poisson", help="open-loop gaps (default poisson)")
    load.add_argument(
        "--max-outstanding",
        type=positive_int,
        default=16,
        metavar="N",
        help="open loop: at most N requests in flight, one session each (default 16)",
    )
    load.add_argument(
        "--num-requests",
        type=positive_int,
        default=None,
        metavar="N",
        help="timed requests per run (with --duration: whichever ends first)",
    )
    load.add_argument(
        "--duration",
        type=positive_float,
        default=None,
        metavar="S",
        help=f"seconds per run (default {DEFAULT_DURATION_S:g} when --num-requests is not given)",
    )
    load.add_argument(
        "--warmup",
        type=non_negative_int,
        default=None,
        metavar="N",
        help="untimed requests before each run (default: one per session)",
    )
    load.add_argument(
        "--think-ms",
        type=non_negative_float,
        default=0.0,
        metavar="MS",
        help="closed loop: pause after each reply, e.g. the simulator executing the chunk (default 0)",
    )

    robot = parser.add_argument_group("robot and payload")
    robot.add_argument(
        "--open-loop-horizon",
        type=positive_int,
        default=droid.DEFAULT_OPEN_LOOP_HORIZON,
        metavar="H",
        help=f"actions executed per chunk (default {droid.DEFAULT_OPEN_LOOP_HORIZON}): actions/s = req/s x H",
    )
    robot.add_argument(
        "--episode-length",
        type=positive_int,
        default=None,
        metavar="N",
        help=f"requests per episode before a session id is rotated (default ceil({droid.MAX_EPISODE_LENGTH} / H))",
    )
    robot.add_argument(
        "--slo-ms",
        type=positive_float,
        default=None,
        metavar="MS",
        help="goodput budget per chunk (default H / 15 s, the time the previous chunk lasts)",
    )
    robot.add_argument(
        "--images",
        default=None,
        metavar="DIR",
        help="png/jpg frames or mp4 videos to send (three-view strips are split); default synthetic",
    )
    robot.add_argument(
        "--image-layout",
        choices=("auto", "strip", "single"),
        default="auto",
        help="how a frame maps to the three views (default auto)",
    )
    robot.add_argument(
        "--max-frames",
        type=positive_int,
        default=16,
        metavar="N",
        help="distinct pre-encoded requests to cycle through (default 16)",
    )
    robot.add_argument("--prompt", default=droid.SCENES[1].prompt, help="instruction sent with every request")
    robot.add_argument("--seed", type=non_negative_int, default=0, help="seed of synthetic images and Poisson gaps")

    bounds = parser.add_argument_group("bounds")
    bounds.add_argument(
        "--ready-timeout",
        type=positive_float,
        default=60.0,
        metavar="S",
        help="wait at most S s for each server's handshake before starting (default 60)",
    )
    bounds.add_argument(
        "--open-timeout",
        type=positive_float,
        default=10.0,
        metavar="S",
        help="bound on opening one connection (default 10)",
    )
    bounds.add_argument(
        "--request-timeout", type=positive_float, default=120.0, metavar="S", help="bound on one request (default 120)"
    )
    bounds.add_argument(
        "--max-consecutive-errors",
        type=positive_int,
        default=20,
        metavar="N",
        help="stop the run after N failed requests in a row (default 20)",
    )
    bounds.add_argument(
        "--timeout", type=positive_float, default=3600.0, metavar="S", help="bound on the whole command (default 3600)"
    )
    bounds.add_argument(
        "--auth-env",
        default=None,
        metavar="NAME",
        help="environment variable holding an API token (sent as 'Authorization: Api-Key <token>')",
    )

    out = parser.add_argument_group("output")
    out.add_argument("--json", default=None, metavar="FILE", help="write the results as JSON ('-' for stdout)")
    out.add_argument(
        "--records",
        default=None,
        metavar="FILE",
        help="write one JSON line per timed request (latency, error, session, ...)",
    )
    out.add_argument("--label", default=None, help="a free-form label stored in the JSON (e.g. the GPU)")
    out.add_argument("--plot", default=None, metavar="FILE", help="with --sweep: write a PNG plot (needs matplotlib)")
    out.add_argument("--quiet", action="store_true", help="print only the final table or summary")
    return parser


def config_from_args(args: argparse.Namespace) -> BenchConfig:
    duration = args.duration
    if duration is None and args.num_requests is None:
        duration = DEFAULT_DURATION_S
    episode_length = args.episode_length or math.ceil(droid.MAX_EPISODE_LENGTH / args.open_loop_horizon)
    return BenchConfig(
        servers=tuple(args.server),
        concurrencies=tuple(args.sweep) if args.sweep else (args.concurrency or 1,),
        request_rate=args.request_rate,
        arrival=args.arrival,
        max_outstanding=args.max_outstanding,
        num_requests=args.num_requests,
        duration_s=duration,
        warmup=args.warmup,
        episode_length=episode_length,
        open_loop_horizon=args.open_loop_horizon,
        think_s=args.think_ms / 1e3,
        slo_s=None if args.slo_ms is None else args.slo_ms / 1e3,
        images_dir=args.images,
        image_layout=args.image_layout,
        max_frames=args.max_frames,
        prompt=args.prompt,
        seed=args.seed,
        ready_timeout=args.ready_timeout,
        open_timeout=args.open_timeout,
        request_timeout=args.request_timeout,
        max_consecutive_errors=args.max_consecutive_errors,
        auth_env=args.auth_env,
    )


def _fail(message: str) -> int:
    first = str(message).strip().splitlines()[0] if str(message).strip() else "unknown error"
    print(f"dz-gym-bench: error: {first}", file=sys.stderr)
    return 1


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.plot and not args.sweep:
        parser.error("--plot: needs --sweep (the plot shows scaling over concurrency)")
    if args.request_rate is None and (args.arrival != "poisson" or args.max_outstanding != 16):
        parser.error("--arrival/--max-outstanding: only apply with --request-rate")
    if args.auth_env is not None and not args.auth_env.replace("_", "a").isalnum():
        parser.error(f"--auth-env: expected the NAME of an environment variable, got {args.auth_env!r}")
    if args.plot:
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            return _fail("--plot needs matplotlib: pip install 'dz-gym[plot]' (or pip install matplotlib)")
    try:
        config = config_from_args(args)
    except ValueError as exc:
        parser.error(str(exc))
    sweep = bool(args.sweep)

    def on_run(run: dict) -> None:
        if args.quiet:
            return
        if sweep:
            latency = run["latency_ms"] or {}
            p50 = latency.get("p50")
            print(
                f"C={run['concurrency']}: {run['requests_per_s']:.2f} req/s, "
                f"p50 {p50 if p50 is None else round(p50, 1)} ms, {run['failed']} failed",
                file=sys.stderr,
                flush=True,
            )

    async def bounded() -> dict:
        task = asyncio.ensure_future(run_benchmark(config, on_run=on_run, keep_records=args.records is not None))
        done, _ = await asyncio.wait({task}, timeout=args.timeout)
        if task in done:
            return task.result()
        # Cancel until the run really ends: on Python < 3.12 a cancellation that races with an inner
        # asyncio.wait_for finishing can be swallowed, and the run would go on to its --duration.
        give_up = time.monotonic() + CANCEL_GRACE_S
        while not task.done() and time.monotonic() < give_up:
            task.cancel()
            await asyncio.wait({task}, timeout=0.5)
        raise TimeoutError(f"the benchmark did not finish within --timeout {args.timeout:g} s")

    try:
        result = asyncio.run(bounded())
    except (asyncio.TimeoutError, TimeoutError) as exc:
        if isinstance(exc, DzGymError):
            return _fail(str(exc))
        return _fail(f"the benchmark did not finish within --timeout {args.timeout:g} s")
    except DzGymError as exc:
        return _fail(str(exc))
    except ValueError as exc:  # e.g. an unreadable --images directory
        return _fail(str(exc))
    except KeyboardInterrupt:
        print("dz-gym-bench: interrupted", file=sys.stderr)
        return 130

    # With --json - the document owns stdout and the human summary goes to stderr.
    human = sys.stderr if args.json == "-" else sys.stdout
    if sweep:
        print(format_sweep(result["runs"]), file=human)
    else:
        print(format_run(result["runs"][0], result["servers"]), file=human)
    if args.json:
        config_dict = dataclasses.asdict(config)
        write_json(args.json, build_document(result, argv=argv, sweep=sweep, config=config_dict, label=args.label))
    if args.records:
        write_records(args.records, result["records"])
    if args.plot:
        plot_sweep(result["runs"], args.plot)
    return 0


if __name__ == "__main__":
    sys.exit(main())
