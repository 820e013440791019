"""argparse helpers shared by the command-line tools: numbers with a one-line error naming the bound, a
parser whose usage errors are one line, and :class:`Flag`, the one declaration of a flag.

A :class:`Flag` names the config field it sets (its argparse ``dest``), so a tool's flags are a table next to
its config dataclass: the parser is built from the table, a test checks the table against the dataclass, and
the default that ``--help`` shows is the dataclass's (:func:`shown_default`). The flags that mean the same in
several tools (:data:`SERVER`, :data:`AUTH_ENV`, :data:`REQUEST_TIMEOUT`, :data:`OPEN_LOOP_HORIZON`,
:data:`SEED`) are declared here once; a tool that gives one a narrower meaning replaces only its help
(:meth:`Flag.but`).
"""

from __future__ import annotations

import argparse
import dataclasses
import math
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from dz_gym.protocol.profiles import SERVER_KINDS


def _number(text: str, kind: type, what: str):
    try:
        value = kind(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None
    if kind is float and not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}")
    return value


def positive_int(text: str) -> int:
    """An integer >= 1."""
    value = _number(text, int, "an integer >= 1")
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {text!r}")
    return value


def non_negative_int(text: str) -> int:
    """An integer >= 0."""
    value = _number(text, int, "an integer >= 0")
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got {text!r}")
    return value


def positive_float(text: str) -> float:
    """A finite number > 0."""
    value = _number(text, float, "a finite number > 0")
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a finite number > 0, got {text!r}")
    return value


def non_negative_float(text: str) -> float:
    """A finite number >= 0."""
    value = _number(text, float, "a finite number >= 0")
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected a finite number >= 0, got {text!r}")
    return value


def integer(text: str) -> int:
    """Any integer (the range is checked by whoever owns the rule, e.g. ``EvalConfig``)."""
    return _number(text, int, "an integer")


def number(text: str) -> float:
    """Any finite number (the range is checked by whoever owns the rule)."""
    return _number(text, float, "a finite number")


def height_by_width(text: str) -> list[int]:
    """``HxW`` (``360x640``) as ``[height, width]`` integers (the range is checked by whoever owns the rule)."""
    parts = text.lower().split("x")
    if len(parts) != 2:
        raise argparse.ArgumentTypeError(f"expected HEIGHTxWIDTH such as 360x640, got {text!r}")
    return [_number(part, int, "HEIGHTxWIDTH integers such as 360x640") for part in parts]


class OneLineErrorParser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose usage errors are one line on stderr (``PROG: error: ...``) and exit 2.

    argparse prints the whole usage block before the error; a usage error here is one line that names the
    flag and what was expected, with a pointer to ``--help``.
    """

    def error(self, message: str):  # type: ignore[override]
        text = " ".join(message.split())
        self.exit(2, f"{self.prog}: error: {text} (see {self.prog} --help)\n")


@dataclasses.dataclass(frozen=True)
class Flag:
    """One command-line flag: its name, the config field it sets and how argparse parses it.

    ``help`` says what the flag does; :meth:`add` appends ``(default X)`` where X is the shown default (the
    config's field default, or ``shown``). ``doc`` is the longer wording of a documentation table (default:
    ``help``). The parser's value for a flag not given is ``default`` (None: "not given", so the config's
    default, or a resumed run's saved value, applies). Types parse values only; the config that owns a range
    checks it.
    """

    name: str
    help: str
    field: str | None = None  # the config field (dotted in a nested config: "plan.seed"); None: the command's own
    type: Callable[[str], Any] | None = None
    metavar: str | None = None
    action: Any = None  # "append", "store_true", argparse.BooleanOptionalAction ...
    choices: Sequence[str] | None = None
    default: Any = None
    shown: str | Callable[[], str] | None = None  # the default shown, when not the field's (a callable: lazily)
    doc: str | None = None
    dest: str | None = None  # the argparse dest when not the field's name (e.g. --task -> tasks)
    required: bool = False

    @property
    def key(self) -> str:
        """The argparse dest: ``dest``, else the config field's name (its last dotted part), else the name without
        dashes."""
        return self.dest or (self.field and self.field.rsplit(".", 1)[-1]) or self.name.lstrip("-").replace("-", "_")

    def but(self, **changes: Any) -> Flag:
        """This flag with some attributes replaced (a tool's own help for a shared flag)."""
        return dataclasses.replace(self, **changes)

    def usage(self) -> str:
        """How the flag is written: ``--num-envs N``, ``--video / --no-video``, ``--backend auto|isaac``."""
        if self.action is argparse.BooleanOptionalAction:
            return f"{self.name} / --no-{self.name[2:]}"
        if self.action in ("store_true", "store_false"):
            return self.name
        if self.choices:
            return f"{self.name} {'|'.join(self.choices)}"
        return f"{self.name} {self.metavar or self.key.upper()}"

    def add(self, group, shown: str | None = None, note: str = "") -> argparse.Action:
        """Add this flag to ``group`` (a parser, an argument group or a mutually exclusive group)."""
        kwargs = {"type": self.type, "metavar": self.metavar, "action": self.action, "choices": self.choices}
        kwargs = {k: v for k, v in kwargs.items() if v is not None}
        if self.required:
            kwargs["required"] = True
        if self.action in ("store_true", "store_false"):
            kwargs.pop("metavar", None)
        shown = shown if self.shown is None else self.shown() if callable(self.shown) else self.shown
        text = self.help + (f" (default {shown})" if shown is not None else "") + note
        return group.add_argument(
            self.name, dest=self.key, default=self.default, help=text.replace("%", "%%"), **kwargs
        )


def field_default(config_cls: type, name: str) -> Any:
    """The default of dataclass field ``name`` of ``config_cls`` (a ``KeyError`` if it has none); a config
    with a ``default`` classmethod (a nested one, whose fields are dotted) answers itself."""
    if callable(getattr(config_cls, "default", None)):
        return config_cls.default(name)
    for f in dataclasses.fields(config_cls):
        if f.name == name:
            if f.default_factory is not dataclasses.MISSING:
                return f.default_factory()
            if f.default is not dataclasses.MISSING:
                return f.default
    raise KeyError(name)


def show(value: Any) -> str | None:
    """A default as --help and the docs show it: ``8``, ``0.05``, ``on``/``off``, ``1, 2``; None: not shown."""
    if value is None:
        return None
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, (list, tuple)):
        return ", ".join(map(str, value)) or None
    return str(value)


