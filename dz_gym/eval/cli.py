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
:class:`~dz_gym.eval.config.EvalConfig`. ``docs/eval.md`` describes flags, outputs and resume.

The parser is plain argparse so Isaac Lab's launcher flags (``--device``, ``--headless``...) join it when
Isaac Lab is installed.
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import sys
import threading
from typing import TYPE_CHECKING, Any

from dz_gym.errors import first_line

# Only light imports here: main() installs the signal handler before it imports numpy, the simulator, the
# transport (seconds on a busy machine), so a Ctrl-C during those imports is a clean stop too.
from dz_gym.eval.flag_table import DEFAULT_OUTPUT_ROOT, DEFAULT_PATH
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
from dz_gym.eval.signals import StopOnSignal, interruptible

if TYPE_CHECKING:
    from dz_gym.eval.config import EvalConfig
    from dz_gym.eval.rundir import RunDir
    from dz_gym.eval.runner import RunControl
    from dz_gym.eval.shards.options import RayOptions

__all__ = ["build_parser", "default_policy", "main", "resolve_config"]


def _say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _start_embedded_server(policy: str, serve_args: list[str]):
    from dz_gym.server.launch import start_server_process

    argv = ["--policy", policy, "--flavor", "vllm-omni", "--quiet", *serve_args]
    server = start_server_process(argv, new_session=True)
    return server, server.url + DEFAULT_PATH


def _is_horizon_error(exc: BaseException) -> bool:
    """The wrapper's error for an open-loop horizon longer than the server's chunk."""
    from dz_gym.chunks import HorizonError

    return isinstance(exc, HorizonError)


def _exit_code(summary: dict[str, Any]) -> int:
    if summary.get("interrupted"):
        return EXIT_INTERRUPTED
    if summary.get("aborted"):
        return EXIT_ABORTED
    return EXIT_OK


def _print_results(run_dir: RunDir, summary: dict[str, Any] | None) -> None:
    from dz_gym.eval.results import format_table

    if summary is not None and "overall" in summary:
        print(format_table(summary))
    print(f"results: {run_dir.path}")


def _run_scene_processes(argv: list[str], config: EvalConfig, run_dir: RunDir, command: str) -> int:
    """Run each scene in a fresh ``dz-gym-eval --resume RUN_DIR --only-scene S`` process, in turn
    (:class:`~dz_gym.eval.processes.SceneProcesses`), as one run segment of this process."""
    from dz_gym.eval.plan import plan_of
    from dz_gym.eval.processes import SceneProcesses
    from dz_gym.eval.segment import RunSegment, run_segment

    # The children start the embedded servers: this process plans the scenes, not the servers' URLs.
    servers = config.servers or ["embedded"]
    plan = plan_of(config, servers, config.servers_b or ["embedded"])
    segment = RunSegment(config, run_dir, plan, servers=config.servers, servers_b=config.servers_b, progress=False,
                         log=_say, command=command, inherit=True)  # fmt: skip
    executor = SceneProcesses(argv, command, _say)
    summary = None
    log = _open_logs(config, run_dir, None)  # the children's rows are logged from the run directory at the end
    try:
        summary = run_segment(segment, executor)
    except KeyboardInterrupt:
        summary = run_dir.read_summary()
    finally:
        _close_logs(log, run_dir, summary)
    if executor.code != EXIT_USAGE:
        _print_results(run_dir, summary)
    return executor.exit_code(summary)


def _preflight(config: EvalConfig) -> str | None:
    """Why the run cannot start (one line), or None; nothing is written either way."""
    from dz_gym.eval.plan import is_url
    from dz_gym.eval.preflight import check_backend, check_servers
    from dz_gym.eval.tracking import missing

    urls = config.servers + config.servers_b + [v for _, v in config.arm_table() if is_url(v)]
    return check_backend(config.backend) or missing(config.log) or check_servers(urls, config.transport_config())


def _open_logs(config: EvalConfig, run_dir: RunDir, control: RunControl | None):
    """The ``--log`` trackers of this run segment, hooked on ``control``'s rows; None without ``--log``."""
    if not config.log:
        return None
    import dataclasses

    from dz_gym.eval.tracking import open_logs

    log = open_logs(config.log, run_dir.path, dataclasses.asdict(config), config.log_project)
    if control is not None:
        log.attach(control)
    return log


