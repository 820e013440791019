"""How a run is split into shards: fixed env-slot ranges, the episodes and servers of each (pure, no Ray).

A one-process run gives episode ``k`` of a scene the seed ``seed + k`` and the env slot ``k % num_envs``; each
slot runs its episodes in order (see :mod:`dz_gym.eval.runner`). A sharded run keeps exactly that map: the
``num_envs`` global slots are cut into ``K`` contiguous ranges, shard ``j`` owns the slots of range ``j`` and so
the episodes ``k`` with ``k % num_envs`` in that range, in the same order on the same (global) slot. The
(scene, seed) set, the quota of every slot and therefore, for a deterministic policy, every row (except timing
and the shard/node that ran it) are the same as in one process, whatever ``K``.

Servers: without ``servers_per_shard`` global slot ``g`` talks to ``servers[g % len(servers)]``, as in one
process. With ``servers_per_shard = M`` shard ``j`` uses its own group of ``M`` servers,
``servers[(j*M + m) % len(servers)]`` for ``m < M``, spread over its slots in turn (servers next to the node that
runs the shard, e.g. one group per node).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence


@dataclasses.dataclass(frozen=True)
class Shard:
    """One shard: its index, its global env slots ``[start, stop)`` and, per scene, its slots' episode queues."""

    index: int
    start: int
    stop: int
    queues: dict[int, tuple[tuple[int, ...], ...]]  # scene -> per local slot, the episodes in order

    @property
    def num_envs(self) -> int:
        return self.stop - self.start

    @property
    def slots(self) -> range:
        return range(self.start, self.stop)

    def episodes(self, scene: int) -> list[int]:
        """The episodes of ``scene`` this shard runs, sorted."""
        return sorted(k for queue in self.queues.get(scene, ()) for k in queue)

    def scenes(self) -> list[int]:
        """The scenes with at least one episode for this shard, in run order."""
        return [s for s, queues in self.queues.items() if any(queues)]


def slot_ranges(num_envs: int, shards: int) -> list[tuple[int, int]]:
    """``shards`` contiguous, near-equal ranges of ``range(num_envs)`` (the larger ones first)."""
    if not isinstance(num_envs, int) or num_envs < 1:
        raise ValueError(f"num_envs: expected an integer >= 1, got {num_envs!r}")
    if not isinstance(shards, int) or isinstance(shards, bool) or shards < 1:
        raise ValueError(f"shards: expected an integer >= 1, got {shards!r}")
    if shards > num_envs:
        raise ValueError(f"shards: expected at most num_envs={num_envs} shards (each needs an env slot), got {shards}")
    base, extra = divmod(num_envs, shards)
    out, start = [], 0
    for j in range(shards):
        width = base + (1 if j < extra else 0)
        out.append((start, start + width))
        start += width
    return out


def plan_shards(todo: Mapping[int, Sequence[int]], num_envs: int, shards: int) -> list[Shard]:
    """Split the episodes ``todo`` (scene -> episode indices still to run) over ``shards`` slot ranges.

    Episode ``k`` goes to the shard owning global slot ``k % num_envs``, at local slot ``k % num_envs - start``;
    each local slot's episodes are in increasing order, as the one-process runner runs them.
    """
    out = []
    for j, (start, stop) in enumerate(slot_ranges(num_envs, shards)):
        queues: dict[int, tuple[tuple[int, ...], ...]] = {}
        for scene, episodes in todo.items():
            per_slot: list[list[int]] = [[] for _ in range(stop - start)]
            for k in sorted({int(e) for e in episodes}):
                if k < 0:
                    raise ValueError(f"episodes: expected indices >= 0, got {k}")
                g = k % num_envs
                if start <= g < stop:
                    per_slot[g - start].append(k)
            queues[int(scene)] = tuple(tuple(q) for q in per_slot)
        out.append(Shard(index=j, start=start, stop=stop, queues=queues))
    return out


def shard_servers(servers: Sequence[str], shard: Shard, servers_per_shard: int | None = None) -> list[str]:
    """The server URL of each local slot of ``shard`` (one entry per slot; see the module docstring)."""
    servers = list(servers)
    if not servers:
        raise ValueError("servers: expected at least one server URL")
    if servers_per_shard is None:
        return [servers[g % len(servers)] for g in shard.slots]
    if not isinstance(servers_per_shard, int) or servers_per_shard < 1:
        raise ValueError(f"servers_per_shard: expected an integer >= 1, got {servers_per_shard!r}")
    if servers_per_shard > len(servers):
        raise ValueError(
            f"servers_per_shard: expected at most the {len(servers)} servers given, got {servers_per_shard}"
        )
    group = [servers[(shard.index * servers_per_shard + m) % len(servers)] for m in range(servers_per_shard)]
    return [group[i % servers_per_shard] for i in range(shard.num_envs)]


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
