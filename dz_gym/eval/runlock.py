"""The run directory's writer lock: one process at a time writes a run directory (a run, or a resume of it).

Two ``dz-gym-eval --resume`` of one interrupted run at once would both find the same episodes missing, run
them twice and append both rows. :class:`RunLock` prevents that with an exclusive ``fcntl.flock`` on the file
``RUN_DIR/.lock``. The kernel releases a ``flock`` when its holder exits, also on a crash or ``kill -9``, so a
lock is never stale while the file system is local; the file itself stays and says who held it last
(pid, host, start time) for the refusal's message. On a network file system where locks outlive a lost
client, the message says how to break it (delete the file once no process of that run is alive).

A process that runs part of a run for its parent (a per-scene child, ``--only-scene``) holds no lock of its
own: the parent hands its locked file descriptor down (:meth:`RunLock.child_env`, ``pass_fds``) and the
child adopts it (:meth:`RunLock.acquire` sees :data:`INHERIT_ENV`), checking that it is the same locked file;
the child never unlocks it.

Another process that tries to lock the same directory gets :class:`RunLocked`, whose one line names the
holder and how to break a stale lock; in the same process a second acquire is the same lock, counted:

>>> import tempfile
>>> with tempfile.TemporaryDirectory() as d:
...     first = RunLock.acquire(d)
...     again = RunLock.acquire(d)
...     again is first, sorted(json.loads((Path(d) / LOCK_FILE).read_text()))
...     again.release(); first.release(); first.fd
(True, ['host', 'pid', 'started_at'])
-1
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import time
from pathlib import Path

__all__ = ["INHERIT_ENV", "LOCK_FILE", "RunLock", "RunLocked"]

LOCK_FILE = ".lock"
INHERIT_ENV = "DZ_GYM_RUN_LOCK_FD"  # "FD:PATH" of a lock a parent process holds for this run directory


class RunLocked(RuntimeError):
    """Another process holds the run directory's lock (one line naming it)."""


def _holder(path: Path) -> str:
    try:
        info = json.loads(path.read_text(encoding="utf-8") or "{}")
    except (OSError, ValueError):
        return "an unknown process"
    if not isinstance(info, dict):
        return "an unknown process"
    return f"pid {info.get('pid', '?')} on {info.get('host', '?')}, started {info.get('started_at', '?')}"


class RunLock:
    """An exclusive lock on one run directory (see the module docstring)."""

    _held: dict[str, RunLock] = {}  # this process's locks by path: acquiring one again counts up

    def __init__(self, path: Path, fd: int, inherited: bool):
        self.path, self.fd, self.inherited = path, fd, inherited
        self.count = 1

    @classmethod
    def acquire(cls, run_dir: str | os.PathLike) -> RunLock:
        """Lock ``run_dir`` (or adopt the parent's lock); :class:`RunLocked` when another process holds it.
        Acquired again in the same process it is the same lock, released by as many :meth:`release` calls."""
        path = Path(run_dir) / LOCK_FILE
        held = cls._held.get(os.path.realpath(path))
        if held is not None and held.fd >= 0:
            held.count += 1
            return held
        lock = cls._inherited(path) or cls._lock(path, run_dir)
        cls._held[os.path.realpath(path)] = lock
        return lock

    @classmethod
    def _lock(cls, path: Path, run_dir: str | os.PathLike) -> RunLock:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise RunLocked(
                f"resume: {run_dir} is being written by another dz-gym-eval ({_holder(path)}); wait for it to end, "
                f"or, if no such process is alive (a lock left on a network file system), delete {path}"
            ) from None
        except OSError:
            os.close(fd)
            raise
        stamp = {"pid": os.getpid(), "host": socket.gethostname(),
                 "started_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}  # fmt: skip
        os.ftruncate(fd, 0)
        os.pwrite(fd, (json.dumps(stamp) + "\n").encode(), 0)
        return cls(path, fd, inherited=False)

    @classmethod
    def _inherited(cls, path: Path) -> RunLock | None:
        """The parent's lock on ``path``, when :data:`INHERIT_ENV` hands down a descriptor of that file."""
        value = os.environ.get(INHERIT_ENV, "")
        fd_text, _, locked_path = value.partition(":")
        if not fd_text.isdigit() or not locked_path:
            return None
        fd = int(fd_text)
        try:
            held, here = os.fstat(fd), os.stat(path)
            same = os.path.samefile(locked_path, path) and (held.st_dev, held.st_ino) == (here.st_dev, here.st_ino)
        except OSError:
            return None
        if not same:
            return None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # the parent's open file: already ours
        except OSError:
            return None
        return cls(path, fd, inherited=True)

    def child_env(self) -> dict[str, str]:
        """The environment entry that lets a child process adopt this lock (give it ``pass_fds=[lock.fd]``)."""
        return {INHERIT_ENV: f"{self.fd}:{self.path}"}

    def release(self) -> None:
        """Unlock once every acquire of this process was released (a lock adopted from the parent stays the
        parent's); calls beyond that do nothing."""
        if self.fd < 0:
            return
        self.count -= 1
        if self.count > 0:
            return
        fd, self.fd = self.fd, -1
        self._held.pop(os.path.realpath(self.path), None)
        if not self.inherited:
            fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)

    def __enter__(self) -> RunLock:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()
