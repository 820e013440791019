"""Worker processes: the cores there are for them (:func:`usable_cores`), and starting ``spawn``-context workers
(:func:`start_worker`) with everything a start does to this process in one place, undone before it returns.

A ``spawn`` child of :mod:`multiprocessing` first imports the parent's ``__main__`` module (as
``__mp_main__``), so that objects defined there can be unpickled. For dz-gym's workers (the transport's,
:mod:`dz_gym.transport.workers.handle`, and the embedded simulator's, :mod:`dz_gym.envs.mujoco.worker`) that
import is all cost and some danger: their targets and arguments live in dz-gym, but the caller's script runs
again in every worker, down to its ``if __name__ == "__main__":`` guard. An Isaac Lab script launches its app
at the top of the file, a training script imports torch and builds its models there, and a script without
the guard starts the evaluation again and dies in the child ("An attempt has been made to start a new
process before the current process has finished its bootstrapping phase").

:func:`start_worker` starts a process with a stand-in ``__main__`` (no file, no module name) in place for the
moment of ``start()``: the child then imports nothing of the caller's. Everything the child needs must be
importable from dz-gym or the arguments (that is already so for both pools). For the same moment the
variables the worker needs are set in this process's environment (a spawned child inherits it at its start)
and ``SIGINT`` is blocked (the mask survives fork and exec: a Ctrl-C in the terminal reaches the whole process
group, and a worker still importing its site packages would die of it with a traceback; the workers ignore it
once they run, and this process gets its own when the mask is restored). The swaps are process-wide for the
few milliseconds of the start; starts are serialized by a lock. The start method is a context's
(``multiprocessing.get_context("spawn")``): the process's default start method is never set.
:mod:`dz_gym.host_process` lists what else dz-gym may do to the process it runs in.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import types
from collections.abc import Mapping
from typing import Any

__all__ = ["start_worker", "usable_cores"]

_lock = threading.Lock()


def usable_cores() -> int:
    """The cores this process may run on (its affinity mask where the platform has one), at least 1."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # not Linux
        return max(1, os.cpu_count() or 1)


def start_worker(process: Any, environ: Mapping[str, str] | None = None) -> None:
    """``process.start()`` (a ``spawn``-context :class:`multiprocessing.Process`) with the caller's
    ``__main__`` hidden from it, so the child does not import the caller's script, ``environ`` in this
    process's environment for the child to inherit, and ``SIGINT`` blocked; all put back before it returns."""
    environ = dict(environ or {})
    with _lock:
        main = sys.modules.get("__main__")
        saved = {key: os.environ.get(key) for key in environ}
        os.environ.update(environ)
        sys.modules["__main__"] = types.ModuleType("__main__", "a stand-in while a dz-gym worker starts")
        masked = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT}) if _CAN_MASK else None
        try:
            process.start()
        finally:
            if masked is not None:
                signal.pthread_sigmask(signal.SIG_SETMASK, masked)
            if main is None:
                sys.modules.pop("__main__", None)
            else:
                sys.modules["__main__"] = main
            for key, value in saved.items():
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value


_CAN_MASK = hasattr(signal, "pthread_sigmask")
