"""The caller's cost of request rounds in-process vs over worker processes (:class:`ProcessSessionPool`).

N sessions (256 and 1024) send rounds of N requests, each three 180x320x3 uint8 views plus the small arrays,
to ``dz-gym-serve --policy hold`` in a process of its own (vLLM-Omni's route: sessions by id on one server).
For each client -- :class:`~dz_gym.transport.SessionPool` (the baseline) and
:class:`~dz_gym.transport.ProcessSessionPool` with 2 and 4 workers -- it runs two warm-up rounds, then
``--rounds`` measured ones, and prints per request the calling thread's CPU (encoding and hand-off; waiting
costs none), this process's CPU (all its threads: the in-process pool's loop thread too, not the workers)
and the round's wall time, with each one's ratio to the baseline of the same N. The wall time includes the
server's own decoding, which on a small machine shares the cores with the client and its workers. The rows
"views shared" first copy each round's views into the pool's view memory (as the wrapper copies a GPU batch's
views from the GPU; that copy, ``views_copy_ms``, is outside the measured round): the requests then go to the
workers by reference, with nothing copied by ``submit_many``. The rows "batch" give the round as the wrapper
builds it, a :class:`~dz_gym.protocol.request_batch.RequestBatch` (its views in the view memory where the pool
has one; building it is ``views_copy_ms``, outside the round): the in-process pool joins each frame from the
batch's template, the worker processes frame the requests themselves.

Usage: python benchmarks/bench_processes.py [--num-envs 256 1024] [--rounds 4] [--processes 2 4]
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np

from dz_gym.server.launch import start_server_process
from dz_gym.transport import ProcessSessionPool, SessionPool, TransportConfig

PATH = "/v1/realtime/robot/openpi"
VIEWS = ("observation/exterior_image_0_left", "observation/exterior_image_1_left", "observation/wrist_image_left")
VIEW_SHAPE = (180, 320, 3)
SOURCES = 64  # distinct image sets (33 MB: more than the caches hold), cycled over the sessions
WARMUP_ROUNDS = 2


def requests_for(num: int, round_k: int) -> list[tuple[int, dict]]:
    rng = np.random.default_rng(0)
    images = [[rng.integers(0, 255, (180, 320, 3), dtype=np.uint8) for _ in VIEWS] for _ in range(SOURCES)]
    return [
        (
            i,
            {
                **dict(zip(VIEWS, images[i % SOURCES])),
                "observation/joint_position": np.full(7, 0.01 * i),
                "observation/gripper_position": np.zeros(1),
                "prompt": "put the cube in the bowl",
                "session_id": f"env{i}-round{round_k}",
            },
        )
        for i in range(num)
    ]


def one_round(pool, items, batch: bool = False) -> tuple[float, float, float]:
    """(caller thread CPU, process CPU, wall) of one round, in seconds: ``items`` as ``(i, dict)`` pairs
    (``submit_many``), or with ``batch`` a RequestBatch of the wrapper's (``submit_batch``)."""
    thread0, cpu0, wall0 = time.thread_time(), time.process_time(), time.perf_counter()
    futures = pool.submit_batch(items, items.env_ids) if batch else pool.submit_many(items)
    outcomes = [f.result(300) for f in futures]
    thread, cpu, wall = time.thread_time() - thread0, time.process_time() - cpu0, time.perf_counter() - wall0
    failed = [o for o in outcomes if not o.ok]
    if failed:
        raise SystemExit(f"{len(failed)} request(s) failed; first: {failed[0].error}")
    return thread, cpu, wall


def into_view_memory(pool: ProcessSessionPool, items: list[tuple[int, dict]]) -> float:
    """Move the round's views into one block of the pool's view memory (where the wrapper copies a GPU batch's
    views to); the seconds the copy took (on a GPU host that copy is the GPU's, which it is anyway)."""
    start = time.perf_counter()
    size = int(np.prod(VIEW_SHAPE))
    block = pool.host_views.alloc(len(items) * len(VIEWS) * size)
    if block is None:
        raise SystemExit("no room in the view memory")
    slots = block.reshape(len(items), len(VIEWS), *VIEW_SHAPE)
    for row, (_, request) in enumerate(items):
        for j, key in enumerate(VIEWS):
            slots[row, j] = request[key]
            request[key] = slots[row, j]
    return time.perf_counter() - start


