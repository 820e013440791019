"""``--select-best``: the race of a run of named arms, fed with its rows in plan order (pure, no I/O).

Every seed of such a run (a *group*: one (scene, episode) under every arm) runs on neighbouring slots of one
batch. :class:`ArmRace` receives rows in the order they are written but folds each complete group into
:class:`~dz_gym.stats.select.BestArmSelection` **in plan order** (``order``: the (scene, episode) of every
group): a group that completes early waits until every group before it is in, as the A/B test's pairs do
(:mod:`dz_gym.eval.ab`), since completion order can depend on outcomes. A group is complete when every arm
still in the race when the group is folded has its row; rows of arms already eliminated are ignored.

After each fold, arms the selection eliminated are in :attr:`eliminated_arms`: the runner drops their queued
entries (their slots idle; no rows are written for them) and the run segment leaves them out of a resume.
:attr:`stopped` (one arm left, or every planned group folded) ends the run. A resumed run rebuilds the same
state from its rows.

Example::

    >>> rows = [{"scene": 1, "episode": k, "seed": k, "arm": arm, "error": None, "success_at_end": arm == "x"}
    ...         for k in range(12) for arm in ("x", "y")]
    >>> race = ArmRace(["x", "y"], order=[(1, k) for k in range(12)], rows=rows)
    >>> race.stopped, race.selection.best, race.eliminated_arms
    (True, 'x', {'y'})
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from dz_gym.stats.select import BestArmSelection

__all__ = ["ArmRace"]


def _outcome(row: Mapping[str, Any]) -> bool | None:
    return None if row.get("error") is not None else bool(row.get("success_at_end"))


class ArmRace:
    """The race of ``arms`` over the groups of ``order`` (see the module docstring); ``alpha``: the chance
    that the arm named best is not a best arm."""

    pairs_twins = False  # a stop cuts nothing off: running episodes finish and keep their rows

    def __init__(self, arms: Sequence[str], *, order: Sequence[tuple[int, int]], alpha: float = 0.05,
                 rows: Iterable[Mapping[str, Any]] = ()):  # fmt: skip
        self.order = [(int(s), int(k)) for s, k in order]
        self.selection = BestArmSelection(list(arms), alpha=alpha, max_rounds=len(self.order))
        self._position = {key: i for i, key in enumerate(self.order)}
        self._rows: dict[tuple[int, int], dict[str, Mapping[str, Any]]] = {}
        self.next_group = 0  # plan index of the next group the race waits for
        self.seeds: dict[str, int] = {}  # per eliminated arm: the groups (seeds) folded when it went out
        for row in rows:
            self.add(row)

    @property
    def stopped(self) -> bool:
        """One arm left, or every planned group folded: start no new episodes."""
        return self.selection.stopped

    @property
    def eliminated_arms(self) -> set[str]:
        return set(self.selection.eliminated)

    def add(self, row: Mapping[str, Any]) -> bool:
        """Take one written row; returns :attr:`stopped` after it."""
        arm = row.get("arm")
        key = (int(row["scene"]), int(row["episode"]))
        if arm not in self.selection.arms or key not in self._position:
            return self.stopped
        self._rows.setdefault(key, {}).setdefault(arm, row)
        while not self.stopped and self.next_group < len(self.order):
            group = self._rows.get(self.order[self.next_group], {})
            active = self.selection.survivors
            if any(a not in group for a in active):
                break
            self.selection.update({a: _outcome(group[a]) for a in active})
            self._rows.pop(self.order[self.next_group], None)
            self.next_group += 1
            for name in self.selection.eliminated:
                self.seeds.setdefault(name, self.next_group)
        return self.stopped

    def summary(self) -> dict[str, Any]:
        """The summary's ``selection``: the race's state, per eliminated arm after how many seeds, the winner."""
        out = self.selection.to_dict()
        out["planned_seeds"] = len(self.order)
        out["eliminated_after_seeds"] = dict(self.seeds)
        return out
