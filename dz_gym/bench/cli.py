"""``dz-gym-bench``: throughput and latency of OpenPI/DreamZero policy servers under realistic DROID load.

Examples::

    dz-gym-bench --server ws://127.0.0.1:8000 --concurrency 8 --num-requests 400
    dz-gym-bench --server ws://HOST:8000/v1/realtime/robot/openpi --sweep 1,2,4,8 --duration 60 \\
        --json sweep.json --plot sweep.png
    dz-gym-bench --server ws://127.0.0.1:8000 --request-rate 5 --arrival poisson --duration 60

Exit status: 0 when the benchmark ran (failed requests are counted and reported, not fatal), 1 when it could
not run or had to stop (server never ready, server gone, nothing but errors, ``--timeout``), 2 for bad flags
(also an output file, ``--json``/``--records``/``--plot``, that cannot be written: checked before the benchmark).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import sys
import time
from collections.abc import Sequence

from dz_gym.bench.load import ARRIVALS
from dz_gym.bench.report import build_document, format_run, format_sweep, plot_sweep, write_json, write_records
from dz_gym.bench.runner import BenchConfig, run_benchmark
from dz_gym.cli_types import (
    AUTH_ENV,
    OPEN_LOOP_HORIZON,
    REQUEST_TIMEOUT,
    SEED,
    SERVER,
    SERVER_KIND,
    Flag,
    OneLineErrorParser,
    add_flags,
    flag_message,
    given_fields,
    non_negative_float,
    non_negative_int,
    number,
    positive_float,
    positive_int,
)
from dz_gym.envs import droid
from dz_gym.errors import DzGymError, first_line
from dz_gym.eval.preflight import check_output_file

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


# Every flag, declared once with the BenchConfig field it sets (its default is the field's, shown in --help).
LOAD_SHAPE = (  # mutually exclusive: closed loop at one concurrency, a sweep, or open loop
    Flag("--concurrency", "C sessions, one connection each, each sending its next request when a reply comes",
         type=positive_int, metavar="C", shown="1"),
    Flag("--sweep", "run each concurrency in turn and print the scaling table, e.g. 1,2,4,8,16", type=_sweep,
         metavar="C1,C2,..."),
    Flag("--request-rate", "open loop: R requests/s on a schedule, whatever the replies do", field="request_rate",
         type=positive_float, metavar="R"),
)  # fmt: skip
LOAD = (
    Flag("--arrival", "open-loop gaps", field="arrival", choices=ARRIVALS),
    Flag("--max-outstanding", "open loop: at most N requests in flight, one session each", field="max_outstanding",
         type=positive_int, metavar="N"),
    Flag("--num-requests", "timed requests per run (with --duration: whichever ends first)", field="num_requests",
         type=positive_int, metavar="N"),
    Flag("--duration", "seconds per run", dest="duration", type=positive_float, metavar="S",
         shown=f"{DEFAULT_DURATION_S:g} when --num-requests is not given"),
    Flag("--warmup", "untimed requests before each run", field="warmup", type=non_negative_int, metavar="N",
         shown="one per session"),
    Flag("--think-ms", "closed loop: pause after each reply, e.g. the simulator executing the chunk",
         dest="think_ms", type=non_negative_float, metavar="MS", shown="0"),
)  # fmt: skip
ROBOT = (
    OPEN_LOOP_HORIZON.but(help="actions executed per chunk: actions/s = req/s x H", shown="the server profile's"),
    SERVER_KIND,
    Flag("--episode-length", "requests per episode before a session id is rotated", field="episode_length",
         type=positive_int, metavar="N", shown=f"ceil({droid.MAX_EPISODE_LENGTH} / H)"),
    Flag("--slo-ms", "goodput budget per chunk", dest="slo_ms", type=positive_float, metavar="MS",
         shown="H / 15 s, the time the previous chunk lasts"),
    Flag("--images", "png/jpg frames or mp4 videos to send (three-view strips are split)", dest="images",
         metavar="DIR", shown="synthetic"),
    Flag("--image-layout", "how a frame maps to the three views", field="image_layout",
         choices=("auto", "strip", "single")),
    Flag("--max-frames", "distinct pre-encoded requests to cycle through", field="max_frames", type=positive_int,
         metavar="N"),
    Flag("--prompt", "instruction sent with every request", field="prompt", metavar="TEXT"),
    SEED.but(help="seed of synthetic images and Poisson gaps"),
)  # fmt: skip
BOUNDS = (
    Flag("--ready-timeout", "wait at most S s for each server's handshake before starting", field="ready_timeout",
         type=positive_float, metavar="S"),
    Flag("--open-timeout", "bound on opening one connection", field="open_timeout", type=number, metavar="S"),
    REQUEST_TIMEOUT,
    Flag("--max-consecutive-errors", "stop the run after N failed requests in a row",
         field="max_consecutive_errors", type=positive_int, metavar="N"),
    Flag("--timeout", "bound on the whole command", dest="timeout", type=positive_float, default=3600.0,
         metavar="S", shown="3600"),
    AUTH_ENV,
)  # fmt: skip
OUTPUT = (
    Flag("--json", "write the results as JSON ('-' for stdout)", dest="json", metavar="FILE"),
    Flag("--records", "write one JSON line per timed request (latency, error, session, ...)", dest="records",
         metavar="FILE"),
    Flag("--label", "a free-form label stored in the JSON (e.g. the GPU)", dest="label", metavar="TEXT"),
    Flag("--plot", "with --sweep: write a PNG plot (needs matplotlib)", dest="plot", metavar="FILE"),
    Flag("--quiet", "print only the final table or summary", dest="quiet", action="store_true", default=False),
)  # fmt: skip
ALL = (SERVER, *LOAD_SHAPE, *LOAD, *ROBOT, *BOUNDS, *OUTPUT)


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineErrorParser(
        prog="dz-gym-bench",
        description="Throughput and latency of OpenPI/DreamZero policy servers under realistic DROID load.",
        epilog="Exit status: 0 ran, 1 could not run or had to stop, 2 bad flags.",
    )
    add_flags(parser, [SERVER.but(required=True)], BenchConfig)
    load = parser.add_argument_group("load shape (closed loop by default)")
    add_flags(load.add_mutually_exclusive_group(), LOAD_SHAPE, BenchConfig)
    add_flags(load, LOAD, BenchConfig)
    for title, flags in (("robot and payload", ROBOT), ("bounds", BOUNDS), ("output", OUTPUT)):
        add_flags(parser.add_argument_group(title), flags, BenchConfig)
    return parser


def config_from_args(args: argparse.Namespace) -> BenchConfig:
    """The :class:`BenchConfig` of the flags: the fields given, BenchConfig's defaults for the rest."""
    fields = given_fields(args, ALL)
    fields["servers"] = tuple(args.servers)
    duration = args.duration
    if duration is None and args.num_requests is None:
        duration = DEFAULT_DURATION_S
    return BenchConfig(
        concurrencies=tuple(args.sweep) if args.sweep else (args.concurrency or 1,),
        duration_s=duration,
        think_s=(args.think_ms or 0.0) / 1e3,
        slo_s=None if args.slo_ms is None else args.slo_ms / 1e3,
        images_dir=args.images,
        **fields,
    )


