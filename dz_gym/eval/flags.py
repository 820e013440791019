"""The flags of ``dz-gym-eval``: the parser, and the one path from flags (and a saved run) to an EvalConfig.

The flags are declared once in :mod:`dz_gym.eval.flag_table`; every default comes from
:class:`~dz_gym.eval.config.EvalConfig`, and the parser leaves a flag that was not given at None, so on
``--resume`` the saved value stays. Only light imports: :mod:`dz_gym.eval.cli` builds the parser
before it imports numpy, the simulator or the transport.
"""

from __future__ import annotations

import argparse
import importlib.util
from typing import TYPE_CHECKING, Any

from dz_gym.cli_types import OneLineErrorParser, given_fields, integer
from dz_gym.cli_types import flag_message as _flag_message
from dz_gym.eval.flag_table import (
    DEFAULT_HOST,
    DEFAULT_PATH,
    DEFAULT_PORT,
    GROUPS,
    LOCKED_NOTE,
    eval_flags,
    flag_of,
    locked,
    shown,
)

if TYPE_CHECKING:
    from dz_gym.eval.config import EvalConfig
    from dz_gym.eval.rundir import RunDir

__all__ = ["build_parser", "default_policy", "flag_message", "flag_of", "resolve_config"]


COMMAND_ENV = "DZ_GYM_EVAL_COMMAND"  # the user's command, handed to per-scene child processes
EXIT_OK, EXIT_ABORTED, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130


def default_policy(backend: str = "mujoco") -> str:
    """The embedded server's default policy for ``backend`` (see :func:`dz_gym.eval.config.default_policy`)."""
    from dz_gym.eval.config import default_policy as policy_for

    return policy_for(backend)


def build_parser(isaac_args: bool | None = None) -> argparse.ArgumentParser:
    """The ``dz-gym-eval`` parser, from :data:`~dz_gym.eval.flag_table.GROUPS`; Isaac Lab's launcher flags are
    added when Isaac Lab is importable.

    Flags parse values only; :class:`EvalConfig` checks their ranges (one rule, one place) and its defaults
    are the ones ``--help`` shows.
    """
    p = OneLineErrorParser(
        prog="dz-gym-eval",
        description="Evaluate an OpenPI/DreamZero policy server on the DROID scenes with batched envs.",
        epilog=f"Flags marked{LOCKED_NOTE} change what is measured: --resume keeps the run's saved values.",
    )
    for title, description, flags in GROUPS:
        group = p.add_argument_group(title, description)
        for flag in flags:
            flag.add(group, shown(flag), LOCKED_NOTE if locked(flag) else "")
    p.add_argument("--only-scene", type=integer, action="append", help=argparse.SUPPRESS)  # per-scene child process
    p.add_argument("--parent-pid", type=integer, help=argparse.SUPPRESS)  # per-scene child: stop with the parent
    if isaac_args is None:
        isaac_args = importlib.util.find_spec("isaaclab") is not None
    if isaac_args:
        from dz_gym.envs.isaac import add_launcher_args
        from dz_gym.errors import BackendUnavailable

        try:
            add_launcher_args(p)
        except (BackendUnavailable, ImportError):
            pass  # an Isaac Lab that cannot load (a 2.x wheel without Isaac Sim): the preflight check says why
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
    return _flag_message(exc, eval_flags())


def resolve_config(
    parser: argparse.ArgumentParser, args: argparse.Namespace
) -> tuple[EvalConfig, RunDir | None, list[str] | None]:
    """One merge: EvalConfig's defaults (or, with ``--resume``, the saved config), then the flags given.

    Returns the config, the run directory to resume (or None) and the external servers (None: the
    embedded one). Bad values and result-changing differences on resume end in ``parser.error``.
    """
    from dz_gym.eval.config import PATHS, EvalConfig, resume_conflicts
    from dz_gym.eval.rundir import RunDir

    given: dict[str, Any] = given_fields(args, eval_flags())  # by dotted field: "plan.scenes"
    given.pop("policies.servers", None)  # --server and --host/--port/--path: below
    if getattr(args, "tasks", None):  # named sim-evals tasks run as scene ids (see dz_gym.envs.scenes)
        from dz_gym.envs import backends
        from dz_gym.envs.scenes import tasks_from_names

        try:
            named = tasks_from_names(args.tasks)
        except ValueError as exc:
            parser.error(str(exc))
        given["plan.scenes"] = list(given.get("plan.scenes") or []) + [task.key for task in named]
        given.setdefault("plan.max_steps", max(task.max_steps for task in named))
        mila = [task.name for task in named if task.is_mila]
        able = [name for name, traits in backends.REGISTRY.items() if traits.named_tasks]
        if mila and given.get("plan.backend") not in (None, backends.AUTO, *able):
            parser.error(f"--task {mila[0]}: a sim-evals MILA task, only on --backend {' or '.join(able)}")
        if mila and given.get("plan.backend") in (None, backends.AUTO):
            given["plan.backend"] = able[0]  # the backends that have them
    if "plan.scenes" in given:
        given["plan.scenes"] = list(dict.fromkeys(given["plan.scenes"]))
    servers = _servers_from_flags(parser, args)
    if servers is not None:
        given["policies.servers"] = servers
    values: dict[str, Any] = {}
    saved: EvalConfig | None = None
    run_dir: RunDir | None = None
    if args.resume is not None:
        try:
            run_dir = RunDir.open(args.resume)
            saved = run_dir.load_config()
        except ValueError as exc:
            parser.error(f"--resume: {exc}")
        values = {path: saved.get(path) for path in PATHS.values()}
        if "policies.servers" in given:
            values["policies.policy"] = None  # external servers now: "external" unless --policy says otherwise
        if "policies.servers_b" in given:
            values["policies.policy_b"] = None
    values.update(given)
    try:
        config = EvalConfig(**values)
    except ValueError as exc:
        parser.error(flag_message(exc))
    if saved is not None:
        conflicts = resume_conflicts(saved, config)
        if conflicts:
            parser.error(f"--resume: settings that change results differ from {args.resume}: " + "; ".join(conflicts))
    return config, run_dir, (list(config.policies.servers) or None)
