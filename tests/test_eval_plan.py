"""The run plan (pure): seeds, slots, servers, shards and pairs, resume and scene order."""

from __future__ import annotations

import pytest

from dz_gym.eval.config import EvalConfig
from dz_gym.eval.plan import build_plan, plan_of


def plan(**kw):
    values = {"scenes": [1], "episodes": 7, "num_envs": 3, "seed": 0, "servers": ["ws://a"]}
    values.update(kw)
    return build_plan(**values)


def test_fixed_quotas_per_slot_in_episode_order():
    p = plan()
    assert [[e.episode for e in q] for q in p.slot_queues(1)] == [[0, 3, 6], [1, 4], [2, 5]]
    assert [e.seed for e in p.entries] == list(range(7)) and [e.order for e in p.entries] == list(range(7))
    assert [e.seed for e in plan(seed=100).entries][:2] == [100, 101]


def test_remaining_keeps_the_plan_map_and_order():
    p = plan(episodes=5, num_envs=4).remaining([{"scene": 1, "episode": 0}, {"scene": 1, "episode": 3}])
    assert [[e.episode for e in q] for q in p.slot_queues(1)] == [[4], [1], [2], []]
    assert [e.order for e in p.entries] == [1, 2, 4]


def test_ab_pairs_are_numbered_in_plan_order_and_scenes_can_interleave():
    ab = plan(scenes=[1, 2], episodes=2, num_envs=2, servers_b=["ws://b"])
    assert ab.arms == ("a", "b") and ab.pairs() == [(1, 0), (1, 1), (2, 0), (2, 1)]
    assert [(e.scene, e.episode, e.arm, e.pair, e.slot) for e in ab.entries[:4]] == [
        (1, 0, "a", 0, 0), (1, 0, "b", 0, 1), (1, 1, "a", 1, 0), (1, 1, "b", 1, 1)]  # fmt: skip
    mixed = plan(scenes=[1, 2], episodes=2, num_envs=2, servers_b=["ws://b"], interleave=True)
    assert mixed.pairs() == [(1, 0), (2, 0), (1, 1), (2, 1)] and mixed.scene_order() == [1, 2]
    # a resumed run keeps the pair numbers of the whole plan
    assert ab.remaining([{"scene": 1, "episode": 0, "arm": "a"}]).entries[0].pair == 0
    assert ab.arm_servers("a") == ["ws://a"] and ab.arm_servers("b") == ["ws://b"]


def test_ab_servers_are_per_arm_slot():
    ab = plan(episodes=4, num_envs=4, servers=["ws://a0", "ws://a1"], servers_b=["ws://b0"])
    assert ab.servers_of() == ["ws://a0", "ws://b0", "ws://a1", "ws://b0"]


@pytest.mark.parametrize(
    "kw,needle",
    [
        ({"num_envs": 1, "servers_b": ["ws://b"]}, "num_envs: an A/B run needs at least 2"),
        ({"num_envs": 4, "servers_b": ["ws://b"], "shards": 2}, "shards: an A/B run runs in one process"),
        ({"episodes": -1}, "episodes: expected an integer >= 0"),
        ({"shards": 4}, "shards: expected at most num_envs=3"),
    ],
)
def test_bad_plans_are_one_line_errors(kw, needle):
    with pytest.raises(ValueError, match=needle):
        plan(**kw)


def test_plan_of_a_config_and_only_scenes():
    config = EvalConfig(scenes=[3, 1], episodes=2, num_envs=2, backend="mujoco")
    p = plan_of(config)  # from the config alone: the servers come once they run
    assert p.arms == () and p.scene_order() == [3, 1] and {e.server for e in p.entries} == {None}
    resolved = p.resolve(["ws://a", "ws://b"], ["ws://ignored"])  # not an A/B config: no arms
    assert [e.server for e in resolved.entries] == ["ws://a", "ws://a", "ws://b", "ws://b"]
    assert [(e.scene, e.episode, e.slot) for e in resolved.entries] == [(e.scene, e.episode, e.slot) for e in p.entries]
    assert [e.scene for e in p.only_scenes([1]).entries] == [1, 1]
