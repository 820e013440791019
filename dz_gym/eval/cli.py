"""``dz-gym-eval``: evaluate a policy server on the DROID scenes with N batched envs.

Examples::

    dz-gym-eval --num-envs 8 --scene 1                       # embedded simulator + embedded reference server
    dz-gym-eval --num-envs 8 --scene 1 --scene 2 --episodes 40 --server ws://gpu-box:8000/v1/realtime/robot/openpi
    dz-gym-eval --host 10.0.0.5 --port 8000 --scene 3        # the reference client's flags
    dz-gym-eval --resume runs/dz_gym_eval/20261130-120000_scene1

Exit status: 0 when every planned episode has a row, 130 after Ctrl-C (everything finished so far is kept and
``summary.json`` says ``"interrupted": true``), 1 when the run aborted (``--max-errors`` exceeded, a simulator
or server failure outside an episode), 2 for bad flags. ``docs/eval.md`` describes flags, outputs and resume.

The parser is plain argparse so Isaac Lab's launcher flags (``--device``, ``--headless``...) join it when
Isaac Lab is installed.
"""

from __future__ import annotations

import argparse
import importlib.util
import logging
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

from dz_gym.envs import droid
from dz_gym.cli_types import non_negative_int, positive_float, positive_int
from dz_gym.eval.config import EvalConfig, resume_conflicts
from dz_gym.eval.results import format_table
from dz_gym.eval.rundir import RunDir
from dz_gym.eval.runner import RunControl

DEFAULT_OUTPUT_ROOT = Path("runs") / "dz_gym_eval"
DEFAULT_PATH = "/v1/realtime/robot/openpi"
DEFAULT_PORT = 8000
DEFAULT_HOST = "127.0.0.1"
COMMAND_ENV = "DZ_GYM_EVAL_COMMAND"  # the user's command, handed to per-scene child processes
EXIT_OK, EXIT_ABORTED, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130

# Defaults of the flags a resumed run takes from its config.json instead (None in the parser = "not given").
DEFAULTS: dict[str, Any] = {
    "scenes": [1],
    "seed": 0,
    "backend": "auto",
    "open_loop_horizon": droid.DEFAULT_OPEN_LOOP_HORIZON,
    "prefetch": 0,
    "simulated_delay": None,
    "max_stale_steps": None,
    "max_steps": droid.MAX_EPISODE_LENGTH,
    "max_errors": None,
    "request_timeout": 600.0,
    "auth_env": None,
    "video": True,
    "num_envs": 8,
}


def _scene(text: str) -> int:
    try:
        return droid.scene_spec(int(text)).scene_id
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected one of {sorted(droid.SCENES)}, got {text!r}") from None


def default_policy(backend: str = "mujoco") -> str:
    """The embedded server's default policy: ``reference`` on the embedded simulator (the only scenes it
    knows: their colours and camera calibration), else ``hold``."""
    from dz_gym.server.policies import BUILTIN_POLICIES

    return "reference" if backend == "mujoco" and "reference" in BUILTIN_POLICIES else "hold"


