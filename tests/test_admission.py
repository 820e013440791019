"""Session admission and the announced policy contract, end to end over real loopback websockets.

The reference server with ``--max-sessions K`` refuses sessions beyond K resident (as vLLM-Omni's proposed
``SessionAdmissionError``) and frees them on reset, on a session switch and on disconnect; the evaluator
waits and re-runs refused episodes, so a run with more envs than admitted sessions loses nothing. A server
that announces the robot policy contract is checked against the wrapper before its first request.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path

import numpy as np
import pytest

from dz_gym.errors import HandshakeError, SessionRefused
from dz_gym.records import SESSION_REFUSED, event_of
from dz_gym.server.admission import ResidentSessions
from dz_gym.server.launch import start_server_thread
from dz_gym.server.policies import HoldPolicy
from dz_gym.testing.memory_client import MemoryPolicyClient
from dz_gym.testing.toy_env import ToyDroidEnv
from dz_gym.transport import SessionPool, TransportConfig
from dz_gym.wrapper import DreamZeroPolicyWrapper

pytestmark = pytest.mark.timeout(240)

PATH = "/v1/realtime/robot/openpi"
FAST = TransportConfig(open_timeout=5, request_timeout=20, close_timeout=1, connect_retries=1)


def request(session_id: str) -> dict:
    return {"observation/joint_position": np.zeros(7), "prompt": "pick", "session_id": session_id}


def outcome(pool: SessionPool, i: int, session_id: str):
    return pool.submit(i, request(session_id)).result(30)


def wait_for(predicate, what: str, bound_s: float = 60.0) -> None:
    """Wait until the server has observed what another connection did (``predicate``), within a bound: a
    close or a reset sent without waiting for a reply reaches the server in its own time."""
    done = threading.Event()
    for _ in range(int(bound_s / 0.01)):
        if predicate():
            return
        done.wait(0.01)
    raise AssertionError(f"the server never observed {what} within {bound_s} s")


# ---------------------------------------------------------------------------------------------- server
def test_server_refuses_beyond_the_cap_and_frees_on_reset_switch_and_close():
    with start_server_thread("hold", max_sessions=1) as server, SessionPool(server.url, 3, FAST) as pool:
        (meta, *_) = pool.connect()
        assert meta.contract.max_sessions == 1 and meta.raw["max_sessions"] == 1
        assert outcome(pool, 0, "a").ok
        refused = outcome(pool, 1, "b")
        assert isinstance(refused.error, SessionRefused) and event_of(refused.error) == SESSION_REFUSED
        assert "SessionAdmissionError" in str(refused.error) and pool.is_connected(1)  # the connection stays
        assert outcome(pool, 0, "a2").ok  # a switch on connection 0 frees "a" and takes the place
        assert not outcome(pool, 1, "b").ok
        pool.release(0, "a2").result(10)  # a reset on connection 0 frees its session
        assert outcome(pool, 1, "b").ok
        assert not outcome(pool, 2, "c").ok
        pool.loop.run(pool.session(1).close(), 10)  # closing connection 1 frees "b"...
        wait_for(lambda: len(server.server.sessions) == 0, "the close of connection 1")  # ...once the server sees it
        assert outcome(pool, 2, "c").ok
    stats = server.server.sessions
    assert (stats.peak, stats.admitted, stats.refusals) == (1, 4, 3)


def test_resident_sessions_bookkeeping():
    sessions = ResidentSessions(2)
    assert sessions.admit("a", 1) and sessions.admit("a", 1) and sessions.admit("b", 2)
    assert not sessions.admit("c", 3) and len(sessions) == 2
    sessions.release("a")
    assert sessions.admit("c", 3) and not sessions.admit("d", 4)
    sessions.release_connection(2)
    assert sessions.admit("d", 4) and (sessions.peak, sessions.refusals) == (2, 2)
    with pytest.raises(ValueError, match="max_sessions"):
        ResidentSessions(0)


def test_max_sessions_is_refused_for_flavors_without_sessions():
    from dz_gym.server.app import ServerConfig

    with pytest.raises(ValueError, match="only the vllm-omni flavor"):
        ServerConfig(flavor="openpi", max_sessions=2)


# ---------------------------------------------------------------------------------------------- wrapper
def test_wrapper_waits_for_admission_without_a_tight_loop():
    """Two envs on a server that admits one: the refused env holds and asks again only after its backoff."""
    config = TransportConfig(
        open_timeout=5, request_timeout=20, close_timeout=1, admission_backoff=60.0, admission_backoff_max=60.0
    )
    with start_server_thread("hold", max_sessions=1) as server:
        env = DreamZeroPolicyWrapper(
            ToyDroidEnv(2, max_episode_length=40, image_shape=(18, 32)), server=server.url + PATH, transport=config
        )
        try:
            env.reset(seed=0)
            _, _, _, _, info = env.step()
            refused = [i for i in range(2) if info["integrity_event"][i] == SESSION_REFUSED]
            assert len(refused) == 1 and info["policy_held"][refused[0]]
            i = refused[0]
            assert env.admission_retry_at(i) is not None and env.admission_retry_at(1 - i) is None
            calls = 0
            for _ in range(20):  # no new request from the refused env before its retry time (60 s away)
                _, _, _, _, info = env.step()
                calls += int(info["policy_called"][i])
            assert calls == 0 and server.server.sessions.refusals == 1
            assert env.admitted_sessions == {server.url + PATH: 1}
        finally:
            env.close()


def test_ended_episodes_free_their_sessions_on_the_server():
    """Where the handshake announces a session cap, each ended episode's session is freed with a reset on
    its env's connection: once the last episodes end, nothing of this run stays resident on the server."""
    with start_server_thread("hold", max_sessions=8) as server:
        env = DreamZeroPolicyWrapper(
            ToyDroidEnv(2, max_episode_length=10, image_shape=(18, 32)), server=server.url + PATH, transport=FAST
        )
        try:
            env.reset(seed=0)
            for _ in range(30):  # three episodes per env, the last ones end at step 30
                env.step()
            sessions = server.server.sessions
            wait_for(lambda: len(sessions) == 0, "the releases")  # they are sent without waiting for a reply
            assert sessions.admitted == 6 and sessions.peak == 2
        finally:
            env.close()


