"""DreamZeroPolicyWrapper against the reference server, on the Isaac stand-in (torch) and the embedded sim (numpy)."""

from __future__ import annotations

import threading
import time
import uuid
import warnings

import gymnasium as gym
import numpy as np
import pytest
import torch
from gymnasium.vector import AutoresetMode

from dz_gym.envs import droid
from dz_gym.errors import HandshakeError
from dz_gym.records import EpisodeStats
from dz_gym.server.launch import start_server_thread
from dz_gym.server.policies import DREAMZERO_METADATA
from dz_gym.testing.isaac_standin import IsaacDroidStandIn, decode_stamp
from dz_gym.transport import TransportConfig
from dz_gym.wrapper import DreamZeroPolicyWrapper

PATH = "/v1/realtime/robot/openpi"
FAST = TransportConfig(open_timeout=5.0, connect_retries=1, request_timeout=20.0)


class RecordingPolicy:
    """Records every request; answers a chunk that is a deterministic function of the request."""

    def __init__(self, delay_s: float = 0.0, metadata: dict | None = None, barrier: threading.Barrier | None = None):
        self.metadata = dict(DREAMZERO_METADATA if metadata is None else metadata)
        self.delay_s = delay_s
        self.barrier = barrier  # every call waits until `parties` calls are in service at once
        self.fail_sessions: set[str] = set()
        self.fatal = False
        self.calls: list[dict] = []
        self._lock = threading.Lock()

    def infer(self, request: dict, *, session_id: str, new_session: bool) -> np.ndarray:
        start = time.perf_counter()
        record = {
            key: (np.array(value, copy=True) if isinstance(value, np.ndarray) else value)
            for key, value in request.items()
        }
        call = {"request": record, "session_id": session_id, "start": start}
        with self._lock:
            self.calls.append(call)
        if session_id in self.fail_sessions:
            raise RuntimeError(f"injected failure for {session_id}")
        if self.barrier is not None:
            self.barrier.wait()  # raises BrokenBarrierError (a server error) if the calls do not overlap
        if self.delay_s:
            time.sleep(self.delay_s)  # server latency, for the tests of latency hiding
        joints = np.asarray(request["observation/joint_position"], dtype=np.float32)
        chunk = np.zeros((droid.ACTION_HORIZON, droid.ACTION_DIM), dtype=np.float32)
        chunk[:, :7] = joints + 0.01 * np.arange(1, droid.ACTION_HORIZON + 1)[:, None]
        chunk[:, 7] = np.where(np.arange(droid.ACTION_HORIZON) % 3 == 0, 0.9, 0.2)  # binarized by clients
        call["end"] = time.perf_counter()
        return chunk


@pytest.fixture
def recording_server():
    handles = []

    def start(policy: RecordingPolicy, **fields):
        handle = start_server_thread(policy, **fields)
        handles.append(handle)
        return handle

    yield start
    for handle in handles:
        handle.stop()


def make_wrapper(env, url, **kwargs):
    kwargs.setdefault("transport", FAST)
    return DreamZeroPolicyWrapper(env, server=url + PATH, **kwargs)


