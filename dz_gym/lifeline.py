"""A child process that dies with the process that started it, whatever ends that process.

dz-gym starts long-lived children: ``dz-gym-serve`` for the evaluator's embedded servers and the wrapper's
``policy=`` (:func:`~dz_gym.server.launch.start_server_process`), and a ``dz-gym-eval`` process per scene
(:mod:`dz_gym.eval.processes`), each in a session of its own so that a Ctrl-C reaches only the parent. The
parent stops them on the way out, but a ``kill -9`` of the parent or of its process group, or an interpreter
that exits with a server's handle unclosed, never gets there, and the child would run on (a server forever).
Two signals of the parent's end:

- **a pipe**: the parent starts the child with its stdin a pipe whose write end it keeps and never writes. The
  kernel closes that end when the parent exits, however it exits, and the child, reading stdin on a thread of
  its own, sees EOF. This works on every platform, whichever thread started the child.
- **a parent-death signal** (Linux; for servers): ``prctl(PR_SET_PDEATHSIG)``, so the kernel signals the child
  when its parent goes, also where a process the parent forked (without exec) still holds the pipe's write
  end. The kernel sends it when the parent *thread* that started the child ends, not only the process; the
  child therefore takes a signal of its own (``SIGUSR1``) and, on it, looks at ``getppid()``: the parent
  process is gone only when that is no longer the parent's pid. The signal is set only when the child's parent
  is that pid at start (not, say, an interpreter shim that forked it); the pipe covers the rest.

On either, the child stops as on SIGTERM (its own clean stop: a server closes its connections, an evaluator
keeps its rows); if it is still running :data:`GRACE_S` seconds later (SIGTERM ignored, a stop that hangs), it
exits at once.
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

GRACE_S = 30.0  # the longest a child whose parent is gone takes to stop before it exits at once
PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
PARENT_SIGNAL = signal.SIGUSR1 if hasattr(signal, "SIGUSR1") else None

_stopping = threading.Lock()


def _parent_gone(name: str, why: str) -> None:
    """Stop as on SIGTERM, and exit at once if still here after :data:`GRACE_S` (once, from any thread)."""
    if not _stopping.acquire(blocking=False):
        return
    print(f"{name}: {why}: stopping", file=sys.stderr, flush=True)

    def last_resort() -> None:
        time.sleep(GRACE_S)
        os._exit(1)

    threading.Thread(target=last_resort, name="lifeline-last-resort", daemon=True).start()
    os.kill(os.getpid(), signal.SIGTERM)


def _watch_stdin(name: str) -> None:
    """Read stdin until EOF (the parent's end of the pipe closed), then stop."""
    try:
        while os.read(0, 65536):
            pass
    except OSError:
        pass
    _parent_gone(name, "the process that started this one is gone (EOF on stdin)")


def set_parent_death_signal(signum: int) -> bool:
    """``prctl(PR_SET_PDEATHSIG, signum)`` for this process (Linux); whether it was set."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        return libc.prctl(PR_SET_PDEATHSIG, int(signum), 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def hold_to_parent(parent_pid: int, name: str, *, death_signal: bool = True) -> None:
    """Stop this process when process ``parent_pid``, the one that started it, is gone (see the module
    docstring): watch stdin for EOF and, with ``death_signal`` where the parent is ``parent_pid``, set the
    parent-death signal (it takes ``SIGUSR1``: leave it off in a process whose libraries may claim that
    signal). ``name`` starts the line said on stderr. Call it from the main thread, before anything slow
    (loading a policy), so that a parent that dies early is seen."""
    threading.Thread(target=_watch_stdin, args=(name,), name="lifeline-parent-pipe", daemon=True).start()
    if not death_signal or PARENT_SIGNAL is None or os.getppid() != parent_pid:
        return
    why = f"the process that started this one (pid {parent_pid}) is gone"

    def on_signal(signum: int, frame: object) -> None:
        if os.getppid() != parent_pid:  # not a thread of the parent that ended: the parent itself
            _parent_gone(name, why)

    signal.signal(PARENT_SIGNAL, on_signal)
    if set_parent_death_signal(PARENT_SIGNAL) and os.getppid() != parent_pid:  # gone before the signal was set
        _parent_gone(name, why)
