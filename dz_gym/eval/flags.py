"""The flags of ``dz-gym-eval``: the parser, and the one path from flags (and a saved run) to an EvalConfig.

Every default comes from :class:`~dz_gym.eval.config.EvalConfig`; the parser leaves a flag that was not given
at None, so on ``--resume`` the saved value stays. Only light imports: :mod:`dz_gym.eval.cli` builds the parser
before it imports numpy, the simulator or the transport.
"""

from __future__ import annotations

import argparse
import importlib.util
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dz_gym.cli_types import OneLineErrorParser, integer, number

if TYPE_CHECKING:
    from dz_gym.eval.config import EvalConfig
    from dz_gym.eval.rundir import RunDir

__all__ = ["build_parser", "default_policy", "flag_message", "flag_of", "resolve_config"]


DEFAULT_OUTPUT_ROOT = Path("runs") / "dz_gym_eval"
DEFAULT_PATH = "/v1/realtime/robot/openpi"
DEFAULT_PORT = 8000
DEFAULT_HOST = "127.0.0.1"
COMMAND_ENV = "DZ_GYM_EVAL_COMMAND"  # the user's command, handed to per-scene child processes
EXIT_OK, EXIT_ABORTED, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130

# EvalConfig fields set by a flag of the same name (None in the parser = "not given": on resume the saved
# value stays, else EvalConfig's default applies).
FLAG_FIELDS = (
    "scenes",
    "num_envs",
    "episodes",
    "seed",
    "backend",
    "policy",
    "max_steps",
    "open_loop_horizon",
    "prefetch",
    "simulated_delay",
    "max_stale_steps",
    "max_errors",
    "request_timeout",
    "retry_server_errors",
    "server_max_sessions",
    "server_idle_timeout",
    "auth_env",
    "video",
    "report",
    "policy_b",
    "sequential",
    "alpha",
    "max_episodes",
    "policy_seed",
    "num_inference_steps",
)
_FLAG_OF_FIELD = {"scenes": "--scene", "servers": "--server", "servers_b": "--server-b"}


def flag_of(field: str) -> str:
    """The command-line flag that sets EvalConfig field ``field``."""
    return _FLAG_OF_FIELD.get(field, "--" + field.replace("_", "-"))


def _default(field: str) -> Any:
    from dz_gym.eval.config import EvalConfig

    return EvalConfig.default(field)


def default_policy(backend: str = "mujoco") -> str:
    """The embedded server's default policy for ``backend`` (see :func:`dz_gym.eval.config.default_policy`)."""
    from dz_gym.eval.config import default_policy as policy_for

    return policy_for(backend)