def reference_single_env_rollout(url: str, env: IsaacDroidStandIn, steps: int, prompt: str) -> list[np.ndarray]:
    """The reference single-env client's logic (openpi-client preprocessing and codec, sync websockets)."""
    import websockets.sync.client
    from openpi_client import image_tools, msgpack_numpy

    with websockets.sync.client.connect(url + PATH, compression=None, max_size=None) as conn:
        assert isinstance(msgpack_numpy.unpackb(conn.recv()), dict)
        packer = msgpack_numpy.Packer()
        session_id = str(uuid.uuid4())
        completed, chunk, executed = 0, None, []
        obs, _ = env.reset(seed=0)
        for _ in range(steps):
            policy = obs["policy"]
            right = policy["external_cam"][0].clone().detach().cpu().numpy()
            left = policy["external_cam_2"][0].clone().detach().cpu().numpy()
            wrist = policy["wrist_cam"][0].clone().detach().cpu().numpy()
            joints = policy["arm_joint_pos"][0].clone().detach().cpu().numpy()  # upstream's (7,) env-0 term
            gripper = policy["gripper_pos"][0].clone().detach().cpu().numpy()
            if completed == 0 or completed >= 8 or chunk is None:
                completed = 0
                request = {
                    "observation/exterior_image_0_left": image_tools.resize_with_pad(right, 180, 320),
                    "observation/exterior_image_1_left": image_tools.resize_with_pad(left, 180, 320),
                    "observation/wrist_image_left": image_tools.resize_with_pad(wrist, 180, 320),
                    "observation/joint_position": joints.astype(np.float64),
                    "observation/cartesian_position": np.zeros((6,), dtype=np.float64),
                    "observation/gripper_position": gripper.astype(np.float64),
                    "prompt": prompt,
                    "session_id": session_id,
                    "endpoint": "infer",
                }
                conn.send(packer.pack(request))
                chunk = np.asarray(msgpack_numpy.unpackb(conn.recv()), dtype=np.float32)
            action = np.array(chunk[completed], copy=True)
            completed += 1
            action[-1] = 1.0 if action[-1].item() > 0.5 else 0.0
            executed.append(action)
            obs, *_ = env.step(torch.tensor(action, dtype=torch.float32)[None])
        return executed


def test_one_env_sends_the_reference_clients_requests_and_executes_its_actions(recording_server):
    steps = 20
    ours, theirs = RecordingPolicy(), RecordingPolicy()
    ours_server, theirs_server = recording_server(ours), recording_server(theirs)
    prompt = droid.SCENES[1].prompt

    reference_actions = reference_single_env_rollout(
        theirs_server.url, IsaacDroidStandIn(scene=1, num_envs=1), steps, prompt
    )
    env = make_wrapper(IsaacDroidStandIn(scene=1, num_envs=1), ours_server.url)
    try:
        env.reset(seed=0)
        wrapper_actions = [env.step()[4]["policy_action"][0] for _ in range(steps)]
    finally:
        env.close()

    np.testing.assert_array_equal(np.stack(wrapper_actions), np.stack(reference_actions))
    assert len(ours.calls) == len(theirs.calls) == 3  # steps 0, 8, 16
    for mine, ref in zip(ours.calls, theirs.calls):
        a, b = mine["request"], ref["request"]
        assert sorted(a) == sorted(b)
        for key in a:
            if key == "session_id":
                assert uuid.UUID(a[key]).version == 4 and uuid.UUID(b[key]).version == 4
            elif isinstance(b[key], np.ndarray):
                assert a[key].dtype == b[key].dtype and a[key].shape == b[key].shape, key
                diff = np.abs(a[key].astype(np.float64) - b[key].astype(np.float64)).max()
                assert diff <= (1 if a[key].dtype == np.uint8 else 0), key
            else:
                assert a[key] == b[key], key
    assert len({c["session_id"] for c in ours.calls}) == 1


def test_eight_envs_use_distinct_sessions_per_episode_and_query_concurrently(recording_server):
    policy = RecordingPolicy(barrier=threading.Barrier(8, timeout=15))  # passes only with 8 calls in service
    server = recording_server(policy, workers=8)
    env = make_wrapper(IsaacDroidStandIn(scene=2, num_envs=8, max_episode_length=12), server.url)
    try:
        _, info = env.reset(seed=0)
        first_wave = set(info["session_id"])
        assert len(first_wave) == 8
        errors = []
        for _ in range(24):
            _, _, _, _, info = env.step()
            assert info["policy_called"].sum() == 0 or info["policy_called"].all()
            errors += [e for e in info["policy_error"] if e is not None]
    finally:
        env.close()
    sessions = [c["session_id"] for c in policy.calls]
    assert len(set(sessions)) == 16  # two episode waves of 8
    assert set(sessions[:8]) == first_wave
    assert all(sessions.count(s) == 2 for s in set(sessions))  # steps 0 and 8 of a 12-step episode
    assert errors == [] and not policy.barrier.broken  # every wave of 8 calls met at the barrier, at once
    assert all(c["request"]["prompt"] == droid.SCENES[2].prompt for c in policy.calls)


