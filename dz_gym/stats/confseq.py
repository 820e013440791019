"""A confidence sequence for the paired difference in success rate, valid at any stopping time (pure).

Each pair gives ``X = b_success - a_success`` in {-1, 0, 1}; its mean is the difference ``delta = p_B - p_A``.
For every candidate ``m`` two bettors wager on ``Y = (X + 1) / 2`` in [0, 1] against the mean ``(m + 1) / 2``,
one on "above", one on "below", with predictable bet sizes (the predictable plug-in of Waudby-Smith and Ramdas,
"Estimating means of bounded random variables by betting", JRSS-B 2024). Their average wealth is a
nonnegative martingale with mean 1 when ``m`` is the true difference, so by Ville's inequality it ever reaches
``1/alpha`` with probability at most ``alpha``. The interval keeps the ``m`` whose wealth has never reached
``1/alpha``: it covers the true difference at every pair simultaneously with probability ``1 - alpha``, so
also at a data-dependent stop such as the sequential test's.

The pairs must be given in the order that the stopping rule saw them (plan order).
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import numpy as np

__all__ = ["difference_confidence_sequence"]

_GRID = 801


def difference_confidence_sequence(
    outcomes: Iterable[tuple[bool, bool]], alpha: float = 0.05, grid: int = _GRID
) -> tuple[float, float] | None:
    """``(low, high)`` for ``p_B - p_A`` after the pairs ``(a_success, b_success)`` (None: no pairs).

    The bounds are on a grid of ``grid`` points over [-1, 1] (rounded outward).
    """
    if not 0.0 < float(alpha) < 1.0:
        raise ValueError(f"alpha: expected a number in (0, 1), got {alpha!r}")
    xs = np.asarray([float(bool(b)) - float(bool(a)) for a, b in outcomes], dtype=np.float64)
    if xs.size == 0:
        return None
    y = (xs + 1.0) / 2.0
    n = y.size
    t = np.arange(1, n + 1, dtype=np.float64)
    # Predictable variance estimate (from the pairs before each one, with a prior pseudo-pair) sizes the bets.
    mean_after = (0.5 + np.cumsum(y)) / (t + 1)
    var_after = (0.25 + np.cumsum((y - mean_after) ** 2)) / (t + 1)
    var_before = np.concatenate([[0.25], var_after[:-1]])
    lam = np.sqrt(2.0 * math.log(2.0 / alpha) / (var_before * t * np.log1p(t)))
    mu = (np.linspace(-1.0, 1.0, grid) + 1.0) / 2.0  # candidate means of Y
    inner = mu[1:-1]
    lam_up = np.minimum(lam[:, None], 0.5 / inner[None, :])
    lam_down = np.minimum(lam[:, None], 0.5 / (1.0 - inner[None, :]))
    dev = y[:, None] - inner[None, :]
    log_up = np.cumsum(np.log1p(lam_up * dev), axis=0)
    log_down = np.cumsum(np.log1p(-lam_down * dev), axis=0)
    wealth = np.logaddexp(log_up, log_down) - math.log(2.0)
    excluded = (wealth >= math.log(1.0 / alpha)).any(axis=0)
    keep = np.concatenate([[not (y > 0).any()], ~excluded, [not (y < 1).any()]])
    # The endpoints m = -1 / m = 1 stay unless an observation rules them out (Y > 0, Y < 1 respectively).
    idx = np.nonzero(keep)[0]
    if idx.size == 0:  # cannot happen for the true mean; keep the point estimate's cell
        centre = int(np.clip(round((xs.mean() + 1) / 2 * (grid - 1)), 0, grid - 1))
        idx = np.asarray([centre])
    values = np.linspace(-1.0, 1.0, grid)
    step = 2.0 / (grid - 1)
    return float(max(-1.0, values[idx[0]] - step)), float(min(1.0, values[idx[-1]] + step))
