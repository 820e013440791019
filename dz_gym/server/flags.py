"""Every flag of ``dz-gym-serve``, declared once (:class:`~dz_gym.cli_types.Flag`), grouped by what a user decides.

Each flag names the :class:`~dz_gym.server.app.ServerConfig` field it sets, or, for the command's own flags,
its argparse dest (``--policy``, ``--policy-arg``, ``--max-payload-mib``, ``--no-robot-policy``, ``--quiet``,
``--parent-pid``).
The parser (:func:`build_parser`, grouped ``--help`` with each default) and the flags table of
``docs/server.md`` (:func:`markdown_table`, checked by a test) are built from :data:`GROUPS`; the defaults they
show are the config's. The ranges are the config's rules: its one-line errors are worded with the flag
(:func:`config_of`).
"""

from __future__ import annotations

import argparse
from typing import Any

from dz_gym.cli_types import Flag, OneLineErrorParser, add_flags, flag_message, given_fields, integer, number
from dz_gym.server.app import FLAVORS, ServerConfig
from dz_gym.server.policies import BUILTIN_POLICIES

__all__ = ["GROUPS", "build_parser", "config_of", "markdown_table"]

DEFAULT_PORT = 8000  # the command's port (ServerConfig's 0, a free port, is what tests and launchers want)
MIB = 1024 * 1024

WHAT = (
    Flag("--policy", f"built-in policy ({', '.join(sorted(BUILTIN_POLICIES))}) or module:factory", dest="policy",
         metavar="NAME", default="hold", shown="hold"),
    Flag("--policy-arg", "keyword argument for the policy factory (repeatable; JSON values, else strings)",
         dest="policy_arg", action="append", default=[], metavar="KEY=VALUE"),
    Flag("--flavor", "which real server to behave like", field="flavor", choices=FLAVORS),
)  # fmt: skip
WHERE = (
    Flag("--host", "bind address", field="host", metavar="HOST"),
    Flag("--port", "port; 0 picks a free one (read it from the ready line)", field="port", type=integer,
         metavar="PORT", default=DEFAULT_PORT, shown=str(DEFAULT_PORT)),
)  # fmt: skip
BEHAVIOUR = (
    Flag("--workers", "independent inference workers (emulated GPUs)", field="workers", type=integer, metavar="K"),
    Flag("--latency-ms", "minimum model time per inference", field="latency_ms", type=number, metavar="MS"),
    Flag("--jitter-ms", "uniform +/- jitter on the model time", field="jitter_ms", type=number, metavar="MS"),
    Flag("--seed", "seed of the latency jitter", field="seed", type=integer, metavar="K", shown="none"),
    Flag("--fail-every", "every N-th inference raises (0: never)", field="fail_every", type=integer, metavar="N"),
    Flag("--idle-timeout", "vllm-omni: close a connection idle for S seconds (0 disables; the real server uses 30)",
         field="idle_timeout_s", type=number, metavar="S"),
    Flag("--max-payload-mib", "largest request accepted (MiB); vllm-omni answers up to twice this with an error "
         "reply and closes (1009) beyond, the others close (1009) beyond it", dest="max_payload_mib", type=number,
         metavar="MIB", shown=f"{ServerConfig().max_payload_bytes / MIB:g}"),
    Flag("--no-robot-policy", "vllm-omni: answer every handshake with the 'Robot policy not available' text error "
         "and close", dest="no_robot_policy", action="store_true", default=False),
    Flag("--max-sessions", "vllm-omni: keep at most K sessions resident and refuse new ones beyond "
         "(SessionAdmissionError) until one is freed by a reset, a session switch or a disconnect",
         field="max_sessions", type=integer, metavar="K", shown="no cap"),
)  # fmt: skip
OUTPUT = (Flag("--quiet", "no per-request log lines", dest="quiet", action="store_true", default=False),)
LIFETIME = (
    Flag("--parent-pid", "stop when process PID, which started this server, is gone: at EOF on stdin (the "
         "launcher holds a pipe to it) and, on Linux, by a parent-death signal", dest="parent_pid", type=integer,
         metavar="PID", shown="none"),
)  # fmt: skip
GROUPS = (("what to serve", WHAT), ("where", WHERE), ("how it behaves", BEHAVIOUR), ("output", OUTPUT),
          ("lifetime", LIFETIME))  # fmt: skip
FLAGS = tuple(flag for _, flags in GROUPS for flag in flags)


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineErrorParser(
        prog="dz-gym-serve",
        description="Reference OpenPI/DreamZero websocket policy server (for tests, demos and throughput work).",
    )
    for title, flags in GROUPS:
        add_flags(parser.add_argument_group(title), flags, ServerConfig)
    return parser


def config_of(parser: argparse.ArgumentParser, args: argparse.Namespace) -> ServerConfig:
    """The :class:`ServerConfig` of parsed ``args``; a bad value ends the command with one line naming the flag."""
    fields: dict[str, Any] = given_fields(args, FLAGS)
    if args.max_payload_mib is not None:
        fields["max_payload_bytes"] = int(args.max_payload_mib * MIB)
    fields["robot_policy_available"] = not args.no_robot_policy
    try:
        return ServerConfig(**fields)
    except ValueError as exc:
        text = flag_message(exc, FLAGS)
        if text.startswith("max_payload_bytes:"):
            text = f"--max-payload-mib: expected at least 1/1024 MiB, got {args.max_payload_mib!r}"
        parser.error(text)
        raise  # parser.error exits


def markdown_table() -> str:
    """The flags table of ``docs/server.md``: one line per flag (usage, default, meaning), a line per group."""
    from dz_gym.cli_types import shown_default

    lines = ["| flag | default | meaning |", "|---|---|---|"]
    for title, flags in GROUPS:
        lines.append(f"| **{title}** | | |")
        for flag in flags:
            shown = shown_default(flag, ServerConfig)
            default = f"`{shown}`" if shown is not None else ""
            usage = flag.usage().replace("|", "\\|")
            lines.append(f"| `{usage}` | {default} | {flag.doc or flag.help} |")
    return "\n".join(lines)