def build_parser(isaac_args: bool | None = None) -> argparse.ArgumentParser:
    """The ``dz-gym-eval`` parser; Isaac Lab's launcher flags are added when Isaac Lab is importable.

    Flags parse values only; :class:`EvalConfig` checks their ranges (one rule, one place) and its defaults
    are the ones ``--help`` shows.
    """
    from dz_gym.eval.config import BACKENDS, DEFAULT_MAX_EPISODES

    p = OneLineErrorParser(
        prog="dz-gym-eval",
        description="Evaluate an OpenPI/DreamZero policy server on the DROID scenes with batched envs.",
    )
    run = p.add_argument_group("what to run")
    run.add_argument("--num-envs", type=integer, help=f"envs stepped together (default {_default('num_envs')})")
    run.add_argument(
        "--scene",
        dest="scenes",
        type=integer,
        action="append",
        help=f"DROID scene 1, 2 or 3 (repeatable; default {', '.join(map(str, _default('scenes')))})",
    )
    run.add_argument(
        "--task",
        dest="tasks",
        action="append",
        metavar="NAME",
        help="a sim-evals task by name, e.g. place_spoon_in_sink or DROID-CubeInBowl (repeatable; isaac backend; "
        "its instruction is the prompt and its max_timesteps the default --max-steps; see docs/isaac.md)",
    )
    run.add_argument("--episodes", type=integer, help="episodes per scene (default: one per env)")
    run.add_argument("--seed", type=integer, help=f"episode k of a scene has seed SEED+k (default {_default('seed')})")
    run.add_argument(
        "--max-steps", type=integer, help=f"steps per episode (default {_default('max_steps')}, the env's)"
    )
    run.add_argument(
        "--open-loop-horizon",
        type=integer,
        help=f"actions executed per chunk before replanning (default {_default('open_loop_horizon')}); longer "
        "than the server's chunks is an error",
    )
    run.add_argument(
        "--prefetch",
        type=integer,
        metavar="K",
        help="latency hiding: send an env's next request when K actions of its window are left and keep "
        f"executing; rows for the steps executed meanwhile are skipped (default {_default('prefetch')}: wait, "
        "like the reference client)",
    )
    run.add_argument(
        "--simulated-delay",
        type=integer,
        metavar="D",
        help="apply every chunk exactly D steps after its request instead of when it arrives (reproducible latency)",
    )
    run.add_argument(
        "--max-stale-steps",
        type=integer,
        metavar="S",
        help="with --prefetch: rows a late env may run past its window before it waits (default: the whole chunk)",
    )
    run.add_argument(
        "--backend",
        choices=BACKENDS,
        help=f"simulator (default {_default('backend')}: isaac when Isaac Lab is importable, else mujoco)",
    )
    run.add_argument(
        "--process-per-scene",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="run each scene in a fresh process (default: on for isaac, off for mujoco)",
    )
    srv = p.add_argument_group("policy server (none given: start the embedded reference server)")
    srv.add_argument(
        "--server",
        dest="servers",
        action="append",
        metavar="URL",
        help="ws:// URL (repeatable: envs are spread over the servers)",
    )
    srv.add_argument("--host", help=f"server host, as the reference client (default {DEFAULT_HOST})")
    srv.add_argument("--port", type=integer, help=f"server port, as the reference client (default {DEFAULT_PORT})")
    srv.add_argument("--path", help=f"websocket path, as the reference client (default {DEFAULT_PATH})")
    srv.add_argument(
        "--request-timeout",
        type=number,
        metavar="S",
        help=f"seconds to wait for one chunk (default {_default('request_timeout'):g})",
    )
    srv.add_argument(
        "--retry-server-errors",
        type=integer,
        metavar="N",
        help="re-send a request that got a server error up to N times before its episode is flagged "
        f"(default {_default('retry_server_errors')}, as the reference client)",
    )
    srv.add_argument(
        "--server-max-sessions",
        type=integer,
        metavar="N",
        help="sessions one server keeps resident (vLLM-Omni: at most 64, fewer with a small KV pool); more envs "
        f"on one server is a warning (default {_default('server_max_sessions')})",
    )
    srv.add_argument(
        "--server-idle-timeout",
        type=number,
        metavar="S",
        help="seconds after which the servers close an idle connection (vLLM-Omni: 30; 0: none); a warning when "
        f"an env may wait longer between requests (default {_default('server_idle_timeout'):g})",
    )
    srv.add_argument(
        "--auth-env",
        metavar="NAME",
        help="name of the environment variable that holds the servers' API token (sent as 'Authorization: "
        "Api-Key ...'); the token itself is never a flag and never logged",
    )
    srv.add_argument(
        "--policy", help="embedded server: its policy (default: reference on the embedded simulator, hold on Isaac Lab)"
    )
    srv.add_argument(
        "--serve-arg",
        action="append",
        default=[],
        metavar="ARG",
        help="embedded server: extra dz-gym-serve argument, e.g. --serve-arg=--latency-ms=200 (repeatable)",
    )
    ab = p.add_argument_group("A/B: every seed under two policies (docs/eval.md; dz-gym-compare RUN reads the run)")
    ab.add_argument(
        "--server-b",
        dest="servers_b",
        action="append",
        metavar="URL",
        help="arm B's server (repeatable); arm A is --server; env slots alternate A, B on the same seeds",
    )
    ab.add_argument(
        "--policy-b",
        metavar="NAME",
        help="embedded servers: arm B's policy (arm A: --policy), e.g. --policy reference --policy-b reference:skill=0.3",
    )
    ab.add_argument(
        "--sequential",
        action="store_true",
        default=None,
        help="stop as soon as an anytime-valid test on the discordant pairs decides which arm is better",
    )
    ab.add_argument(
        "--alpha",
        type=number,
        help=f"with --sequential: the test's type-I error, valid at any stopping time (default {_default('alpha'):g})",
    )
    ab.add_argument(
        "--max-episodes",
        type=integer,
        metavar="N",
        help="with --sequential: stop undecided after N pairs (N episodes per arm; default "
        f"{DEFAULT_MAX_EPISODES}); the "
        "episodes per scene default to N spread over the scenes",
    )
    sampling = p.add_argument_group(
        "reproducible sampling (sent in every request; servers that do not know them ignore them)"
    )
    sampling.add_argument(
        "--policy-seed",
        action="store_true",
        default=None,
        help="send a per-episode 'seed' derived from the episode's seed (the same in both arms of an A/B run)",
    )
    sampling.add_argument(
        "--num-inference-steps",
        type=integer,
        metavar="N",
        help="send sampling_params {num_inference_steps: N} (vLLM-Omni's diffusion steps)",
    )
    out = p.add_argument_group("outputs and faults")
    out.add_argument(
        "--output-root", type=Path, help=f"where run directories are created (default {DEFAULT_OUTPUT_ROOT})"
    )
    out.add_argument(
        "--resume", type=Path, metavar="RUN_DIR", help="continue RUN_DIR without redoing finished episodes"
    )
    out.add_argument(
        "--video", action=argparse.BooleanOptionalAction, default=None, help="write per-episode mp4 videos (default on)"
    )
    out.add_argument(
        "--report",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="write report.html (dz-gym-report) into the run directory at the end, also after Ctrl-C and on resume (default on)",
    )
    out.add_argument(
        "--max-errors",
        type=integer,
        help="abort after more errored episodes than this (default 10%% of the episodes, at least 5)",
    )
    out.add_argument(
        "--progress",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="progress bars (default: bars when stderr is a TTY, else a progress line every 30 s)",
    )
    from dz_gym.eval.shards.options import add_ray_args

    add_ray_args(p)
    p.add_argument("--only-scene", type=integer, action="append", help=argparse.SUPPRESS)  # per-scene child process
    if isaac_args is None:
        isaac_args = importlib.util.find_spec("isaaclab") is not None
    if isaac_args:
        from dz_gym.envs.isaac import add_launcher_args
        from dz_gym.errors import BackendUnavailable

        try:
            add_launcher_args(p)
        except BackendUnavailable:
            pass  # the preflight check says why in one line
    return p


