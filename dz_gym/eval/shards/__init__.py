"""Sharded runs of ``dz-gym-eval`` on a Ray cluster (``--ray ADDRESS|local --shards K``).

- :mod:`~dz_gym.eval.shards.plan`: what a shard asks the cluster for (pure; who runs what is the run plan's,
  :mod:`dz_gym.eval.plan`);
- :mod:`~dz_gym.eval.shards.worker`: the shard's Ray actor (its own simulator batch and connections);
- :mod:`~dz_gym.eval.shards.collector`: the actor on the driver's node that shards push rows to;
- :mod:`~dz_gym.eval.shards.driver`: :func:`~dz_gym.eval.shards.driver.evaluate_sharded`, the driver.

Ray is optional (``pip install "dz-gym[ray]"``): importing this package does not import it, and
:func:`require_ray` turns its absence into one clear line. ``docs/ray.md`` describes how to run on a cluster.
"""

from __future__ import annotations

from types import ModuleType

from dz_gym.errors import RayMissingError

MISSING_RAY = 'ray: not installed; install it with: pip install "dz-gym[ray]"'


def require_ray() -> ModuleType:
    """The ``ray`` module, or :class:`RayMissingError` with a one-line install hint."""
    try:
        import ray
    except ImportError:
        raise RayMissingError(MISSING_RAY) from None
    return ray
