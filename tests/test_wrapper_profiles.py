"""DreamZeroPolicyWrapper against the FLUX flavors of the reference server: the profile decides the requests,
the schedule, the chunk check and what happens after a 1011 close (on the toy env: no simulator needed)."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from dz_gym.errors import HandshakeError, HorizonError
from dz_gym.protocol.observation import request_profile, request_proprio
from dz_gym.protocol.profiles import PROFILES
from dz_gym.server.launch import start_server_thread
from dz_gym.server.policies import HoldPolicy
from dz_gym.testing.toy_env import ToyDroidEnv
from dz_gym.transport import TransportConfig
from dz_gym.wrapper import DreamZeroPolicyWrapper

FAST = TransportConfig(open_timeout=5.0, connect_retries=1, request_timeout=20.0)


class FluxRecorder:
    """Records what the server hands the policy; answers 32 rows that hold the joints; the sessions in
    ``fail_sessions`` raise (the flavor's error frame, then close 1011)."""

    def __init__(self):
        self.calls: list[tuple[str, list[str]]] = []
        self.fail_sessions: set[str] = set()
        self._lock = threading.Lock()

    def infer(self, request: dict, *, session_id: str, new_session: bool) -> np.ndarray:
        with self._lock:
            self.calls.append((session_id, sorted(request)))
        if session_id in self.fail_sessions:
            raise RuntimeError(f"injected failure for {session_id}")
        joints, _ = request_proprio(request, request_profile(request))
        chunk = np.zeros((32, 8), np.float32)
        chunk[:, :7] = joints
        return chunk


def _wrapper(server, num_envs=4, max_episode_length=70, **kwargs):
    env = ToyDroidEnv(num_envs, max_episode_length=max_episode_length, image_shape=(18, 32))
    url = server.url + PROFILES[server.server.config.flavor].url_path
    return DreamZeroPolicyWrapper(env, server=url, transport=FAST, prompt="put the cube in the bowl", **kwargs)


@pytest.mark.parametrize("flavor", ["flux3-bfl", "sglang"])
def test_flux_servers_get_their_requests_and_all_32_actions_run(flavor):
    policy = FluxRecorder()
    with start_server_thread(policy, flavor=flavor) as server:
        env = _wrapper(server)
        try:
            assert (env.profile.name, env.open_loop_horizon, env.image_resolution) == (flavor, 32, (360, 640))
            env.reset(seed=0)
            called = []
            for _ in range(70):  # an episode of 70 steps: requests at steps 0, 32, 64
                _, _, _, truncated, info = env.step()
                called.append(bool(info["policy_called"][0]))
                assert info["policy_error"].tolist() == [None] * 4
            assert truncated.all() and np.flatnonzero(called).tolist() == [0, 32, 64]
            assert server.server.connections == 4  # no reset frame: BFL would have closed the connection
        finally:
            env.close()
    keys = policy.calls[0][1]
    assert PROFILES[flavor].composite_key in keys and "prompt" in keys


def test_the_users_open_loop_horizon_wins_over_the_profiles():
    with start_server_thread(FluxRecorder(), flavor="sglang") as server:
        env = _wrapper(server, open_loop_horizon=8)
        try:
            assert env.open_loop_horizon == 8
            env.reset(seed=0)
            calls = sum(int(env.step()[4]["policy_called"][0]) for _ in range(17))
            assert calls == 3  # steps 0, 8, 16
        finally:
            env.close()


def test_a_horizon_longer_than_the_profiles_chunk_is_refused_before_any_request():
    with start_server_thread(FluxRecorder(), flavor="flux3-bfl") as server:
        with pytest.raises(HorizonError, match=r"open_loop_horizon: 40 is longer than the server's chunk of 32"):
            _wrapper(server, open_loop_horizon=40)
        assert server.server.stats().inferences == 0


def test_a_chunk_of_the_wrong_geometry_is_an_error_of_that_episode():
    with start_server_thread(HoldPolicy(horizon=24), flavor="flux3-bfl") as server:
        env = _wrapper(server, num_envs=2)
        try:
            env.reset(seed=0)
            _, _, _, _, info = env.step()
            assert info["integrity_event"].tolist() == ["protocol_error"] * 2
            assert "expected horizon 32" in info["policy_error"][0] and info["episode_flagged"].all()
            assert info["policy_held"].all()
        finally:
            env.close()


@pytest.mark.parametrize("flavor", ["flux3-bfl", "sglang"])
def test_after_a_1011_close_the_env_reconnects_and_restarts_its_chunk_others_untouched(flavor):
    policy = FluxRecorder()
    with start_server_thread(policy, flavor=flavor) as server:
        env = _wrapper(server)
        try:
            _, info = env.reset(seed=0)
            policy.fail_sessions.add(info["session_id"][1])
            _, _, _, _, info = env.step()
            assert info["integrity_event"].tolist() == [None, "server_error", None, None]
            assert "injected failure" in info["policy_error"][1] and "\n" not in info["policy_error"][1]
            assert env.episode_stats(1).reconnects == 1 and env.is_connected(1)
            policy.fail_sessions.clear()
            _, _, _, _, info = env.step()  # env 1 asks again for its chunk on its new connection
            assert info["policy_called"].tolist() == [False, True, False, False]
            assert info["policy_error"].tolist() == [None] * 4 and info["episode_flagged"].tolist() == [
                False, True, False, False]  # fmt: skip
            assert [env.episode_stats(i).reconnects for i in range(4)] == [0, 1, 0, 0]
            assert [env.episode_stats(i).chunks for i in range(4)] == [1, 1, 1, 1]  # env 1: its chunk, anew
            assert server.server.connections == 5
            called = [env.step()[4]["policy_called"].tolist() for _ in range(32)]  # steps 2..33
            assert called[-2] == [True, False, True, True] and called[-1] == [False, True, False, False]
        finally:
            env.close()


def test_a_handshake_of_no_known_server_is_one_line_unless_the_kind_is_named():
    odd = HoldPolicy(metadata={"policy_name": "mine"})
    with start_server_thread(odd, flavor="openpi") as server:
        env = ToyDroidEnv(2, max_episode_length=10, image_shape=(18, 32))
        with pytest.raises(HandshakeError) as caught:
            DreamZeroPolicyWrapper(env, server=server.url, transport=FAST, prompt="p")
        text = str(caught.value)
        assert "\n" not in text and "['policy_name']" in text and "--server-kind" in text
        wrapper = DreamZeroPolicyWrapper(env, server=server.url, transport=FAST, prompt="p", server_kind="openpi")
        try:
            assert wrapper.profile.name == "openpi" and wrapper.open_loop_horizon == 8
            wrapper.reset(seed=0)
            assert wrapper.step()[4]["policy_error"].tolist() == [None, None]
        finally:
            wrapper.close()
