"""SlotQueues: what each env slot of a scene runs next, on real run plans (no env, no I/O)."""

from __future__ import annotations

from dz_gym.eval.plan import build_plan
from dz_gym.eval.slots import SlotQueues


def _ab_slots(episodes=3, num_envs=4):
    plan = build_plan(scenes=[1], episodes=episodes, num_envs=num_envs, seed=7, arms=("a", "b"))
    return SlotQueues(plan.slot_queues(1))


def test_each_slot_runs_its_entries_in_plan_order_and_knows_its_last():
    plan = build_plan(scenes=[1], episodes=5, num_envs=2, seed=10)
    slots = SlotQueues(plan.slot_queues(1))
    ran = {0: [], 1: []}
    while slots.first():
        for slot in slots.first():
            entry = slots.pop(slot)
            slots.started(entry)
            ran[slot].append(entry.seed)
    assert ran == {0: [10, 12, 14], 1: [11, 13]} and slots.last_episodes().tolist() == [True, True]


def test_a_requeued_attempt_runs_first_again_once_its_slot_stops_waiting():
    slots = _ab_slots()
    first = slots.pop(0)
    slots.started(first)
    slots.requeue(0, first)
    assert slots.waiting == {0} and slots.next_seed(0) == first.seed and slots.pop(0) == first


def test_a_drain_starts_nothing_new_and_a_twin_not_started_is_pending():
    slots = _ab_slots()
    a0 = slots.pop(0)
    slots.started(a0)
    assert slots.twin_pending(a0.episode, "a")  # arm b's run of that seed has not started
    b0 = slots.pop(1)
    slots.started(b0)
    assert not slots.twin_pending(a0.episode, "a") and not slots.twin_pending(99, "a")  # 99: not this scene's
    slots.requeue(2, slots.pop(2))
    slots.drain()
    assert slots.draining and slots.first() == [] and slots.waiting == set()


def test_an_eliminated_arm_s_entries_are_dropped():
    plan = build_plan(scenes=[1], episodes=4, num_envs=3, seed=0, arms=("x", "y", "z"))
    slots = SlotQueues(plan.slot_queues(1))
    slots.drop_arms({"y"})
    assert slots.first() == [0, 2] and not slots.has_next(1) and len(slots) == 3
