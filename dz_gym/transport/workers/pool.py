"""Sessions spread over worker processes: :class:`ProcessSessionPool`, a
:class:`~dz_gym.policy_client.PolicyClient` with the behaviour of :class:`~dz_gym.transport.SessionPool`.

With hundreds of sessions of 0.5 MB requests (three 180x320 views), one process moves every request's bytes
under one interpreter lock: the caller encodes them and one loop thread masks, copies and sends each frame and
parses each reply. Here session ``i`` lives in worker process ``i % P`` (and talks to ``urls[i % len(urls)]``,
as in SessionPool), where an :class:`~dz_gym.transport.session.AsyncSession` on the worker's own asyncio loop
sends it; the caller only encodes.

How the bytes move (no pickle for anything per request):

- The caller encodes each request straight into a shared-memory segment of its worker's arena
  (:class:`~dz_gym.transport.workers.segments.SharedSegments` of :mod:`multiprocessing.shared_memory`) and
  names its range (segment, offset, length) in the worker's ``send`` message, one ``Connection.send_bytes``
  per call; the worker sends a ``memoryview`` of the segment. A range is reused once the worker reports the
  request done (its outcome: until then it may re-send the request on a fresh connection). A worker's
  segments grow by doubling up to ``arena_bytes`` per worker; a request that finds no room then (or where
  /dev/shm cannot hold a segment) goes in the same message as its bytes instead: nothing waits for room.
- A request whose large pieces (the views) lie in the pool's view memory (:attr:`ProcessSessionPool.host_views`,
  where the wrapper copies a GPU batch's views to) is not copied here at all: its ``send`` request names
  those ranges and carries the small pieces inline, the worker joins the frame, tells this process it took the
  bytes (the block is then free once the caller's arrays of it are gone too) and sends it.
- A batch step's requests given as a :class:`~dz_gym.protocol.request_batch.RequestBatch` (what the wrapper
  builds) are not packed here at all where its views lie in the view memory: each worker gets one ``sendt``
  message -- the batch's frame template, where its columns lie (the views as their place in the view memory,
  the proprio inline) and per request its row and its packed prompt and session id -- and frames each request
  itself, into the bytes ``packb`` gives its dict. The caller's work per request is then bookkeeping
  instead of packing it (``benchmarks/bench_processes.py`` measures both; benchmarks/README.md).
- The worker answers with the raw reply frame and the outcome's stamps, counts and error (type name, message
  and the fields its class needs, rebuilt from :mod:`dz_gym.errors` here); this process parses the frame with
  the parser AsyncSession uses, so the reply is the one SessionPool gives.
- Workers start with the ``spawn`` context (never ``fork``: the caller may hold CUDA state and threads); the
  transport config goes over the pipe as msgpack of its fields. A token named by ``auth_env`` is read by the
  worker from its environment, inherited from this process: it never appears in argv, in the pipe or in logs.
  An ``ssl_context`` cannot be handed over (``TransportConfig`` refuses it with ``processes``).

One reader thread per worker resolves the futures. A worker that dies (killed, crashed) fails all its
requests in flight at once with :class:`~dz_gym.errors.ConnectionLost` and its sessions read as not
connected; the other workers' sessions go on. ``reconnect`` (or ``connect``) of a session of a dead worker
starts a fresh worker for it first, at most ``max_restarts`` times per worker (then
:class:`~dz_gym.errors.WorkerError`); its other sessions are then connected again by their own reconnects.
Every wait is bounded: worker start-up (``start_timeout``), connects, closing (the workers are joined, killed
if they do not exit, and the segments unlinked).
"""

from __future__ import annotations

import concurrent.futures
import logging
import math
import threading
import time
import weakref
from collections.abc import Iterable, Sequence
from typing import Any

