"""Load generation: closed-loop concurrency and open-loop request rates over real policy sessions.

Every simulated session is one :class:`~dz_gym.transport.AsyncSession` (one websocket, one request in flight),
the same client code the evaluator uses, and owns an episode: its session id is rotated every
``episode_length`` requests (and after a reconnect, which restarts the server-side context anyway), and the
first request under a new id is marked so the first-chunk latency can be reported apart.

- **Closed loop** (``--concurrency C``): C sessions each send, wait for the chunk, optionally "think" (the
  simulator executing the chunk) and send again. Throughput then measures what C robots get from the server.
- **Open loop** (``--request-rate R``): requests arrive on a schedule (Poisson or constant gaps, seeded) no
  matter how fast replies come; each goes out on an idle session, at most ``max_outstanding`` at once. A
  request that finds no idle session waits, and that wait is recorded as schedule lag (so a saturated server
  shows up in the numbers instead of silently slowing the schedule).

Bounds: the run stops after ``num_requests`` timed requests or ``duration_s`` seconds, whichever comes first;
each request is bounded by the transport's ``request_timeout``; a session that lost its connection reconnects
(bounded by the transport's retries) and a failed reconnect, or ``max_consecutive_errors`` failures in a row
with no success in between, aborts the run with :class:`BenchAborted`. A session the server refuses for lack
of room (:class:`~dz_gym.errors.SessionRefused`, e.g. ``dz-gym-serve --max-sessions K``) leaves the run: the
load is what the server admits, the refusal is counted (not recorded as a request), and the run reports the
most sessions the servers admitted at once; a run whose every session is refused aborts.

Every reply is checked against the policy contract as ``dz-gym-eval`` checks the chunks it executes
(:func:`~dz_gym.protocol.contract.check_reply`: the action width, the announced horizon, at least the
open-loop horizon's rows; the parser checks the dtype and finite values): a reply that breaks it is
recorded as a ``ProtocolError``, not as a success.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import math
import time
from collections.abc import Iterator, Sequence

import numpy as np

from dz_gym.bench.metrics import RequestRecord
from dz_gym.bench.payloads import PayloadSet, new_session_id
from dz_gym.envs import droid
from dz_gym.errors import BenchAborted, DzGymError, ProtocolError, SessionRefused
from dz_gym.protocol.contract import PolicyContract, check_chunk, check_reply
from dz_gym.transport import AsyncSession, TransportConfig

__all__ = ["ARRIVALS", "BenchAborted", "LoadResult", "LoadSpec", "SimSession", "arrival_offsets", "run_load"]

ARRIVALS = ("poisson", "constant")


def arrival_offsets(rate: float, arrival: str = "poisson", seed: int = 0) -> Iterator[float]:
    """Send times (seconds from the start) of an open-loop schedule of ``rate`` requests per second.

    ``poisson``: exponential gaps with mean ``1/rate`` (seeded, so runs are repeatable); ``constant``: ``k/rate``.
    The first request goes out at 0. Infinite: the caller stops it.
    """
    if not (isinstance(rate, (int, float)) and math.isfinite(rate) and rate > 0):
        raise ValueError(f"request rate: expected a finite number > 0, got {rate!r}")
    if arrival not in ARRIVALS:
        raise ValueError(f"arrival: expected one of {ARRIVALS}, got {arrival!r}")
    if arrival == "constant":
        return (k / rate for k in itertools.count())
    rng = np.random.default_rng(seed)

    def poisson() -> Iterator[float]:
        t = 0.0
        while True:
            yield t
            t += float(rng.exponential(1.0 / rate))

    return poisson()


@dataclasses.dataclass(frozen=True)
class LoadSpec:
    """The shape and bounds of one run's load (see the module docstring)."""

    sessions: int
    request_rate: float | None = None
    arrival: str = "poisson"
    num_requests: int | None = None
    duration_s: float | None = None
    warmup: int = 0
    episode_length: int = 50
    think_s: float = 0.0
    seed: int = 0
    max_consecutive_errors: int = 20
    open_loop_horizon: int = 1  # a reply with fewer rows violates the contract (protocol.contract.check_reply)
    action_dim: int = droid.ACTION_DIM

    def __post_init__(self) -> None:
        if self.sessions < 1:
            raise ValueError(f"sessions: expected >= 1, got {self.sessions}")
        if self.num_requests is None and self.duration_s is None:
            raise ValueError("load: expected num_requests or duration_s (or both) to bound the run")
        if self.num_requests is not None and self.num_requests < 1:
            raise ValueError(f"num_requests: expected >= 1, got {self.num_requests}")
        if self.duration_s is not None and not (math.isfinite(self.duration_s) and self.duration_s > 0):
            raise ValueError(f"duration_s: expected a finite number > 0, got {self.duration_s}")
        if self.request_rate is not None:
            arrival_offsets(self.request_rate, self.arrival)  # validates both
        if self.warmup < 0 or self.episode_length < 1 or self.think_s < 0 or self.max_consecutive_errors < 1:
            raise ValueError("load: warmup >= 0, episode_length >= 1, think_s >= 0, max_consecutive_errors >= 1")

    @property
    def open_loop(self) -> bool:
        return self.request_rate is not None


