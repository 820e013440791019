"""Start the reference server from Python: in a background thread, or as a subprocess.

- :func:`start_server_thread` runs a :class:`~dz_gym.server.app.PolicyServer` on its own event loop in a
  daemon thread of this process (tests, the evaluator's embedded server over real loopback). The returned
  handle has ``url``, ``port``, ``server``, ``stats()`` and ``stop()``.
- :func:`start_server_process` runs ``python -m dz_gym.server ARGS`` and waits (bounded) for its ready line;
  the handle has ``url``, ``port``, ``pid``, ``output`` and ``stop()`` (SIGTERM, then kill after a bound).
  The server dies with this process whatever ends it (``kill -9``, an interpreter that exits with the handle
  unclosed): it gets ``--parent-pid`` and a stdin pipe whose write end only the handle holds
  (:mod:`dz_gym.lifeline`).

Both handles are context managers that stop the server on exit.
"""

from __future__ import annotations

import asyncio
import os
import queue
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any

from dz_gym.server.app import PolicyServer, ServerConfig
from dz_gym.server.engine import EngineStats
from dz_gym.server.policies import load_policy

__all__ = ["ServerProcess", "ServerThread", "start_server_process", "start_server_thread"]

READY_PATTERN = re.compile(r"^dz-gym-serve ready on (ws://\S+) ")