def build_parser(isaac_args: bool | None = None) -> argparse.ArgumentParser:
    """The ``dz-gym-eval`` parser; Isaac Lab's launcher flags are added when Isaac Lab is importable."""
    p = argparse.ArgumentParser(
        prog="dz-gym-eval",
        description="Evaluate an OpenPI/DreamZero policy server on the DROID scenes with batched envs.",
    )
    run = p.add_argument_group("what to run")
    run.add_argument("--num-envs", type=positive_int, help="envs stepped together (default 8)")
    run.add_argument("--scene", dest="scenes", type=_scene, action="append", help="DROID scene 1, 2 or 3 (repeatable; default 1)")
    run.add_argument("--episodes", type=positive_int, help="episodes per scene (default: one per env)")
    run.add_argument("--seed", type=int, help="episode k of a scene has seed SEED+k (default 0)")
    run.add_argument("--max-steps", type=positive_int, help=f"steps per episode (default {droid.MAX_EPISODE_LENGTH}, the env's)")
    run.add_argument(
        "--open-loop-horizon", type=positive_int,
        help=f"actions executed per chunk before replanning (default {droid.DEFAULT_OPEN_LOOP_HORIZON})",
    )
    run.add_argument(
        "--prefetch", type=non_negative_int, metavar="K",
        help="latency hiding: send an env's next request when K actions of its window are left and keep "
        "executing; rows for the steps executed meanwhile are skipped (default 0: wait, like the reference client)",
    )
    run.add_argument(
        "--simulated-delay", type=non_negative_int, metavar="D",
        help="apply every chunk exactly D steps after its request instead of when it arrives (reproducible latency)",
    )
    run.add_argument(
        "--max-stale-steps", type=non_negative_int, metavar="S",
        help="with --prefetch: rows a late env may run past its window before it waits (default: the whole chunk)",
    )
    run.add_argument("--backend", choices=("auto", "isaac", "mujoco"), help="simulator (default auto: isaac when importable)")
    run.add_argument(
        "--process-per-scene", action=argparse.BooleanOptionalAction, default=None,
        help="run each scene in a fresh process (default: on for isaac, off for mujoco)",
    )
    srv = p.add_argument_group("policy server (none given: start the embedded reference server)")
    srv.add_argument("--server", dest="servers", action="append", metavar="URL", help="ws:// URL (repeatable: envs are spread over the servers)")
    srv.add_argument("--host", help=f"server host, as the reference client (default {DEFAULT_HOST})")
    srv.add_argument("--port", type=int, help=f"server port, as the reference client (default {DEFAULT_PORT})")
    srv.add_argument("--path", help=f"websocket path, as the reference client (default {DEFAULT_PATH})")
    srv.add_argument("--request-timeout", type=positive_float, help="seconds to wait for one chunk (default 600)")
    srv.add_argument(
        "--auth-env", metavar="NAME",
        help="name of the environment variable that holds the servers' API token (sent as 'Authorization: "
        "Api-Key ...'); the token itself is never a flag and never logged",
    )
    srv.add_argument("--policy", help="embedded server: its policy (default: reference on the embedded simulator, hold on Isaac Lab)")
    srv.add_argument(
        "--serve-arg", action="append", default=[], metavar="ARG",
        help="embedded server: extra dz-gym-serve argument, e.g. --serve-arg=--latency-ms=200 (repeatable)",
    )
    out = p.add_argument_group("outputs and faults")
    out.add_argument("--output-root", type=Path, help=f"where run directories are created (default {DEFAULT_OUTPUT_ROOT})")
    out.add_argument("--resume", type=Path, metavar="RUN_DIR", help="continue RUN_DIR without redoing finished episodes")
    out.add_argument("--video", action=argparse.BooleanOptionalAction, default=None, help="write per-episode mp4 videos (default on)")
    out.add_argument("--max-errors", type=non_negative_int, help="abort after more errored episodes than this (default 10%% of the episodes, at least 5)")
    out.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None, help="progress bars (default: when stderr is a TTY)")
    p.add_argument("--only-scene", type=_scene, action="append", help=argparse.SUPPRESS)  # per-scene child process
    if isaac_args is None:
        isaac_args = importlib.util.find_spec("isaaclab") is not None
    if isaac_args:
        from dz_gym.envs.isaac import add_launcher_args

        add_launcher_args(p)
    return p


def _servers_from_flags(parser: argparse.ArgumentParser, args: argparse.Namespace) -> list[str] | None:
    """The server URLs the flags name, or None for the embedded server."""
    reference_flags = args.host is not None or args.port is not None or args.path is not None
    if args.servers and reference_flags:
        parser.error("--server: give either --server URL or --host/--port/--path, not both")
    if args.servers:
        from dz_gym.transport import validate_url

        for url in args.servers:
            try:
                validate_url(url)
            except ValueError as exc:
                parser.error(f"--server: {exc}")
        return list(args.servers)
    if reference_flags:
        path = args.path if args.path is not None else DEFAULT_PATH
        if path and not path.startswith("/"):
            parser.error(f"--path: expected a path starting with '/', got {path!r}")
        port = args.port if args.port is not None else DEFAULT_PORT
        if not 0 < port < 65536:
            parser.error(f"--port: expected 1..65535, got {port}")
        host = args.host or DEFAULT_HOST
        host = f"[{host}]" if ":" in host and not host.startswith("[") else host
        return [f"ws://{host}:{port}{path}"]
    return None


