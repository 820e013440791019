"""argparse helpers shared by the command-line tools: numbers with a one-line error naming the bound, and a
parser whose usage errors are one line."""

from __future__ import annotations

import argparse
import math


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


class OneLineErrorParser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose usage errors are one line on stderr (``PROG: error: ...``) and exit 2.

    argparse prints the whole usage block before the error; a usage error here is one line that names the
    flag and what was expected, with a pointer to ``--help``.
    """

    def error(self, message: str):  # type: ignore[override]
        text = " ".join(message.split())
        self.exit(2, f"{self.prog}: error: {text} (see {self.prog} --help)\n")