class SimSession:
    """One simulated robot: a connection, the payloads for its server, and its episode bookkeeping."""

    def __init__(
        self, index: int, server: int, url: str, payloads: PayloadSet, config: TransportConfig, episode_length: int
    ):
        self.index = index
        self.server = server
        self.url = url
        self.payloads = payloads
        self.session = AsyncSession(url, config)
        self.episode_length = episode_length
        self.session_id = new_session_id()
        self.in_episode = 0
        self.sent = 0
        self.reconnects = 0
        self.admitted = False  # the server admitted the current session (it replied to it)
        self.retired = False  # the server refused its session: it sends nothing more
        self.chunk_rows: int | None = None  # the rows its server's profile fixes (dz_gym.protocol.profiles.chunk_rows)

    def new_episode(self) -> None:
        self.session_id = new_session_id()
        self.in_episode = 0
        self.admitted = False

    def next_payload(self) -> tuple[bytes, bool]:
        """The next request's bytes and whether it is the first of an episode (rotating the id when due)."""
        if self.in_episode >= self.episode_length:
            self.new_episode()
        first = self.in_episode == 0
        # Walk the templates in order from a per-session offset, like frames of a video.
        payload = self.payloads.payload(self.index * 7 + self.sent, self.session_id)
        self.in_episode += 1
        self.sent += 1
        return payload, first


@dataclasses.dataclass
class LoadResult:
    """What one run of the load produced: the timed records and the window they were measured in."""

    records: list[RequestRecord]
    started_at: float
    ended_at: float
    client_cpu_s: float
    warmup_completed: int = 0
    warmup_errors: int = 0
    reconnects: int = 0
    admitted_peak: int = 0  # most sessions the servers had admitted at once
    refusals: int = 0  # requests refused for lack of room (waited and sent again; not in records)

    @property
    def duration_s(self) -> float:
        return max(self.ended_at - self.started_at, 0.0)


