"""Start a Python child with SIGINT at its default or ignored, whatever this process inherited.

POSIX keeps an ignored signal ignored across ``fork`` and ``exec``, and Python then leaves SIGINT ignored
instead of installing its ``KeyboardInterrupt`` handler. A test suite started with SIGINT ignored (a
background job of a non-interactive shell, ``nohup`` under some shells, CI runners) therefore hands that to
every child. A test that plays a user pressing Ctrl-C in a terminal must start its child as a terminal would,
with SIGINT at its default; one that checks what an ignored SIGINT does starts it ignored. A shell cannot do
this (a non-interactive shell may not reset a signal ignored at its start), so a tiny Python trampoline sets
the disposition and ``exec``s the real command in the same process (same pid, same session).

>>> argv = python_argv("-m", "dz_gym.server", sigint="default")
>>> argv[1] == "-c" and argv[3:] == ["SIG_DFL", "-m", "dz_gym.server"]
True
"""

from __future__ import annotations

import os
import stat
import sys
from pathlib import Path

DISPOSITIONS = {"default": "SIG_DFL", "ignore": "SIG_IGN"}
_TRAMPOLINE = (
    "import os, signal, sys; signal.signal(signal.SIGINT, getattr(signal, sys.argv[1])); "
    "os.execv(sys.executable, [sys.executable, *sys.argv[2:]])"
)


def _disposition(sigint: str) -> str:
    if sigint not in DISPOSITIONS:
        raise ValueError(f"sigint: expected one of {sorted(DISPOSITIONS)}, got {sigint!r}")
    return DISPOSITIONS[sigint]


def python_argv(*args: str, sigint: str = "default", python: str | None = None) -> list[str]:
    """The argv that runs ``python *args`` with SIGINT at ``sigint`` (``"default"`` or ``"ignore"``)."""
    return [python or sys.executable, "-c", _TRAMPOLINE, _disposition(sigint), *args]


def python_executable(directory: str | os.PathLike, sigint: str = "default", python: str | None = None) -> str:
    """An executable file in ``directory`` that behaves as ``python`` with SIGINT at ``sigint``: for the
    launchers that take an interpreter path (``start_server_process(python=...)``)."""
    interpreter = python or sys.executable
    path = Path(directory) / f"python-sigint-{sigint}"
    path.write_text(
        f"#!{interpreter}\n"
        "import os, signal, sys\n"
        f"signal.signal(signal.SIGINT, signal.{_disposition(sigint)})\n"
        "os.execv(sys.executable, [sys.executable, *sys.argv[1:]])\n"
    )
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return str(path)