from dz_gym.errors import DzGymError, PartialConnectError, RequestTimeout
from dz_gym.host_process import UNTOUCHED, HostProcessSettings
from dz_gym.policy_client import Outcome
from dz_gym.protocol import ServerMetadata
from dz_gym.protocol.contract import releases_sessions
from dz_gym.protocol.packer import fast_parts, pieces_of, pieces_size
from dz_gym.protocol.request_batch import RequestBatch
from dz_gym.transport.base import PoolBase
from dz_gym.transport.config import TransportConfig, check_pool_args
from dz_gym.transport.session import request_pieces
from dz_gym.transport.workers.handle import (
    ARENA_BYTES,
    BY_REFERENCE_BYTES,
    FIRST_SEGMENT_BYTES,
    MAX_RESTARTS,
    START_TIMEOUT_S,
    STOP_GRACE_S,
    WorkerHandle,
    process_cpu_s,
)
from dz_gym.transport.workers.segments import create_segment
from dz_gym.transport.workers.views import VIEWS_BYTES, HostViews

__all__ = ["ARENA_BYTES", "FIRST_SEGMENT_BYTES", "PARALLEL_COPY_BYTES", "START_TIMEOUT_S", "ProcessSessionPool"]

logger = logging.getLogger("dz_gym.transport")

PARALLEL_COPY_BYTES = 8 * 2**20
"""A ``submit_many`` of at least this many bytes writes each worker's requests on a thread of its own."""
COPY_TIMEOUT_S = 60.0
"""Bound on writing one ``submit_many``'s requests into the arenas (memory copies)."""


