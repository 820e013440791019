"""The synchronous facade for batched evaluation: :class:`SessionPool`, the wrapper's default
:class:`~dz_gym.policy_client.PolicyClient`.

Session ``i`` talks to ``urls[i % len(urls)]``; all sessions live on one :class:`~dz_gym.transport.loop.LoopThread`.
:meth:`SessionPool.submit` issues one request and returns a future of its
:class:`~dz_gym.policy_client.Outcome` at once, so a caller can keep every session's request in flight
and one session's failure never touches the others' results.

>>> from dz_gym.server.launch import start_server_thread
>>> import numpy as np
>>> def request_for(i):
...     return {"observation/joint_position": np.full(7, 0.1 * i), "prompt": "pick", "session_id": f"episode-{i}"}
>>> with start_server_thread("hold") as server, SessionPool([server.url], num_sessions=2) as pool:
...     metadata = pool.connect()
...     futures = {i: pool.submit(i, request_for(i)) for i in range(2)}
...     outcomes = {i: f.result(pool.config.request_bound()) for i, f in futures.items()}
>>> [(i, o.ok, o.reply.actions.shape) for i, o in outcomes.items()]
[(0, True, (24, 8)), (1, True, (24, 8))]
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import math
import time
import weakref
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from dz_gym.errors import DzGymError, PartialConnectError, RequestTimeout
from dz_gym.policy_client import Outcome
from dz_gym.protocol import ServerMetadata
from dz_gym.protocol.contract import releases_sessions
from dz_gym.protocol.request_batch import RequestBatch
from dz_gym.transport.base import PoolBase
from dz_gym.transport.config import TransportConfig, check_pool_args
from dz_gym.transport.loop import LoopThread
from dz_gym.transport.session import AsyncSession, encode_request

__all__ = ["PartialConnectError", "SessionPool"]

logger = logging.getLogger("dz_gym.transport")


class SessionPool(PoolBase):
    """Synchronous facade over ``num_sessions`` :class:`AsyncSession` objects on one :class:`LoopThread`.

    Session ``i`` talks to ``urls[i % len(urls)]``. Every call is bounded by the config. Methods are
    thread-safe; requests to different sessions run concurrently, requests to one session queue.
    Request dicts are encoded in the calling thread, so the loop thread only moves bytes. As the wrapper's
    :class:`~dz_gym.policy_client.PolicyClient`, slot ``i`` is session ``i``.
    """

    def __init__(
        self,
        urls: list[str] | str,
        num_sessions: int,
        config: TransportConfig | None = None,
        *,
        loop: LoopThread | None = None,
    ):
        urls, self._config = check_pool_args(urls, num_sessions, config)
        self._owns_loop = loop is None
        self._loop = loop if loop is not None else LoopThread()
        self._sessions = [AsyncSession(urls[i % len(urls)], self._config) for i in range(num_sessions)]
        self._semaphore: asyncio.Semaphore | None = None
        self._profiler = None  # a dz_gym.profiling.StageProfiler while profiling (set_profiler)
        self._finalizer = weakref.finalize(
            self, _close_pool, self._loop, list(self._sessions), self._owns_loop, self._config.close_timeout
        )

    # -- introspection ------------------------------------------------------------------------------------
    @property
    def num_sessions(self) -> int:
        return len(self._sessions)

    def url(self, i: int) -> str:
        return self._session(i).url

    def metadata(self, i: int) -> ServerMetadata | None:
        """Metadata of session ``i``'s last handshake (``None`` if it never connected)."""
        return self._session(i).metadata

    def is_connected(self, i: int) -> bool:
        return self._session(i).connected

    def session(self, i: int) -> AsyncSession:
        """The underlying :class:`AsyncSession` (use it only from coroutines run on :attr:`loop`)."""
        return self._session(i)

    @property
    def loop(self) -> LoopThread:
        return self._loop

    def _session(self, i: int) -> AsyncSession:
        if self.closed:
            raise RuntimeError("SessionPool is closed")
        if not isinstance(i, int) or isinstance(i, bool) or not 0 <= i < len(self._sessions):
            raise ValueError(f"session index: expected an int in [0, {len(self._sessions)}), got {i!r}")
        return self._sessions[i]

    # -- connecting -------------------------------------------------------------------------------------
    def connect(self, indices: Iterable[int] | None = None) -> list[ServerMetadata]:
        """Connect the given sessions (default: all) concurrently, at most ``connect_concurrency`` at once.

        Returns their metadata in the order of ``indices``. If some fail, the rest stay connected and
        :class:`PartialConnectError` is raised with both the metadata and the per-session errors.
        """
        order = list(range(len(self._sessions))) if indices is None else list(indices)
        for i in order:
            self._session(i)
        futures = {i: self._loop.submit(self._bounded_connect(i)) for i in order}
        bound = self._config.connect_bound() * math.ceil(len(order) / self._config.connect_concurrency) + 5.0
        done, _ = concurrent.futures.wait(futures.values(), timeout=bound)
        connected: dict[int, ServerMetadata] = {}
        errors: dict[int, DzGymError] = {}
        for i, future in futures.items():
            if future not in done:
                future.cancel()
                errors[i] = RequestTimeout(f"session {i}: connect did not finish within {bound:g} s")
                continue
            exc = future.exception()
            if exc is None:
                connected[i] = future.result()
            elif isinstance(exc, DzGymError):
                errors[i] = exc
            else:
                raise exc
        if errors:
            raise PartialConnectError(connected, errors)
        return [connected[i] for i in order]

    async def _bounded_connect(self, i: int) -> ServerMetadata:
        if self._semaphore is None:
            self._semaphore = asyncio.Semaphore(self._config.connect_concurrency)
        async with self._semaphore:
            return await self._sessions[i].connect()

    def reconnect(self, i: int) -> ServerMetadata:
        """Close session ``i``'s connection and open a new one (bounded); returns the new metadata."""
        self._session(i)
        return self._loop.run(self._bounded_connect(i), self._config.connect_bound() + 5.0)

    # -- requests ---------------------------------------------------------------------------------------
    def submit(self, i: int, request: dict | bytes) -> concurrent.futures.Future[Outcome]:
        """Issue one infer request for session ``i`` without waiting; the future never raises, its
        :class:`Outcome` carries the reply or the error. A dict is encoded here, in the calling thread.

        Wait on it at most ``config.request_bound()`` seconds: that covers every attempt the request may
        make (see :meth:`AsyncSession.send`).
        """
        return self.submit_many([(i, request)])[0]

    def submit_many(self, items: Iterable[tuple[int, dict | bytes]]) -> list[concurrent.futures.Future[Outcome]]:
        """:meth:`submit` for each ``(i, request)``: all encoded here, then handed to the loop thread at once
        (one wake-up instead of one per request: with hundreds of sessions the two threads otherwise trade
        the interpreter lock at every request)."""
        return self._send_all(items, lambda i, request: encode_request(request))

    def submit_batch(self, batch: RequestBatch, env_ids: Sequence[int]) -> list[concurrent.futures.Future[Outcome]]:
        """:meth:`submit_many` of ``batch``'s requests of ``env_ids``, each framed from the batch's template
        (:meth:`RequestBatch.frame <dz_gym.protocol.request_batch.RequestBatch.frame>`) where it has one, else
        encoded from its dict."""
        return self._send_all(((int(i), batch) for i in env_ids), _frame_of)

    def _send_all(self, items: Iterable[tuple[int, Any]], encode: Callable[[int, Any], bytes]):
        """Encode each ``(i, item)`` here (``encode(i, item)``), then hand them all to the loop thread."""
        profiler = self._profiler
        futures: list[concurrent.futures.Future[Outcome] | None] = []
        coros, slots = [], []
        for i, item in items:
            session = self._session(i)
            start = time.perf_counter()
            try:
                payload = encode(i, item)
            except DzGymError as exc:
                done: concurrent.futures.Future[Outcome] = concurrent.futures.Future()
                done.set_result(Outcome.failed(i, exc))
                futures.append(done)
                continue
            if profiler is not None:
                profiler.add("encode", time.perf_counter() - start)
            slots.append(len(futures))
            futures.append(None)
            coros.append(session.send(payload, index=i))
        start = time.perf_counter()
        for slot, future in zip(slots, self._loop.submit_many(coros)):
            futures[slot] = future
        if profiler is not None:
            profiler.add("submit", time.perf_counter() - start)
        return futures

    def set_profiler(self, profiler) -> None:
        """Time this pool's encoding and hand-offs, and its sessions' sends and reply parsing, into
        ``profiler`` (a :class:`dz_gym.profiling.StageProfiler`; None: stop)."""
        self._profiler = profiler
        for session in self._sessions:
            session.profiler = profiler

    @property
    def loop_thread_id(self) -> int | None:
        """The loop thread's ``threading`` ident (its CPU clock: ``time.pthread_getcpuclockid``)."""
        return self._loop.thread_id

    def transport_cpu_s(self) -> float | None:
        """CPU seconds the loop thread has used so far (for ``--profile``); None where the platform has no
        per-thread clock."""
        thread_id = self._loop.thread_id
        if thread_id is None or not hasattr(time, "pthread_getcpuclockid"):
            return None
        try:
            return time.clock_gettime(time.pthread_getcpuclockid(thread_id))
        except (OSError, OverflowError):
            return None

    def release(self, i: int, session_id: str) -> concurrent.futures.Future[None]:
        """Ask session ``i``'s server to free ``session_id`` (a ``reset`` naming it) without waiting.

        It goes on that session's own connection, ahead of the next request, so it only concerns that env's
        episode. Best effort: a failure is logged and leaves the connection to the usual recovery.
        """
        session = self._session(i)

        async def reset() -> None:
            try:
                await session.reset(session_id)
            except DzGymError as exc:
                logger.info("session %d: releasing %s failed: %s", i, session_id, exc)

        return self._loop.submit(reset())

    def end_session(self, i: int, session_id: str) -> None:
        """Free the ended episode's session on its server where the handshake says that is safe and useful
        (:func:`~dz_gym.protocol.contract.releases_sessions`), with :meth:`release`; elsewhere nothing is sent
        (see :meth:`PolicyClient.end_session <dz_gym.policy_client.PolicyClient.end_session>`)."""
        metadata = self.metadata(i)
        if metadata is not None and releases_sessions(metadata.contract) and self.is_connected(i):
            self.release(i, session_id)

    # -- teardown ---------------------------------------------------------------------------------------
    def close(self) -> None:
        """Close every connection (and the loop thread if the pool made it); idempotent."""
        self._finalizer()


def _frame_of(i: int, batch: RequestBatch) -> bytes:
    """Request ``i``'s frame from ``batch``'s template, else encoded from its dict."""
    frame = batch.frame(i)
    return encode_request(batch[i]) if frame is None else frame


def _close_pool(loop: LoopThread, sessions: list[AsyncSession], owns_loop: bool, close_timeout: float) -> None:
    """The pool's one close path (also run when a forgotten pool is collected or the interpreter exits)."""
    if not loop.closed and not loop.in_loop_thread():

        async def close_all() -> None:
            await asyncio.gather(*(s.close() for s in sessions), return_exceptions=True)

        try:
            loop.run(close_all(), close_timeout + 2.0)
        except BaseException:  # noqa: BLE001 - closing is best effort
            logger.debug("closing sessions did not finish cleanly", exc_info=True)
    if owns_loop and not loop.in_loop_thread():
        loop.close()
