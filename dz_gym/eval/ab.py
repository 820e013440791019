"""A/B runs: the pairs of episodes as they complete, and the sequential stopping rule fed with them.

In an A/B run every (scene, episode) runs once per arm; the two rows share the seed and differ only in the
policy. :class:`PairTracker` receives rows in the order they are written (``episodes.jsonl`` order), folds
each completed pair, the moment its second row arrives, into :class:`~dz_gym.stats.sequential.SequentialPairTest`
(with ``--sequential``), and says when to stop starting new episodes. A resumed run rebuilds the same state
from the rows, in the same order, so the decision does not depend on interruptions.

A pair with an errored episode is counted as errored by the test and left out (as ``dz-gym-compare`` does).
Pairs completed after the decision are ignored by the test (its decision is final) but are real pairs and
appear in the comparison; an episode whose twin never ran (cut off at the decision) is listed under
``unpaired`` in the summary and left out of the comparison.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

from dz_gym.stats.sequential import SequentialDecision, SequentialPairTest

__all__ = ["PairTracker", "unpaired_rows"]

ARMS = ("a", "b")


def _pair_key(row: Mapping[str, Any]) -> tuple[int, int]:
    return int(row["scene"]), int(row["seed"])


def _outcome(row: Mapping[str, Any]) -> bool | None:
    return None if row.get("error") is not None else bool(row.get("success_at_end"))


def unpaired_rows(rows: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """``{"scene", "episode", "seed", "arm"}`` of every A/B row whose twin (same scene and seed, other arm)
    has no row."""
    by_key: dict[tuple[int, int], dict[str, Mapping[str, Any]]] = {}
    for row in rows:
        if row.get("arm") in ARMS:
            by_key.setdefault(_pair_key(row), {})[row["arm"]] = row
    out = []
    for key in sorted(by_key):
        arms = by_key[key]
        if len(arms) == 1:
            ((arm, row),) = arms.items()
            out.append(
                {
                    "scene": row["scene"],
                    "episode": row["episode"],
                    "seed": row["seed"],
                    "arm": arm,
                }
            )
    return out


class PairTracker:
    """Completed pairs of an A/B run and, with ``sequential``, the stopping rule (see the module docstring).

    ``rows``: the rows already written (resume), in file order. ``max_pairs``: the test's cap.
    """

    def __init__(self, *, sequential: bool, alpha: float = 0.05, max_pairs: int | None = None,
                 rows: Iterable[Mapping[str, Any]] = ()):  # fmt: skip
        self.test = SequentialPairTest(alpha, max_pairs) if sequential else None
        self._waiting: dict[tuple[int, int], Mapping[str, Any]] = {}
        self.pairs = 0
        for row in rows:
            self.add(row)

    @property
    def decision(self) -> SequentialDecision | None:
        return None if self.test is None else self.test.decision

    @property
    def stopped(self) -> bool:
        """Whether the sequential test has decided (or reached its cap): start no new episodes."""
        return self.test is not None and self.test.decision.stop

    def add(self, row: Mapping[str, Any]) -> bool:
        """Take one written row; returns :attr:`stopped` after it."""
        arm = row.get("arm")
        if arm not in ARMS:
            return self.stopped
        key = _pair_key(row)
        twin = self._waiting.pop(key, None)
        if twin is None or twin.get("arm") == arm:
            self._waiting[key] = row
            return self.stopped
        self.pairs += 1
        a, b = (twin, row) if arm == "b" else (row, twin)
        if self.test is not None:
            self.test.update([(_outcome(a), _outcome(b))])
        return self.stopped

    def summary(
        self, rows: Iterable[Mapping[str, Any]], *, planned_pairs: int, finished: bool
    ) -> dict[str, Any] | None:
        """``summary.json``'s ``sequential`` entry (None without ``--sequential``): the test's settings and
        decision, why the run stopped (``stopped_by``) and the episodes left without a twin.

        ``finished``: every planned episode has a row (else the run was interrupted or aborted).
        """
        if self.test is None:
            return None
        decision = self.test.decision
        if decision.reason in ("a_better", "b_better"):
            stopped_by = "decision"
        elif decision.reason == "max_pairs":
            stopped_by = "max_episodes"
        elif finished:
            stopped_by = "planned_episodes_done"
        else:
            stopped_by = "not_stopped"  # interrupted or aborted: --resume continues the test
        entry = self.test.to_dict()
        entry.update(
            stopped_by=stopped_by,
            planned_pairs=int(planned_pairs),
            completed_pairs=self.pairs,
            unpaired=unpaired_rows(rows),
            log10_e_value=None if decision.e_value <= 0 else math.log10(decision.e_value),
        )
        return entry
