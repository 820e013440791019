"""dz_gym.eval.collector: the collector's passes per generation and their seconds while entered (``--profile``'s
``collector``)."""

from __future__ import annotations

import gc

from dz_gym.eval.collector import CollectorPauses


def test_pauses_count_the_passes_per_generation_while_entered():
    with CollectorPauses() as pauses:
        gc.collect(0)
        gc.collect(2)
    assert pauses.passes[0] >= 1 and pauses.passes[2] >= 1
    assert all(s >= 0 for s in pauses.seconds)
    counted = pauses.report()
    gc.collect()  # after the exit nothing is counted
    assert pauses.report() == counted == {"passes": pauses.passes, "seconds": pauses.seconds}
