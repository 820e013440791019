"""A server that dies with the process that started it, whatever ends that process.

A launcher (:func:`~dz_gym.server.launch.start_server_process`: the evaluator's embedded servers, the wrapper's
``policy=``) stops its server on the way out, but a ``kill -9`` of the launcher or of its process group, or an
interpreter that exits with the server's handle unclosed, never gets there, and the server (in a session of its
own, so that a Ctrl-C reaches only the launcher) would run on forever. Two signals of the launcher's end:

- **a pipe**: the launcher starts the server with its stdin a pipe whose write end it keeps and never writes.
  The kernel closes that end when the launcher exits, however it exits, and the server, reading stdin on a
  thread of its own, sees EOF. This works on every platform, whichever thread started the server.
- **a parent-death signal** (Linux): ``prctl(PR_SET_PDEATHSIG)``, so the kernel signals the server when its
  parent goes, also where a child the launcher forked (without exec) still holds the pipe's write end. The
  kernel sends it when the parent *thread* that started the server ends, not only the process; the server
  therefore takes a signal of its own (``SIGUSR1``) and, on it, looks at ``getppid()``: the parent process is
  gone only when that is no longer the launcher's pid. The signal is set only when the server's parent is the
  launcher at start (not, say, an interpreter shim that forked it); the pipe covers the rest.

On either, the server stops as on SIGTERM (its clean shutdown); if it is still running :data:`GRACE_S` seconds
later (SIGTERM ignored, a stop that hangs), it exits at once.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import signal
import sys
import threading
import time

__all__ = ["GRACE_S", "hold_to_parent", "set_parent_death_signal"]

GRACE_S = 30.0  # the longest a server whose launcher is gone takes to stop before it exits at once
PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
PARENT_SIGNAL = signal.SIGUSR1 if hasattr(signal, "SIGUSR1") else None

_stopping = threading.Lock()


def _parent_gone(why: str) -> None:
    """Stop as on SIGTERM, and exit at once if still here after :data:`GRACE_S` (once, from any thread)."""
    if not _stopping.acquire(blocking=False):
        return
    print(f"dz-gym-serve: {why}: stopping", file=sys.stderr, flush=True)

    def last_resort() -> None:
        time.sleep(GRACE_S)
        os._exit(1)

    threading.Thread(target=last_resort, name="dz-gym-serve-last-resort", daemon=True).start()
    os.kill(os.getpid(), signal.SIGTERM)


def _watch_stdin() -> None:
    """Read stdin until EOF (the launcher's end of the pipe closed), then stop."""
    try:
        while os.read(0, 65536):
            pass
    except OSError:
        pass
    _parent_gone("the process that started this server is gone (EOF on stdin)")


def set_parent_death_signal(signum: int) -> bool:
    """``prctl(PR_SET_PDEATHSIG, signum)`` for this process (Linux); whether it was set."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        return libc.prctl(PR_SET_PDEATHSIG, int(signum), 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def hold_to_parent(parent_pid: int) -> None:
    """Stop this server when process ``parent_pid``, the one that started it, is gone (see the module
    docstring): watch stdin for EOF, and where the parent is ``parent_pid`` set the parent-death signal. Call it
    from the main thread, before anything slow (loading the policy), so that a launcher that dies early is seen."""
    threading.Thread(target=_watch_stdin, name="dz-gym-serve-parent-pipe", daemon=True).start()
    if PARENT_SIGNAL is None or os.getppid() != parent_pid:
        return

    def on_signal(signum: int, frame: object) -> None:
        if os.getppid() != parent_pid:  # not a thread of the parent that ended: the parent itself
            _parent_gone(f"the process that started this server (pid {parent_pid}) is gone")

    signal.signal(PARENT_SIGNAL, on_signal)
    if set_parent_death_signal(PARENT_SIGNAL) and os.getppid() != parent_pid:  # gone before the signal was set
        _parent_gone(f"the process that started this server (pid {parent_pid}) is gone")
