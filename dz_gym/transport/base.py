"""What the two pools share: :class:`PoolBase`, a :class:`~dz_gym.policy_client.PolicyClient` with a
:class:`~dz_gym.transport.config.TransportConfig` and a ``weakref.finalize`` close path.

:class:`~dz_gym.transport.SessionPool` (sessions on a loop thread of this process) and
:class:`~dz_gym.transport.ProcessSessionPool` (sessions in worker processes) differ in where the sessions
live; their config, their reply bound, ``closed``, ``len`` and the context-manager protocol are the same, and
live here once. A subclass sets ``self._config`` and ``self._finalizer`` (which closes it) and defines
``num_sessions`` and ``close``.
"""

from __future__ import annotations

from typing import Any

from dz_gym.policy_client import PolicyClient
from dz_gym.transport.config import TransportConfig

__all__ = ["REPLY_MARGIN_S", "PoolBase"]

REPLY_MARGIN_S = 10.0
"""What :attr:`PoolBase.reply_bound` adds to the bound of one request (the wrapper's guard on a lost future)."""


class PoolBase(PolicyClient):
    """Config, reply bound, ``closed``, ``len`` and ``with`` of a pool (see the module docstring)."""

    _config: TransportConfig
    _finalizer: Any  # weakref.finalize

    @property
    def config(self) -> TransportConfig:
        return self._config

    @property
    def reply_bound(self) -> float:
        """The bound of one submitted request (``config.request_bound()``), with a margin."""
        return self._config.request_bound() + REPLY_MARGIN_S

    @property
    def closed(self) -> bool:
        return not self._finalizer.alive

    def __len__(self) -> int:
        return self.num_sessions

    def __enter__(self):
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
