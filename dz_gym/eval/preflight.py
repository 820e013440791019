"""Checks made before a run directory exists: the outputs can be written, the simulator backend is
importable, every server answers; and for every command, that an output file can be written
(:func:`check_output_file`).

A failed check is one line for the user and leaves nothing behind. The output check
(:func:`check_writable`) finds the nearest folder of the path that exists and creates an unnamed temporary
file in it, so that a path under a file, a read-only mount or a folder without write permission (also for
root, whom permission bits do not stop) is refused before any server or simulator starts. The server check is the metadata
handshake (the readiness probe the protocol recommends: ``/health`` may say 200 while a server cannot serve),
with the run's own :class:`~dz_gym.transport.TransportConfig`, so its connect retries and bounds apply.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Sequence
from pathlib import Path

from dz_gym.envs import backends
from dz_gym.errors import DzGymError, first_line
from dz_gym.transport import PartialConnectError, SessionPool, TransportConfig


def check_writable(path: str | os.PathLike, what: str) -> str | None:
    """``None`` when ``path`` (a folder, created if missing) can be written, else why not (one line starting
    with ``what``, the flag that names it)."""
    target = Path(path)
    existing = target
    while not os.path.lexists(existing) and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        if existing == target:
            return f"{what}: {path} is not a directory"
        return f"{what}: cannot create {path}: {existing} is not a directory"
    try:
        with tempfile.TemporaryFile(dir=existing):
            pass
    except OSError as exc:
        return f"{what}: cannot write in {existing} ({exc.strerror or type(exc).__name__})"
    return None


def check_output_file(path: str | os.PathLike | None, what: str) -> str | None:
    """``None`` when a file can be written at ``path`` (no path and ``-``, stdout, too), else why not (one line
    starting with ``what``, the flag that names it): its folder must exist and take a new file, and an
    existing file must open for writing. Nothing is written: a command checks its output files this way before
    its work, instead of failing after it."""
    if path is None or str(path) == "-":
        return None
    target = Path(path)
    if target.is_dir():
        return f"{what}: {path} is a directory, expected a file"
    folder = target.parent
    if not folder.is_dir():
        why = "is not a directory" if os.path.lexists(folder) else "does not exist"
        return f"{what}: cannot write {path}: {folder} {why}"
    if target.exists():
        try:
            with open(target, "ab"):
                pass
        except OSError as exc:
            return f"{what}: cannot write {path} ({exc.strerror or type(exc).__name__})"
        return None
    return check_writable(folder, f"{what} {path}")


def check_backend(backend: str) -> str | None:
    """``None`` when ``backend``'s package can be imported, else why not (one line)."""
    try:
        traits = backends.traits(backend)
    except ValueError:
        return f"--backend: unknown backend {backend!r}"
    return None if traits.available() else f"--backend {backend}: {traits.missing}"


def check_servers(servers: Sequence[str], transport: TransportConfig, metadata: list | None = None) -> str | None:
    """``None`` when every server completes the handshake, else the first failure (one line); each server's
    :class:`~dz_gym.protocol.ServerMetadata` is appended to ``metadata`` when given."""
    if not servers:
        return None
    pool = SessionPool(list(servers), num_sessions=len(servers), config=transport)
    try:
        found = pool.connect()
        if metadata is not None:
            metadata.extend(found)
    except PartialConnectError as exc:
        first = min(exc.errors)
        text = first_line(exc.errors[first])
        return f"--server: {text}" if servers[first] in text else f"--server {servers[first]}: {text}"
    except DzGymError as exc:
        return f"--server: {first_line(exc)}"
    finally:
        pool.close()
    return None
