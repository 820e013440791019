"""The contract between :class:`~dz_gym.wrapper.DreamZeroPolicyWrapper` and a policy: :class:`PolicyClient`,
and :class:`Outcome`, what every one of its requests comes back as.

The wrapper asks a :class:`PolicyClient` for everything it needs from the policy, per env slot ``env_id``: send an
infer request (or a batch step's requests, :meth:`PolicyClient.submit_batch`) and get a future of its
:class:`Outcome` (a reply or a typed error, with timing and recovery counts), the URL it talks to, whether the
slot's connection is usable, and a bounded reconnect that returns the new handshake. It is what openpi-client's
``BasePolicy`` is to its ``ActionChunkBroker``, with the batch, the futures and the failure types that a vectorized
evaluator needs; the chunk bookkeeping stays in :mod:`dz_gym.chunks` and the wrapper.

- :class:`~dz_gym.transport.SessionPool` (the default) satisfies it directly: one websocket per env slot,
  spread over the servers round-robin.
- :class:`dz_gym.testing.memory_client.MemoryPolicyClient` runs a policy object in this process through the
  protocol's codec, with no sockets (tests, notebooks, a policy that lives in the same process).

A client of your own subclasses :class:`PolicyClient` and implements the abstract methods; ``submit_many``,
``submit_batch``, ``end_session``, ``config`` and ``reply_bound`` have defaults. This module imports nothing of the
transport, so the transport can build its outcomes here.
"""

from __future__ import annotations

import abc
import concurrent.futures
import dataclasses
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy as np

    from dz_gym.protocol.request_batch import RequestBatch

from dz_gym.errors import DzGymError
from dz_gym.protocol import InferReply, ServerMetadata

__all__ = ["Outcome", "PolicyClient"]


@dataclasses.dataclass(frozen=True)
class Outcome:
    """What happened to one request: a reply or a typed error, with client-side timing and recovery counts.

    ``sent_at``/``received_at`` are ``time.perf_counter()`` stamps of the request's last attempt, taken right
    before the send and right after the reply frame arrived (on failure, when the failure was seen);
    ``latency_s`` is their difference. ``request_bytes`` is the encoded size. ``reconnects`` counts the fresh
    connections this request opened (a re-send after the server closed the connection cleanly before
    replying, or a retry after a fatal server error); each one may have restarted the policy's context on
    servers that key sessions per connection (vLLM-Omni). ``retries`` counts the re-sends after a server
    error reply (``TransportConfig.retry_server_errors``).
    """

    index: int
    reply: InferReply | None
    error: DzGymError | None
    sent_at: float
    received_at: float
    request_bytes: int = 0
    reconnects: int = 0
    retries: int = 0

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def latency_s(self) -> float:
        return self.received_at - self.sent_at

    @classmethod
    def failed(
        cls,
        index: int,
        error: DzGymError,
        *,
        sent_at: float | None = None,
        received_at: float | None = None,
        request_bytes: int = 0,
        reconnects: int = 0,
        retries: int = 0,
    ) -> Outcome:
        """The outcome of a request that ended with ``error``; missing stamps are now."""
        now = time.perf_counter()
        sent = sent_at if sent_at is not None else now
        received = received_at if received_at is not None else now
        return cls(index, None, error, sent, max(received, sent), request_bytes, reconnects, retries)


class PolicyClient(abc.ABC):
    """What the wrapper needs from the policy for ``num_sessions`` env slots (see the module docstring).

    Contract: ``submit`` never raises for a failure of the request itself; the future resolves to an
    :class:`Outcome` whose ``error`` is a typed :mod:`dz_gym.errors` exception (``ServerError``,
    ``SessionRefused``, ``ConnectionLost``, ``RequestTimeout``, ``ProtocolError``). Every future resolves
    within ``reply_bound`` seconds; the wrapper treats one that does not as a timeout of that env. After a
    failure that breaks a connection (:func:`dz_gym.transport.rules.breaks_connection`) the wrapper calls
    ``reconnect``; the client itself never reconnects on its own account, except to re-send a request the
    server cannot have processed.
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

    def submit_many(self, items: Sequence[tuple[int, dict]]) -> list[concurrent.futures.Future[Outcome]]:
        """:meth:`submit` for each ``(env_id, request)``, in order (a client may hand them over at once)."""
        return [self.submit(env_id, request) for env_id, request in items]

    def submit_batch(self, batch: RequestBatch, env_ids: Sequence[int]) -> list[concurrent.futures.Future[Outcome]]:
        """The requests of ``env_ids`` of one batch step (a :class:`~dz_gym.protocol.request_batch.RequestBatch`,
        what the wrapper sends), in order. By default :meth:`submit_many` of their request dicts; a client
        that can frame them from the batch's columns does so instead (the transport's pools)."""
        return self.submit_many([(env_id, batch[env_id]) for env_id in env_ids])

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
    def close(self) -> None:
        """Close every connection; idempotent."""

    @property
    def host_memory(self) -> Callable[[int], np.ndarray | None] | None:
        """Where the wrapper may copy a batch's views to (``nbytes`` -> a writable uint8 array, or None when
        there is no room): memory this client sends from without copying it again. None (the default): the
        wrapper's own memory. :class:`~dz_gym.transport.ProcessSessionPool` gives its workers' view memory."""
        return None

    def reserve_host_memory(self, nbytes: int, *, wait: bool = True) -> bool:
        """Make :attr:`host_memory` ready for a batch of ``nbytes`` now (the wrapper calls it at reset with a
        full round's views, so that the first step does not pay for making that memory); whether it has
        room. ``wait=False``: start making it and return (the wrapper does so before the env's reset, from
        the observation space, so that the two overlap). The default, without host memory: False, nothing
        to do."""
        return False

    def end_session(self, env_id: int, session_id: str) -> None:  # noqa: B027 (an optional hook)
        """Slot ``env_id``'s episode with ``session_id`` ended (a fresh session id follows).

        Nothing goes over the wire by default: a ``reset`` on a shared connection would lose every session of
        that connection on vLLM-Omni and the global one on DreamZero's server, and rotating the session id
        already starts a new episode on both. A client that holds per-session state may free it here.
        """

    @property
    def config(self) -> Any:
        """The client's :class:`~dz_gym.transport.TransportConfig`, where it has one (None: the defaults
        apply); the wrapper reads the wait of a refused session from it."""
        return None

    @property
    def reply_bound(self) -> float | None:
        """Seconds within which every submitted future resolves (the wrapper's guard against a lost one);
        None (the default): the bound of one request under ``config``, else the default transport settings."""
        return None