# ---------------------------------------------------------------------------------------------- contract
def wrapper_with(metadata: dict, **kwargs):
    meta = {"image_resolution": [18, 32], "needs_session_id": True, "action_space": "joint_position", **metadata}
    client = MemoryPolicyClient(HoldPolicy(), num_envs=2, metadata=meta)
    return DreamZeroPolicyWrapper(ToyDroidEnv(2, max_episode_length=10, image_shape=(18, 32)), client=client, **kwargs)


@pytest.mark.parametrize(
    ("metadata", "kwargs", "words"),
    [
        ({"action_dim": 7}, {}, ["action_dim=7", "8 values"]),
        ({"action_horizon": 24}, {"open_loop_horizon": 32}, ["action_horizon=24", "open-loop horizon is 32"]),
        ({"max_action_horizon": 16}, {"open_loop_horizon": 20}, ["max_action_horizon=16", "20"]),
        ({"action_keys": ["eef", "gripper"]}, {}, ["action_keys=['eef', 'gripper']", "'actions'"]),
    ],
)
def test_contract_mismatch_is_one_line_naming_both(metadata, kwargs, words):
    with pytest.raises(HandshakeError) as info:
        wrapper_with(metadata, **kwargs)
    text = str(info.value)
    assert "\n" not in text and all(word in text for word in words), text


def test_announced_horizon_is_used_where_none_is_set():
    env = wrapper_with({"action_horizon": 24, "default_action_horizon": 24, "max_action_horizon": 32})
    assert env.open_loop_horizon == 8  # the DROID default when the server's chunks are longer
    env.close()
    env = wrapper_with({"default_action_horizon": 24, "max_action_horizon": 32}, open_loop_horizon=12)
    assert env.open_loop_horizon == 12  # a horizon the user set wins
    env.close()


