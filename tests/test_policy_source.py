"""policy_source: the wrapper's one way to its policy, checked before anything starts."""

from __future__ import annotations

import pytest

from dz_gym.policy_source import DEFAULT_SERVER, open_client, server_urls
from dz_gym.server.policies import HoldPolicy
from dz_gym.testing.memory_client import MemoryPolicyClient
from dz_gym.transport import TransportConfig


def test_server_urls_default_one_url_or_a_list():
    assert server_urls(None, None, None, None, 2) == [DEFAULT_SERVER]
    assert server_urls("ws://a:1", None, None, None, 2) == ["ws://a:1"]
    assert server_urls(("ws://a:1", "ws://b:2"), None, None, None, 2) == ["ws://a:1", "ws://b:2"]


@pytest.mark.parametrize(
    ("server", "client", "policy", "transport", "match"),
    [
        ("ws://a:1", "client", None, None, "^client: pass either"),
        (None, "client", None, TransportConfig(), "^client: pass either"),
        ("ws://a:1", None, "hold", None, "^policy: pass either"),
        ([], None, None, None, "^server: expected a ws:// or wss:// URL"),
        (["ws://a:1", ""], None, None, None, "^server: expected a ws:// or wss:// URL"),
    ],
)
def test_one_way_to_the_policy_or_one_line_naming_the_argument(server, client, policy, transport, match):
    client = MemoryPolicyClient(HoldPolicy(), num_envs=2) if client == "client" else None
    with pytest.raises(ValueError, match=match):
        server_urls(server, client, policy, transport, 2)


def test_a_client_must_be_a_policy_client_with_a_session_per_env():
    with pytest.raises(TypeError, match="^client: expected a dz_gym.policy_client.PolicyClient"):
        server_urls(None, object(), None, None, 2)
    with pytest.raises(ValueError, match=r"^client: expected 3 sessions \(one per env\), got 2"):
        server_urls(None, MemoryPolicyClient(HoldPolicy(), num_envs=2), None, None, 3)


def test_open_client_returns_the_caller_s_client_as_it_is():
    client = MemoryPolicyClient(HoldPolicy(), num_envs=2)
    assert server_urls(None, client, None, None, 2) is None
    assert open_client(None, client, None, None, 2) == (client, None)


def test_an_embedded_server_is_stopped_when_its_pool_cannot_be_made(monkeypatch):
    import dz_gym.policy_source as source
    from dz_gym.server.embedded import EmbeddedServer

    started: list[EmbeddedServer] = []
    real_start = EmbeddedServer.start

    def start(self):
        started.append(self)
        return real_start(self)

    def refuse(urls, num_envs, transport):
        assert started and urls == [started[0].url] and started[0].running  # the pool is asked for the real server
        raise OSError("no pool")

    monkeypatch.setattr(EmbeddedServer, "start", start)
    monkeypatch.setattr(source, "open_pool", refuse)
    with pytest.raises(OSError, match="no pool"):
        open_client([DEFAULT_SERVER], None, HoldPolicy(), None, 2)  # a policy object: served on a thread here
    assert [server.running for server in started] == [False]
