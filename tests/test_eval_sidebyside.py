"""step_in_turn's clock: the side-by-side result's wall time is the stepping's, as SceneRunner.run's is.

The runners here are stand-ins with the four calls step_in_turn makes (begin, tick, refill, end) and a
clock that moves only when they say, so the spans are exact and do not depend on the machine's speed.
"""

from __future__ import annotations

import threading

import pytest

from dz_gym.eval import sidebyside
from dz_gym.eval.timing import SceneResult


class Clock:
    """``time`` for sidebyside: ``perf_counter`` reads ``now``, which only the stand-ins advance."""

    def __init__(self):
        self.now = 100.0

    def perf_counter(self) -> float:
        return self.now


class StandInRunner:
    """``steps`` ticks of ``step_s`` each after a ``begin_s`` begin; its end takes ``end_s`` (the writer's tail)."""

    def __init__(self, clock: Clock, scene: int, steps: int, *, begin_s=0.0, step_s=1.0, end_s=0.0, fail_at=None):
        self.clock, self.scene, self.left = clock, scene, steps
        self.begin_s, self.step_s, self.end_s, self.fail_at = begin_s, step_s, end_s, fail_at
        self.hold_starts = False
        self.control = type("Control", (), {"stop": threading.Event()})()
        self.calls: list[str] = []

    @property
    def stepping(self) -> bool:
        return self.left > 0

    def begin(self):
        self.calls.append("begin")
        self.clock.now += self.begin_s

    def tick(self) -> bool:
        if self.left == 0:
            return False
        if self.fail_at == self.left:
            raise RuntimeError("the env failed")
        self.left -= 1
        self.clock.now += self.step_s
        return True

    def refill(self):
        self.calls.append("refill")

    def end(self) -> SceneResult:
        self.calls.append("end")
        self.clock.now += self.end_s
        return SceneResult(self.scene, env_steps=4 * self.calls.count("refill"))


@pytest.fixture
def clock(monkeypatch):
    clock = Clock()
    monkeypatch.setattr(sidebyside, "time", clock)
    return clock


def test_the_wall_time_ends_with_the_stepping_not_the_writers_tail(clock):
    a = StandInRunner(clock, 1, steps=3, begin_s=0.5, step_s=1.0, end_s=7.0)
    b = StandInRunner(clock, 2, steps=2, begin_s=0.25, step_s=2.0, end_s=11.0)
    result = sidebyside.step_in_turn([a, b])
    # begins 0.75 s, then a's 3 steps of 1 s and b's 2 of 2 s; the ends' 18 s of writing are not stepping
    assert result.wall_s == pytest.approx(0.75 + 3 * 1.0 + 2 * 2.0)
    assert clock.now == pytest.approx(100.0 + 0.75 + 7.0 + 18.0)
    assert a.calls[-1] == b.calls[-1] == "end" and result.scene == 1
    assert result.env_steps == 4 * (a.calls.count("refill") + b.calls.count("refill"))


def test_a_failing_batch_still_ends_every_begun_runner(clock):
    a = StandInRunner(clock, 1, steps=3, end_s=1.0)
    b = StandInRunner(clock, 2, steps=3, end_s=1.0, fail_at=2)
    with pytest.raises(RuntimeError, match="the env failed"):
        sidebyside.step_in_turn([a, b])
    assert a.calls[-1] == b.calls[-1] == "end"
