"""Statistics for evaluating policies: success-rate intervals, paired A/B comparison, sequential stopping.

Pure functions and small state machines, no I/O:

- :mod:`~dz_gym.stats.proportions`: Wilson interval, Newcombe's paired-difference interval;
- :mod:`~dz_gym.stats.exact`: exact McNemar p-value, Holm adjustment;
- :mod:`~dz_gym.stats.walk`: exact operating characteristics of a sequential paired rule (dynamic program);
- :mod:`~dz_gym.stats.design`: the sequential design (truncated SPRT with futility, alpha spent to the cap);
- :mod:`~dz_gym.stats.sequential`: that rule fed pair by pair in plan order, errored pairs bounded against each claim;
- :mod:`~dz_gym.stats.confseq`: a confidence sequence for the paired difference (valid at any stop);
- :mod:`~dz_gym.stats.ranking`: K arms on the same seeds: Wilson intervals and simultaneous rank intervals;
- :mod:`~dz_gym.stats.select`: adaptive selection of the best of K arms (anytime-valid elimination);
- :mod:`~dz_gym.stats.comparison`: rows of two arms -> the comparison JSON and its printed table.
"""

from dz_gym.stats.comparison import compare_rows, format_comparison, pair_rows, split_arms
from dz_gym.stats.confseq import difference_confidence_sequence
from dz_gym.stats.design import SequentialDesign
from dz_gym.stats.exact import binomial_half_two_sided_p, holm_adjust, mcnemar_exact_p
from dz_gym.stats.proportions import Z95, PairedCounts, paired_difference_interval, wilson_interval
from dz_gym.stats.ranking import rank_arms
from dz_gym.stats.select import BestArmSelection
from dz_gym.stats.sequential import SequentialDecision, SequentialPairTest, log_e_values

__all__ = [
    "BestArmSelection",
    "Z95",
    "PairedCounts",
    "SequentialDecision",
    "SequentialDesign",
    "SequentialPairTest",
    "binomial_half_two_sided_p",
    "compare_rows",
    "difference_confidence_sequence",
    "format_comparison",
    "holm_adjust",
    "log_e_values",
    "mcnemar_exact_p",
    "pair_rows",
    "rank_arms",
    "paired_difference_interval",
    "split_arms",
    "wilson_interval",
]
