"""The report's sequential status block: the decision first, why it stopped, the e-value path."""

from __future__ import annotations

from dz_gym.eval.ab import PairTracker
from dz_gym.report.sequential import sequential_block


def _entry(pairs, planned):
    rows = [{"scene": 1, "episode": k, "seed": k, "arm": arm, "error": None, "success_at_end": out}
            for k, pair in enumerate(pairs) for arm, out in zip("ab", pair)]  # fmt: skip
    return PairTracker(sequential=True, rows=rows).summary(rows, planned_pairs=planned, finished=True)


def test_block_shows_decision_path_and_interval():
    entry = _entry([(False, True)] * 30, 30)
    html = sequential_block({"sequential": entry})
    assert 'data-reason="b_better"' in html and "B is better" in html and "descriptive only" in html
    assert 'id="plot-evalue"' in html and "<polyline" in html
    assert "confidence sequence" in html and "bias of the estimate" in html
    assert f"cap {entry['max_pairs']} pairs" in html


def test_block_for_futility_and_for_plain_runs():
    entry = _entry([(True, False), (False, True)] * 100, 200)
    html = sequential_block({"sequential": entry})
    assert 'data-reason="no_difference"' in html and "stopped for futility" in html
    assert sequential_block({"scenes": [1]}) == ""