def shown_default(flag: Flag, config_cls: type | None) -> str | None:
    """What ``flag``'s default is shown as: ``flag.shown``, else its config field's default, else None."""
    if flag.shown is not None:
        return flag.shown() if callable(flag.shown) else flag.shown
    if flag.field is None or config_cls is None:
        return None
    try:
        return show(field_default(config_cls, flag.field))
    except KeyError:
        return None


def add_flags(group, flags: Iterable[Flag], config_cls: type | None = None, note: Callable[[Flag], str] | None = None):
    """Add every flag of ``flags`` to ``group``, with the defaults of ``config_cls`` and ``note(flag)`` appended."""
    for flag in flags:
        flag.add(group, shown_default(flag, config_cls), note(flag) if note else "")


def given_fields(args: argparse.Namespace, flags: Iterable[Flag]) -> dict[str, Any]:
    """The config fields the command line set: every flag with a field whose value is not None."""
    return {f.field: getattr(args, f.key) for f in flags if f.field and getattr(args, f.key, None) is not None}


def flag_message(exc: Exception, flags: Iterable[Flag]) -> str:
    """A config's ``field: ...`` error worded with the flag that sets the field (else unchanged)."""
    text = str(exc)
    field, sep, rest = text.partition(":")
    names = {f.key: f.name for f in flags}
    return f"{names[field]}:{rest}" if sep and field in names else text


# The flags several tools share (each tool's config has a field of the same name).
SERVER = Flag(
    "--server",
    "ws:// or wss:// URL of a policy server (repeatable: the sessions are spread over the servers)",
    field="servers",
    action="append",
    metavar="URL",
)
AUTH_ENV = Flag(
    "--auth-env",
    "name of the environment variable that holds the servers' API token (sent as 'Authorization: Api-Key "
    "...'); the token itself is never a flag and never logged",
    field="auth_env",
    metavar="NAME",
)
REQUEST_TIMEOUT = Flag(
    "--request-timeout",
    "seconds to wait for one chunk (the transport's bound on one request)",
    field="request_timeout",
    type=number,
    metavar="S",
)
OPEN_LOOP_HORIZON = Flag(
    "--open-loop-horizon",
    "actions executed per chunk before the next request",
    field="open_loop_horizon",
    type=integer,
    metavar="H",
)
SEED = Flag("--seed", "the base seed", field="seed", type=integer, metavar="K")
SERVER_KIND = Flag(
    "--server-kind",
    "which server's protocol to speak (docs/server_profiles.md); auto: chosen from each server's handshake",
    field="server_kind",
    choices=SERVER_KINDS,
)
