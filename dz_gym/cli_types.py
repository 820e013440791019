"""argparse value types shared by the command-line tools: numbers with a one-line error naming the bound."""

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