def resolve_config(parser: argparse.ArgumentParser, args: argparse.Namespace) -> tuple[EvalConfig, RunDir | None, list[str] | None]:
    """Merge flags, the saved config (on resume) and defaults; bad combinations end in ``parser.error``."""
    servers = _servers_from_flags(parser, args)
    wanted: dict[str, Any] = {}
    for key in (
        "scenes", "num_envs", "episodes", "seed", "max_steps", "open_loop_horizon", "prefetch", "simulated_delay",
        "max_stale_steps", "max_errors", "request_timeout", "auth_env", "video",
    ):
        value = getattr(args, key)
        if value is not None:
            wanted[key] = value
    if "scenes" in wanted:
        wanted["scenes"] = list(dict.fromkeys(wanted["scenes"]))
    if args.backend is not None:
        from dz_gym.envs import resolve_backend

        wanted["backend"] = resolve_backend(args.backend)
    if servers is not None:
        if args.policy is not None:
            parser.error("--policy: only for the embedded server; an external server serves its own policy")
        wanted["servers"] = servers
        wanted["policy"] = "external"
    elif args.policy is not None:
        wanted["policy"] = args.policy

    if args.resume is not None:
        try:
            run_dir = RunDir.open(args.resume)
            saved = run_dir.load_config()
        except ValueError as exc:
            parser.error(f"--resume: {exc}")
        if servers is None and saved.servers:
            if args.policy is not None:
                parser.error("--policy: the run used external servers; --policy only selects the embedded server's policy")
            servers = list(saved.servers)  # resume against the servers the run used
        if servers is None and "policy" not in wanted:
            wanted["policy"] = saved.policy
        conflicts = resume_conflicts(saved, wanted)
        if conflicts:
            parser.error(f"--resume: settings that change results differ from {args.resume}: " + "; ".join(conflicts))
        merged = saved.to_dict()
        merged.update({k: v for k, v in wanted.items() if k in merged})
        if servers is not None:
            merged["servers"] = servers
        config = EvalConfig.from_dict(merged)
        return config, run_dir, servers

    values = dict(DEFAULTS)
    values.update(wanted)
    if values["backend"] == "auto":
        from dz_gym.envs import resolve_backend

        values["backend"] = resolve_backend("auto")
    values.setdefault("episodes", values["num_envs"])
    if servers is None:
        values["servers"] = []
        values.setdefault("policy", None)
        if values["policy"] is None:
            values["policy"] = default_policy(values["backend"])
    try:
        config = EvalConfig(**{k: v for k, v in values.items() if k in EvalConfig.__dataclass_fields__})
    except ValueError as exc:
        parser.error(str(exc))
    return config, None, servers


class _StopOnSignal:
    """First SIGINT/SIGTERM: stop at the next step boundary; second: stop now (KeyboardInterrupt).

    With ``children`` (per-scene processes, each in its own session) every signal is forwarded to the running
    child instead, which then stops the same way; this process only stops starting new children.
    """

    def __init__(self, control: RunControl, say, children: list[subprocess.Popen] | None = None):
        self.control = control
        self.say = say
        self.children = children
        self._previous: dict[int, Any] = {}

    def __enter__(self):
        for sig in (signal.SIGINT, signal.SIGTERM):
            try:
                self._previous[sig] = signal.signal(sig, self._handle)
            except ValueError:  # not the main thread
                pass
        return self

    def _handle(self, signum, frame) -> None:
        if self.children is not None:
            self.control.stop.set()
            for proc in self.children:
                if proc.poll() is None:
                    proc.send_signal(signal.SIGINT)
            return
        if self.control.stop.is_set():
            raise KeyboardInterrupt
        self.control.stop.set()
        self.say("dz-gym-eval: stopping after this step (finished episodes are kept); Ctrl-C again to stop now")

    def __exit__(self, *exc) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)


def _say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _start_embedded_server(config: EvalConfig, serve_args: list[str]):
    from dz_gym.server.launch import start_server_process

    argv = ["--policy", config.policy, "--flavor", "vllm-omni", "--quiet", *serve_args]
    server = start_server_process(argv, new_session=True)
    return server, server.url + DEFAULT_PATH


def _exit_code(summary: dict[str, Any]) -> int:
    if summary.get("interrupted"):
        return EXIT_INTERRUPTED
    if summary.get("aborted"):
        return EXIT_ABORTED
    return EXIT_OK


