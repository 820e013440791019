"""An in-process :class:`~dz_gym.policy_client.PolicyClient`: a policy object served without sockets.

:class:`MemoryPolicyClient` runs a policy with the reference server's interface (``infer(request, *,
session_id, new_session)``, optional ``metadata`` and ``reset``; see :mod:`dz_gym.server.policies`) in the
caller's thread. Every request and reply still goes through the protocol's codec (``packb`` -> the server's
``parse_request``; the policy's chunk -> ``encode_reply`` -> the client's ``parse_infer_response``), so a
request the websocket client could not send, or a reply it could not parse, fails here the same way.
Sessions follow vLLM-Omni: ``new_session`` is true for the first request of a session id on a slot's
connection, and a reconnect starts an empty seen-set. A policy exception becomes a binary error reply
(vLLM-Omni's form: a non-fatal :class:`~dz_gym.errors.ServerError`, the connection stays open).

For failure-path tests, :meth:`MemoryPolicyClient.break_connection` drops a slot's connection: its next
request fails with :class:`~dz_gym.errors.ConnectionLost` until it reconnects.

What it does not cover: network timing and concurrency (a request is answered before ``submit`` returns),
frame size limits, idle timeouts and close codes. Tests of those use the reference server over loopback.
"""

from __future__ import annotations

import concurrent.futures
import threading
import time
from typing import Any

from dz_gym.errors import ConnectionLost, DzGymError, ProtocolError
from dz_gym.policy_client import Outcome, PolicyClient
from dz_gym.protocol import (
    ServerMetadata,
    encode_error,
    encode_metadata,
    encode_reply,
    packb,
    parse_infer_response,
    parse_metadata,
    parse_request,
)

__all__ = ["MemoryPolicyClient"]


def _policy_metadata(policy: Any, metadata: dict | None) -> dict:
    if metadata is not None:
        return dict(metadata)
    from dz_gym.server.policies import policy_metadata

    return policy_metadata(policy)


class MemoryPolicyClient(PolicyClient):
    """Serve ``policy`` to ``num_envs`` env slots in this process (see the module docstring).

    ``metadata`` overrides the policy's handshake fields (default: its ``metadata``, else DreamZero's);
    ``url`` is what :meth:`url` reports for every slot. ``requests[i]`` and ``reconnects[i]`` count slot
    ``i``'s requests and reconnects; ``sessions_seen`` lists ``(env_id, session_id, new_session)`` per request
    and ``ended_sessions`` ``(env_id, session_id)`` per :meth:`end_session`.
    """

    def __init__(self, policy: Any, num_envs: int, *, metadata: dict | None = None, url: str = "memory://policy"):
        if not callable(getattr(policy, "infer", None)):
            raise TypeError(
                f"policy: expected an object with infer(request, *, session_id, new_session), got {policy!r}"
            )
        if int(num_envs) < 1:
            raise ValueError(f"num_envs: expected an integer >= 1, got {num_envs!r}")
        self.policy = policy
        self._num = int(num_envs)
        self._url = str(url)
        self._metadata_frame = encode_metadata(_policy_metadata(policy, metadata))
        self._meta: list[ServerMetadata | None] = [None] * self._num
        self._connected = [False] * self._num
        self._seen: list[set[str]] = [set() for _ in range(self._num)]
        self._lock = threading.Lock()
        self._closed = False
        self.requests = [0] * self._num
        self.reconnects = [0] * self._num
        self.sessions_seen: list[tuple[int, str, bool]] = []
        self.ended_sessions: list[tuple[int, str]] = []

    # -- PolicyClient ---------------------------------------------------------------------------------
    @property
    def num_sessions(self) -> int:
        return self._num

    def connect(self) -> list[ServerMetadata]:
        return [self._open(i) for i in range(self._num)]

    def reconnect(self, env_id: int) -> ServerMetadata:
        self._check(env_id)
        self.reconnects[env_id] += 1
        return self._open(env_id)

    def is_connected(self, env_id: int) -> bool:
        self._check(env_id)
        return self._connected[env_id]

    def url(self, env_id: int) -> str:
        self._check(env_id)
        return self._url

    def metadata(self, env_id: int) -> ServerMetadata | None:
        self._check(env_id)
        return self._meta[env_id]

    def submit(self, env_id: int, request: dict) -> concurrent.futures.Future[Outcome]:
        self._check(env_id)
        future: concurrent.futures.Future[Outcome] = concurrent.futures.Future()
        future.set_running_or_notify_cancel()
        sent_at = time.perf_counter()
        reply, error, size = None, None, 0
        try:
            frame = packb(request)
            size = len(frame)
            reply = parse_infer_response(self._serve(env_id, frame), action_dim=None)  # as the transport
        except DzGymError as exc:
            error = exc
        future.set_result(Outcome(env_id, reply, error, sent_at, time.perf_counter(), size))
        return future

    def close(self) -> None:
        self._closed = True
        self._connected = [False] * self._num

    # -- faults ---------------------------------------------------------------------------------------
    def break_connection(self, env_id: int) -> None:
        """Drop slot ``env_id``'s connection: its requests fail with ``ConnectionLost`` until a reconnect."""
        self._check(env_id)
        self._connected[env_id] = False

    # -- internals ------------------------------------------------------------------------------------
    def _check(self, env_id: int) -> None:
        if self._closed:
            raise RuntimeError("MemoryPolicyClient: closed")
        if not 0 <= int(env_id) < self._num:
            raise IndexError(f"env_id: expected 0..{self._num - 1}, got {env_id}")

    def _open(self, env_id: int) -> ServerMetadata:
        if self._closed:
            raise RuntimeError("MemoryPolicyClient: closed")
        meta = parse_metadata(self._metadata_frame)
        self._meta[env_id] = meta
        self._seen[env_id] = set()
        self._connected[env_id] = True
        return meta

    def _serve(self, env_id: int, frame: bytes) -> bytes:
        """The server's side of one request: decode, route the session, run the policy, encode the reply."""
        if not self._connected[env_id]:
            raise ConnectionLost(f"{self._url} (env {env_id}): not connected")
        try:
            request = parse_request(frame)
        except ProtocolError:
            return encode_error("Invalid request payload")
        request.pop("endpoint", None)
        session_id = str(request.get("session_id") or "default")
        new_session = session_id not in self._seen[env_id]
        self._seen[env_id].add(session_id)
        with self._lock:
            self.requests[env_id] += 1
            self.sessions_seen.append((env_id, session_id, new_session))
        try:
            return encode_reply(self.policy.infer(request, session_id=session_id, new_session=new_session))
        except Exception as exc:  # noqa: BLE001 - a policy failure is the server's error reply, as on the wire
            self._seen[env_id].discard(session_id)  # vLLM-Omni releases the session's state
            text = str(exc).strip().splitlines()
            return encode_error(f"{type(exc).__name__}: {text[-1] if text else ''}".rstrip(": "))

    def end_session(self, env_id: int, session_id: str) -> None:
        """Record that the wrapper ended ``session_id`` on slot ``env_id`` (in ``ended_sessions``); like the
        websocket client, nothing reaches the policy (no ``reset``)."""
        self._check(env_id)
        self.ended_sessions.append((int(env_id), str(session_id)))

    @property
    def reply_bound(self) -> float:
        return 60.0  # every future is resolved before submit returns
