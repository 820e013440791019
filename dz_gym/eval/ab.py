"""A/B runs: the pairs of episodes in plan order, and the sequential stopping rule fed with them.

In an A/B run every (scene, episode) runs once per arm; the two rows share the seed and differ only in the
policy. :class:`PairTracker` receives rows in the order they are written, but folds the pairs into
:class:`~dz_gym.stats.sequential.SequentialPairTest` (with ``--sequential``) **in the order of the plan**
(``order``: the (scene, episode) of every pair): a pair that completes early waits until every pair before it
is in. Completion order may depend on the outcomes (an episode that succeeds can end early, and an arm that
ends early runs more episodes per second), and a test fed in that order loses its type-I guarantee; the plan
order is fixed before any outcome. A resumed run rebuilds the same state from its rows.

A pair with an episode that still errored after the runner's retries is folded in as well: each claim is
judged with its errored outcomes imputed against it, at every look (see :mod:`dz_gym.stats.sequential`); the
summary's ``errors`` entry says how many pairs were bounded that way and what the rule would have said with
them dropped.
Pairs completed after the decision are ignored by the test (its decision is final) but are real pairs and
appear in the comparison; an episode whose twin never ran (cut off at the decision) is listed under
``unpaired`` in the summary and left out of the comparison.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from dz_gym.stats.comparison import ARMS
from dz_gym.stats.confseq import difference_confidence_sequence
from dz_gym.stats.sequential import (
    DEFAULT_MIN_DIFFERENCE,
    DEFAULT_POWER,
    MAX_PAIRS,
    SequentialDecision,
    SequentialPairTest,
)

__all__ = ["PairTracker", "unpaired_rows"]


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
    """Pairs of an A/B run and, with ``sequential``, the stopping rule (see the module docstring).

    ``order``: the (scene, episode) of every planned pair, in plan order (default: sorted). ``rows``: the rows
    already written (resume). ``max_pairs``: the run's budget of pairs (errored ones included); ``min_difference``, ``power``:
    the design (:class:`~dz_gym.stats.design.SequentialDesign`).
    """

    def __init__(self, *, sequential: bool, alpha: float = 0.05, max_pairs: int | None = None,
                 rows: Iterable[Mapping[str, Any]] = (), order: Sequence[tuple[int, int]] | None = None,
                 min_difference: float = DEFAULT_MIN_DIFFERENCE, power: float = DEFAULT_POWER):  # fmt: skip
        self.test = (SequentialPairTest(alpha, max_pairs, min_difference=min_difference, power=power)
                     if sequential else None)  # fmt: skip
        rows = list(rows)
        if order is None:
            order = sorted({(int(r["scene"]), int(r["episode"])) for r in rows if r.get("arm") in ARMS})
        self.order = [(int(scene), int(episode)) for scene, episode in order]
        self._position = {key: i for i, key in enumerate(self.order)}
        self._halves: dict[tuple[int, int], dict[str, Mapping[str, Any]]] = {}
        self._done: dict[int, tuple[bool | None, bool | None]] = {}
        self.next_pair = 0  # plan index of the next pair the test waits for
        self.pairs = 0
        # the pairs the test saw, in its order (None: that episode errored; bounded in the confidence sequence)
        self.outcomes: list[tuple[bool | None, bool | None]] = []
        for row in rows:
            self.add(row)

    @property
    def decision(self) -> SequentialDecision | None:
        return None if self.test is None else self.test.decision

    @property
    def stopped(self) -> bool:
        """Whether the sequential test has stopped (decided, futile, cap, refused): start no new episodes."""
        return self.test is not None and self.test.decision.stop

    def add(self, row: Mapping[str, Any]) -> bool:
        """Take one written row; returns :attr:`stopped` after it."""
        arm = row.get("arm")
        if arm not in ARMS:
            return self.stopped
        key = (int(row["scene"]), int(row["episode"]))
        halves = self._halves.setdefault(key, {})
        if arm in halves:
            return self.stopped
        halves[arm] = row
        if len(halves) < 2:
            return self.stopped
        self.pairs += 1
        del self._halves[key]
        index = self._position.get(key)
        if index is None:  # not in the plan given (an older run's layout): append in arrival order
            index = len(self.order)
            self.order.append(key)
            self._position[key] = index
        self._done[index] = (_outcome(halves["a"]), _outcome(halves["b"]))
        while self.next_pair in self._done:
            pair = self._done.pop(self.next_pair)
            self.next_pair += 1
            if self.test is None or not self.test.decision.stop:
                self.outcomes.append(pair)
            if self.test is not None:
                self.test.update([pair])
        return self.stopped

    def _difference(self) -> dict[str, Any] | None:
        clean = [(a, b) for a, b in self.outcomes if a is not None and b is not None]
        if self.test is None or not self.outcomes:
            return None
        n = len(clean)
        estimate = sum(int(b) - int(a) for a, b in clean) / n if n else None
        discordance = sum(a != b for a, b in clean) / n if n else 0.0
        interval = difference_confidence_sequence(self.outcomes, self.test.alpha)
        low = sum((b is True) - (a is not False) for a, b in self.outcomes) / len(self.outcomes)
        high = sum((b is not False) - (a is True) for a, b in self.outcomes) / len(self.outcomes)
        bias = None if estimate is None else self.test.design.estimate_bias(discordance, estimate,
                                                                             pairs=self.test.max_pairs)  # fmt: skip
        return {
            "estimate": estimate,
            "estimate_range": [low, high],
            "confidence_sequence": list(interval) if interval else None,
            "level": 1 - self.test.alpha,
            "bias": bias,
            "note": "B - A over the pairs the test used without errors (estimate; descriptive when pairs errored) and "
            "over all of them with the errored outcomes imputed against B and against A (estimate_range); the "
            "interval is a confidence sequence (valid at the stop) bounded over the errored outcomes; bias: "
            "E[estimate at the stop] - difference for this design, computed exactly at the estimate",
        }

    def _errors(self, decision: SequentialDecision) -> dict[str, Any]:
        """How the errored pairs entered the decision: bounded, never dropped."""
        return {
            "bounded_pairs": decision.errored,
            "worst_for_b": list(decision.worst_for_b),
            "worst_for_a": list(decision.worst_for_a),
            "without_errored": self.test.without_errored(),
            "note": "pairs whose episode still errored after the retries count against every claim: 'B better' "
            "is judged with B's errored episodes as failures and A's as successes ([A only, B only] in "
            "worst_for_b), 'A better' the other way; without_errored: the rule's reason with those pairs dropped "
            "(information only: not valid when errors depend on outcomes)",
        }

    def summary(
        self, rows: Iterable[Mapping[str, Any]], *, planned_pairs: int, finished: bool
    ) -> dict[str, Any] | None:
        """``summary.json``'s ``sequential`` entry (None without ``--sequential``): the test's design, the
        budget of pairs (``budget_pairs``) and the power it has (``power``, ``below_cap``), its decision, why the run stopped (``stopped_by``), the difference with a confidence sequence, and the
        episodes left without a twin. ``finished``: every planned episode has a row; an undecided test then
        takes its final look at this budget."""
        if self.test is None:
            return None
        if finished and not self.test.decision.stop and self.next_pair >= len(self.order):
            self.test.finish()
        decision = self.test.decision
        stopped_by = {"a_better": "decision", "b_better": "decision", "no_difference": "futility",
                      "errors_undecided": "futility_errors_undecided",
                      "errors_differ": "errors_differ"}.get(decision.reason)  # fmt: skip
        if decision.reason == MAX_PAIRS:
            stopped_by = "max_episodes" if decision.pairs >= self.test.max_pairs else "planned_episodes_done"
        elif stopped_by is None:
            stopped_by = "not_stopped"  # interrupted or aborted: --resume continues the test
        entry = self.test.to_dict()
        # The pairs the run can give the test: its budget, or fewer when fewer pairs are planned; the power is
        # the one this budget has (exactly, at the planned point), never the design's planned power.
        budget = min(self.test.max_pairs, max(int(planned_pairs), 1))
        entry.update(
            budget_pairs=budget,
            power=self.test.power(budget),
            below_cap=budget < self.test.design.max_pairs,
            stopped_by=stopped_by,
            planned_pairs=int(planned_pairs),
            completed_pairs=self.pairs,
            waiting_for_pair=None if decision.stop or self.next_pair >= len(self.order) else self.next_pair,
            difference=self._difference(),
            errors=self._errors(decision),
            unpaired=unpaired_rows(rows),
            log10_e_value=None if decision.e_value <= 0 else math.log10(decision.e_value),
        )
        return entry