def test_envs_finishing_at_different_steps_call_only_on_their_own_schedule(recording_server):
    lengths = [5, 7, 9, 11, 13, 17, 19, 23]
    server = recording_server(RecordingPolicy(), workers=2)
    env = make_wrapper(IsaacDroidStandIn(scene=1, num_envs=8, episode_lengths=lengths), server.url)
    try:
        env.reset(seed=0)
        episode_step = np.zeros(8, dtype=int)
        calls_per_step = []
        for _ in range(60):
            _, _, terminated, truncated, info = env.step()
            called = info["policy_called"]
            assert (called == (episode_step % 8 == 0)).all(), (episode_step, called)
            calls_per_step.append(int(called.sum()))
            done = (terminated | truncated).numpy()
            episode_step = np.where(done, 0, episode_step + 1)
    finally:
        env.close()
    assert max(calls_per_step[20:]) < 8  # desynchronised envs never refill all at once


def test_one_envs_server_error_flags_only_its_episode(recording_server):
    policy = RecordingPolicy()
    server = recording_server(policy)
    env = make_wrapper(IsaacDroidStandIn(scene=1, num_envs=4, max_episode_length=10), server.url)
    try:
        obs, info = env.reset(seed=0)
        failing = info["session_id"][2]
        policy.fail_sessions.add(failing)
        obs, _, _, _, info = env.step()
        assert info["integrity_event"].tolist() == [None, None, "server_error", None]
        assert "Internal inference error" in info["policy_error"][2] or "injected" in info["policy_error"][2]
        assert info["episode_flagged"].tolist() == [False, False, True, False]
        assert info["policy_held"].tolist() == [False, False, True, False]
        np.testing.assert_allclose(info["policy_action"][2, :7], obs["policy"]["arm_joint_pos"][2].numpy(), atol=0.05)
        for _ in range(9):  # env 2 keeps asking (and failing) while the others use their caches
            _, _, _, truncated, info = env.step()
        assert truncated.all()
        assert info["session_id"][2] == failing
        _, _, _, _, info = env.step()  # a new episode with a new session id succeeds
        assert info["policy_error"].tolist() == [None] * 4 and info["policy_called"].all()
    finally:
        env.close()


def test_fatal_error_closes_the_connection_and_the_env_reconnects(recording_server):
    policy = RecordingPolicy()
    server = recording_server(policy, flavor="openpi")
    env = make_wrapper(IsaacDroidStandIn(scene=1, num_envs=2), server.url)
    try:
        _, info = env.reset(seed=0)
        policy.fail_sessions.add(info["session_id"][1])
        _, _, _, _, info = env.step()
        assert info["integrity_event"][1] == "server_error" and info["integrity_event"][0] is None
        policy.fail_sessions.clear()
        _, _, _, _, info = env.step()  # env 1 asks again on its new connection
        assert info["policy_called"].tolist() == [False, True]
        assert info["policy_error"][1] is None and info["episode_flagged"][1]
        assert env.is_connected(1)
        assert env.episode_stats(1).reconnects == 1 and env.episode_stats(0).reconnects == 0
    finally:
        env.close()


def test_callers_action_is_executed_while_the_policy_schedule_stays_in_sync(recording_server):
    policy = RecordingPolicy()
    server = recording_server(policy)
    base = IsaacDroidStandIn(scene=1, num_envs=2, joint_tau=1e-3)
    env = make_wrapper(base, server.url)
    try:
        env.reset(seed=0)
        target = torch.full((2, 8), 0.3)
        target[:, 7] = 0.0
        for step in range(10):
            obs, _, _, _, info = env.step(target)
            assert info["policy_called"].all() == (step in (0, 8))
            assert not np.allclose(info["policy_action"], target.numpy())
        np.testing.assert_allclose(obs["policy"]["arm_joint_pos"].numpy(), 0.3, atol=1e-3)
        with pytest.raises(ValueError, match=r"action: expected shape \(2, 8\)"):
            env.step(np.zeros((3, 8)))
    finally:
        env.close()
    assert len(policy.calls) == 4


