"""The run plan: who runs what. Scene x episode x arm -> seed, env slot, server, shard, pair (pure, no I/O).

Every executor (one process, a process per scene, Ray shards) runs the entries of one :class:`RunPlan` and
decides nothing itself; the rows a run writes are therefore the same whichever executor runs it.

The map, fixed for a run by its config (``num_envs``, arms, shard count) and independent of timing and of
the servers' URLs: :func:`plan_of` builds it from the config alone, and :meth:`RunPlan.resolve` puts in the
servers once they run (the embedded servers' URLs are known only then):

- episode ``k`` of a scene has seed ``seed + k``;
- without arms it runs on env slot ``k % num_envs``; in a run of ``K`` arms (an A/B run: ``K = 2``, arms
  ``a`` and ``b``) arm ``i`` on slot ``K (k % P) + i`` with ``P = num_envs // K`` (the ``K`` runs of a seed
  side by side, in the same batch);
- each slot runs its entries in plan order; a slot whose entries are done idles;
- server (:meth:`RunPlan.resolve`): slot ``g`` talks to ``servers[g % len(servers)]`` (as the transport's pool
  numbers its sessions); in an A/B run the slots of arm A (``2j``) to ``servers[j % len(servers)]`` and those of
  arm B to ``servers_b[j % len(servers_b)]``; with ``K`` named arms slot ``K j + i`` to arm ``i``'s
  ``servers[j % len(servers)]``; with ``servers_per_shard = M`` shard ``s`` uses its own group of ``M``
  servers, ``servers[(s*M + m) % len(servers)]``, over its slots in turn;
- shard: the ``num_envs`` slots are cut into contiguous near-equal ranges, one per shard (one shard when the
  run is not sharded); a shard runs the entries of its slots;
- plan order: scenes in their config order, then episode, then arm (``order``); with ``interleave=True`` (a
  run's plan, :func:`plan_of`) the scenes alternate (episode-major). A/B entries carry ``pair``: the index of
  their (scene, episode) among the plan's pairs in plan order, which a sequential test can consume in that
  order whatever order the episodes finish in; so that it can stop in any scene, the executors run a run's
  scenes side by side (one batch each), not one after another.

Example::

    >>> plan = build_plan(scenes=[1, 2], episodes=3, num_envs=2, seed=10, servers=["ws://a", "ws://b"])
    >>> [(e.scene, e.episode, e.seed, e.slot, e.server) for e in plan.entries][:4]
    [(1, 0, 10, 0, 'ws://a'), (1, 1, 11, 1, 'ws://b'), (1, 2, 12, 0, 'ws://a'), (2, 0, 10, 0, 'ws://a')]
    >>> [[e.episode for e in q] for q in plan.slot_queues(1)]
    [[0, 2], [1]]
    >>> ab = build_plan(scenes=[1], episodes=2, num_envs=4, seed=0, servers=["ws://a"], servers_b=["ws://b"])
    >>> [(e.episode, e.arm, e.slot, e.server, e.pair) for e in ab.entries]
    [(0, 'a', 0, 'ws://a', 0), (0, 'b', 1, 'ws://b', 0), (1, 'a', 2, 'ws://a', 1), (1, 'b', 3, 'ws://b', 1)]
    >>> k3 = build_plan(scenes=[1], episodes=1, num_envs=3, seed=0, servers=["ws://a"],
    ...                 arm_servers=[("x", ["ws://x"]), ("y", ["ws://y"]), ("z", ["ws://z"])])
    >>> [(e.arm, e.slot, e.server, e.pair) for e in k3.entries]
    [('x', 0, 'ws://x', 0), ('y', 1, 'ws://y', 0), ('z', 2, 'ws://z', 0)]
    >>> rest = plan.remaining([{"scene": 1, "episode": 0}])
    >>> len(rest.entries), rest.entries[0].order
    (5, 1)
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from dz_gym.stats.comparison import ARMS  # the arms of an A/B run (--server-b/--policy-b); --arm names its own


def is_url(value: str) -> bool:
    """Whether an ``--arm`` value is a server URL (else an embedded policy spec).

    >>> is_url("ws://127.0.0.1:8000"), is_url("reference:skill=0.3")
    (True, False)
    """
    return str(value).startswith(("ws://", "wss://"))


__all__ = [
    "ARMS",
    "PlanEntry",
    "RunPlan",
    "build_plan",
    "is_url",
    "pair_order",
    "plan_of",
    "servers_of_arms",
    "slot_ranges",
]


@dataclasses.dataclass(frozen=True)
class PlanEntry:
    """One episode of the plan: what it is (scene, episode, arm, seed) and where it runs (slot, server, shard);
    ``server`` is None until the plan is resolved (:meth:`RunPlan.resolve`).

    ``order``: its position in the whole plan (kept by :meth:`RunPlan.remaining`); ``pair``: A/B runs only,
    the index of its (scene, episode) among the plan's pairs, in plan order; ``policy``: its arm's policy
    (:meth:`~dz_gym.eval.config.EvalConfig.arm_policies`), None where the plan was not given one."""

    order: int
    scene: int
    episode: int
    arm: str | None
    seed: int
    slot: int
    server: str | None
    shard: int = 0
    pair: int | None = None
    policy: str | None = None

    @property
    def key(self) -> tuple[int, int, str | None]:
        """What identifies the episode in the rows: ``(scene, episode, arm)``."""
        return self.scene, self.episode, self.arm


def row_key(row: Mapping[str, Any]) -> tuple[int, int, str | None]:
    """The :attr:`PlanEntry.key` of a written row."""
    return int(row["scene"]), int(row["episode"]), row.get("arm")


@dataclasses.dataclass(frozen=True)
class RunPlan:
    """Entries in plan order, and the run's slot layout (see the module docstring); ``slot_servers`` is empty
    until :meth:`resolve` names the servers."""

    entries: tuple[PlanEntry, ...]
    num_envs: int
    scenes: tuple[int, ...]
    arms: tuple[str, ...]
    shards: tuple[tuple[int, int], ...]  # per shard, its global slots [start, stop)
    slot_servers: tuple[str, ...] = ()  # per global slot, its server URL (empty: not resolved)

    def resolve(
        self,
        servers: Sequence[str] = (),
        servers_b: Sequence[str] = (),
        *,
        arm_servers: Sequence[tuple[str, Sequence[str]]] | Mapping[str, Sequence[str]] = (),
        servers_per_shard: int | None = None,
    ) -> RunPlan:
        """This plan with its servers (see the module docstring): ``servers`` for a run without arms, arm ``a``'s
        with ``servers_b`` arm ``b``'s in an A/B run, ``arm_servers`` per named arm (a mapping or ``(name,
        urls)`` pairs) in a run of named arms."""
        named = dict(arm_servers)
        if self.arms and not named:
            named = {"a": list(servers), "b": list(servers_b)} if self.arms == ARMS else {}
        missing = [arm for arm in self.arms if not named.get(arm)]
        if missing:
            raise ValueError(f"arm_servers: expected at least one server URL for arm {missing[0]!r}")
        ordered = [(arm, list(named[arm])) for arm in self.arms]
        first = list(servers) or (ordered[0][1] if ordered else [])
        slot_servers = _slot_servers(self.num_envs, first, ordered, self.shards, servers_per_shard)
        entries = tuple(dataclasses.replace(e, server=slot_servers[e.slot]) for e in self.entries)
        return dataclasses.replace(self, entries=entries, slot_servers=slot_servers)

    def remaining(self, rows: Iterable[Mapping[str, Any]]) -> RunPlan:
        """The plan without the entries that have a row (an errored episode's row counts: it is not re-run)."""
        done = {row_key(r) for r in rows}
        return dataclasses.replace(self, entries=tuple(e for e in self.entries if e.key not in done))

    def only_scenes(self, scenes: Iterable[int]) -> RunPlan:
        """The plan restricted to ``scenes`` (a process per scene runs one of them)."""
        keep = {int(s) for s in scenes}
        return dataclasses.replace(self, entries=tuple(e for e in self.entries if e.scene in keep))

    def __len__(self) -> int:
        return len(self.entries)

    def scene_order(self) -> list[int]:
        """The scenes that have entries, in the order their first entry comes in the plan."""
        out: list[int] = []
        for e in self.entries:
            if e.scene not in out:
                out.append(e.scene)
        return out

    def scene_entries(self, scene: int) -> list[PlanEntry]:
        return [e for e in self.entries if e.scene == int(scene)]

    def slot_queues(self, scene: int, shard: int | None = None) -> list[list[PlanEntry]]:
        """Per slot (of the whole run, or of ``shard``: its local slots), the entries of ``scene`` in order."""
        start, stop = (0, self.num_envs) if shard is None else self.shards[shard]
        queues: list[list[PlanEntry]] = [[] for _ in range(stop - start)]
        for e in self.entries:
            if e.scene == int(scene) and start <= e.slot < stop:
                queues[e.slot - start].append(e)
        return queues

    def servers_of(self, shard: int | None = None) -> list[str]:
        """The server URL of each slot (of the whole run, or of ``shard``'s local slots)."""
        start, stop = (0, self.num_envs) if shard is None else self.shards[shard]
        return list(self.slot_servers[start:stop])

    def arm_servers(self, arm: str) -> list[str]:
        """Runs with arms: the server of each of ``arm``'s slots (slot ``K j + i`` is arm ``i``'s slot ``j``)."""
        k, offset = len(self.arms), self.arms.index(arm)
        return [self.slot_servers[g] for g in range(offset, k * (self.num_envs // k), k)]

    def shard_entries(self, shard: int) -> list[PlanEntry]:
        return [e for e in self.entries if e.shard == int(shard)]

    def pairs(self) -> list[tuple[int, int]]:
        """A/B runs: the (scene, episode) of every pair in pair order (empty without arms)."""
        seen: dict[int, tuple[int, int]] = {}
        for e in self.entries:
            if e.pair is not None:
                seen.setdefault(e.pair, (e.scene, e.episode))
        return [seen[i] for i in sorted(seen)]


def slot_ranges(num_envs: int, shards: int) -> list[tuple[int, int]]:
    """``shards`` contiguous, near-equal ranges of ``range(num_envs)`` (the larger ones first).

    >>> slot_ranges(5, 2)
    [(0, 3), (3, 5)]
    """
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


def _slot_servers(
    num_envs: int,
    servers: Sequence[str],
    arm_servers: Sequence[tuple[str, Sequence[str]]],
    ranges: Sequence[tuple[int, int]],
    servers_per_shard: int | None,
) -> tuple[str, ...]:
    if not servers:
        raise ValueError("servers: expected at least one server URL")
    if arm_servers:
        k = len(arm_servers)
        for name, urls in arm_servers:
            if not urls:
                raise ValueError(f"arm_servers: expected at least one server URL for arm {name!r}")
        return tuple(arm_servers[g % k][1][(g // k) % len(arm_servers[g % k][1])] for g in range(num_envs))
    if servers_per_shard is None:
        return tuple(servers[g % len(servers)] for g in range(num_envs))
    if not isinstance(servers_per_shard, int) or isinstance(servers_per_shard, bool) or servers_per_shard < 1:
        raise ValueError(f"servers_per_shard: expected an integer >= 1, got {servers_per_shard!r}")
    if servers_per_shard > len(servers):
        raise ValueError(
            f"servers_per_shard: expected at most the {len(servers)} servers given, got {servers_per_shard}"
        )
    out: list[str] = []
    for j, (start, stop) in enumerate(ranges):
        group = [servers[(j * servers_per_shard + m) % len(servers)] for m in range(servers_per_shard)]
        out.extend(group[i % servers_per_shard] for i in range(stop - start))
    return tuple(out)


def pair_order(scenes: Sequence[int], episodes: int, interleave: bool = False) -> list[tuple[int, int]]:
    """Every (scene, episode) of a plan in plan order: scene after scene, or with ``interleave`` episode-major
    (the scenes alternate), the order an A/B run's sequential test takes its pairs in.

    >>> pair_order([1, 2], 2), pair_order([1, 2], 2, interleave=True)
    ([(1, 0), (1, 1), (2, 0), (2, 1)], [(1, 0), (2, 0), (1, 1), (2, 1)])
    """
    if interleave:
        return [(int(s), k) for k in range(int(episodes)) for s in scenes]
    return [(int(s), k) for s in scenes for k in range(int(episodes))]


def build_plan(
    *,
    scenes: Sequence[int],
    episodes: int,
    num_envs: int,
    seed: int,
    servers: Sequence[str] = (),
    servers_b: Sequence[str] = (),
    arms: Sequence[str] = (),
    shards: int = 1,
    servers_per_shard: int | None = None,
    interleave: bool = False,
    arm_servers: Sequence[tuple[str, Sequence[str]]] = (),
    policies: Mapping[str | None, str] | None = None,
) -> RunPlan:
    """The plan of a run (see the module docstring); ``arms``: the arms' names in order (none: a run without
    arms); ``policies``: per arm (None without arms) the policy its entries name. With servers it comes resolved
    (:meth:`RunPlan.resolve`): ``servers_b`` non-empty makes it an A/B run (arms ``a``: ``servers`` and ``b``:
    ``servers_b``); ``arm_servers``: ``(name, servers)`` per arm of a run of ``K >= 2`` named arms, in arm order."""
    if not isinstance(episodes, int) or isinstance(episodes, bool) or episodes < 0:
        raise ValueError(f"episodes: expected an integer >= 0, got {episodes!r}")
    if servers_b:
        arm_servers = (("a", list(servers)), ("b", list(servers_b)))
    arm_servers = tuple((str(name), list(urls)) for name, urls in arm_servers)
    arms = tuple(name for name, _ in arm_servers) or tuple(str(arm) for arm in arms)
    if len(arms) == 1 or len(set(arms)) != len(arms):
        raise ValueError(f"arm_servers: expected at least 2 arms with distinct names, got {list(arms)}")
    what = "an A/B run" if arms == ARMS else f"a run of {len(arms)} arms"
    if arms and num_envs < len(arms):
        raise ValueError(f"num_envs: {what} needs at least {len(arms)} env slots (one per arm), got {num_envs}")
    if arms and shards != 1:
        raise ValueError(f"shards: {what} runs in one process (its arms share each batch); expected 1 shard")
    ranges = slot_ranges(int(num_envs), int(shards))
    shard_of = [j for j, (start, stop) in enumerate(ranges) for _ in range(start, stop)]
    per_arm = int(num_envs) // max(1, len(arms))
    scene_list = [int(s) for s in scenes]
    entries = []
    for pair, (scene, k) in enumerate(pair_order(scene_list, episodes, interleave)):
        for arm in arms or (None,):
            slot = k % int(num_envs) if arm is None else len(arms) * (k % per_arm) + arms.index(arm)
            entries.append(PlanEntry(order=len(entries), scene=scene, episode=k, arm=arm, seed=int(seed) + k,
                                     slot=slot, server=None, shard=shard_of[slot],
                                     pair=pair if arm is not None else None,
                                     policy=(policies or {}).get(arm)))  # fmt: skip
    plan = RunPlan(tuple(entries), int(num_envs), tuple(scene_list), arms, tuple(ranges))
    if servers or arm_servers:
        return plan.resolve(servers, arm_servers=arm_servers, servers_per_shard=servers_per_shard)
    return plan


def plan_of(config: Any, *, shards: int = 1) -> RunPlan:
    """The plan of an :class:`~dz_gym.eval.config.EvalConfig`, from the config alone: who runs what, on which
    slot and shard; its servers are put in once they run (:meth:`RunPlan.resolve`, :func:`servers_of_arms`)."""
    return build_plan(
        scenes=config.plan.scenes,
        episodes=config.plan.episodes,
        num_envs=config.plan.num_envs,
        seed=config.plan.seed,
        arms=config.arms,
        shards=shards,
        policies=config.arm_policies(),
        interleave=True,  # pairs numbered as the sequential test takes them (eval/ab.py), the scenes side by side
    )


def servers_of_arms(config: Any, arm_servers: Mapping[str, Sequence[str]] | None = None) -> dict[str, list[str]]:
    """A run of named arms: each arm's server URLs, ``arm_servers``' where given, else the arm's own URL; an arm
    that names a policy needs its embedded server's URL in ``arm_servers`` (a one-line error naming it)."""
    given = dict(arm_servers or {})
    out = {}
    for name, value in config.arm_table():
        urls = list(given.get(name) or ([value] if is_url(value) else []))
        if not urls:
            raise ValueError(
                f"arm_servers: arm {name!r} names a policy; it needs its server's URL (dz-gym-eval starts it)"
            )
        out[name] = urls
    return out
