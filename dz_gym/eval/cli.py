"""``dz-gym-eval``: evaluate a policy server on the DROID scenes with N batched envs.

Examples::

    dz-gym-eval --num-envs 8 --scene 1                       # embedded simulator + embedded reference server
    dz-gym-eval --num-envs 8 --scene 1 --scene 2 --episodes 40 --server ws://gpu-box:8000/v1/realtime/robot/openpi
    dz-gym-eval --host 10.0.0.5 --port 8000 --scene 3        # the reference client's flags
    dz-gym-eval --resume runs/dz_gym_eval/20261130-120000_scene1
    dz-gym-eval --num-envs 8 --scene 1 --policy reference --policy-b reference:skill=0.3 --sequential
    dz-gym-eval --server ws://a:8000/v1/realtime/robot/openpi --server-b ws://b:8000/v1/realtime/robot/openpi

Exit status: 0 when every planned episode has a row, 130 after Ctrl-C or SIGTERM (everything finished so far is
kept and ``summary.json`` says ``"interrupted": true``), 1 when a preflight check failed (nothing is written) or
the run aborted (``--max-errors`` exceeded, a simulator or server failure outside an episode), 2 for bad flags
(one line) and for an ``--open-loop-horizon`` longer than the server's chunks. Every default comes from
:class:`~dz_gym.eval.config.EvalConfig`. ``docs/eval.md`` describes flags, outputs and resume. This module only
parses, calls :func:`dz_gym.eval.run.run_eval` (the run itself, the same from Python), prints what it returns
and maps its status to the exit status.

The parser is plain argparse so Isaac Lab's launcher flags (``--device``, ``--headless``...) join it when
Isaac Lab is installed.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import sys
import threading
from typing import TYPE_CHECKING, Any

# Only light imports here: main() installs the signal handler before it imports numpy, the simulator, the
# transport (seconds on a busy machine), so a Ctrl-C during those imports is a clean stop too.
from dz_gym.eval.flag_table import DEFAULT_PATH
from dz_gym.eval.flags import (
    COMMAND_ENV,
    EXIT_ABORTED,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_USAGE,
    build_parser,
    default_policy,
    flag_message,
    resolve_config,
)
from dz_gym.eval.signals import StopOnSignal

if TYPE_CHECKING:
    from dz_gym.eval.config import EvalConfig
    from dz_gym.eval.rundir import RunDir

__all__ = ["DEFAULT_PATH", "build_parser", "default_policy", "main", "resolve_config"]


def _say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _print_results(run_dir: RunDir | None, summary: dict[str, Any] | None) -> None:
    from dz_gym.eval.results import format_table

    if summary is not None and "overall" in summary:
        print(format_table(summary))
    if run_dir is not None:
        print(f"results: {run_dir.path}")


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    early_stop = threading.Event()
    # The handler first: a signal while the heavy modules load or the flags are checked is a clean stop too.
    with StopOnSignal(early_stop, _say) as signals:
        try:
            from dz_gym.envs.isaac.launch import isaac_flags_wanted

            parser = build_parser(isaac_args=isaac_flags_wanted(argv))
            args = parser.parse_args(argv)
            if args.parent_pid is not None:  # a scene's process: stop when the evaluator that started it is gone
                from dz_gym.lifeline import hold_to_parent

                hold_to_parent(args.parent_pid, "dz-gym-eval", death_signal=False)  # SIGUSR1 may be Isaac Sim's
            config, run_dir, _ = resolve_config(parser, args)
            from dz_gym.eval.shards.options import ray_options_from_args

            ray_options = ray_options_from_args(parser, args, config)
            logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s", stream=sys.stderr)
            from dz_gym.eval.control import RunControl
            from dz_gym.eval.evaluate import python_command

            command = os.environ.get(COMMAND_ENV) or python_command(["dz-gym-eval", *argv])
            control = RunControl(config.error_budget)
            signals.stop = control.stop
            if early_stop.is_set():
                _say("dz-gym-eval: stopped before the run started; nothing was written")
                return EXIT_INTERRUPTED
            from dz_gym.envs.backends import traits

            config = dataclasses.replace(config, execution=dataclasses.replace(
                config.execution, ray=ray_options, progress=args.progress, command=command, argv=argv,
                only_scenes=args.only_scene, control=control,
                env_kwargs={"app_args": args} if traits(config.plan.backend).starts_app else {}))  # fmt: skip
            return _main(args, config, run_dir, signals)
        except KeyboardInterrupt:  # a repeated signal where stopping at once was safe (nothing half-written)
            return EXIT_INTERRUPTED


def _main(args: argparse.Namespace, config: EvalConfig, run_dir: RunDir | None, signals: StopOnSignal) -> int:
    """Call :func:`~dz_gym.eval.run.run_eval` with what the flags say, print what it gives, map it to the exit
    status."""
    from dz_gym.envs.backends import auto_reason
    from dz_gym.eval.run import run_eval

    if args.backend in (None, "auto") and args.resume is None and not args.only_scene:
        _say(f"dz-gym-eval: backend {config.plan.backend} (auto: {auto_reason(config.plan.backend)})")
    result = run_eval(
        config, run_dir=run_dir, output_root=args.output_root, on_line=lambda line: _say(f"dz-gym-eval: {line}")
    )
    if result.status == "usage":
        if result.exception is None and result.error:  # an output that cannot be written: nothing started
            _say(f"dz-gym-eval: error: {result.error}")
        if result.exception is not None:  # the horizon error of this process (a child prints its own)
            text = flag_message(ValueError(result.error))
            _say(f"dz-gym-eval: error: {text if text.startswith('--') else '--open-loop-horizon: ' + text}")
            if result.run_dir is not None:  # episodes ran before (a resume): kept
                print(f"results: {result.run_dir.path}")
        return EXIT_USAGE
    if result.run_dir is None:  # nothing was written
        if result.status == "interrupted":
            _say(f"dz-gym-eval: {result.error}")
        elif result.error:
            _say(f"dz-gym-eval: error: {result.error}")
        return EXIT_INTERRUPTED if result.status == "interrupted" else EXIT_ABORTED
    if result.exception is not None:  # a failure outside an episode; the summary is written
        if not signals.signals:  # else caused by stopping (e.g. a simulator worker that got the signal too)
            _say(f"dz-gym-eval: error: {result.error}")
        _print_results(result.run_dir, result.summary)
        return EXIT_INTERRUPTED if signals.signals else EXIT_ABORTED
    if not args.only_scene or result.status in ("interrupted", "aborted"):
        _print_results(result.run_dir, result.summary)
    return {"interrupted": EXIT_INTERRUPTED, "aborted": EXIT_ABORTED}.get(result.status, EXIT_OK)


if __name__ == "__main__":
    sys.exit(main())
