"""The policy side of :class:`~dz_gym.wrapper.DreamZeroPolicyWrapper`: one interface, injectable.

The wrapper asks a :class:`PolicyClient` for everything it needs from the policy, per env slot ``env_id``:
send an infer request and get a future of its :class:`~dz_gym.transport.Outcome` (a reply or a typed error,
with timing and recovery counts), the server's handshake metadata, the URL it talks to, whether the slot's
connection is healthy, and a bounded reconnect. It is what openpi-client's ``BasePolicy`` is to its
``ActionChunkBroker``, with the batch, the futures and the failure types that a vectorized evaluator needs;
the chunk bookkeeping stays in :mod:`dz_gym.chunks` and the wrapper.

- :class:`WebsocketPolicyClient` (the default) is the websocket :class:`~dz_gym.transport.SessionPool`: one
  connection per env, spread over the servers round-robin.
- :class:`dz_gym.testing.memory_client.MemoryPolicyClient` runs a policy object in this process through the
  protocol's codec, with no sockets (tests, notebooks, a policy that lives in the same process).

A client of your own subclasses :class:`PolicyClient` and implements the abstract methods; ``end_session``
and ``reply_bound`` have defaults.
"""

from __future__ import annotations

import abc
import concurrent.futures
from collections.abc import Sequence

from dz_gym.protocol import ServerMetadata
from dz_gym.protocol.contract import releases_sessions
from dz_gym.transport import Outcome, SessionPool, TransportConfig

__all__ = ["Outcome", "PolicyClient", "WebsocketPolicyClient"]


class PolicyClient(abc.ABC):
    """What the wrapper needs from the policy for ``num_sessions`` env slots (see the module docstring).

    Contract: ``submit`` never raises for a failure of the request itself; the future resolves to an
    :class:`~dz_gym.transport.Outcome` whose ``error`` is a typed :mod:`dz_gym.errors` exception
    (``ServerError``, ``ConnectionLost``, ``RequestTimeout``, ``ProtocolError``). Every future resolves
    within ``reply_bound`` seconds; the wrapper treats one that does not as a timeout of that env.
    """

    @property
    @abc.abstractmethod
    def num_sessions(self) -> int:
        """Number of env slots (the wrapper's ``num_envs``)."""

    @abc.abstractmethod
    def connect(self) -> list[ServerMetadata]:
        """Open every slot's connection; the handshake metadata of each slot, in order.

        Raises a :class:`~dz_gym.errors.DzGymError` when a slot cannot be served.
        """

    @abc.abstractmethod
    def submit(self, env_id: int, request: dict) -> concurrent.futures.Future[Outcome]:
        """Send one infer request of slot ``env_id``; the future resolves to its outcome."""

    @abc.abstractmethod
    def reconnect(self, env_id: int) -> ServerMetadata:
        """Reopen slot ``env_id``'s connection (bounded); its new metadata. Raises a ``DzGymError`` or
        ``OSError`` when that fails."""

    @abc.abstractmethod
    def is_connected(self, env_id: int) -> bool:
        """Whether slot ``env_id``'s connection is open and usable."""

    @abc.abstractmethod
    def url(self, env_id: int) -> str:
        """The server slot ``env_id`` talks to."""

    @abc.abstractmethod
    def metadata(self, env_id: int) -> ServerMetadata | None:
        """The metadata of slot ``env_id``'s last handshake (None before the first)."""

    @abc.abstractmethod
    def close(self) -> None:
        """Close every connection; idempotent."""

    def end_session(self, env_id: int, session_id: str) -> None:  # noqa: B027 (an optional hook)
        """Slot ``env_id``'s episode with ``session_id`` ended (a fresh session id follows).

        Nothing goes over the wire by default: a ``reset`` on a shared connection would lose every session of
        that connection on vLLM-Omni and the global one on DreamZero's server, and rotating the session id
        already starts a new episode on both. A client that holds per-session state may free it here.
        """

    @property
    def reply_bound(self) -> float:
        """Seconds within which every submitted future resolves (the wrapper's guard against a lost one);
        by default the bound of one request under the default transport settings."""
        return self.config.request_bound()

    @property
    def config(self) -> TransportConfig:
        """The transport's bounds and options (the defaults unless the client has its own); the wrapper reads
        the wait of a refused session from it."""
        return TransportConfig()


class WebsocketPolicyClient(PolicyClient):
    """The default client: a websocket :class:`~dz_gym.transport.SessionPool`, one connection per env slot.

    ``servers`` are ``ws://``/``wss://`` URLs; slot ``i`` talks to ``servers[i % len(servers)]``.
    """

    def __init__(self, servers: str | Sequence[str], num_envs: int, config: TransportConfig | None = None):
        urls = [servers] if isinstance(servers, str) else list(servers)
        self._config = config or TransportConfig()
        self._pool = SessionPool(urls, int(num_envs), self._config)

    @property
    def num_sessions(self) -> int:
        return self._pool.num_sessions

    @property
    def config(self) -> TransportConfig:
        """The transport's bounds and options."""
        return self._config

    def connect(self) -> list[ServerMetadata]:
        return self._pool.connect()

    def submit(self, env_id: int, request: dict) -> concurrent.futures.Future[Outcome]:
        return self._pool.submit(env_id, request)

    def reconnect(self, env_id: int) -> ServerMetadata:
        return self._pool.reconnect(env_id)

    def is_connected(self, env_id: int) -> bool:
        return self._pool.is_connected(env_id)

    def url(self, env_id: int) -> str:
        return self._pool.url(env_id)

    def metadata(self, env_id: int) -> ServerMetadata | None:
        return self._pool.metadata(env_id)

    def close(self) -> None:
        self._pool.close()

    def end_session(self, env_id: int, session_id: str) -> None:
        """Free the ended episode's session on its server where the handshake says that is safe and useful
        (:func:`~dz_gym.protocol.contract.releases_sessions`): a ``reset`` naming it, on that env's own
        connection. Elsewhere nothing is sent (see :meth:`PolicyClient.end_session`)."""
        metadata = self._pool.metadata(env_id)
        if metadata is not None and releases_sessions(metadata.contract) and self._pool.is_connected(env_id):
            self._pool.release(env_id, session_id)

    @property
    def reply_bound(self) -> float:
        config = self._config
        request_bound = getattr(config, "request_bound", None)
        bound = request_bound() if callable(request_bound) else config.request_timeout + config.close_timeout
        return float(bound) + 10.0