def _run_scene_processes(args: argparse.Namespace, argv: list[str], config: EvalConfig, run_dir: RunDir, command: str) -> int:
    """Run each scene in a fresh ``dz-gym-eval --resume RUN_DIR --only-scene S`` process, in turn."""
    drop_with_value = {"--scene", "--resume", "--output-root", "--only-scene"}
    base: list[str] = []
    skip = False
    for item in argv:
        if skip:
            skip = False
            continue
        name = item.split("=", 1)[0]
        if name in drop_with_value:
            skip = "=" not in item
            continue
        base.append(item)
    env = dict(os.environ)
    env[COMMAND_ENV] = command
    control = RunControl()
    children: list[subprocess.Popen] = []
    code = EXIT_OK
    with _StopOnSignal(control, _say, children):
        for scene in config.scenes:
            if control.stop.is_set():
                code = EXIT_INTERRUPTED
                break
            child_argv = [sys.executable, "-m", "dz_gym.eval.cli", *base, "--resume", str(run_dir.path), "--only-scene", str(scene)]
            _say(f"dz-gym-eval: scene {scene} in a new process")
            # A session of its own: a Ctrl-C in the terminal reaches only this process, which forwards it once.
            proc = subprocess.Popen(child_argv, env=env, start_new_session=True)
            children[:] = [proc]
            code = proc.wait()
            if code != EXIT_OK:
                break
    summary = run_dir.read_summary()
    if summary is not None:
        print(format_table(summary))
    print(f"results: {run_dir.path}")
    if code == EXIT_OK and (summary is None or not summary.get("complete")):
        code = EXIT_ABORTED
    return code if code in (EXIT_OK, EXIT_ABORTED, EXIT_INTERRUPTED) else EXIT_ABORTED


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    args = parser.parse_args(argv)
    config, run_dir, servers = resolve_config(parser, args)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    from dz_gym.eval.evaluate import evaluate, python_command

    command = os.environ.get(COMMAND_ENV) or python_command(["dz-gym-eval", *argv])
    if args.backend in (None, "auto") and args.resume is None and not args.only_scene:
        why = "Isaac Lab is importable" if config.backend == "isaac" else "Isaac Lab is not importable"
        _say(f"dz-gym-eval: backend {config.backend} (auto: {why})")
    if run_dir is None:
        run_dir = RunDir.create(args.output_root or DEFAULT_OUTPUT_ROOT, config)
        _say(f"dz-gym-eval: run directory {run_dir.path}")
    else:
        run_dir.save_config(config)
        if not args.only_scene:
            _say(f"dz-gym-eval: resuming {run_dir.path}")

    per_process = args.process_per_scene if args.process_per_scene is not None else config.backend == "isaac"
    if per_process and not args.only_scene and len(config.scenes) > 1:
        return _run_scene_processes(args, argv, config, run_dir, command)

    control = RunControl(config.error_budget)
    server = None
    server_info: dict[str, Any] = {"embedded": not servers}
    try:
        if not servers:
            server, url = _start_embedded_server(config, args.serve_arg)
            servers = [url]
            server_info.update(policy=config.policy, flavor="vllm-omni", serve_args=list(args.serve_arg), url=url)
            _say(f"dz-gym-eval: no --server given; started the embedded reference server (policy {config.policy}) at {url}")
        with _StopOnSignal(control, _say):
            summary = evaluate(
                config,
                run_dir,
                servers,
                control=control,
                progress=args.progress,
                command=command,
                server_info=server_info,
                only_scenes=args.only_scene,
                env_kwargs={"app_args": args} if config.backend == "isaac" else None,
            )
    except KeyboardInterrupt:
        summary = run_dir.read_summary() or {"interrupted": True}
        summary["interrupted"] = True
    except Exception as exc:  # noqa: BLE001 - one line for the user; the summary is already written
        _say(f"dz-gym-eval: error: {type(exc).__name__}: {exc}")
        summary = run_dir.read_summary()
        if summary is not None:
            print(format_table(summary))
        print(f"results: {run_dir.path}")
        return EXIT_ABORTED
    finally:
        if server is not None:
            server.stop()
    if not args.only_scene or summary.get("interrupted") or summary.get("aborted"):
        if "overall" in summary:
            print(format_table(summary))
        print(f"results: {run_dir.path}")
    return _exit_code(summary)


if __name__ == "__main__":
    sys.exit(main())