def as_batch(pool, items: list[tuple[int, dict]]):
    """The round as the wrapper builds it: a RequestBatch whose views lie in one block of the pool's view memory
    (where the pool has one), framed from its template (by the workers), for ``submit_batch``."""
    from dz_gym.envs import droid
    from dz_gym.requests import assemble_requests

    num, size = len(items), int(np.prod(VIEW_SHAPE))
    memory = getattr(pool, "host_memory", None)
    block = memory(num * len(VIEWS) * size) if memory is not None else None
    block = np.empty(num * len(VIEWS) * size, np.uint8) if block is None else block
    cams = block.reshape(len(VIEWS), num, *VIEW_SHAPE)
    for row, (_, request) in enumerate(items):
        for j, key in enumerate(VIEWS):
            cams[j, row] = request[key]
    joints = np.stack([request["observation/joint_position"] for _, request in items])
    gripper = np.stack([request["observation/gripper_position"] for _, request in items])
    batch = assemble_requests(dict(zip(droid.CAMERA_KEYS, cams)), joints, gripper, range(num),
                              prompts=[r["prompt"] for _, r in items], session_ids=[r["session_id"] for _, r in items])  # fmt: skip
    return batch


def measure(url: str, num: int, processes: int, rounds: int, shared: bool = False, batch: bool = False) -> dict:
    config = TransportConfig(request_timeout=120)
    pool = (
        SessionPool(url, num, config) if processes == 0 else ProcessSessionPool(url, num, config, processes=processes)
    )
    with pool:
        pool.connect()
        totals, gather = np.zeros(3), 0.0
        for k in range(WARMUP_ROUNDS + rounds):
            items = requests_for(num, k)
            start = time.perf_counter()
            if batch:
                items = as_batch(pool, items)
            copy_s = into_view_memory(pool, items) if shared else time.perf_counter() - start
            result = one_round(pool, items, batch)
            del items  # the views' block is free once the workers took it and these are gone
            if k >= WARMUP_ROUNDS:
                totals += result
                gather += copy_s
    thread, cpu, wall = totals / rounds
    client = "in-process" if processes == 0 else f"processes={processes}"
    return {
        "num_envs": num,
        "client": client + (", views shared" if shared else "") + (", batch" if batch else ""),
        "caller_cpu_ms_per_request": thread / num * 1e3,
        "process_cpu_ms_per_request": cpu / num * 1e3,
        "round_ms": wall * 1e3,
        "views_copy_ms": gather / rounds * 1e3,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num-envs", type=int, nargs="+", default=[256, 1024])
    parser.add_argument("--rounds", type=int, default=4, help="measured rounds per client (default 4)")
    parser.add_argument("--processes", type=int, nargs="+", default=[2, 4])
    args = parser.parse_args()
    server = start_server_process(["--policy", "hold", "--workers", "8", "--quiet"], timeout=60)
    try:
        for num in args.num_envs:
            base = None
            arms = [(0, False, False)] + [(p, False, False) for p in args.processes]
            arms += [(p, True, False) for p in args.processes] + [(0, False, True)]
            arms += [(p, False, True) for p in args.processes]
            for processes, shared, batch in arms:
                row = measure(server.url + PATH, num, processes, args.rounds, shared, batch)
                base = base or row
                for key in ("caller_cpu_ms_per_request", "process_cpu_ms_per_request", "round_ms"):
                    row[key.replace("_ms", "") + "_ratio"] = row[key] / base[key]
                print(json.dumps({k: round(v, 3) if isinstance(v, float) else v for k, v in row.items()}), flush=True)
    finally:
        server.stop(10)


if __name__ == "__main__":
    main()