def _fail(message: str) -> int:
    print(f"dz-gym-bench: error: {first_line(message, 'unknown error')}", file=sys.stderr)
    return 1


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.plot and not args.sweep:
        parser.error("--plot: needs --sweep (the plot shows scaling over concurrency)")
    if args.request_rate is None and (args.arrival is not None or args.max_outstanding is not None):
        parser.error("--arrival/--max-outstanding: only apply with --request-rate")
    for flag, path in (("--json", args.json), ("--records", args.records), ("--plot", args.plot)):
        problem = check_output_file(path, flag)  # before the benchmark: not a traceback after it
        if problem is not None:
            parser.error(problem)
    if args.plot:
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            return _fail("--plot needs matplotlib: pip install 'dz-gym[plot]' (or pip install matplotlib)")
    try:
        config = config_from_args(args)
    except ValueError as exc:
        parser.error(flag_message(exc, ALL))
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
    try:
        if args.json:
            document = build_document(
                result, argv=argv, sweep=sweep, config=dataclasses.asdict(config), label=args.label
            )
            write_json(args.json, document)
        if args.records:
            write_records(args.records, result["records"])
        if args.plot:
            plot_sweep(result["runs"], args.plot)
    except OSError as exc:  # checked before the benchmark; a disk that fills up meanwhile
        return _fail(f"cannot write {exc.filename or 'an output file'} ({exc.strerror or exc})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