def test_propose_shows_the_policy_action_before_the_step(recording_server):
    policy = RecordingPolicy()
    server = recording_server(policy)
    env = make_wrapper(IsaacDroidStandIn(scene=1, num_envs=2, joint_tau=1e-3), server.url)
    try:
        with pytest.raises(RuntimeError, match="reset"):
            env.propose()
        env.reset(seed=0)
        for step in range(10):
            proposal = env.propose()
            np.testing.assert_array_equal(env.propose(), proposal)  # asking twice changes nothing
            residual = np.zeros_like(proposal)
            residual[:, 0] = 0.05
            obs, _, _, _, info = env.step(proposal + residual)
            np.testing.assert_array_equal(info["policy_action"], proposal)
            assert info["policy_called"].all() == (step in (0, 8))
        np.testing.assert_allclose(obs["policy"]["arm_joint_pos"][:, 0].numpy(), proposal[:, 0] + 0.05, atol=1e-3)
    finally:
        env.close()
    assert len(policy.calls) == 4  # the same schedule as without propose()


def test_gymnasium_surface(recording_server):
    server = recording_server(RecordingPolicy())
    env = make_wrapper(IsaacDroidStandIn(scene=3, num_envs=3, image_shape=(90, 160)), server.url)
    try:
        assert isinstance(env, gym.Wrapper)
        assert env.num_envs == 3 and env.max_episode_length == 450
        assert env.metadata["autoreset_mode"] is AutoresetMode.SAME_STEP
        assert env.metadata is not env.unwrapped.metadata
        assert env.single_action_space.shape == (8,) and env.action_space.shape == (3, 8)
        assert env.observation_space["policy"]["wrist_cam"].shape == (3, 90, 160, 3)
        assert env.prompts == [droid.SCENES[3].prompt] * 3
        assert env.image_resolution == (180, 320)
        with pytest.raises(RuntimeError, match="reset"):
            env.step()
        obs, _ = env.reset(seed=1)
        assert decode_stamp(obs["policy"]["wrist_cam"][1]).env_id == 1
    finally:
        env.close()
    with pytest.raises(RuntimeError, match="closed"):
        env.is_connected(0)  # close() closed every connection


def test_server_that_cannot_serve_droid_is_refused(recording_server):
    metadata = dict(DREAMZERO_METADATA, action_space="cartesian_velocity")
    server = recording_server(RecordingPolicy(metadata=metadata))
    with pytest.raises(HandshakeError, match="action_space='cartesian_velocity'"):
        make_wrapper(IsaacDroidStandIn(scene=1, num_envs=1), server.url)


def test_dreamzero_style_server_with_many_envs_warns_once_it_has_replied(recording_server):
    server = recording_server(RecordingPolicy(), flavor="dreamzero")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the handshake and the URL alone are no evidence
        env = DreamZeroPolicyWrapper(IsaacDroidStandIn(scene=1, num_envs=2), server=server.url, transport=FAST)
    try:
        env.reset(seed=0)
        with pytest.warns(UserWarning, match="ONE global"):
            env.step()  # a DreamZero handshake, bare-array replies, no path, two envs
        assert len(env.server_notes) == 1 and server.url in env.server_notes[0]
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            env.step()  # once per server
    finally:
        env.close()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        one = DreamZeroPolicyWrapper(IsaacDroidStandIn(scene=1, num_envs=1), server=server.url, transport=FAST)
        try:
            one.reset(seed=0)
            one.step()
        finally:
            one.close()