def _servers_from_flags(parser: argparse.ArgumentParser, args: argparse.Namespace) -> list[str] | None:
    """The server URLs the flags name (checked by EvalConfig), or None when no server flag was given."""
    reference_flags = args.host is not None or args.port is not None or args.path is not None
    if args.servers and reference_flags:
        parser.error("--server: give either --server URL or --host/--port/--path, not both")
    if args.servers:
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


def flag_message(exc: ValueError) -> str:
    """EvalConfig's ``field: ...`` error, worded with the flag that sets the field."""
    from dz_gym.eval.config import EvalConfig

    text = str(exc)
    field, sep, rest = text.partition(":")
    if sep and field in EvalConfig.__dataclass_fields__:
        return f"{flag_of(field)}:{rest}"
    return text


def resolve_config(
    parser: argparse.ArgumentParser, args: argparse.Namespace
) -> tuple[EvalConfig, RunDir | None, list[str] | None]:
    """One merge: EvalConfig's defaults (or, with ``--resume``, the saved config), then the flags given.

    Returns the config, the run directory to resume (or None) and the external servers (None: the
    embedded one). Bad values and result-changing differences on resume end in ``parser.error``.
    """
    from dz_gym.eval.config import EvalConfig, resume_conflicts
    from dz_gym.eval.rundir import RunDir

    given: dict[str, Any] = {k: getattr(args, k) for k in FLAG_FIELDS if getattr(args, k) is not None}
    if getattr(args, "tasks", None):  # named sim-evals tasks run as scene ids (see dz_gym.envs.scenes)
        from dz_gym.envs import backends
        from dz_gym.envs.scenes import tasks_from_names

        try:
            named = tasks_from_names(args.tasks)
        except ValueError as exc:
            parser.error(str(exc))
        given["scenes"] = list(given.get("scenes") or []) + [task.key for task in named]
        given.setdefault("max_steps", max(task.max_steps for task in named))
        mila = [task.name for task in named if task.is_mila]
        able = [name for name, traits in backends.REGISTRY.items() if traits.named_tasks]
        if mila and given.get("backend") not in (None, backends.AUTO, *able):
            parser.error(f"--task {mila[0]}: a sim-evals MILA task, only on --backend {' or '.join(able)}")
        if mila and given.get("backend") in (None, backends.AUTO):
            given["backend"] = able[0]  # the backends that have them
    if "scenes" in given:
        given["scenes"] = list(dict.fromkeys(given["scenes"]))
    servers = _servers_from_flags(parser, args)
    if servers is not None:
        given["servers"] = servers
    if getattr(args, "servers_b", None):
        given["servers_b"] = list(args.servers_b)
    values: dict[str, Any] = {}
    saved: EvalConfig | None = None
    run_dir: RunDir | None = None
    if args.resume is not None:
        try:
            run_dir = RunDir.open(args.resume)
            saved = run_dir.load_config()
        except ValueError as exc:
            parser.error(f"--resume: {exc}")
        values = saved.to_dict()
        if "servers" in given:
            values["policy"] = None  # external servers now: "external" unless --policy says otherwise
        if "servers_b" in given:
            values["policy_b"] = None
    values.update(given)
    try:
        config = EvalConfig(**values)
    except ValueError as exc:
        parser.error(flag_message(exc))
    if saved is not None:
        conflicts = resume_conflicts(saved, config)
        if conflicts:
            parser.error(f"--resume: settings that change results differ from {args.resume}: " + "; ".join(conflicts))
    return config, run_dir, (list(config.servers) or None)
