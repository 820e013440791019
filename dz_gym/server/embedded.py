"""An embedded reference server for library users: started with the env, stopped with it.

:func:`embedded_server` is a context manager (and :class:`EmbeddedServer` an object with ``start``/``stop``)
that serves a policy on 127.0.0.1 with ``dz-gym-serve`` and gives its websocket URL, the one thing
:class:`~dz_gym.wrapper.DreamZeroPolicyWrapper` needs; the wrapper's ``policy=`` argument starts one itself and
stops it on ``close()``. ``policy`` is what ``dz-gym-serve --policy`` takes: ``"reference"`` (the embedded
scenes' classical pick and place), ``"hold"`` (hold the current pose; any scene, any backend), ``NAME:k=v,...``
or your own ``module:factory``.

By default the server runs in a process of its own (``python -m dz_gym.server``, like ``dz-gym-eval``'s
embedded server), so its policy does not compete with the simulator for this process's interpreter lock;
``in_process=True`` runs it on an event loop thread here instead (quicker to start, for light policies and
for policy objects). Starting waits (bounded by ``timeout``) for the server to listen; a server that fails to
start is a one-line ``RuntimeError`` with its last output.

Example::

    import gymnasium as gym
    import dz_gym

    with dz_gym.embedded_server("reference") as server:
        env = dz_gym.DreamZeroPolicyWrapper(gym.make_vec("dz_gym/DROID-CubeInBowl-v0", num_envs=8), server=server.url)
        ...
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from dz_gym.server.launch import ServerProcess, ServerThread, start_server_process, start_server_thread

__all__ = ["OPENPI_PATH", "EmbeddedServer", "embedded_server"]

OPENPI_PATH = "/v1/realtime/robot/openpi"  # vLLM-Omni's path; the reference server serves any path


class EmbeddedServer:
    """A reference server serving ``policy`` on loopback (see the module docstring); ``url`` once started.

    ``flavor``: which real server it behaves like (``vllm-omni``, the default, ``dreamzero`` or ``openpi``);
    ``serve_args``: more ``dz-gym-serve`` flags (``["--latency-ms", "200"]``), for a server in its own process.
    """

    def __init__(
        self,
        policy: Any = "reference",
        *,
        flavor: str = "vllm-omni",
        serve_args: Sequence[str] = (),
        in_process: bool = False,
        timeout: float = 60.0,
    ):
        if isinstance(policy, str):
            if not policy:
                raise ValueError("policy: expected a policy name or module:factory, got ''")
        elif not in_process:
            raise ValueError(
                f"policy: a server in its own process takes a policy name or module:factory, got {type(policy).__name__} "
                "(pass in_process=True to serve a policy object)"
            )
        self.policy, self.flavor, self.in_process = policy, flavor, bool(in_process)
        self.serve_args, self.timeout = list(serve_args), float(timeout)
        self._handle: ServerThread | ServerProcess | None = None
        self.url: str | None = None

    def start(self) -> EmbeddedServer:
        """Start the server (a no-op when it runs); returns self."""
        if self._handle is not None:
            return self
        if self.in_process:
            if self.serve_args:
                raise ValueError("serve_args: only for a server in its own process (in_process=False)")
            handle: ServerThread | ServerProcess = start_server_thread(
                self.policy, flavor=self.flavor, start_timeout=self.timeout
            )
        else:
            argv = ["--policy", self.policy, "--flavor", self.flavor, "--quiet", *self.serve_args]
            handle = start_server_process(argv, timeout=self.timeout, new_session=True)
        self._handle = handle
        self.url = handle.url.rstrip("/") + (OPENPI_PATH if self.flavor == "vllm-omni" else "")
        return self

    @property
    def pid(self) -> int | None:
        """The server's process id (None in this process or when not running); the server dies with this
        process however it ends, also with the server left unstopped (:mod:`dz_gym.lifeline`)."""
        return getattr(self._handle, "pid", None)

    @property
    def running(self) -> bool:
        """Whether the server was started and not stopped yet."""
        return self._handle is not None

    def stop(self) -> None:
        """Stop the server (idempotent; bounded: a process that ignores SIGTERM is killed)."""
        handle, self._handle = self._handle, None
        if handle is not None:
            handle.stop()

    def __enter__(self) -> EmbeddedServer:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()


def embedded_server(policy: Any = "reference", **options: Any) -> EmbeddedServer:
    """An :class:`EmbeddedServer` for a ``with`` block: started on entry, stopped on exit."""
    return EmbeddedServer(policy, **options)