@pytest.mark.parametrize("metadata", [{}, DREAMZERO_METADATA])
def test_openpi_servers_on_a_bare_url_give_no_single_session_warning(recording_server, metadata):
    # openpi's WebsocketPolicyServer (and openpi-server, policy-websocket) reply with a map carrying server_timing.
    server = recording_server(RecordingPolicy(metadata=metadata), flavor="openpi")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        env = DreamZeroPolicyWrapper(
            IsaacDroidStandIn(scene=1, num_envs=2), server=server.url, transport=FAST, image_resolution=(180, 320)
        )
        try:
            env.reset(seed=0)
            for _ in range(9):
                env.step()
            assert env.server_notes == []
        finally:
            env.close()


def test_prompt_validation():
    with pytest.raises(ValueError, match="prompt: expected a string or 2 strings"):
        DreamZeroPolicyWrapper(IsaacDroidStandIn(scene=1, num_envs=2), server="ws://127.0.0.1:1", prompt=["a"])


def test_latency_honest_delays_follow_each_round_trip_and_replayed_ones_reproduce_a_run(recording_server):
    """A server 50 ms slow at 15 Hz: each chunk comes ceil(latency x 15) >= 1 steps after its request, every
    request's delay is in the episode's stats; a rerun handed those delays takes the same actions whatever its
    own latency."""

    def run(delay_s: float, replay=None) -> tuple[np.ndarray, list]:
        server = recording_server(RecordingPolicy(delay_s=delay_s), workers=4)
        env = make_wrapper(IsaacDroidStandIn(scene=1, num_envs=2, max_episode_length=30), server.url,
                           latency_honest_hz=15.0)  # fmt: skip
        try:
            env.reset(seed=0)
            for i, delays in enumerate(replay or ()):
                env.replay_delays(i, delays)
            actions = []
            for _ in range(30):
                _, _, _, _, info = env.step()
                actions.append(info["policy_action"])
            return np.stack(actions), [EpisodeStats.from_info(info, i) for i in range(2)]
        finally:
            env.close()

    slow_actions, slow_stats = run(0.05)
    for stats in slow_stats:
        assert len(stats.drawn_delays) == len(stats.latencies_s) >= 2 and min(stats.drawn_delays) >= 1
        assert stats.delays == stats.drawn_delays[: len(stats.delays)]
        assert stats.wait_steps >= sum(stats.delays)  # the arm held its pose while each chunk was out
    fast_actions, fast_stats = run(0.0, replay=[s.drawn_delays for s in slow_stats])
    np.testing.assert_array_equal(fast_actions, slow_actions)
    assert [s.drawn_delays for s in fast_stats] == [s.drawn_delays for s in slow_stats]
    with pytest.raises(ValueError, match="latency_honest_hz"):
        make_wrapper(IsaacDroidStandIn(scene=1, num_envs=2), "ws://127.0.0.1:1", latency_honest_hz=0)


def test_simulated_delay_is_reproducible_whatever_the_server_latency(recording_server):
    def run(delay_s: float) -> tuple[np.ndarray, list]:
        server = recording_server(RecordingPolicy(delay_s=delay_s), workers=4)
        env = make_wrapper(
            IsaacDroidStandIn(scene=1, num_envs=4, max_episode_length=30), server.url, prefetch=3, simulated_delay=2
        )
        try:
            env.reset(seed=0)
            actions, stats = [], []
            for _ in range(30):
                _, _, _, _, info = env.step()
                actions.append(info["policy_action"])
            assert info["_chunk_stats"].all()
            stats = [EpisodeStats.from_info(info, i) for i in range(4)]
            return np.stack(actions), stats
        finally:
            env.close()

    fast_actions, fast_stats = run(0.0)
    slow_actions, slow_stats = run(0.05)
    np.testing.assert_array_equal(fast_actions, slow_actions)
    assert all(s.delays == (2,) * len(s.delays) and len(s.delays) >= 4 for s in fast_stats)
    assert [s.delays for s in fast_stats] == [s.delays for s in slow_stats]


