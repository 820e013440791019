"""Policy clients the evaluator puts between the wrapper and the servers: A/B routing and request fields.

- :class:`ArmRouter`: one :class:`~dz_gym.policy_client.PolicyClient` per arm of a run with ``K`` arms (an
  A/B run: ``K = 2``) behind the wrapper's single client. Env slot ``i`` belongs to arm ``i % K`` and is slot
  ``i // K`` of that arm's client, so all arms run on the same simulator, in the same batch, under the same
  load; episode ``k`` of a scene runs on the neighbouring slots ``K j + i`` at about the same time.
- :class:`RequestFields`: adds the optional sampling fields (:func:`dz_gym.protocol.messages.sampling_fields`)
  to every request of a slot: a ``seed`` derived from the slot's current episode seed
  (:func:`policy_seed`), and ``sampling_params``. The runner tells it each slot's episode seed.

Both delegate everything else (connections, metadata, recovery) to the clients they wrap.
"""

from __future__ import annotations

import concurrent.futures
from collections.abc import Mapping, Sequence

from dz_gym.host_process import HostProcessSettings
from dz_gym.policy_client import Outcome, PolicyClient
from dz_gym.protocol import ServerMetadata
from dz_gym.protocol.messages import sampling_fields
from dz_gym.stats.comparison import ARMS
from dz_gym.transport import TransportConfig, open_pool

__all__ = ["ArmRouter", "RequestFields", "arm_of_slot", "build_client", "policy_seed"]


_MASK64 = (1 << 64) - 1


def arm_of_slot(slot: int) -> str:
    """The arm of env slot ``slot`` in an A/B run: ``"a"`` for even slots, ``"b"`` for odd ones."""
    return ARMS[int(slot) % 2]


def policy_seed(episode_seed: int) -> int:
    """The request ``seed`` of an episode: a SplitMix64 mix of its episode seed, in ``[0, 2**31)``.

    Neighbouring episode seeds give unrelated policy seeds (a sampler seeded with ``s`` and ``s + 1`` may
    draw correlated noise); the same episode seed gives the same policy seed in every run and in both arms
    of an A/B run, so the pairs stay paired. ``2**31`` keeps it valid for engines that take an int32.

    >>> policy_seed(0) == policy_seed(0), policy_seed(0) != policy_seed(1), 0 <= policy_seed(12) < 2**31
    (True, True, True)
    """
    z = (int(episode_seed) + 0x9E3779B97F4A7C15) & _MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return (z ^ (z >> 31)) & 0x7FFFFFFF


class _Delegate(PolicyClient):
    """Base of the clients here: every call goes to ``self._route(env_id)``."""

    def _route(self, env_id: int) -> tuple[PolicyClient, int]:
        raise NotImplementedError

    def submit(self, env_id: int, request: dict) -> concurrent.futures.Future[Outcome]:
        client, local = self._route(env_id)
        return client.submit(local, request)

    def reconnect(self, env_id: int) -> ServerMetadata:
        client, local = self._route(env_id)
        return client.reconnect(local)

    def is_connected(self, env_id: int) -> bool:
        client, local = self._route(env_id)
        return client.is_connected(local)

    def url(self, env_id: int) -> str:
        client, local = self._route(env_id)
        return client.url(local)

    def end_session(self, env_id: int, session_id: str) -> None:
        client, local = self._route(env_id)
        client.end_session(local, session_id)