def test_shorter_announced_chunks_shorten_the_default_horizon():
    class Short(HoldPolicy):
        def infer(self, request, *, session_id, new_session):
            return super().infer(request, session_id=session_id, new_session=new_session)[:4]

    meta = {"image_resolution": [18, 32], "action_horizon": 4, "action_dim": 8}
    client = MemoryPolicyClient(Short(), num_envs=2, metadata=meta)
    env = DreamZeroPolicyWrapper(ToyDroidEnv(2, max_episode_length=10, image_shape=(18, 32)), client=client)
    try:
        assert env.open_loop_horizon == 4
        env.reset(seed=0)
        called = []
        for _ in range(9):
            _, _, _, _, info = env.step()
            assert all(e is None for e in info["policy_error"])
            called.append(bool(info["policy_called"][0]))
        assert [k for k, c in enumerate(called) if c] == [0, 4, 8]
    finally:
        env.close()


def test_reply_of_another_horizon_than_announced_is_a_protocol_error():
    env = wrapper_with({"action_horizon": 16})  # the hold policy replies 24 rows
    try:
        env.reset(seed=0)
        _, _, _, _, info = env.step()
        assert info["integrity_event"].tolist() == ["protocol_error"] * 2
        assert "expected horizon 16" in info["policy_error"][0]
    finally:
        env.close()


# ---------------------------------------------------------------------------------------------- evaluator
def rows_of(root: Path) -> list[dict]:
    (run,) = [p for p in root.iterdir() if p.is_dir()]
    lines = (run / "episodes.jsonl").read_text().splitlines()
    return sorted((json.loads(line) for line in lines), key=lambda r: r["episode"])


STABLE = ("episode", "seed", "steps", "server_calls", "error", "error_event", "success_at_end", "success_any_step")


@pytest.mark.slow  # about 13 s on 2 cores; runs in the first environment's pass
def test_eval_with_more_envs_than_admitted_sessions_loses_no_episode(tmp_path, caplog):
    """8 envs, a server that admits 2 sessions: every episode completes, none errored, and the rows equal
    those of a run on a server without a cap (the refused episodes ran later, with their own seeds)."""
    from dz_gym.eval import cli

    base = ["--num-envs", "8", "--episodes", "8", "--max-steps", "8", "--no-progress", "--no-video"]
    assert cli.main([*base, "--serve-arg=--max-sessions=2", "--output-root", str(tmp_path / "capped")]) == 0
    said = [r.getMessage() for r in caplog.records if "refused a new session" in r.getMessage()]
    assert len(said) == 1 and "with 2 of this run's sessions admitted" in said[0], said  # said once
    capped = rows_of(tmp_path / "capped")
    assert [r["episode"] for r in capped] == list(range(8))
    assert all(r["error"] is None and r["steps"] == 8 and r["server_calls"] == 1 for r in capped)
    assert cli.main([*base, "--output-root", str(tmp_path / "free")]) == 0
    free = rows_of(tmp_path / "free")
    assert [{k: r[k] for k in STABLE} for r in capped] == [{k: r[k] for k in STABLE} for r in free]


def test_bench_reports_admitted_sessions(tmp_path):
    from dz_gym.bench import cli

    out = tmp_path / "bench.json"
    with start_server_thread("hold", max_sessions=2) as server:
        argv = ["--server", server.url, "--concurrency", "4", "--num-requests", "12", "--warmup", "0"]
        assert cli.main([*argv, "--json", str(out), "--quiet"]) == 0
    run = json.loads(out.read_text())
    run = run["runs"][0] if "runs" in run else run
    assert run["admitted_sessions"] == 2 and run["admission_refusals"] == 2
    assert run["completed"] == 12 and run["failed"] == 0