class ServerThread:
    """A reference server on its own event loop in a daemon thread."""

    def __init__(self, server: PolicyServer, start_timeout: float = 30.0):
        self.server = server
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="dz-gym-serve-loop", daemon=True)
        self._thread.start()
        self._stopped = False
        try:
            asyncio.run_coroutine_threadsafe(server.start(), self._loop).result(start_timeout)
        except BaseException:
            self._shutdown_loop()
            raise
        self.url: str = server.url
        self.port: int = server.port  # type: ignore[assignment]

    def stats(self) -> EngineStats:
        """Requests, failures and busy time so far (utilization = busy / (wall * workers))."""
        return self.server.stats()

    def stop(self, timeout: float = 10.0) -> EngineStats:
        """Close every connection, stop the workers and the loop; returns the final stats."""
        if not self._stopped:
            self._stopped = True
            try:
                asyncio.run_coroutine_threadsafe(self.server.stop(timeout), self._loop).result(timeout + 5)
            finally:
                self._shutdown_loop()
        return self.server.stats()

    def _shutdown_loop(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        if not self._thread.is_alive():
            self._loop.close()

    def __enter__(self) -> ServerThread:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()


def start_server_thread(
    policy: Any = "hold",
    *,
    policy_args: Mapping[str, Any] | None = None,
    config: ServerConfig | None = None,
    start_timeout: float = 30.0,
    **config_fields: Any,
) -> ServerThread:
    """Start a reference server in this process; ``policy`` is a name/``module:factory`` or a policy object.

    ``config_fields`` are :class:`ServerConfig` fields (``flavor="dreamzero"``, ``latency_ms=50``, ...); the
    default binds 127.0.0.1 on a free port.
    """
    if config is None:
        config = ServerConfig(**config_fields)
    elif config_fields:
        raise ValueError("pass either config or config fields, not both")
    name = policy if isinstance(policy, str) else type(policy).__name__
    instance = load_policy(policy, policy_args) if isinstance(policy, str) else policy
    return ServerThread(PolicyServer(instance, config, policy_name=name), start_timeout)


class ServerProcess:
    """A ``dz-gym-serve`` subprocess; ``output`` collects its stdout lines (ready line, shutdown summary)."""

    def __init__(self, proc: subprocess.Popen, url: str, lines: queue.Queue, reader: threading.Thread, log: Any = None):
        self.proc = proc
        self._log = log
        self._final_log = ""
        self.pid = proc.pid
        self.url = url
        self.port = int(url.rsplit(":", 1)[1].split("/")[0])
        self.output: list[str] = []
        self._lines = lines
        self._reader = reader

    def _drain(self) -> None:
        while True:
            try:
                line = self._lines.get_nowait()
            except queue.Empty:
                return
            if line is not None:
                self.output.append(line)

    def poll(self) -> int | None:
        return self.proc.poll()

    def stop(self, timeout: float = 10.0) -> int:
        """SIGTERM, wait up to ``timeout``, then SIGKILL; returns the exit code."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self._reader.join(5)
        self._drain()
        if self.proc.stdout is not None and not self._reader.is_alive():
            self.proc.stdout.close()
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        if self._log is not None:
            self._final_log = self.log_text()
            self._log.close()
            self._log = None
        return self.proc.returncode

    def log_text(self) -> str:
        """The server's stderr (per-request log), when it was captured (the default); kept after stop."""
        if self._log is None:
            return self._final_log
        self._log.flush()
        self._log.seek(0)
        return self._log.read()

    def summary(self) -> dict[str, str]:
        """The ``key=value`` fields of the shutdown line (``requests``, ``busy_s``, ``utilization``, ...)."""
        self._drain()
        for line in reversed(self.output):
            if line.startswith("dz-gym-serve stopped"):
                return dict(token.split("=", 1) for token in line.split() if "=" in token)
        return {}

    def __enter__(self) -> ServerProcess:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()


def _read_lines(stream: Any, lines: queue.Queue) -> None:
    try:
        for line in stream:
            lines.put(line.rstrip("\n"))
    finally:
        lines.put(None)


def start_server_process(
    args: Sequence[str] = (),
    *,
    timeout: float = 60.0,
    env: Mapping[str, str] | None = None,
    stderr: Any = "capture",
    python: str | None = None,
    new_session: bool = False,
    die_with_parent: bool = True,
) -> ServerProcess:
    """Run ``python -m dz_gym.server *args`` (``--port 0`` unless given) and wait for its ready line.

    ``stderr`` (the per-request log) goes to a temporary file by default (``log_text()`` reads it); pass a
    file, ``subprocess.DEVNULL`` or ``None`` (inherit) instead. Raises RuntimeError with the process's last
    output if it exits or stays silent for ``timeout`` seconds. ``new_session`` starts the server in a session
    of its own, so a Ctrl-C in the caller's terminal reaches only the caller (which then stops the server).
    ``die_with_parent`` (the default): the server stops when this process is gone, however it ends (see the
    module docstring), so it lives no longer than this process.
    """
    argv = list(args)
    if "--port" not in argv and not any(a.startswith("--port=") for a in argv):
        argv += ["--port", "0"]
    if die_with_parent:
        argv += ["--parent-pid", str(os.getpid())]
    full_env = dict(os.environ if env is None else env)
    full_env.setdefault("PYTHONUNBUFFERED", "1")
    # Make this very dz_gym importable in the child even when it is not installed (a source checkout).
    package_root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    full_env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, full_env.get("PYTHONPATH", "")) if p)
    log = tempfile.TemporaryFile("w+", encoding="utf-8", errors="replace") if stderr == "capture" else None
    proc = subprocess.Popen(
        [python or sys.executable, "-m", "dz_gym.server", *argv],
        stdin=subprocess.PIPE if die_with_parent else subprocess.DEVNULL,  # the pipe: never written, held open
        stdout=subprocess.PIPE,
        stderr=log if log is not None else stderr,
        text=True,
        env=full_env,
        start_new_session=new_session,
    )
    lines: queue.Queue = queue.Queue()
    reader = threading.Thread(target=_read_lines, args=(proc.stdout, lines), name="dz-gym-serve-stdout", daemon=True)
    reader.start()
    seen: list[str] = []
    deadline = time.monotonic() + timeout

    def failure(why: str) -> RuntimeError:
        reader.join(5)
        if proc.stdout is not None and not reader.is_alive():
            proc.stdout.close()
        if proc.stdin is not None:
            proc.stdin.close()
        err = ""
        if log is not None:
            log.seek(0)
            err = " | ".join(log.read().strip().splitlines()[-3:])
            log.close()
        return RuntimeError(f"dz-gym-serve {why}; stdout: {seen[-3:]}; stderr: {err or '(not captured)'}")

    try:
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                proc.kill()
                proc.wait(5)
                raise failure(f"printed no ready line within {timeout:.0f} s")
            try:
                line = lines.get(timeout=min(remaining, 0.5))
            except queue.Empty:
                continue
            if line is None:
                proc.wait(5)
                raise failure(f"exited with {proc.returncode} before it was ready")
            seen.append(line)
            match = READY_PATTERN.match(line)
            if match:
                handle = ServerProcess(proc, match.group(1), lines, reader, log)
                handle.output.extend(seen)
                return handle
    except BaseException:  # e.g. KeyboardInterrupt while waiting: never leave the server running behind
        if proc.poll() is None:
            proc.kill()
            proc.wait(5)
        raise