class _Run:
    """State of one run of :func:`run_load` (lives in one event loop)."""

    def __init__(self, sims: Sequence[SimSession], spec: LoadSpec):
        self.sims = list(sims)
        self.spec = spec
        self.records: list[RequestRecord] = []
        self.issued = 0
        self.deadline = math.inf
        self.consecutive_errors = 0
        self.last_error: str = ""
        self.admitted_peak = 0
        self.refusals = 0

    def _retire(self, sim: SimSession) -> None:
        """The server refused ``sim``'s session: it leaves the run (the load is what the server admits)."""
        self.refusals += 1
        sim.retired = True
        if all(s.retired for s in self.sims):
            raise BenchAborted(f"the server refused every session; last: {self.last_error or 'SessionRefused'}")

    def may_issue(self) -> bool:
        spec = self.spec
        if spec.num_requests is not None and self.issued >= spec.num_requests:
            return False
        return time.perf_counter() < self.deadline

    async def ensure_connected(self, sim: SimSession) -> None:
        if sim.session.connected:
            return
        try:
            await sim.session.connect()
        except DzGymError as exc:
            raise BenchAborted(f"session {sim.index}: server {sim.url} unreachable: {exc}") from None
        sim.reconnects += 1
        sim.new_episode()  # a new connection restarts the server-side context: a new episode

    def _violation(self, sim: SimSession, actions: np.ndarray) -> ProtocolError | None:
        """The reply's breach of the policy contract, as dz-gym-eval would refuse it (None: a usable chunk)."""
        metadata = sim.session.metadata
        contract = metadata.contract if metadata is not None else PolicyContract()
        try:
            check_reply(actions, contract, open_loop_horizon=self.spec.open_loop_horizon,
                        action_dim=self.spec.action_dim)  # fmt: skip
            check_chunk(actions, action_dim=self.spec.action_dim, horizon=sim.chunk_rows)
        except ProtocolError as exc:
            return exc
        return None

    async def request(self, sim: SimSession, *, record: bool = True, scheduled_at: float | None = None) -> bool:
        """Send one request on ``sim``; returns whether it succeeded; raises BenchAborted when the run must stop."""
        await self.ensure_connected(sim)
        payload, first = sim.next_payload()
        sent_at = time.perf_counter()
        infer_ms = None
        rows = None
        outcome = await sim.session.send(payload, index=sim.index)
        if isinstance(outcome.error, SessionRefused):
            self.last_error = f"SessionRefused: {outcome.error}"
            self._retire(sim)
            return False
        error, reply = outcome.error, outcome.reply
        received_at = time.perf_counter()
        if error is None:
            error = self._violation(sim, reply.actions)
        if outcome.reconnects:
            # The transport re-sent the request on a fresh connection (the server had closed the idle one):
            # the server ran it as the first of a new context.
            sim.reconnects += outcome.reconnects
            first = True
        if error is None:
            timing = reply.server_timing or {}
            value = timing.get("infer_ms")
            if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
                infer_ms = float(value)
            rows = int(reply.actions.shape[0])
            self.consecutive_errors = 0
            sim.admitted = True
            self.admitted_peak = max(self.admitted_peak, sum(s.admitted for s in self.sims))
        else:
            self.consecutive_errors += 1
            self.last_error = f"{type(error).__name__}: {error}"
        if record:
            self.records.append(
                RequestRecord(
                    session=sim.index,
                    server=sim.server,
                    sent_at=sent_at,
                    received_at=received_at,
                    request_bytes=len(payload),
                    error_kind=None if error is None else type(error).__name__,
                    error_message=None if error is None else str(error),
                    first_of_episode=first,
                    infer_ms=infer_ms,
                    scheduled_at=scheduled_at,
                    chunk_rows=rows,
                )
            )
        if self.consecutive_errors >= self.spec.max_consecutive_errors:
            raise BenchAborted(f"{self.consecutive_errors} requests failed in a row; last: {self.last_error}")
        return error is None

    # -- phases -----------------------------------------------------------------------------------------
    async def warmup(self) -> tuple[int, int]:
        """``spec.warmup`` untimed requests spread over the sessions; every session then starts an episode."""
        remaining = self.spec.warmup
        ok = failed = 0

        async def worker(sim: SimSession, count: int) -> None:
            nonlocal ok, failed
            for _ in range(count):
                if sim.retired:
                    break
                if await self.request(sim, record=False):
                    ok += 1
                elif not sim.retired:
                    failed += 1

        if remaining:
            share = [
                remaining // len(self.sims) + (1 if i < remaining % len(self.sims) else 0)
                for i in range(len(self.sims))
            ]
            await _all_or_abort([worker(sim, n) for sim, n in zip(self.sims, share) if n])
            if ok == 0:
                raise BenchAborted(f"all {failed} warmup requests failed; last: {self.last_error}")
        for sim in self.sims:
            sim.new_episode()
        self.consecutive_errors = 0
        return ok, failed

    async def closed_loop(self) -> None:
        async def worker(sim: SimSession) -> None:
            while self.may_issue() and not sim.retired:
                self.issued += 1
                await self.request(sim)
                self.issued -= sim.retired  # a refused request did not count
                if self.spec.think_s > 0 and self.may_issue():
                    await asyncio.sleep(self.spec.think_s)

        await _all_or_abort([worker(sim) for sim in self.sims])

    async def open_loop(self) -> None:
        assert self.spec.request_rate is not None
        idle: asyncio.Queue[SimSession] = asyncio.Queue()
        for sim in self.sims:
            idle.put_nowait(sim)
        tasks: set[asyncio.Task[bool]] = set()
        start = time.perf_counter()
        failure: list[BaseException] = []

        async def one(sim: SimSession, scheduled_at: float) -> bool:
            try:
                return await self.request(sim, scheduled_at=scheduled_at)
            finally:
                if not sim.retired:
                    idle.put_nowait(sim)

        def done(task: asyncio.Task[bool]) -> None:
            tasks.discard(task)
            if not task.cancelled() and task.exception() is not None:
                failure.append(task.exception())

        try:
            for offset in arrival_offsets(self.spec.request_rate, self.spec.arrival, self.spec.seed):
                if failure or not self.may_issue():
                    break
                scheduled_at = start + offset
                delay = scheduled_at - time.perf_counter()
                if delay > 0:
                    await asyncio.sleep(min(delay, max(self.deadline - time.perf_counter(), 0.0)))
                if failure or not self.may_issue():
                    break
                try:
                    sim = await asyncio.wait_for(
                        idle.get(),
                        max(self.deadline - time.perf_counter(), 0.0) if math.isfinite(self.deadline) else None,
                    )
                except asyncio.TimeoutError:
                    break
                if failure:
                    idle.put_nowait(sim)
                    break
                self.issued += 1
                task = asyncio.ensure_future(one(sim, scheduled_at))
                tasks.add(task)
                task.add_done_callback(done)
            if tasks:
                await asyncio.wait(list(tasks))
        finally:
            for task in list(tasks):
                task.cancel()
        if failure:
            raise failure[0]