def test_prefetch_keeps_executing_while_the_next_chunk_is_computed(recording_server):
    policy = RecordingPolicy(delay_s=0.05)  # far slower than a stand-in step: replies come back late
    server = recording_server(policy, workers=2)
    env = make_wrapper(
        IsaacDroidStandIn(scene=1, num_envs=2, max_episode_length=40), server.url, prefetch=4, max_stale_steps=2
    )
    try:
        env.reset(seed=0)
        for _ in range(40):
            _, _, _, _, info = env.step()
            assert not info["policy_held"].any()  # real-time prefetch waits, it never holds
        assert info["_chunk_stats"].all() and info["chunk_stats"]["_delays"].all()
        stats = [EpisodeStats.from_info(info, i) for i in range(2)]
    finally:
        env.close()
    for record in stats:
        assert record.delays[0] == 0 and all(d >= 1 for d in record.delays[1:])
        chunks = len(record.delays)
        assert record.stale_steps <= 2 * chunks  # stale rows stop at the bound, then the env waits
        assert record.wait_steps <= chunks
        # every chunk skips the rows of the steps executed while it was computed
        assert sum(min(8, 24 - d) for d in record.delays) + record.stale_steps >= 40


def test_numpy_env_renders_only_the_envs_that_replan_next():
    from dz_gym.envs.mujoco import make_env

    policy = RecordingPolicy()
    with start_server_thread(policy) as server:
        env = make_wrapper(make_env(scene=1, num_envs=2, seed=3, num_workers=0, max_episode_length=12), server.url)
        try:
            obs, _ = env.reset(seed=3)
            assert isinstance(obs["policy"]["arm_joint_pos"], np.ndarray)
            fresh = []
            for _ in range(12):
                _, _, _, truncated, info = env.step()
                fresh.append(info["images_fresh"].copy())
            called_next = [(step + 1) % 8 == 0 for step in range(12)]
            for step in range(11):
                assert fresh[step].all() == called_next[step], step
            assert truncated.all() and fresh[11].all()  # reset envs are always rendered
        finally:
            env.close()
    assert len(policy.calls) == 4
    for call in policy.calls:
        assert call["request"]["observation/wrist_image_left"].shape == (180, 320, 3)
        assert call["request"]["observation/joint_position"].dtype == np.float64


# -- the same wrapper on the in-memory policy client (no sockets) -----------------------------------------


def memory_wrapper(policy, num_envs=2, *, max_episode_length=450, **kwargs):
    from dz_gym.testing.memory_client import MemoryPolicyClient
    from dz_gym.testing.toy_env import ToyDroidEnv

    env = ToyDroidEnv(num_envs, max_episode_length=max_episode_length, image_shape=(36, 64))
    client = MemoryPolicyClient(policy, num_envs)
    return DreamZeroPolicyWrapper(env, client=client, **kwargs), client


def test_memory_client_and_websocket_give_the_same_requests_and_actions(recording_server):
    from dz_gym.testing.memory_client import MemoryPolicyClient

    steps = 20
    over_socket, in_memory = RecordingPolicy(), RecordingPolicy()
    server = recording_server(over_socket)
    runs = []
    for make in (
        lambda env: make_wrapper(env, server.url),
        lambda env: DreamZeroPolicyWrapper(env, client=MemoryPolicyClient(in_memory, 2)),
    ):
        env = make(IsaacDroidStandIn(scene=1, num_envs=2, max_episode_length=12))
        try:
            env.reset(seed=0)
            runs.append([env.step()[4]["policy_action"] for _ in range(steps)])
        finally:
            env.close()
    np.testing.assert_array_equal(np.stack(runs[0]), np.stack(runs[1]))
    assert len(over_socket.calls) == len(in_memory.calls) == 6  # 2 envs x steps 0, 8, 12 (a new 12-step episode)

    def by_content(calls):
        # the two envs' requests reach the server on two connections in either order: pair them by their bytes
        return sorted(
            calls,
            key=lambda call: [np.asarray(v).tobytes() for k, v in sorted(call["request"].items()) if k != "session_id"],
        )

    for a, b in zip(by_content(over_socket.calls), by_content(in_memory.calls)):
        assert sorted(a["request"]) == sorted(b["request"])
        for key, value in a["request"].items():
            if key != "session_id":
                np.testing.assert_array_equal(np.asarray(value), np.asarray(b["request"][key]))


