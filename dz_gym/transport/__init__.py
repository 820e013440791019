"""Client transport: one websocket per policy session, driven by a background asyncio loop.

This is the I/O edge of dz-gym, in layers (each usable on its own, each importing only the ones above it):

- :mod:`~dz_gym.transport.rules` -- pure rules, no I/O: the session state machine, what a close code
  means, which failures are retried, the backoff schedule, when a request may be re-sent;
- :mod:`~dz_gym.transport.config` -- :class:`TransportConfig` (every bound and default) and :func:`validate_url`;
- :mod:`~dz_gym.transport.session` -- :class:`AsyncSession`, one connection for asyncio code;
- :mod:`~dz_gym.transport.loop` -- :class:`LoopThread`, a private event loop for synchronous callers;
- :mod:`~dz_gym.transport.base` -- :class:`~dz_gym.transport.base.PoolBase`, what the two pools below share;
- :mod:`~dz_gym.transport.pool` -- :class:`SessionPool`, the synchronous facade: the wrapper's default
  :class:`~dz_gym.policy_client.PolicyClient`;
- :mod:`~dz_gym.transport.workers` -- :class:`ProcessSessionPool`, the same facade with the sessions spread
  over worker processes (its own subpackage: the pool, each worker's handle in this process, the worker
  itself, what they say to each other, the shared memory the requests are handed over in);
  :func:`open_pool` picks one of the two by ``TransportConfig.processes`` (None, the default: by the sessions
  and the cores, :func:`~dz_gym.transport.config.auto_processes`).

Every request comes back as a :class:`~dz_gym.policy_client.Outcome` (re-exported here).

What the bytes mean is left to :mod:`dz_gym.protocol`; this package only calls it.
"""

from __future__ import annotations

from dz_gym.host_process import HostProcessSettings
from dz_gym.policy_client import Outcome
from dz_gym.transport.config import TransportConfig, check_pool_args, validate_url
from dz_gym.transport.loop import LoopThread
from dz_gym.transport.pool import PartialConnectError, SessionPool
from dz_gym.transport.rules import SessionState
from dz_gym.transport.session import AsyncSession
from dz_gym.transport.workers import ProcessSessionPool

__all__ = [
    "AsyncSession",
    "LoopThread",
    "Outcome",
    "PartialConnectError",
    "ProcessSessionPool",
    "SessionPool",
    "SessionState",
    "TransportConfig",
    "open_pool",
    "validate_url",
]


def open_pool(
    urls: list[str] | str,
    num_sessions: int,
    config: TransportConfig | None = None,
    *,
    host: HostProcessSettings | None = None,
    pools: int = 1,
) -> SessionPool | ProcessSessionPool:
    """The pool of ``num_sessions`` sessions over ``urls`` that ``config`` asks for
    (:meth:`TransportConfig.process_count`, ``pools`` pools of this process sharing its cores): a
    :class:`SessionPool` in this process (0) or a :class:`ProcessSessionPool` of that many worker processes,
    its memory set up as ``host`` says (:mod:`dz_gym.host_process`; None: nothing done to this process)."""
    urls, config = check_pool_args(urls, num_sessions, config)
    processes = config.process_count(num_sessions, pools=pools)
    if processes > 0:
        return ProcessSessionPool(urls, num_sessions, config, processes=processes, host=host)
    return SessionPool(urls, num_sessions, config)