async def _all_or_abort(coros: list) -> None:
    """Run coroutines concurrently; the first exception cancels the rest and is raised."""
    tasks = [asyncio.ensure_future(c) for c in coros]
    try:
        done, pending = await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
        for task in done:
            if task.exception() is not None:
                raise task.exception()  # type: ignore[misc]
    finally:
        for task in tasks:
            if not task.done():
                task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def run_load(sims: Sequence[SimSession], spec: LoadSpec, *, connect_concurrency: int = 16) -> LoadResult:
    """Connect ``sims``, run the warmup and the timed phase of ``spec``, close, and return the records.

    Raises :class:`BenchAborted` when a session cannot connect or the run turns into nothing but errors.
    """
    if len(sims) != spec.sessions:
        raise ValueError(f"sims: expected {spec.sessions} sessions, got {len(sims)}")
    run = _Run(sims, spec)
    gate = asyncio.Semaphore(connect_concurrency)

    async def connect(sim: SimSession) -> None:
        async with gate:
            try:
                await sim.session.connect()
            except DzGymError as exc:
                raise BenchAborted(f"session {sim.index}: cannot connect to {sim.url}: {exc}") from None

    try:
        await _all_or_abort([connect(sim) for sim in sims])
        warm_ok, warm_failed = await run.warmup()
        reconnects_before = sum(sim.reconnects for sim in sims)
        cpu_start = time.thread_time()
        started_at = time.perf_counter()
        if spec.duration_s is not None:
            run.deadline = started_at + spec.duration_s
        if spec.open_loop:
            await run.open_loop()
        else:
            await run.closed_loop()
        ended_at = max((r.received_at for r in run.records), default=time.perf_counter())
        cpu = time.thread_time() - cpu_start
    finally:
        await asyncio.gather(*(sim.session.close() for sim in sims), return_exceptions=True)
    return LoadResult(
        records=run.records,
        started_at=started_at,
        ended_at=ended_at,
        client_cpu_s=cpu,
        warmup_completed=warm_ok,
        warmup_errors=warm_failed,
        reconnects=sum(sim.reconnects for sim in sims) - reconnects_before,
        admitted_peak=run.admitted_peak,
        refusals=run.refusals,
    )
