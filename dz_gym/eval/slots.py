"""What each env slot of a scene runs next: :class:`SlotQueues`, the plan's entries per slot and their state.

A scene's runner (:class:`~dz_gym.eval.runner.SceneRunner`) steps the batch; which plan entry a slot starts
next, which slots wait to start an episode again (a refused session's admission time, a retried attempt), which
episodes have started (an A/B pair's twin), and the stop of an adaptive test (nothing new starts once it has
stopped; an eliminated arm's entries are dropped) are kept here, with no env, wrapper or I/O.

A slot is the index of an env in the batch, the evaluator's one name for it (``env`` in the rows; the wrapper's
and the envs' API call it ``env_id``): episode ``k`` of a scene runs on the slot the run plan gives it
(:mod:`dz_gym.eval.plan`); each slot runs its entries in plan order.

>>> from dz_gym.eval.plan import build_plan
>>> plan = build_plan(scenes=[1], episodes=3, num_envs=2, seed=0)
>>> slots = SlotQueues(plan.slot_queues(1))
>>> slots.first(), slots.next_seed(0), slots.last_episodes().tolist()
([0, 1], 0, [False, False])
>>> entry = slots.pop(0); slots.started(entry); slots.last_episodes().tolist()
[False, False]
>>> slots.requeue(0, entry); sorted(slots.waiting), slots.next_seed(0)
([0], 0)
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Sequence

import numpy as np

from dz_gym.eval.plan import PlanEntry

__all__ = ["SlotQueues"]


class SlotQueues:
    """Per env slot, the plan entries it still runs, in order; which have started; which slots wait.

    ``queues``: one list of :class:`~dz_gym.eval.plan.PlanEntry` per slot
    (:meth:`~dz_gym.eval.plan.RunPlan.slot_queues`). ``draining``: the adaptive test stopped, nothing new starts.
    """

    def __init__(self, queues: Sequence[Sequence[PlanEntry]]):
        self._queues: list[deque[PlanEntry]] = [deque(q) for q in queues]
        self.todo = {(e.episode, e.arm) for q in queues for e in q}  # every (episode, arm) this scene runs
        self._started: set[tuple[int, str | None]] = set()
        self.waiting: set[int] = set()  # slots whose episode waits to start again (admission or retry)
        self.draining = False

    def __len__(self) -> int:
        return len(self._queues)

    def has_next(self, slot: int) -> bool:
        return bool(self._queues[slot])

    def first(self) -> list[int]:
        """The slots that have an entry to run."""
        return [slot for slot, queue in enumerate(self._queues) if queue]

    def next_seed(self, slot: int) -> int:
        """The seed of the slot's next entry (queued with the env as the current one starts)."""
        return self._queues[slot][0].seed

    def pop(self, slot: int) -> PlanEntry:
        """The slot's next entry, taken off its queue."""
        return self._queues[slot].popleft()

    def started(self, entry: PlanEntry) -> None:
        self._started.add((entry.episode, entry.arm))

    def last_episodes(self) -> np.ndarray:
        """Per slot, whether it has nothing more queued (its autoreset's frames are read by nobody)."""
        return np.fromiter((not q for q in self._queues), dtype=bool, count=len(self._queues))

    def requeue(self, slot: int, entry: PlanEntry) -> None:
        """``entry``'s attempt was dropped: it runs again first on its slot, once the slot stops waiting."""
        self._started.discard((entry.episode, entry.arm))
        self._queues[slot].appendleft(entry)
        self.waiting.add(slot)

    def drain(self) -> None:
        """The adaptive test stopped: nothing new starts (the queues and the waiting slots are cleared)."""
        self.draining = True
        for queue in self._queues:
            queue.clear()
        self.waiting.clear()

    def twin_pending(self, episode: int, arm: str) -> bool:
        """An A/B episode whose twin (the other arm, same seed) has neither started nor finished before."""
        twin = (episode, "b" if arm == "a" else "a")
        return twin not in self._started and twin in self.todo

    def drop_arms(self, arms: Iterable[str]) -> None:
        """Drop the queued entries of ``arms`` (eliminated by a race)."""
        out = set(arms)
        for queue in self._queues:
            kept = [e for e in queue if e.arm not in out]
            if len(kept) != len(queue):
                queue.clear()
                queue.extend(kept)