class ArmRouter(_Delegate):
    """The clients of ``K >= 2`` arms behind one client of ``K * P`` slots (see the module docstring).

    ``clients`` maps each arm's name, in arm order (an A/B run: ``"a"``, ``"b"``), to a client of ``P``
    sessions.
    """

    def __init__(self, clients: Mapping[str, PolicyClient]):
        if len(clients) < 2:
            raise ValueError(f"clients: expected one client per arm, at least 2 arms, got {list(clients)}")
        sizes = {arm: client.num_sessions for arm, client in clients.items()}
        if len(set(sizes.values())) != 1:
            raise ValueError(f"clients: expected the same number of sessions per arm, got {sizes}")
        self._clients = dict(clients)
        self._arms = tuple(clients)
        self._per_arm = sizes[self._arms[0]]

    @property
    def arms(self) -> tuple[str, ...]:
        return self._arms

    @property
    def num_sessions(self) -> int:
        return len(self._arms) * self._per_arm

    def client(self, arm: str) -> PolicyClient:
        """The client of ``arm``."""
        return self._clients[arm]

    def _route(self, env_id: int) -> tuple[PolicyClient, int]:
        env_id = int(env_id)
        if not 0 <= env_id < self.num_sessions:
            raise IndexError(f"env_id: expected 0 <= env_id < {self.num_sessions}, got {env_id}")
        k = len(self._arms)
        return self._clients[self._arms[env_id % k]], env_id // k

    def connect(self) -> list[ServerMetadata]:
        opened: list[PolicyClient] = []
        k = len(self._arms)
        try:
            per_arm = {}
            for arm in self._arms:
                per_arm[arm] = self._clients[arm].connect()
                opened.append(self._clients[arm])
        except BaseException:
            for client in opened:
                client.close()
            raise
        return [per_arm[self._arms[i % k]][i // k] for i in range(self.num_sessions)]

    def close(self) -> None:
        for arm in self._arms:
            self._clients[arm].close()

    @property
    def config(self) -> TransportConfig | None:
        return self._clients[self._arms[0]].config

    @property
    def reply_bound(self) -> float | None:
        bounds = [self._clients[arm].reply_bound for arm in self._arms]
        return None if None in bounds else max(bounds)


class RequestFields(_Delegate):
    """``inner`` with the sampling fields added to every request (see the module docstring).

    ``policy_seed``: send ``seed`` = :func:`policy_seed` of the slot's episode seed (set with
    :meth:`begin_episode`); ``num_inference_steps``: send ``sampling_params``.
    """

    def __init__(
        self,
        inner: PolicyClient,
        *,
        policy_seed: bool = False,
        num_inference_steps: int | None = None,
    ):
        self._inner = inner
        self._seeds: list[int | None] = [None] * inner.num_sessions
        self._policy_seed = bool(policy_seed)
        self._fixed = sampling_fields(num_inference_steps=num_inference_steps)

    @property
    def inner(self) -> PolicyClient:
        return self._inner

    @property
    def num_sessions(self) -> int:
        return self._inner.num_sessions

    def _route(self, env_id: int) -> tuple[PolicyClient, int]:
        return self._inner, int(env_id)

    def begin_episode(self, env_id: int, episode_seed: int) -> None:
        """Slot ``env_id`` starts the episode with seed ``episode_seed``."""
        self._seeds[int(env_id)] = int(episode_seed)

    def fields(self, env_id: int) -> dict:
        """The fields added to slot ``env_id``'s next request."""
        seed = self._seeds[int(env_id)]
        fields = dict(self._fixed)
        if self._policy_seed and seed is not None:
            fields.update(sampling_fields(seed=policy_seed(seed)))
        return fields

    def submit(self, env_id: int, request: dict) -> concurrent.futures.Future[Outcome]:
        fields = self.fields(env_id)
        if fields:
            request = {**request, **fields}
        return self._inner.submit(int(env_id), request)

    def connect(self) -> list[ServerMetadata]:
        return self._inner.connect()

    def close(self) -> None:
        self._inner.close()

    @property
    def config(self) -> TransportConfig | None:
        return self._inner.config

    @property
    def host_memory(self):
        return self._inner.host_memory  # the added fields are small: the views still go as they lie

    def reserve_host_memory(self, nbytes: int, *, wait: bool = True) -> bool:
        return self._inner.reserve_host_memory(nbytes, wait=wait)

    @property
    def reply_bound(self) -> float | None:
        return self._inner.reply_bound


def build_client(
    servers: Sequence[str],
    servers_b: Sequence[str],
    num_envs: int,
    transport: TransportConfig,
    *,
    policy_seed: bool = False,
    num_inference_steps: int | None = None,
    arm_servers: Mapping[str, Sequence[str]] | None = None,
    host: HostProcessSettings | None = None,
) -> PolicyClient:
    """The evaluator's client: websocket pools (one per arm behind an :class:`ArmRouter` when ``servers_b``,
    or per named arm of ``arm_servers``, in order), wrapped in :class:`RequestFields` when a sampling field is
    sent. Each pool is :func:`~dz_gym.transport.open_pool`'s: in this process, or over
    ``transport.process_count`` worker processes (the pools sharing the cores), with ``host``'s settings of
    the pools' memory (:mod:`dz_gym.host_process`; None: nothing done to this process)."""
    client: PolicyClient
    if arm_servers:
        per, pools = int(num_envs) // len(arm_servers), len(arm_servers)
        client = ArmRouter({arm: open_pool(list(urls), per, transport, host=host, pools=pools)
                            for arm, urls in arm_servers.items()})  # fmt: skip
    elif servers_b:
        half = int(num_envs) // 2
        client = ArmRouter({
            "a": open_pool(list(servers), half, transport, host=host, pools=2),
            "b": open_pool(list(servers_b), half, transport, host=host, pools=2),
        })  # fmt: skip
    else:
        client = open_pool(list(servers), int(num_envs), transport, host=host)
    if policy_seed or num_inference_steps is not None:
        client = RequestFields(client, policy_seed=policy_seed, num_inference_steps=num_inference_steps)
    return client
