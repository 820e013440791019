"""How a sharded run is placed on Ray (:class:`RayOptions`) and the ``dz-gym-eval`` flags that set it.

None of these settings changes results, so none is saved in ``config.json``: a resumed run may use other
shards, nodes or none at all. Parsing the flags does not import Ray; a missing Ray is a usage error of
``--ray`` (one line, exit 2).
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
from collections.abc import Callable, Mapping

from dz_gym.cli_types import Flag, flag_message, given_fields, integer, number
from dz_gym.envs.backends import BackendTraits, per_backend, traits

AB_NOT_SHARDED = (
    "A/B and --arm runs (--server-b/--policy-b/--arm) keep each pair's two slots in one batch; run them without --ray"
)


def check_shardable(config) -> None:
    """The one rule on what may run as Ray shards (an ``EvalConfig``): not an A/B run; a ``ValueError`` naming
    ``ray_options`` otherwise (the command line words it as ``--ray``)."""
    if config.armed:
        raise ValueError(f"ray_options: {AB_NOT_SHARDED}")


@dataclasses.dataclass
class RayOptions:
    """How to run on Ray (none of it changes results).

    ``address``: ``"local"`` (a private Ray instance on this machine) or a cluster address (``"auto"``,
    ``"HOST:6379"``, ``"ray://HOST:10001"``). ``shards``: default one per node (MuJoCo) or per GPU (Isaac Lab).
    ``servers_per_shard``: each shard uses its own group of that many server URLs. ``shard_cpus``: CPUs per
    MuJoCo shard (default: one per env slot, at most its share of a node), also its env worker count.
    ``resources``: custom Ray resources every shard asks for (to place shards on the nodes that have them).
    ``max_restarts``: new actors per shard after its actor died. ``local_cpus``, ``local_gpus``: CPUs and
    GPUs of the ``local`` instance (default: all that Ray detects). ``ship_files``: send trajectories and videos back as bytes (True), or have shards
    write them into the run directory (False: it must be on a file system every node shares); default: write
    directly from the nodes that see the run directory (a token file written by the driver tells), ship from
    the others. ``worker_setup``: a function every shard's actor calls first, before it starts Isaac Sim or
    imports a simulator (e.g. to put a site's packages in place; it travels to the nodes with cloudpickle).
    ``poll_s``: how often the driver drains rows; ``stop_grace_s``: how long shards get to stop
    after a stop request before they are killed.
    """

    address: str = "local"
    shards: int | None = None
    servers_per_shard: int | None = None
    shard_cpus: float | None = None
    shard_gpus: float | None = None
    resources: Mapping[str, float] = dataclasses.field(default_factory=dict)
    max_restarts: int = 2
    local_cpus: int | None = None
    local_gpus: int | None = None
    ship_files: bool | None = None
    worker_setup: Callable[[], None] | None = None
    poll_s: float = 0.1
    stop_grace_s: float = 120.0

    def __post_init__(self) -> None:
        if not isinstance(self.address, str) or not self.address.strip():
            raise ValueError(f"address: expected 'local' or a Ray cluster address, got {self.address!r}")
        for name in ("shards", "servers_per_shard"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
                raise ValueError(f"{name}: expected an integer >= 1, got {value!r}")
        if self.shard_cpus is not None and not self.shard_cpus > 0:
            raise ValueError(f"shard_cpus: expected a number > 0, got {self.shard_cpus!r}")
        if self.shard_gpus is not None and not (
            self.shard_gpus >= 0 and (self.shard_gpus <= 1 or float(self.shard_gpus).is_integer())
        ):
            raise ValueError(
                f"shard_gpus: expected a number >= 0, at most 1 or a whole number, got {self.shard_gpus!r}"
            )
        if self.local_gpus is not None and (not isinstance(self.local_gpus, int) or self.local_gpus < 0):
            raise ValueError(f"local_gpus: expected an integer >= 0, got {self.local_gpus!r}")
        if not isinstance(self.max_restarts, int) or self.max_restarts < 0:
            raise ValueError(f"max_restarts: expected an integer >= 0, got {self.max_restarts!r}")
        for name, amount in self.resources.items():
            if not name or name in ("CPU", "GPU") or not amount > 0:
                raise ValueError(
                    f"resources: expected NAME=AMOUNT (a custom resource, AMOUNT > 0), got {name}={amount}"
                )


def _default_shards(traits: BackendTraits) -> str:
    if traits.shard_gpus is None:
        return "one per GPU, at least one per Ray node"
    if not traits.shard_gpus:
        return "one per Ray node"
    return "one per GPU" if traits.shard_gpus == 1 else f"one per {traits.shard_gpus:g} GPUs"


def _default_gpus(traits: BackendTraits) -> str:
    if traits.shard_gpus is None:
        return "a share of its node's GPUs (none without)"
    return f"{traits.shard_gpus:g}"


def _default_cpus(traits: BackendTraits) -> str:
    return f"{traits.shard_cpus:g}" if traits.shard_cpus else "one per env slot, at most its share of a node"


# The scale-out flags of ``dz-gym-eval`` that set a RayOptions field (or, --ray-resource, its ``resources``).
RAY_FLAGS = (
    Flag("--ray", "run the envs as shards on a Ray cluster: 'local' (a private Ray on this machine), 'auto' or "
         "HOST:PORT of a running cluster (needs the ray extra; docs/ray.md)", field="address", metavar="ADDRESS",
         shown="off: one process"),
    Flag("--shards", "shards", field="shards", type=integer, metavar="K", shown=per_backend(_default_shards)),
    Flag("--servers-per-shard", "each shard uses its own M of the --server URLs, in order (shard j: the (j*M)th "
         "to the (j*M+M-1)th)", field="servers_per_shard", type=integer, metavar="M",
         shown="envs spread over all servers as in one process"),
    Flag("--shard-cpus", "CPUs (and simulator workers) per shard", field="shard_cpus", type=number, metavar="C",
         shown=per_backend(_default_cpus)),
    Flag("--shard-gpus", "GPUs per shard, fractional allowed (0.25: four shards share a GPU); a shard simulates "
         "and renders on the GPU Ray gives it", field="shard_gpus", type=number, metavar="F",
         shown=per_backend(_default_gpus)),
    Flag("--ray-resource", "a custom Ray resource every shard asks for (repeatable): places shards on the nodes "
         "that have it", dest="resources", action="append", metavar="NAME=AMOUNT"),
    Flag("--shard-restarts", "new actors for a shard whose actor died", field="max_restarts", type=integer,
         metavar="R"),
    Flag("--ship-files", "send trajectories and videos back to this machine", field="ship_files",
         action=argparse.BooleanOptionalAction, shown="only from nodes that do not see the run directory"),
)  # fmt: skip


def ray_options_from_args(parser: argparse.ArgumentParser, args: argparse.Namespace, config) -> RayOptions | None:
    """:class:`RayOptions` from the flags (None without ``--ray``) for the run ``config`` (an ``EvalConfig``);
    bad flags end in ``parser.error``. A flag not given keeps :class:`RayOptions`' default."""
    num_envs = config.plan.num_envs
    given = given_fields(args, RAY_FLAGS)
    if given.pop("address", None) is None:
        others = [f.name for f in RAY_FLAGS if getattr(args, f.key, None) is not None]
        if others:
            parser.error(f"{others[0]}: only with --ray ADDRESS|local")
        return None
    try:
        check_shardable(config)
    except ValueError as exc:
        parser.error(f"--ray: {str(exc).partition(': ')[2]}")
    if importlib.util.find_spec("ray") is None:
        from dz_gym.eval.shards import MISSING_RAY

        parser.error(f"--ray: {MISSING_RAY}")
    resources = {}
    for item in args.resources or ():
        name, sep, amount = item.partition("=")
        try:
            resources[name.strip()] = float(amount) if sep else 1.0
        except ValueError:
            parser.error(f"--ray-resource: expected NAME=AMOUNT, got {item!r}")
    if args.shards is not None and args.shards > num_envs:
        parser.error(f"--shards: expected at most --num-envs={num_envs} shards (each needs an env), got {args.shards}")
    try:
        options = RayOptions(address=args.address, resources=resources, **given)
        if options.shard_gpus is not None:
            traits(config.plan.backend).check_shard_gpus(options.shard_gpus)
        return options
    except ValueError as exc:
        parser.error(flag_message(exc, RAY_FLAGS))
