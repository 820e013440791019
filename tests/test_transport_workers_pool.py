"""ProcessSessionPool: the sessions in worker processes give SessionPool's outcomes (loopback servers only).

Requests against the reference server through 2 workers equal the in-process pool's; the bytes written into
the shared-memory arena (or sent through the pipe) are packb's; a partial connect failure, a server error or a
killed worker touch only their own sessions; closing joins the workers and unlinks the shared memory; the
evaluator gives the same rows with ``--transport-processes 2``.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import json
import os
import signal
from pathlib import Path

import numpy as np
import pytest

from dz_gym.errors import ConnectionLost, ProtocolError, ServerError
from dz_gym.protocol import packb
from dz_gym.protocol.packer import RELEASING_COPY_BYTES, fast_parts, pieces_size, write_pieces
from dz_gym.server.launch import start_server_thread
from dz_gym.server.policies import load_policy
from dz_gym.testing.gated import GatedPolicy
from dz_gym.testing.servers import ServerThread, free_port, gather, good, replying
from dz_gym.transport import ProcessSessionPool, SessionPool, TransportConfig, open_pool
from dz_gym.transport.session import request_pieces
from dz_gym.transport.workers.pool import PARALLEL_COPY_BYTES

pytestmark = pytest.mark.timeout(120)

FAST = TransportConfig(open_timeout=5, request_timeout=30, close_timeout=2, connect_retries=0)
BOUND_S = 60.0


def dz_request(k: int, image: bool = True) -> dict:
    request = {
        "observation/joint_position": np.full(7, 0.01 * k),
        "observation/gripper_position": np.zeros(1),
        "prompt": "put the cube in the bowl",
        "session_id": f"episode-{k}",
    }
    if image:
        request["observation/exterior_image_0_left"] = np.full((180, 320, 3), k % 256, dtype=np.uint8)
    return request


def shm_exists(name: str) -> bool:
    return Path("/dev/shm", name.lstrip("/")).exists()


def same_reply(a, b) -> None:
    assert (a is None) == (b is None)
    if a is None:
        return
    for field in dataclasses.fields(a):
        x, y = getattr(a, field.name), getattr(b, field.name)
        if isinstance(x, np.ndarray):
            np.testing.assert_array_equal(x, y)
            assert x.dtype == y.dtype
        else:
            assert x == y, field.name


# ------------------------------------------------------------------------------------------ encoding
@pytest.mark.parametrize(
    "value",
    [
        dz_request(3),
        {"x": np.arange(12, dtype=np.float32).reshape(3, 4)[:, ::2], "s": np.array(["ab", "c"]), "n": [1, None]},
        {"t": np.array(["2020-01-01"], dtype="datetime64[D]"), "b": b"raw"},  # msgpack's general path
        {"g": np.float32(2.5), "z": np.array(7), "flag": np.array([True, False])},
        {"big": np.arange(3 * RELEASING_COPY_BYTES, dtype=np.uint8)[::3], "after": b"x" * 5},  # numpy's copy
    ],
)
def test_pieces_written_into_a_buffer_are_packb_bytes(value):
    parts = fast_parts(value)
    assert parts is None or b"".join(parts) == packb(value)  # the parts a worker joins by reference
    pieces = request_pieces(value)
    buffer = bytearray(pieces_size(pieces) + 100)
    end = write_pieces(pieces, buffer, 37)
    assert bytes(buffer[37:end]) == packb(value) and end - 37 == len(packb(value))
    with pytest.raises(ValueError, match="buffer"):
        write_pieces(pieces, bytearray(3))


@pytest.mark.parametrize("arena_bytes", [None, 0])  # the arena, or (no room at all) the pipe
def test_the_server_receives_packb_bytes(arena_bytes):
    frames: list[bytes] = []

    def reply(frame, n):
        frames.append(bytes(frame))
        return {"actions": np.zeros((24, 8), dtype=np.float32)}

    kwargs = {} if arena_bytes is None else {"arena_bytes": arena_bytes}
    requests = {i: dz_request(i) for i in range(4)}
    with (
        ServerThread(replying(reply)) as server,
        ProcessSessionPool(server.url, 4, FAST, processes=2, **kwargs) as pool,
    ):
        pool.connect()
        outcomes = gather(pool, requests, BOUND_S)
        assert bool(pool.shared_memory_names()) == (arena_bytes is None)
    assert all(o.ok for o in outcomes.values())
    assert sorted(frames) == sorted(packb(r) for r in requests.values())


def test_a_large_batch_is_written_by_one_thread_per_worker_and_arrives_intact():
    """A submit_many over PARALLEL_COPY_BYTES: each worker's requests written on a copier thread (numpy copies
    for the large pieces), every frame still packb's bytes, the caller's arrays free to change on return."""
    frames: list[bytes] = []

    def reply(frame, n):
        frames.append(bytes(frame))
        return {"actions": np.zeros((24, 8), dtype=np.float32)}

    def big(k):
        request = dz_request(k)
        for key in ("observation/exterior_image_1_left", "observation/wrist_image_left"):
            request[key] = np.full((180, 320, 3), (3 * k + len(key)) % 256, dtype=np.uint8)
        return request

    requests = {i: big(i) for i in range(24)}
    expected = sorted(packb(r) for r in requests.values())
    assert sum(len(e) for e in expected) >= PARALLEL_COPY_BYTES
    with ServerThread(replying(reply)) as server, ProcessSessionPool(server.url, 24, FAST, processes=3) as pool:
        pool.connect()
        futures = pool.submit_many(list(requests.items()))
        for request in requests.values():  # the bytes were taken before submit_many returned
            request["observation/exterior_image_0_left"][:] = 255
        concurrent.futures.wait(futures, timeout=BOUND_S)
        assert all(f.done() and f.result().ok for f in futures)
        assert pool._copiers, "the batch was written on the copier threads"
    assert sorted(frames) == expected


def test_the_workers_sends_reach_the_profiler_and_their_cpu_is_the_transports():
    from dz_gym.profiling import StageProfiler

    profiler = StageProfiler()
    with start_server_thread("hold") as server, ProcessSessionPool(server.url, 4, FAST, processes=2) as pool:
        pool.connect()
        before = pool.transport_cpu_s()
        pool.set_profiler(profiler)
        outcomes = gather(pool, {i: dz_request(i) for i in range(4)}, BOUND_S)
        after = pool.transport_cpu_s()
    assert all(o.ok for o in outcomes.values())
    assert profiler.total("send") > 0 and profiler.total("receive_decode") > 0
    assert before is not None and after is not None and after >= before >= 0


# ------------------------------------------------------------------------------ the same as SessionPool
def test_outcomes_and_metadata_equal_the_in_process_pool():
    with start_server_thread("hold") as a, start_server_thread("hold") as b:
        urls = [a.url, b.url]
        requests = [(i, dz_request(i, image=i % 2 == 0)) for i in range(6)]
        results = {}
        for name, make in (("in", SessionPool), ("procs", lambda *args: ProcessSessionPool(*args, processes=2))):
            with make(urls, 6, FAST) as pool:
                metadata = pool.connect()
                assert [pool.url(i) for i in range(6)] == [urls[i % 2] for i in range(6)]
                futures = pool.submit_many(requests)
                results[name] = (
                    metadata,
                    [f.result(BOUND_S) for f in futures],
                    [pool.is_connected(i) for i in range(6)],
                )
    (meta_in, out_in, conn_in), (meta_p, out_p, conn_p) = results["in"], results["procs"]
    assert meta_in == meta_p and conn_in == conn_p == [True] * 6
    for x, y in zip(out_in, out_p):
        assert (x.index, x.ok, x.request_bytes, x.reconnects, x.retries) == (y.index, y.ok, y.request_bytes, 0, 0)
        same_reply(x.reply, y.reply)
        assert y.sent_at <= y.received_at


def test_partial_connect_failure_keeps_the_others():
    dead = f"ws://127.0.0.1:{free_port()}"
    with ServerThread(good()) as server, ProcessSessionPool([server.url, dead], 4, FAST, processes=3) as pool:
        assert pool.processes == 3
        with pytest.raises(Exception) as info:
            pool.connect()
        err = info.value
        assert type(err).__name__ == "PartialConnectError"
        assert sorted(err.connected) == [0, 2] and sorted(err.errors) == [1, 3]
        assert all(isinstance(e, ConnectionLost) for e in err.errors.values())
        assert [pool.is_connected(i) for i in range(4)] == [True, False, True, False]
        outcomes = gather(pool, {i: dz_request(i, image=False) for i in range(4)}, BOUND_S)
    assert outcomes[0].ok and outcomes[2].ok
    assert isinstance(outcomes[1].error, ConnectionLost) and outcomes[1].reply is None


def test_server_errors_come_back_as_in_process_and_touch_no_other_session():
    bad = replying(lambda frame, n: b"\xc1\xc1 not msgpack")
    with start_server_thread("hold") as ok, start_server_thread("hold", flavor="vllm-omni", fail_every=1) as failing:
        with ServerThread(bad) as garbage:
            urls = [ok.url, failing.url, garbage.url]
            errors = {}
            for name, make in (("in", SessionPool), ("procs", lambda *args: ProcessSessionPool(*args, processes=2))):
                with make(urls, 6, FAST) as pool:
                    pool.connect()
                    outcomes = gather(pool, {i: dz_request(i) for i in range(6)}, BOUND_S)
                    assert outcomes[0].ok and outcomes[3].ok
                    errors[name] = {i: outcomes[i].error for i in (1, 2, 4, 5)}
                    connected = [pool.is_connected(i) for i in range(6)]
                    assert connected == [True, True, False, True, True, False]  # garbage breaks its sessions
                    again = gather(pool, {0: dz_request(0), 3: dz_request(3)}, BOUND_S)
                    assert again[0].ok and again[3].ok
    for i, error in errors["procs"].items():
        expected = errors["in"][i]
        assert type(error) is type(expected) and str(error) == str(expected)
    assert isinstance(errors["procs"][1], ServerError) and errors["procs"][1].fatal is False
    assert errors["procs"][1].message == errors["in"][1].message and errors["procs"][1].code == errors["in"][1].code
    assert isinstance(errors["procs"][2], ProtocolError)


# --------------------------------------------------------------------------------------- dead workers
def test_a_killed_worker_fails_its_requests_at_once_and_the_others_complete():
    gated = GatedPolicy(load_policy("hold"), free=0)
    with start_server_thread(gated) as server, ProcessSessionPool(server.url, 4, FAST, processes=2) as pool:
        pool.connect()
        futures = pool.submit_many([(i, dz_request(i)) for i in range(4)])
        gated.held.wait(BOUND_S)
        victim = pool.worker_pid(1)
        assert victim is not None and pool.worker_pid(3) == victim and pool.worker_pid(0) != victim
        os.kill(victim, signal.SIGKILL)
        for i in (1, 3):  # the server still holds every reply: these fail because their worker died
            outcome = futures[i].result(BOUND_S)
            assert isinstance(outcome.error, ConnectionLost) and "exited" in str(outcome.error)
        assert not futures[0].done() and not futures[2].done()
        assert not pool.is_connected(1) and pool.is_connected(0)
        assert isinstance(pool.submit(3, dz_request(3)).result(BOUND_S).error, ConnectionLost)
        gated.open()
        assert futures[0].result(BOUND_S).ok and futures[2].result(BOUND_S).ok
        # reconnect restarts the dead worker; its other session reconnects on its own call
        pool.reconnect(1)
        assert pool.worker_pid(1) not in (None, victim)
        assert pool.is_connected(1) and not pool.is_connected(3)
        assert pool.submit(1, dz_request(1)).result(BOUND_S).ok
        pool.reconnect(3)
        assert pool.submit(3, dz_request(3)).result(BOUND_S).ok


def test_a_message_the_table_does_not_declare_stops_its_worker_and_only_its_sessions():
    """A worker that reads a message of an undeclared kind logs why and exits: its requests fail as a dead
    worker's do, the other worker's go on, and a reconnect starts it again."""
    gated = GatedPolicy(load_policy("hold"), free=0)
    with start_server_thread(gated) as server, ProcessSessionPool(server.url, 2, FAST, processes=2) as pool:
        pool.connect()
        futures = pool.submit_many([(i, dz_request(i)) for i in range(2)])
        gated.held.wait(BOUND_S)
        worker = pool._workers[1]
        worker.send_message(["sendx", 1])  # what no parent of this code sends
        worker.reader.join(BOUND_S)  # the worker exited and its reader saw the pipe close
        assert pool.worker_pid(1) is None and not pool.is_connected(1)
        assert isinstance(futures[1].result(BOUND_S).error, ConnectionLost)  # its connection closed as it went
        assert not futures[0].done() and pool.is_connected(0)
        gated.open()
        assert futures[0].result(BOUND_S).ok
        pool.reconnect(1)
        assert pool.submit(1, dz_request(1)).result(BOUND_S).ok


def test_restarts_are_bounded():
    with ServerThread(good()) as server, ProcessSessionPool(server.url, 2, FAST, processes=2, max_restarts=0) as pool:
        pool.connect()
        pid = pool.worker_pid(1)
        os.kill(pid, signal.SIGKILL)
        assert isinstance(pool.submit(1, dz_request(1)).result(BOUND_S).error, ConnectionLost)
        with pytest.raises(Exception, match="restarted too often") as info:
            pool.reconnect(1)
        assert type(info.value).__name__ == "WorkerError"
        assert pool.submit(0, dz_request(0)).result(BOUND_S).ok


# ------------------------------------------------------------------------------------------ teardown
def test_close_joins_the_workers_unlinks_shared_memory_and_is_idempotent():
    with ServerThread(good()) as server:
        pool = ProcessSessionPool(server.url, 3, FAST, processes=2)
        pool.connect()
        assert all(o.ok for o in gather(pool, {i: dz_request(i) for i in range(3)}, BOUND_S).values())
        names = pool.shared_memory_names()
        processes = [w.process for w in pool._workers]
        assert names and all(shm_exists(n) for n in names)
        pool.close()
        pool.close()
    assert pool.closed and not any(shm_exists(n) for n in names)
    assert all(not p.is_alive() and p.exitcode == 0 for p in processes)
    with pytest.raises(RuntimeError, match="closed"):
        pool.submit(0, dz_request(0))


def test_config_and_factory():
    with pytest.raises(ValueError, match="processes"):
        TransportConfig(processes=-1)
    with pytest.raises(ValueError, match="processes"):
        ProcessSessionPool("ws://127.0.0.1:1", 2, processes=0)
    with open_pool("ws://127.0.0.1:1", 2, TransportConfig()) as pool:
        assert type(pool) is SessionPool
    with open_pool("ws://127.0.0.1:1", 3, TransportConfig(processes=5)) as pool:
        assert type(pool) is ProcessSessionPool and pool.processes == 3  # at most one per session


# ---------------------------------------------------------------------------------------- the evaluator
@pytest.mark.slow
def test_evaluator_rows_with_transport_processes_equal_the_in_process_run(tmp_path, capsys):
    pytest.importorskip("mujoco")
    from dz_gym.eval import cli
    from dz_gym.eval.row import PLACEMENT, comparable
    from dz_gym.eval.rundir import RunDir

    base = ["--num-envs", "4", "--episodes", "4", "--max-steps", "16", "--no-progress", "--no-video", "--no-report"]
    rows, summaries = {}, {}
    for name, extra in (("in", []), ("procs", ["--transport-processes", "2"])):
        root = tmp_path / name
        assert cli.main([*base, *extra, "--output-root", str(root)]) == 0
        said = capsys.readouterr()
        assert ("transport: 2 worker processes a connection pool" in said.out + said.err) == bool(extra)
        (path,) = [p for p in root.iterdir() if p.is_dir()]
        run = RunDir(path)
        rows[name] = comparable(run.read_rows(), ignore=PLACEMENT)
        summaries[name] = json.loads((run.path / "summary.json").read_text())["overall"]
    assert len(rows["in"]) == 4 and rows["in"] == rows["procs"]
    for key in ("episodes", "errored", "success_at_end", "success_any_step", "server_calls"):
        assert summaries["in"][key] == summaries["procs"][key], key


def test_the_evaluator_builds_a_process_pool_for_transport_processes():
    from dz_gym.eval.config import EvalConfig
    from dz_gym.eval.scene import policy_client

    urls = ["ws://127.0.0.1:1"] * 4
    assert policy_client(EvalConfig(num_envs=4, backend="mujoco"), urls) is None  # the wrapper's SessionPool
    config = EvalConfig(num_envs=4, backend="mujoco", transport_processes=2)
    assert config.transport_config().processes == 2
    client = policy_client(config, urls)
    try:
        assert type(client) is ProcessSessionPool and client.processes == 2
    finally:
        client.close()
    with pytest.raises(ValueError, match="transport_processes"):
        EvalConfig(num_envs=4, backend="mujoco", transport_processes=-1)


def test_auto_processes_grows_with_the_sessions_within_the_cores():
    """One worker per 64 sessions, at most one per core and 8, none below two or on fewer than 4 cores."""
    from dz_gym.spawning import usable_cores
    from dz_gym.transport.config import auto_processes

    table = {(8, 2): 0, (1024, 2): 0, (1024, 3): 0, (127, 16): 0, (128, 16): 2, (192, 4): 3, (256, 16): 4,
             (512, 16): 8, (1024, 16): 8, (1024, 8): 8, (1024, 4): 4, (4096, 128): 8, (1024, 5): 5}  # fmt: skip
    assert {key: auto_processes(key[0], cores=key[1]) for key in table} == table
    assert usable_cores() >= 1 and auto_processes(10**6) <= 8


def test_the_evaluator_chooses_its_worker_processes_when_none_are_given(monkeypatch):
    """``transport_processes`` None (the default, TransportConfig's): ``auto_processes`` of each pool's envs on
    this machine's cores, shared by an A/B run's two pools; an explicit count, 0 included, is kept; config.json
    keeps None."""
    from dz_gym.eval.config import EvalConfig
    from dz_gym.eval.scene import policy_client
    from dz_gym.transport import config as config_module

    monkeypatch.setattr(config_module, "usable_cores", lambda: 16)
    assert EvalConfig.default("transport_processes") is None
    big = EvalConfig(num_envs=1024, backend="mujoco")
    assert big.transport_process_count() == big.transport_config().process_count(1024) == 8
    assert EvalConfig.from_dict(big.to_dict()).transport.processes is None
    ab = EvalConfig(num_envs=1024, backend="mujoco", policy_b="hold")
    assert ab.transport_process_count() == 8  # 512 envs a pool, 8 cores a pool
    monkeypatch.setattr(config_module, "usable_cores", lambda: 8)
    assert ab.transport_process_count() == 4 and big.transport_process_count() == 8
    assert EvalConfig(num_envs=64, backend="mujoco").transport_process_count() == 0
    assert EvalConfig(num_envs=1024, backend="mujoco", transport_processes=0).transport_process_count() == 0
    monkeypatch.setattr(config_module, "usable_cores", lambda: 2)
    assert policy_client(EvalConfig(num_envs=1024, backend="mujoco"), ["ws://127.0.0.1:1"] * 1024) is None
    monkeypatch.setattr(config_module, "usable_cores", lambda: 4)
    client = policy_client(EvalConfig(num_envs=128, backend="mujoco"), ["ws://127.0.0.1:1"] * 128)
    try:
        assert type(client) is ProcessSessionPool and client.processes == 2
    finally:
        client.close()