class ProcessSessionPool(PoolBase):
    """:class:`~dz_gym.transport.SessionPool`'s behaviour with session ``i`` in worker process ``i % P``
    (see the module docstring). Methods are thread-safe; every call is bounded by the config.

    ``processes``: how many workers (at most one per session). ``arena_bytes``: the most shared memory of one
    worker. ``views_bytes``: the most shared memory of :attr:`host_views` (0: none). ``start_timeout``: bound
    on a worker's start-up. ``max_restarts``: how often a dead worker is restarted by ``connect``/``reconnect``.
    ``host``: what the pool may do to this process (:mod:`dz_gym.host_process`: page-locked and populated view
    memory); None: nothing.
    """

    def __init__(
        self,
        urls: list[str] | str,
        num_sessions: int,
        config: TransportConfig | None = None,
        *,
        processes: int = 2,
        arena_bytes: int = ARENA_BYTES,
        views_bytes: int = VIEWS_BYTES,
        start_timeout: float = START_TIMEOUT_S,
        max_restarts: int = MAX_RESTARTS,
        host: HostProcessSettings | None = None,
    ):
        urls, self._config = check_pool_args(urls, num_sessions, config)
        host = UNTOUCHED if host is None else host
        if not isinstance(host, HostProcessSettings):
            raise ValueError(f"host: expected a HostProcessSettings or None, got {type(host).__name__}")
        if not isinstance(processes, int) or isinstance(processes, bool) or processes < 1:
            raise ValueError(f"processes: expected an int >= 1, got {processes!r}")
        if not isinstance(arena_bytes, int) or isinstance(arena_bytes, bool) or arena_bytes < 0:
            raise ValueError(f"arena_bytes: expected an int >= 0, got {arena_bytes!r}")
        if not isinstance(views_bytes, int) or isinstance(views_bytes, bool) or views_bytes < 0:
            raise ValueError(f"views_bytes: expected an int >= 0, got {views_bytes!r}")
        if self._config.ssl_context is not None:
            raise ValueError("config.ssl_context: a TLS context cannot be handed to worker processes; expected None")
        self._num = num_sessions
        self._urls = [urls[i % len(urls)] for i in range(num_sessions)]
        count = min(processes, num_sessions)
        concurrency = max(1, math.ceil(self._config.connect_concurrency / count))
        workers: list[WorkerHandle] = []

        def announce(k: int, name: str) -> None:  # every worker maps a new view segment before it is named
            for worker in workers:
                worker.announce_views(k, name)

        self._views = None
        if views_bytes > 0:
            self._views = HostViews(create_segment, announce, capacity=views_bytes, page_lock=host.page_lock,
                                    populate=host.populate_views)  # fmt: skip
        workers += [
            WorkerHandle(
                w,
                [(i, self._urls[i]) for i in range(w, num_sessions, count)],
                self._config,
                concurrency=concurrency,
                arena_bytes=arena_bytes,
                start_timeout=start_timeout,
                max_restarts=max_restarts,
                views=self._views,
            )  # fmt: skip
            for w in range(count)
        ]
        self._workers = workers
        self._metadata: list[ServerMetadata | None] = [None] * num_sessions
        self._profiler = None
        self._copiers: list[concurrent.futures.ThreadPoolExecutor] = []  # at most one (see _copier)
        self._copier_lock = threading.Lock()
        self._finalizer = weakref.finalize(
            self, _close_workers, list(self._workers), self._config.close_timeout, self._copiers, self._views
        )
        try:
            for worker in self._workers:
                worker.spawn()
            for worker in self._workers:
                worker.wait_ready()
        except BaseException:
            self._finalizer()
            raise

    # -- introspection ------------------------------------------------------------------------------------
    @property
    def num_sessions(self) -> int:
        return self._num

    @property
    def processes(self) -> int:
        return len(self._workers)

    def url(self, i: int) -> str:
        self._check(i)
        return self._urls[i]

    def metadata(self, i: int) -> ServerMetadata | None:
        """Metadata of session ``i``'s last handshake (``None`` if it never connected)."""
        self._check(i)
        return self._metadata[i]

    def is_connected(self, i: int) -> bool:
        worker = self._worker(i)
        with worker.lock:
            return worker.alive and worker.connected[i]

    def worker_pid(self, i: int) -> int | None:
        """The process id of session ``i``'s worker (None while it is not running)."""
        worker = self._worker(i)
        return worker.process.pid if worker.alive else None

    def shared_memory_names(self) -> list[str]:
        """The names of the shared-memory segments the workers use now (under /dev/shm on Linux): their
        arenas and the view segments."""
        views = [] if self._views is None else [name for _, name in self._views.names]
        return [name for w in self._workers for _, name in w.arena.names] + views

    @property
    def host_views(self) -> HostViews | None:
        """Shared memory for GPU views that the workers read directly (see
        :mod:`dz_gym.transport.workers.views`); None with ``views_bytes=0``. A request whose large pieces lie in
        its blocks is not copied by :meth:`submit_many`: its worker joins the frame from them."""
        return self._views

    @property
    def host_memory(self):
        """:meth:`HostViews.alloc <dz_gym.transport.workers.views.HostViews.alloc>` of :attr:`host_views` (the
        wrapper copies GPU views there), or None without view memory."""
        return None if self._views is None else self._views.alloc

    def reserve_host_memory(self, nbytes: int, *, wait: bool = True) -> bool:
        """:meth:`HostViews.reserve <dz_gym.transport.workers.views.HostViews.reserve>` of :attr:`host_views`
        (False without view memory)."""
        return False if self._views is None else self._views.reserve(nbytes, wait=wait)

    def _check(self, i: int) -> None:
        if self.closed:
            raise RuntimeError("ProcessSessionPool is closed")
        if not isinstance(i, int) or isinstance(i, bool) or not 0 <= i < self._num:
            raise ValueError(f"session index: expected an int in [0, {self._num}), got {i!r}")

    def _worker(self, i: int) -> WorkerHandle:
        self._check(i)
        return self._workers[i % len(self._workers)]

    # -- connecting ---------------------------------------------------------------------------------------
    def connect(self, indices: Iterable[int] | None = None) -> list[ServerMetadata]:
        """Connect the given sessions (default: all) concurrently, at most ``connect_concurrency`` at once
        over all workers (a dead worker is restarted first).

        Returns their metadata in the order of ``indices``. If some fail, the rest stay connected and
        :class:`PartialConnectError` is raised with both the metadata and the per-session errors.
        """
        order = list(range(self._num)) if indices is None else list(indices)
        for i in order:
            self._check(i)
        errors: dict[int, DzGymError] = {}
        futures: dict[int, concurrent.futures.Future] = {}
        for i in order:
            worker = self._worker(i)
            try:
                worker.ensure_alive()
            except DzGymError as exc:
                errors[i] = exc
                continue
            futures[i] = worker.connect(i)
        per_worker = max((sum(1 for i in futures if self._worker(i) is w) for w in self._workers), default=0)
        concurrency = self._workers[0].concurrency
        bound = self._config.connect_bound() * math.ceil(per_worker / concurrency) + 5.0
        done, _ = concurrent.futures.wait(futures.values(), timeout=bound)
        connected: dict[int, ServerMetadata] = {}
        for i, future in futures.items():
            if future not in done:
                errors[i] = RequestTimeout(f"session {i}: connect did not finish within {bound:g} s")
                continue
            metadata, error = future.result()
            if error is not None:
                errors[i] = error
            else:
                self._metadata[i] = connected[i] = metadata
        if errors:
            raise PartialConnectError(connected, errors)
        return [connected[i] for i in order]

    def reconnect(self, i: int) -> ServerMetadata:
        """Close session ``i``'s connection and open a new one (bounded); returns the new metadata. A dead
        worker is restarted first (``max_restarts`` per worker, then :class:`~dz_gym.errors.WorkerError`)."""
        worker = self._worker(i)
        worker.ensure_alive()
        bound = self._config.connect_bound() + 5.0
        try:
            metadata, error = worker.connect(i).result(bound)
        except concurrent.futures.TimeoutError:
            raise RequestTimeout(f"session {i}: reconnect did not finish within {bound:g} s") from None
        if error is not None:
            raise error
        self._metadata[i] = metadata
        return metadata

    # -- requests -----------------------------------------------------------------------------------------
    def submit(self, i: int, request: dict | bytes) -> concurrent.futures.Future[Outcome]:
        """Issue one infer request for session ``i`` without waiting; the future never raises, its
        :class:`Outcome` carries the reply or the error. A dict is encoded here, into the worker's arena."""
        return self.submit_many([(i, request)])[0]

    def submit_many(self, items: Iterable[tuple[int, dict | bytes]]) -> list[concurrent.futures.Future[Outcome]]:
        """:meth:`submit` for each ``(i, request)``: each encoded here (into its worker's arena, or as references
        to its views), then one ``send`` message per worker.

        A call of at least :data:`PARALLEL_COPY_BYTES` to copy writes each worker's requests on a thread of its
        own, side by side (the copies let go of the interpreter lock), and returns once all are written: the
        caller may reuse its arrays as soon as this returns, as with SessionPool. Requests whose views lie in
        :attr:`host_views` are not copied (their blocks stay until the workers took them); with ``--profile``
        the packing is ``encode`` and the copies and hand-off are ``submit``."""
        profiler = self._profiler
        start = time.perf_counter()
        futures: list[concurrent.futures.Future[Outcome]] = []
        entries: dict[int, list[tuple[int, Any, concurrent.futures.Future, Any]]] = {}
        copy_bytes = 0
        views_in_use = self._views is not None and self._views.blocks > 0
        for i, request in items:
            worker = self._worker(i)
            future: concurrent.futures.Future[Outcome] = concurrent.futures.Future()
            futures.append(future)
            pieces, split = None, None
            if views_in_use and type(request) is dict:  # packed once: its views referred to, or its pieces
                parts = fast_parts(request)
                if parts is not None:
                    split = worker.by_reference(parts)
                    if split is None:
                        pieces = pieces_of(parts)
            if split is None and pieces is None:
                try:
                    pieces = request_pieces(request)
                except DzGymError as exc:
                    future.set_result(Outcome.failed(i, exc))
                    continue
            if split is None:
                copy_bytes += pieces_size(pieces)
            entries.setdefault(worker.number, []).append((i, pieces, future, split))
        placed = time.perf_counter()
        if len(entries) > 1 and copy_bytes >= PARALLEL_COPY_BYTES:
            copier = self._copier()
            tasks = [copier.submit(self._workers[n].place_many, batch) for n, batch in entries.items()]
            done, _ = concurrent.futures.wait(tasks, timeout=COPY_TIMEOUT_S)
            if len(done) < len(tasks):  # memory copies: only a machine that has stopped gets here
                raise RuntimeError(f"writing {copy_bytes} bytes of requests took over {COPY_TIMEOUT_S:g} s")
            for task in tasks:
                task.result()
        else:
            for n, batch in entries.items():
                self._workers[n].place_many(batch)
        if profiler is not None:  # packing (and finding the views), then the copies and the hand-off
            profiler.add("encode", placed - start)
            profiler.add("submit", time.perf_counter() - placed)
        return futures

    def submit_batch(self, batch: RequestBatch, env_ids: Sequence[int]) -> list[concurrent.futures.Future[Outcome]]:
        """:meth:`submit_many` of ``batch``'s requests of ``env_ids``, as the wrapper sends a batch step's.

        Where the batch's large columns (the views) lie in :attr:`host_views`, nothing is packed here: each
        worker gets one ``sendt`` message (:meth:`_template_messages`) and frames its requests itself: the
        caller's work per request is bookkeeping, not packing. Otherwise (no view memory, no frame
        template, a string that is not UTF-8, views elsewhere) the requests go as dicts through
        :meth:`submit_many`, the reason counted by the profiler (``batches_as_dicts``)."""
        env_ids = [int(i) for i in env_ids]
        if self._views is not None:
            profiler = self._profiler
            start = time.perf_counter()
            try:
                futures, messages = self._template_messages(batch, env_ids)
            except _AsDicts as why:
                if profiler is not None:
                    profiler.batch_as_dicts(str(why))
            else:
                placed = time.perf_counter()
                for worker, message in messages:
                    worker.send_message(message)
                if profiler is not None:
                    profiler.add("encode", placed - start)
                    profiler.add("submit", time.perf_counter() - placed)
                return futures
        return self.submit_many((i, batch[i]) for i in env_ids)

    def _template_messages(self, batch: RequestBatch, env_ids: list[int]) -> tuple[
            list[concurrent.futures.Future[Outcome]], list[tuple[WorkerHandle, list]]]:  # fmt: skip
        """The futures and each worker's ``sendt`` message of a batch's requests, to be framed by the workers
        from the batch's template (:meth:`RequestBatch.frame_template
        <dz_gym.protocol.request_batch.RequestBatch.frame_template>`): a large column (the views) goes as its
        place in :attr:`host_views`, a small one (the proprio) inline, each request as its row and its two
        packed strings. :class:`_AsDicts`, saying why in words, where the batch has no template, some string
        is no UTF-8 or a large column lies outside the view memory."""
        template = batch.frame_template()
        if template is None:
            raise _AsDicts("no frame template")
        strings = [batch.strings(env_id) for env_id in env_ids]
        if any(s is None for s in strings):
            raise _AsDicts("a prompt or session id that is not UTF-8")
        sizes = [template.row_bytes(j) for j in range(len(template.columns))]
        large = [j for j, size in enumerate(sizes) if size >= BY_REFERENCE_BYTES]
        inline = {j: template.columns[j].tobytes() for j in range(len(sizes)) if j not in large}
        per_worker: dict[int, list] = {}
        futures: list[concurrent.futures.Future[Outcome]] = []
        row_bytes = template.fixed_bytes + sum(sizes)
        for env_id, packed in zip(env_ids, strings):
            worker = self._worker(env_id)
            future: concurrent.futures.Future[Outcome] = concurrent.futures.Future()
            futures.append(future)
            nbytes = row_bytes + len(packed[0]) + len(packed[1])
            per_worker.setdefault(worker.number, []).append((env_id, batch.row(env_id), packed, future, nbytes))
        found = [self._views.refer_arrays([template.columns[j] for j in large]) for _ in per_worker]
        if any(spot is None for spots, _ in found for spot in spots):
            for _, keys in found:
                for key in keys:
                    self._views.release(key)
            raise _AsDicts("views outside the view memory")
        messages = []
        for (number, rows), (spots, keys) in zip(per_worker.items(), found):
            where = dict(zip(large, spots))
            columns = [[*where[j], sizes[j]] if j in where else [inline[j], 0, sizes[j]] for j in range(len(sizes))]
            worker = self._workers[number]
            message = worker.template_message(template.parts, columns, rows, keys)
            if message is not None:
                messages.append((worker, message))
        return futures, messages

    def _copier(self) -> concurrent.futures.ThreadPoolExecutor:
        """The threads that write requests into the arenas, one per worker (made at first use)."""
        with self._copier_lock:
            if not self._copiers:
                self._copiers.append(
                    concurrent.futures.ThreadPoolExecutor(
                        len(self._workers), thread_name_prefix="dz-gym-transport-copy"
                    )
                )
            return self._copiers[0]

    def transport_cpu_s(self) -> float | None:
        """CPU seconds the worker processes have used so far (all of them, live ones; Linux's ``/proc``), the
        counterpart of SessionPool's loop thread for ``--profile``; None where it cannot be read."""
        total = 0.0
        for worker in self._workers:
            process = worker.process
            seconds = None if process is None else process_cpu_s(process.pid)
            if seconds is None:
                return None
            total += seconds
        return total

    def set_profiler(self, profiler) -> None:
        """Time the encoding into the arenas and the hand-offs (the caller's side) and the parsing of the
        replies into ``profiler`` (a :class:`dz_gym.profiling.StageProfiler`; None: stop); the workers time
        their sends and each outcome carries them here."""
        self._profiler = profiler
        for worker in self._workers:
            worker.profiler = profiler

    def release(self, i: int, session_id: str) -> concurrent.futures.Future[None]:
        """Ask session ``i``'s server to free ``session_id`` (a ``reset`` naming it) without waiting; best
        effort, as :meth:`SessionPool.release <dz_gym.transport.SessionPool.release>`."""
        answer = self._worker(i).reset(i, session_id)
        done: concurrent.futures.Future[None] = concurrent.futures.Future()

        def settle(future: concurrent.futures.Future) -> None:
            error = future.result()
            if error is not None:
                logger.info("session %d: releasing %s failed: %s", i, session_id, error)
            done.set_result(None)

        answer.add_done_callback(settle)
        return done

    def end_session(self, i: int, session_id: str) -> None:
        """As :meth:`SessionPool.end_session <dz_gym.transport.SessionPool.end_session>`."""
        metadata = self.metadata(i)
        if metadata is not None and releases_sessions(metadata.contract) and self.is_connected(i):
            self.release(i, session_id)

    # -- teardown -----------------------------------------------------------------------------------------
    def close(self) -> None:
        """Close every connection, join the workers and unlink their shared memory; idempotent."""
        self._finalizer()


class _AsDicts(Exception):
    """A batch that cannot be framed by the workers from its template; its message says why."""


def _close_workers(
    workers: list[WorkerHandle],
    close_timeout: float,
    copiers: list[concurrent.futures.ThreadPoolExecutor],
    views: HostViews | None,
) -> None:
    """The pool's one close path (also run when a forgotten pool is collected or the interpreter exits);
    the workers close side by side."""
    for copier in copiers:
        copier.shutdown(wait=True)  # a write in progress ends before its arena can go
    threads = [threading.Thread(target=w.shutdown, args=(close_timeout,), daemon=True) for w in workers]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(close_timeout + 4 * STOP_GRACE_S)
    if views is not None:
        views.close()