def test_memory_client_lost_connection_flags_the_episode_and_counts_the_reconnect():
    from dz_gym.server.policies import HoldPolicy

    env, client = memory_wrapper(HoldPolicy(), 3, max_episode_length=20)
    try:
        env.reset(seed=0)
        env.step()
        client.break_connection(1)
        for _ in range(7):
            _, _, _, _, info = env.step()
        assert not info["policy_called"].any()
        _, _, _, _, info = env.step()  # step 8: env 1's request fails on its dropped connection
        assert info["integrity_event"].tolist() == [None, "connection_lost", None]
        assert info["episode_flagged"].tolist() == [False, True, False] and info["policy_held"][1]
        assert "not connected" in info["policy_error"][1]
        assert env.is_connected(1) and client.reconnects == [0, 1, 0]
        stats = env.episode_stats(1)
        assert (stats.reconnects, stats.reconnect_failures, stats.flagged, stats.chunks) == (1, 0, True, 1)
        _, _, _, _, info = env.step()  # asks again on its new connection
        assert info["policy_called"].tolist() == [False, True, False] and info["policy_error"][1] is None
        for _ in range(10):  # to the end of the 20-step episodes
            _, _, _, truncated, info = env.step()
        assert truncated.all() and info["_chunk_stats"].all()
        assert info["chunk_stats"]["reconnects"].tolist() == [0, 1, 0]
        assert info["chunk_stats"]["flagged"].tolist() == [False, True, False]
        assert env.episode_stats(1).reconnects == 0  # the next episode starts from zero
        assert [sid for _, sid in client.ended_sessions[-3:]] == list(info["session_id"])
    finally:
        env.close()


def test_memory_client_server_error_keeps_the_connection():
    from dz_gym.server.policies import HoldPolicy

    class FailFirst(HoldPolicy):
        def infer(self, request, *, session_id, new_session):
            if request["observation/joint_position"][0] < 0.0 and new_session:
                raise RuntimeError("Internal inference error")
            return super().infer(request, session_id=session_id, new_session=new_session)

    env, client = memory_wrapper(FailFirst(), 2)
    try:
        env.reset(seed=0)
        policy_obs = env.last_obs["policy"]
        failing = [i for i in range(2) if policy_obs["arm_joint_pos"][i, 0] < 0.0]
        _, _, _, _, info = env.step()
        events = [("server_error" if i in failing else None) for i in range(2)]
        assert info["integrity_event"].tolist() == events
        assert client.reconnects == [0, 0]  # a non-fatal server error leaves the connection open
    finally:
        env.close()


def test_a_chunk_shorter_than_the_horizon_stops_at_the_first_reply(recording_server):
    from dz_gym.chunks import HorizonError
    from dz_gym.server.policies import HoldPolicy

    env, _ = memory_wrapper(HoldPolicy(horizon=4), 2, open_loop_horizon=6)
    try:
        env.reset(seed=0)
        with pytest.raises(HorizonError, match=r"open_loop_horizon: 6 is longer than the server's chunk of 4 row"):
            env.step()
    finally:
        env.close()
    server = recording_server(HoldPolicy(horizon=24))
    env = make_wrapper(IsaacDroidStandIn(scene=1, num_envs=1, image_shape=(90, 160)), server.url, open_loop_horizon=30)
    try:
        env.reset(seed=0)
        with pytest.raises(HorizonError, match=server.url) as caught:
            env.step()
        assert (caught.value.horizon, caught.value.chunk_length) == (30, 24) and "\n" not in str(caught.value)
    finally:
        env.close()


