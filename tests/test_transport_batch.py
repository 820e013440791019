"""One hand-off for many requests: LoopThread.submit_many and SessionPool.submit_many (real loopback server)."""

from __future__ import annotations

import asyncio

import numpy as np

from dz_gym.server.launch import start_server_thread
from dz_gym.transport import SessionPool
from dz_gym.transport.loop import LoopThread


def test_loop_submit_many_results_and_cancel():
    loop = LoopThread()
    gate = asyncio.Event()
    started = []

    async def value(v):
        return v

    async def blocked():
        started.append(True)
        await gate.wait()
        return "late"

    try:
        futures = loop.submit_many([value(1), value(2), blocked()])
        assert [f.result(30) for f in futures[:2]] == [1, 2]
        futures[2].cancel()  # the task is cancelled on the loop too: it never returns "late"
        assert futures[2].cancelled()
        loop.run(asyncio.sleep(0), 30)
        loop.loop.call_soon_threadsafe(gate.set)
        assert loop.submit(value(3)).result(30) == 3
    finally:
        loop.close()


def test_pool_submit_many_in_order_with_a_bad_request():
    def request_for(i):
        return {"observation/joint_position": np.full(7, 0.1 * i), "prompt": "pick", "session_id": f"episode-{i}"}

    with start_server_thread("hold") as server, SessionPool([server.url], num_sessions=3) as pool:
        pool.connect()
        items = [(2, request_for(2)), (0, "not a request"), (1, request_for(1))]
        outcomes = [f.result(pool.config.request_bound()) for f in pool.submit_many(items)]
        assert [o.index for o in outcomes] == [2, 0, 1]
        assert [o.ok for o in outcomes] == [True, False, True]
        assert "expected a dict or encoded bytes" in str(outcomes[1].error)
        np.testing.assert_allclose(outcomes[0].reply.actions[0, :7], 0.2, rtol=1e-6)


def test_a_round_larger_than_the_trim_threshold_raises_it():
    """A round holding more bytes than the heap's trim threshold raises the threshold to twice the round (so
    the next round reuses the freed buffers instead of faulting them in); nothing needs to be connected."""
    from dz_gym.transport import heap

    if not heap.keep_freed_buffers():
        return  # not glibc, or the user set the thresholds
    payload = bytes(100 * 2**20)
    with SessionPool("ws://127.0.0.1:1", 2) as pool:
        outcomes = [f.result(30) for f in pool.submit_many([(0, payload), (1, payload)])]
    assert not any(o.ok for o in outcomes)  # never connected
    assert heap.trim_threshold() >= min(heap.TRIM_CAP, 400 * 2**20)
