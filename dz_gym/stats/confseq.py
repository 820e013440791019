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

A pair with an errored episode (``None``) is bounded, not dropped: the "above" bettors (which exclude values too
low) bet on the pairs with the errored outcomes imputed against B (B's as failures, A's as successes), the
"below" bettors on those imputed against A, each with bet sizes from its own sequence's past. Imputation moves
``Y`` toward the side where that bettor loses, and its bets are nonnegative and predictable, so each bettor's
wealth is at most its wealth on the complete outcomes with the same bets (a martingale under the true mean when
the errors of a pair depend only on that pair): the interval contains the true difference at every pair with
probability ``1 - alpha`` whatever the errors depend on. Without errored pairs both sequences are the data.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import numpy as np

__all__ = ["difference_confidence_sequence"]

_GRID = 801


def _bets(y: np.ndarray, alpha: float) -> np.ndarray:
    """The predictable plug-in bet sizes for the sequence ``y`` (from the pairs before each one)."""
    t = np.arange(1, y.size + 1, dtype=np.float64)
    mean_after = (0.5 + np.cumsum(y)) / (t + 1)
    var_after = (0.25 + np.cumsum((y - mean_after) ** 2)) / (t + 1)
    var_before = np.concatenate([[0.25], var_after[:-1]])
    return np.sqrt(2.0 * math.log(2.0 / alpha) / (var_before * t * np.log1p(t)))


def difference_confidence_sequence(
    outcomes: Iterable[tuple[bool | None, bool | None]], alpha: float = 0.05, grid: int = _GRID
) -> tuple[float, float] | None:
    """``(low, high)`` for ``p_B - p_A`` after the pairs ``(a_success, b_success)`` (None: no pairs; an
    outcome ``None``: that episode errored, bounded as the module docstring says).

    The bounds are on a grid of ``grid`` points over [-1, 1] (rounded outward).
    """
    if not 0.0 < float(alpha) < 1.0:
        raise ValueError(f"alpha: expected a number in (0, 1), got {alpha!r}")
    pairs = list(outcomes)
    if not pairs:
        return None

    # Y = (X + 1) / 2 with the errored outcomes imputed against B (low) and against A (high)
    low_b = np.asarray([0.0 if b is None else float(bool(b)) for _, b in pairs])
    low_a = np.asarray([1.0 if a is None else float(bool(a)) for a, _ in pairs])
    high_b = np.asarray([1.0 if b is None else float(bool(b)) for _, b in pairs])
    high_a = np.asarray([0.0 if a is None else float(bool(a)) for a, _ in pairs])
    y_low, y_high = (low_b - low_a + 1.0) / 2.0, (high_b - high_a + 1.0) / 2.0
    mu = (np.linspace(-1.0, 1.0, grid) + 1.0) / 2.0  # candidate means of Y
    inner = mu[1:-1]
    lam_up = np.minimum(_bets(y_low, alpha)[:, None], 0.5 / inner[None, :])
    lam_down = np.minimum(_bets(y_high, alpha)[:, None], 0.5 / (1.0 - inner[None, :]))
    log_up = np.cumsum(np.log1p(lam_up * (y_low[:, None] - inner[None, :])), axis=0)
    log_down = np.cumsum(np.log1p(-lam_down * (y_high[:, None] - inner[None, :])), axis=0)
    wealth = np.logaddexp(log_up, log_down) - math.log(2.0)
    excluded = (wealth >= math.log(1.0 / alpha)).any(axis=0)
    keep = np.concatenate([[not (y_low > 0).any()], ~excluded, [not (y_high < 1).any()]])
    # The endpoints m = -1 / m = 1 stay unless an observation rules them out (Y > 0, Y < 1 respectively).
    idx = np.nonzero(keep)[0]
    if idx.size == 0:  # cannot happen for the true mean; keep the point estimate's cell
        centre = int(np.clip(round((y_low.mean() + y_high.mean()) / 2 * (grid - 1)), 0, grid - 1))
        idx = np.asarray([centre])
    values = np.linspace(-1.0, 1.0, grid)
    step = 2.0 / (grid - 1)
    return float(max(-1.0, values[idx[0]] - step)), float(min(1.0, values[idx[-1]] + step))