def test_runner_surface_validates_its_inputs():
    from dz_gym.server.policies import HoldPolicy
    from dz_gym.testing.memory_client import MemoryPolicyClient
    from dz_gym.testing.toy_env import ToyDroidEnv

    env, client = memory_wrapper(HoldPolicy(), 2)
    try:
        with pytest.raises(ValueError, match=r"idle mask: expected shape \(2,\)"):
            env.set_idle([True])
        with pytest.raises(ValueError, match="render_policy: expected one of due, all"):
            env.render_policy = "some"
        env.render_policy = "all"
        env.set_idle([False, True])
        assert env.idle_envs.tolist() == [False, True] and env.render_policy == "all"
        assert env.client is client and env.server_url(1) == "memory://policy"
        assert env.ensure_connected(1) and client.reconnects == [0, 0]
        client.break_connection(1)
        assert not env.is_connected(1) and env.ensure_connected(1) and client.reconnects == [0, 1]
    finally:
        env.close()
    with pytest.raises(ValueError, match="client: pass either client= or server="):
        DreamZeroPolicyWrapper(ToyDroidEnv(2), server="ws://127.0.0.1:1", client=MemoryPolicyClient(HoldPolicy(), 2))
    with pytest.raises(ValueError, match="client: expected 2 sessions"):
        DreamZeroPolicyWrapper(ToyDroidEnv(2), client=MemoryPolicyClient(HoldPolicy(), 3))


def test_pypi_openpi_server_on_a_bare_url_gives_no_single_session_warning():
    """openpi-server 0.1.0 (openpi's own server) serving DreamZero's metadata on a URL without a path: its
    replies carry server_timing, so it is not mistaken for DreamZero's single-session server."""
    pytest.importorskip("openpi_server")
    from test_interop_openpi_server import OpenpiServerThread

    class Hold:
        def infer(self, obs: dict) -> dict:
            actions = np.zeros((droid.ACTION_HORIZON, droid.ACTION_DIM), dtype=np.float32)
            actions[:, :7] = np.asarray(obs["observation/joint_position"])
            return {"actions": actions}

        def reset(self) -> None:
            pass

    transport = TransportConfig(
        open_timeout=3, request_timeout=10, close_timeout=1, connect_retries=10, retry_backoff=0.05
    )
    with OpenpiServerThread(Hold(), metadata=dict(DREAMZERO_METADATA)) as server, warnings.catch_warnings():
        warnings.simplefilter("error")
        env = DreamZeroPolicyWrapper(
            IsaacDroidStandIn(scene=1, num_envs=2, image_shape=(90, 160)), server=server.url, transport=transport
        )
        try:
            env.reset(seed=0)
            for _ in range(9):
                _, _, _, _, info = env.step()
                assert info["policy_error"].tolist() == [None, None]
            assert env.server_notes == []
        finally:
            env.close()


def test_reset_starts_making_the_view_memory_from_the_space_before_the_env_resets():
    """The wrapper asks its client for a full round's view memory without waiting, from the observation
    space, before the env's reset (the two overlap), and once more, waiting, from the reset's observation."""
    from dz_gym.server.policies import HoldPolicy
    from dz_gym.testing.memory_client import MemoryPolicyClient
    from dz_gym.testing.toy_env import ToyDroidEnv

    calls = []

    class Client(MemoryPolicyClient):
        def reserve_host_memory(self, nbytes, *, wait=True):
            calls.append(("reserve", nbytes, wait))
            return False

    class Env(ToyDroidEnv):
        def reset(self, **kwargs):
            calls.append("reset")
            return super().reset(**kwargs)

    env = Env(2, max_episode_length=10, image_shape=(36, 64))
    wrapper = DreamZeroPolicyWrapper(env, client=Client(HoldPolicy(), 2), image_resolution=(18, 32))
    try:
        wrapper.reset(seed=0)
    finally:
        wrapper.close()
    round_bytes = 2 * len(droid.CAMERA_KEYS) * 18 * 32 * 3  # at the request resolution, uint8
    assert calls == [("reserve", round_bytes, False), "reset", ("reserve", round_bytes, True)]