def _close_logs(log, run_dir: RunDir, summary: dict[str, Any] | None) -> None:
    if log is not None:
        log.finish(run_dir.path, run_dir.read_rows(), summary if summary is not None else run_dir.read_summary())


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    early_stop = threading.Event()
    # The handler first: a signal while the heavy modules load or the flags are checked is a clean stop too.
    with StopOnSignal(early_stop, _say) as signals:
        try:
            from dz_gym.envs.isaac.launch import isaac_flags_wanted

            parser = build_parser(isaac_args=isaac_flags_wanted(argv))
            args = parser.parse_args(argv)
            config, run_dir, _ = resolve_config(parser, args)
            from dz_gym.eval.shards.options import ray_options_from_args

            ray_options = ray_options_from_args(parser, args, config)
            logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s", stream=sys.stderr)
            from dz_gym.eval.evaluate import python_command
            from dz_gym.eval.runner import RunControl

            command = os.environ.get(COMMAND_ENV) or python_command(["dz-gym-eval", *argv])
            control = RunControl(config.error_budget)
            signals.stop = control.stop
            if early_stop.is_set():
                _say("dz-gym-eval: stopped before the run started; nothing was written")
                return EXIT_INTERRUPTED
            return _main(args, argv, config, run_dir, ray_options, command, control, signals)
        except KeyboardInterrupt:  # a repeated signal where stopping at once was safe (nothing half-written)
            return EXIT_INTERRUPTED


def _main(
    args: argparse.Namespace,
    argv: list[str],
    config: EvalConfig,
    run_dir: RunDir | None,
    ray_options: RayOptions | None,
    command: str,
    control: RunControl,
    signals: StopOnSignal,
) -> int:
    """Preflight, embedded server, run directory, evaluation: in this order, so a failure before the run
    leaves nothing behind; a stop signal at any point ends with exit status 130."""

    if args.backend in (None, "auto") and args.resume is None and not args.only_scene:
        from dz_gym.envs.backends import auto_reason

        _say(f"dz-gym-eval: backend {config.backend} (auto: {auto_reason(config.backend)})")
    try:
        with interruptible():
            problem = _preflight(config)
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    if problem is not None:
        _say(f"dz-gym-eval: error: {problem}")
        return EXIT_ABORTED
    if control.stop.is_set():
        _say("dz-gym-eval: stopped before the run started; nothing was written")
        return EXIT_INTERRUPTED

    from dz_gym.envs.backends import traits

    backend = traits(config.backend)
    per_process = args.process_per_scene if args.process_per_scene is not None else backend.one_scene_per_process
    if per_process and not args.only_scene and len(config.scenes) > 1 and ray_options is None:  # shards: a process each
        run_dir, created = _open_run_dir(args, config, run_dir)
        code = _run_scene_processes(argv, config, run_dir, command)
        if code == EXIT_USAGE and created and not run_dir.read_rows():  # a child's horizon error: nothing ran
            shutil.rmtree(run_dir.path, ignore_errors=True)
        return code

    started: list = []  # embedded servers (arm A's, then arm B's; or the --arm arms' that name a policy)
    try:
        servers = list(config.servers)
        servers_b = list(config.servers_b)
        server_info: dict[str, Any] = {"embedded": not servers}
        arm_servers: dict[str, list[str]] | None = None
        if config.arm_specs:
            try:
                with interruptible():
                    arm_servers = _start_arm_servers(config, args.serve_arg, started, server_info)
            except KeyboardInterrupt:
                return EXIT_INTERRUPTED
            except (RuntimeError, OSError, ValueError) as exc:
                _say(f"dz-gym-eval: error: cannot start the embedded server: {first_line(exc)}")
                return EXIT_ABORTED
            servers = [url for urls in arm_servers.values() for url in urls]
            if control.stop.is_set():
                _say("dz-gym-eval: stopped before the run started; nothing was written")
                return EXIT_INTERRUPTED
        elif not servers:
            policies = [config.policy] + ([config.policy_b] if config.ab else [])
            urls = []
            try:
                with interruptible():
                    for policy in policies:  # an A/B run: one server per arm, the same flavor and arguments
                        server, url = _start_embedded_server(policy, args.serve_arg)
                        started.append(server)
                        urls.append(url)
            except KeyboardInterrupt:
                return EXIT_INTERRUPTED
            except (RuntimeError, OSError, ValueError) as exc:
                _say(f"dz-gym-eval: error: cannot start the embedded server: {first_line(exc)}")
                return EXIT_ABORTED
            servers = urls[:1]
            servers_b = urls[1:]
            server_info.update(policy=config.policy, flavor="vllm-omni", serve_args=list(args.serve_arg), url=urls[0])
            if config.ab:
                server_info.update(policy_b=config.policy_b, url_b=urls[1])
                _say(f"dz-gym-eval: no --server given; started two embedded reference servers: arm A (policy "
                     f"{config.policy}) at {urls[0]}, arm B (policy {config.policy_b}) at {urls[1]}")  # fmt: skip
            else:
                _say(
                    f"dz-gym-eval: no --server given; started the embedded reference server (policy {config.policy}) at {urls[0]}"
                )
            if control.stop.is_set():
                _say("dz-gym-eval: stopped before the run started; nothing was written")
                return EXIT_INTERRUPTED
        run_dir, created = _open_run_dir(args, config, run_dir)
        return _evaluate(args, config, run_dir, (servers, servers_b, ray_options, arm_servers), server_info, command,
                         control, signals, created)  # fmt: skip
    finally:
        for server in reversed(started):
            server.stop()


