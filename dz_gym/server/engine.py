"""The inference engine of the reference server: one FIFO queue, K worker threads, emulated model time.

Real policy servers run one request at a time in arrival order, whatever the number of connections (see
the protocol docs, "no server-side batching"). The engine reproduces that: every connection hands its work to
one shared FIFO queue, and ``workers`` threads (K emulated GPUs; 1 by default) take jobs from it in order.
Model time is emulated by sleeping *in the worker* (never on the event loop), so the server keeps answering
pings, health checks and other connections while a request "computes". ``fail_every=N`` makes every N-th
inference raise, for fault-injection tests. The engine also keeps the numbers a throughput study needs: jobs
done, failures and busy time, hence utilization.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from dz_gym.errors import InjectedFailure

__all__ = ["EngineStats", "InferenceEngine", "InjectedFailure", "JobResult"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class JobResult:
    """What a job returned, with how long it waited in the queue and how long it ran (seconds)."""

    value: Any
    wait_s: float
    service_s: float
    sequence: int


@dataclass(frozen=True)
class EngineStats:
    """A snapshot of the engine's counters; ``utilization`` is busy time over wall time times workers."""

    inferences: int
    failures: int
    other_jobs: int
    busy_s: float
    wall_s: float
    workers: int

    @property
    def utilization(self) -> float:
        capacity = self.wall_s * self.workers
        return self.busy_s / capacity if capacity > 0 else 0.0

    def summary(self) -> str:
        return (
            f"requests={self.inferences} failures={self.failures} other_jobs={self.other_jobs} "
            f"busy_s={self.busy_s:.3f} wall_s={self.wall_s:.3f} workers={self.workers} "
            f"utilization={self.utilization:.3f}"
        )


@dataclass
class _Job:
    fn: Callable[[], Any]
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future
    inference: bool
    enqueued: float
    sequence: int


class InferenceEngine:
    """K worker threads serving one FIFO queue; ``await engine.run(fn)`` from any event loop."""

    def __init__(
        self,
        *,
        workers: int = 1,
        latency_s: float = 0.0,
        jitter_s: float = 0.0,
        fail_every: int = 0,
        seed: int | None = None,
    ):
        if workers < 1:
            raise ValueError(f"workers: expected >= 1, got {workers}")
        if latency_s < 0 or jitter_s < 0:
            raise ValueError(f"latency/jitter: expected >= 0 seconds, got {latency_s}/{jitter_s}")
        if fail_every < 0:
            raise ValueError(f"fail_every: expected >= 0 (0 disables), got {fail_every}")
        self.workers = workers
        self.latency_s = latency_s
        self.jitter_s = jitter_s
        self.fail_every = fail_every
        self._rng = random.Random(seed)
        self._queue: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        self._sequence = 0
        self._inference_count = 0  # inferences started, in FIFO order (decides fail_every)
        self._inferences = 0
        self._failures = 0
        self._other_jobs = 0
        self._busy_s = 0.0
        self._started_at: float | None = None
        self._stopped_at: float | None = None
        self._stopping = False

    # -------------------------------------------------------------------------------------------- lifecycle
    def start(self) -> None:
        if self._threads:
            return
        self._started_at = time.monotonic()
        for index in range(self.workers):
            thread = threading.Thread(target=self._worker, name=f"dz-gym-serve-worker-{index}", daemon=True)
            thread.start()
            self._threads.append(thread)

    def stop(self, timeout: float = 10.0) -> None:
        """Fail queued jobs, let running ones finish (bounded by ``timeout``), stop the threads."""
        if self._stopping:
            return
        self._stopping = True
        self._stopped_at = time.monotonic()
        pending = []
        while True:
            try:
                job = self._queue.get_nowait()
            except queue.Empty:
                break
            if job is not None:
                pending.append(job)
        for job in pending:
            self._resolve(job, error=RuntimeError("server is shutting down"))
        for _ in self._threads:
            self._queue.put(None)
        deadline = time.monotonic() + timeout
        for thread in self._threads:
            thread.join(max(0.0, deadline - time.monotonic()))

    # -------------------------------------------------------------------------------------------- submit
    async def run(self, fn: Callable[[], Any], *, inference: bool = True) -> JobResult:
        """Queue ``fn`` behind every earlier job and wait for it; its exception is re-raised here."""
        if self._stopping:
            raise RuntimeError("server is shutting down")
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        with self._lock:
            self._sequence += 1
            sequence = self._sequence
        self._queue.put(_Job(fn, loop, future, inference, time.monotonic(), sequence))
        return await future

    def queue_depth(self) -> int:
        """Jobs waiting for a worker (not counting the ones running)."""
        return self._queue.qsize()

    def stats(self) -> EngineStats:
        with self._lock:
            end = self._stopped_at if self._stopped_at is not None else time.monotonic()
            wall = end - self._started_at if self._started_at is not None else 0.0
            return EngineStats(self._inferences, self._failures, self._other_jobs, self._busy_s, wall, self.workers)

    # -------------------------------------------------------------------------------------------- workers
    def _service_time(self) -> float:
        if self.jitter_s > 0:
            return max(0.0, self.latency_s + self._rng.uniform(-self.jitter_s, self.jitter_s))
        return self.latency_s

    def _worker(self) -> None:
        while True:
            job = self._queue.get()
            if job is None:
                return
            if job.future.cancelled():  # its connection went away while it waited
                continue
            started = time.monotonic()
            value: Any = None
            error: BaseException | None = None
            if job.inference:
                with self._lock:
                    self._inference_count += 1
                    count = self._inference_count
                    target = self._service_time()
                inject = self.fail_every > 0 and count % self.fail_every == 0
                try:
                    if inject:
                        raise InjectedFailure(f"injected failure: inference {count} (every {self.fail_every})")
                    value = job.fn()
                except BaseException as exc:  # handed to the awaiting coroutine
                    error = exc
                remaining = target - (time.monotonic() - started)
                if remaining > 0:
                    time.sleep(remaining)
            else:
                try:
                    value = job.fn()
                except BaseException as exc:
                    error = exc
            finished = time.monotonic()
            with self._lock:
                self._busy_s += finished - started
                if job.inference:
                    self._inferences += 1
                    self._failures += error is not None
                else:
                    self._other_jobs += 1
            result = None if error else JobResult(value, started - job.enqueued, finished - started, job.sequence)
            self._resolve(job, value=result, error=error)

    @staticmethod
    def _resolve(job: _Job, *, value: Any = None, error: BaseException | None = None) -> None:
        def settle() -> None:
            if job.future.done():
                return
            if error is not None:
                job.future.set_exception(error)
            else:
                job.future.set_result(value)

        try:
            job.loop.call_soon_threadsafe(settle)
        except RuntimeError:  # the loop is closed: nobody is waiting any more
            logger.debug("dropped the result of job %d: event loop closed", job.sequence)
