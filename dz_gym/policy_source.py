"""Where a policy wrapper's policy comes from: server URLs, a client of the caller's, or an embedded server.

:class:`~dz_gym.wrapper.DreamZeroPolicyWrapper` reaches its policy in exactly one of three ways: ``server=``
(URLs, default :data:`DEFAULT_SERVER`, with ``transport=`` bounds), ``client=`` (any
:class:`~dz_gym.policy_client.PolicyClient` with one session per env) or ``policy=`` (served by an embedded
server that this module starts: a policy spec in its own process, a policy object on a thread of this one).
:func:`server_urls` checks the arguments before anything starts; :func:`open_client` then opens the client.
"""

from __future__ import annotations

from typing import Any

from dz_gym.policy_client import PolicyClient
from dz_gym.transport import TransportConfig, open_pool

__all__ = ["DEFAULT_SERVER", "open_client", "server_urls"]

DEFAULT_SERVER = "ws://127.0.0.1:8000/v1/realtime/robot/openpi"


def server_urls(server: Any, client: PolicyClient | None, policy: Any, transport: TransportConfig | None,
                num_envs: int) -> list[str] | None:  # fmt: skip
    """The server URLs ``server`` names (default :data:`DEFAULT_SERVER`; None with ``client``), once the
    ways of reaching a policy are checked to be one; a one-line error naming the argument otherwise."""
    if client is not None and (server is not None or transport is not None):
        raise ValueError("client: pass either client= or server=/transport=, not both")
    if policy is not None and (server is not None or client is not None):
        raise ValueError("policy: pass either policy= (an embedded server) or server=/client=, not both")
    if client is None:
        servers = [DEFAULT_SERVER] if server is None else [server] if isinstance(server, str) else list(server)
        if not servers or not all(isinstance(url, str) and url for url in servers):
            raise ValueError(f"server: expected a ws:// or wss:// URL or a list of them, got {server!r}")
        return servers
    if not isinstance(client, PolicyClient):
        raise TypeError(f"client: expected a dz_gym.policy_client.PolicyClient, got {type(client).__name__}")
    if client.num_sessions != num_envs:
        raise ValueError(f"client: expected {num_envs} sessions (one per env), got {client.num_sessions}")
    return None


def open_client(servers: list[str] | None, client: PolicyClient | None, policy: Any,
                transport: TransportConfig | None, num_envs: int) -> tuple[PolicyClient, Any]:  # fmt: skip
    """``(the client, the embedded server or None)`` for arguments :func:`server_urls` accepted: the caller's
    ``client``, else a session pool (:func:`~dz_gym.transport.open_pool`) over ``servers`` or over the
    embedded server started for ``policy`` (stopped again if the pool cannot be made)."""
    if client is not None:
        return client, None
    embedded = None
    if policy is not None:
        from dz_gym.server.embedded import EmbeddedServer  # the server's machinery only when asked for

        embedded = EmbeddedServer(policy, in_process=not isinstance(policy, str)).start()
        servers = [embedded.url]
    try:
        return open_pool(servers, num_envs, transport), embedded
    except BaseException:
        if embedded is not None:
            embedded.stop()
        raise