def _start_arm_servers(config: EvalConfig, serve_args: list[str], started: list, info: dict) -> dict[str, list[str]]:
    """Per ``--arm``, its server URLs: its own URL, or an embedded server started here for its policy (appended to
    ``started``, so that the caller stops it); ``info`` (the summary's ``server``) records each arm's."""
    from dz_gym.eval.plan import is_url

    out: dict[str, list[str]] = {}
    info["arms"] = {}
    for name, value in config.arm_table():
        if is_url(value):
            out[name] = [value]
            info["arms"][name] = {"url": value}
            continue
        server, url = _start_embedded_server(value, serve_args)
        started.append(server)
        out[name] = [url]
        info["arms"][name] = {"policy": value, "url": url, "flavor": "vllm-omni"}
        _say(f"dz-gym-eval: arm {name}: started an embedded reference server (policy {value}) at {url}")
    info["embedded"] = any("policy" in entry for entry in info["arms"].values())
    return out


def _open_run_dir(args: argparse.Namespace, config: EvalConfig, run_dir: RunDir | None) -> tuple[RunDir, bool]:
    """The run directory: a new one (``created``), or the resumed one with the config saved again."""
    from dz_gym.eval.rundir import RunDir

    if run_dir is None:
        run_dir = RunDir.create(args.output_root or DEFAULT_OUTPUT_ROOT, config)
        _say(f"dz-gym-eval: run directory {run_dir.path}")
        return run_dir, True
    run_dir.save_config(config)
    if not args.only_scene:
        _say(f"dz-gym-eval: resuming {run_dir.path}")
    return run_dir, False


def _evaluate(
    args: argparse.Namespace,
    config: EvalConfig,
    run_dir: RunDir,
    placement: tuple[list[str], list[str], RayOptions | None, dict[str, list[str]] | None],
    server_info: dict[str, Any],
    command: str,
    control: RunControl,
    signals: StopOnSignal,
    created: bool,
) -> int:
    from dz_gym.envs.backends import traits
    from dz_gym.eval.evaluate import evaluate

    servers, servers_b, ray_options, arm_servers = placement  # arm A's and B's URLs, the Ray shards, --arm's URLs
    log = None if args.only_scene else _open_logs(config, run_dir, control)  # a scene's child: its parent logs
    summary = None
    try:
        summary = evaluate(
            config,
            run_dir,
            servers,
            control=control,
            progress=args.progress,
            command=command,
            server_info=server_info,
            only_scenes=args.only_scene,
            env_kwargs={"app_args": args} if traits(config.backend).starts_app else None,
            ray_options=ray_options,
            servers_b=servers_b,
            arm_servers=arm_servers,
        )
    except KeyboardInterrupt:
        summary = run_dir.read_summary() or {"interrupted": True}
        summary["interrupted"] = True
    except Exception as exc:  # noqa: BLE001 - one line for the user; the summary is already written
        _close_logs(log, run_dir, None)
        log = None
        if _is_horizon_error(exc):
            text = flag_message(ValueError(first_line(exc)))
            _say(f"dz-gym-eval: error: {text if text.startswith('--') else '--open-loop-horizon: ' + text}")
            if created and not run_dir.read_rows():
                shutil.rmtree(run_dir.path, ignore_errors=True)  # nothing ran: leave nothing behind
            else:
                print(f"results: {run_dir.path}")
            return EXIT_USAGE
        if signals.signals:  # a failure caused by stopping (e.g. a simulator worker that got the signal too)
            _print_results(run_dir, run_dir.read_summary())
            return EXIT_INTERRUPTED
        _say(f"dz-gym-eval: error: {type(exc).__name__}: {first_line(exc)}")
        _print_results(run_dir, run_dir.read_summary())
        return EXIT_ABORTED
    _close_logs(log, run_dir, summary)
    if not args.only_scene or summary.get("interrupted") or summary.get("aborted"):
        _print_results(run_dir, summary)
    return _exit_code(summary)


if __name__ == "__main__":
    sys.exit(main())
