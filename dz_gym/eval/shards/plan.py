"""What a shard asks the cluster for: the default shard count, its CPUs and its simulator workers (pure, no Ray).

Which episodes, slots and servers each shard gets is the run plan's (:mod:`dz_gym.eval.plan`: shard ``j`` owns
the ``j``-th contiguous range of the ``num_envs`` global slots and runs their entries, in the same order on the
same slot as one process would); this module sizes the shards for the nodes they run on.
"""

from __future__ import annotations


def default_shard_count(
    num_envs: int, *, nodes: int, gpus: float, backend: str, shard_gpus: float | None = None
) -> int:
    """One shard per Ray node (MuJoCo on nodes without GPUs), per GPU (MuJoCo on GPU nodes, Isaac Lab) or per
    ``shard_gpus`` GPUs when that is given, at most one per env slot (the backend's
    :meth:`~dz_gym.envs.backends.BackendTraits.shard_count`)."""
    from dz_gym.envs.backends import traits

    return traits(backend).shard_count(num_envs, nodes=nodes, gpus=gpus, shard_gpus=shard_gpus)


def gpus_per_shard(default: float | None, requested: float | None, shards_per_node: int, node_gpus: float) -> float:
    """GPUs a shard asks Ray for: ``requested`` (``--shard-gpus``), else the backend's ``default``; a default
    of None shares the GPUs of a node among its shards: a whole GPU each while there are enough, else
    ``1/m`` with ``m = ceil(shards_per_node / node_gpus)`` (Ray puts a fractional request on one GPU, so ``m``
    shards fill each GPU and every shard fits); no GPU where a node has none (``node_gpus``: the fewest GPUs
    of any node)."""
    if requested is not None:
        if not requested >= 0:
            raise ValueError(f"shard_gpus: expected a number >= 0, got {requested!r}")
        return float(requested)
    if default is not None:
        return float(default)
    gpus = int(node_gpus + 1e-9)
    if gpus < 1:
        return 0.0
    per_gpu = -(-max(1, int(shards_per_node)) // gpus)
    return 1.0 if per_gpu <= 1 else (10_000 // per_gpu) / 10_000  # rounded down: Ray counts 1e-4 GPUs


def cpus_per_shard(
    shard_envs: int, node_cpus: float, shards_per_node: int = 1, requested: float | None = None
) -> float:
    """CPUs a MuJoCo shard asks Ray for: one per env, at most its share of a node (``shards_per_node`` shards
    spread over the nodes share one), at least one; or ``requested``."""
    if requested is not None:
        if not requested > 0:
            raise ValueError(f"shard_cpus: expected a number > 0, got {requested!r}")
        return float(requested)
    share = int(node_cpus) // max(1, int(shards_per_node))
    return float(max(1, min(int(shard_envs), share)))


def env_workers(shard_envs: int, cpus: float) -> int:
    """MuJoCo worker processes of a shard with ``cpus`` CPUs: one per CPU (at most one per env); with a single
    CPU none, the actor steps its envs itself (no inter-process copies)."""
    cpus = int(cpus)
    return min(int(shard_envs), cpus) if cpus >= 2 else 0
