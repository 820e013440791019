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
