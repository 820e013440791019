"""The FIFO inference engine: order, workers, fault injection, shutdown and counters."""

from __future__ import annotations

import asyncio
import threading

import pytest

from dz_gym.server.engine import InferenceEngine, InjectedFailure


def _run(coro):
    return asyncio.run(asyncio.wait_for(coro, 20))


def test_jobs_run_in_submission_order_with_one_worker():
    engine = InferenceEngine(workers=1)
    engine.start()
    order: list[int] = []

    async def main():
        jobs = [engine.run(lambda i=i: order.append(i) or i) for i in range(50)]
        return await asyncio.gather(*jobs)

    try:
        results = _run(main())
    finally:
        engine.stop()
    assert order == list(range(50))
    assert [r.value for r in results] == list(range(50))
    assert [r.sequence for r in results] == list(range(1, 51))


def test_fail_every_counts_inferences_only_and_keeps_going():
    engine = InferenceEngine(fail_every=3)
    engine.start()

    async def main():
        outcomes = []
        for i in range(7):
            await engine.run(lambda: None, inference=False)  # resets etc. do not count
            try:
                outcomes.append((await engine.run(lambda i=i: i)).value)
            except InjectedFailure:
                outcomes.append("fail")
        return outcomes

    try:
        outcomes = _run(main())
    finally:
        engine.stop()
    assert outcomes == [0, 1, "fail", 3, 4, "fail", 6]
    stats = engine.stats()
    assert (stats.inferences, stats.failures, stats.other_jobs) == (7, 2, 7)


def test_policy_exceptions_reach_the_caller():
    engine = InferenceEngine()
    engine.start()

    def boom():
        raise ValueError("bad request")

    try:
        with pytest.raises(ValueError, match="bad request"):
            _run(engine.run(boom))
    finally:
        engine.stop()
    assert engine.stats().failures == 1


def test_latency_is_a_minimum_service_time_and_counts_as_busy():
    engine = InferenceEngine(latency_s=0.02, jitter_s=0.01, seed=0)
    engine.start()

    async def main():
        return [await engine.run(lambda: None) for _ in range(3)]

    try:
        results = _run(main())
    finally:
        engine.stop()
    assert all(r.service_s >= 0.01 for r in results)
    stats = engine.stats()
    assert stats.busy_s >= 0.03 and 0 < stats.utilization <= 1


def test_stop_fails_queued_jobs_and_refuses_new_ones():
    engine = InferenceEngine()
    engine.start()
    gate = threading.Event()

    async def main():
        first = asyncio.ensure_future(engine.run(lambda: gate.wait(60)))
        queued = asyncio.ensure_future(engine.run(lambda: "never"))
        while engine.queue_depth() < 1:
            await asyncio.sleep(0.001)
        loop = asyncio.get_running_loop()
        stopper = loop.run_in_executor(None, engine.stop, 60)
        with pytest.raises(RuntimeError, match="shutting down"):  # failed by stop() while the first still runs
            await asyncio.wait_for(queued, 60)
        gate.set()
        await stopper
        assert (await first).value is True
        with pytest.raises(RuntimeError, match="shutting down"):
            await engine.run(lambda: None)

    _run(main())


def test_bad_arguments():
    with pytest.raises(ValueError, match="workers"):
        InferenceEngine(workers=0)
    with pytest.raises(ValueError, match="fail_every"):
        InferenceEngine(fail_every=-1)
