"""The driver of a sharded run: starts the shards' actors on a Ray cluster, collects their rows, one run directory.

:func:`evaluate_sharded` is the Ray counterpart of :func:`dz_gym.eval.evaluate.evaluate` (same inputs, same
outputs): it makes the run plan with one shard per node or GPU (:mod:`dz_gym.eval.plan`; resources:
:mod:`dz_gym.eval.shards.plan`) and runs it as one run segment (:mod:`dz_gym.eval.segment`) with the
:class:`ShardedRun` executor, which starts one
:class:`~dz_gym.eval.shards.worker.ShardWorker` actor per shard (spread over the nodes, or on the nodes with
the resources the user names; ``num_cpus`` = the shard's env workers on MuJoCo; ``num_gpus``: one on Isaac
Lab, a share of the node's GPUs on MuJoCo, or ``--shard-gpus``),
lets each run its scenes in turn (a fresh actor per scene on Isaac Lab: one scene per process), drains the
:class:`~dz_gym.eval.shards.collector.Collector` every ``poll`` seconds and appends every new row to the one
``episodes.jsonl`` (flushed per episode; trajectories and videos shipped back are written next to it), with
one set of progress bars. The segment writes ``summary.json`` at the end, also after Ctrl-C, an exhausted error
budget or a crash, with the shard count and the nodes used.

Faults: a shard whose actor dies (process killed, node lost) loses no row the driver has; the rest of its
episodes run on a new actor (at most ``max_restarts`` times per shard), then are recorded as errored rows like
any other (``error_event`` ``shard_lost``, with the reason). An exception inside a shard (e.g. a server that cannot be reached) aborts the run, as in one process.
A stop request (first Ctrl-C) reaches every shard with its next push; they stop at the next step boundary
and flush their rows; shards still running after ``stop_grace_s`` are killed.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import secrets
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import PurePosixPath
from typing import Any

from dz_gym.envs.backends import traits
from dz_gym.errors import first_line
from dz_gym.eval.config import EvalConfig
from dz_gym.eval.control import RunControl
from dz_gym.eval.plan import PlanEntry, RunPlan, plan_of, row_key
from dz_gym.eval.row import EpisodeRow
from dz_gym.eval.rundir import RunDir
from dz_gym.eval.runner import task_name
from dz_gym.eval.segment import RunSegment, run_segment
from dz_gym.eval.shards import require_ray
from dz_gym.eval.shards.collector import Collector
from dz_gym.eval.shards.options import RayOptions, check_shardable
from dz_gym.eval.shards.plan import cpus_per_shard, default_shard_count, env_workers, gpus_per_shard
from dz_gym.eval.shards.worker import TOKEN_FILE, ShardWorker
from dz_gym.eval.signals import interruptible
from dz_gym.records import SHARD_LOST

logger = logging.getLogger(__name__)

FORWARDED_ENV = ("MUJOCO_GL", "PYOPENGL_PLATFORM")  # the simulator's rendering set-up, for every shard
LOOPBACK_ENV = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"  # "0": Ray's node address is 127.0.0.1 (read at import)
DRAIN_BATCH = 64
CALL_TIMEOUT_S = 60.0


@dataclasses.dataclass
class _ShardState:
    index: int
    slots: tuple[int, int]  # its global slots [start, stop)
    servers: list[str]  # per local slot
    scenes: list[int]  # scenes still to run, the current one first
    actor: Any = None
    ref: Any = None
    attempt: int = 0
    restarts: int = 0
    where: dict[str, Any] = dataclasses.field(default_factory=dict)
    nodes: list[str] = dataclasses.field(default_factory=list)


def connect(options: RayOptions) -> bool:
    """Connect to (or start) Ray; True when this call did (and so should shut it down).

    ``local`` starts a private single-machine instance on 127.0.0.1 (unless Ray was imported before with
    other settings): nothing outside this machine needs to reach it.
    """
    if options.address == "local" and "ray" not in sys.modules:
        os.environ.setdefault(LOOPBACK_ENV, "0")
    ray = require_ray()
    if ray.is_initialized():
        return False
    kwargs: dict[str, Any] = {"include_dashboard": False, "logging_level": logging.WARNING}
    if options.address == "local":
        kwargs["num_cpus"] = options.local_cpus or os.cpu_count() or 1
        if options.local_gpus is not None:
            kwargs["num_gpus"] = options.local_gpus
    env_vars = {name: os.environ[name] for name in FORWARDED_ENV if name in os.environ}
    if env_vars:
        kwargs["runtime_env"] = {"env_vars": env_vars}
    ray.init(address=options.address, **kwargs)
    return True


@dataclasses.dataclass(frozen=True)
class Layout:
    """How many shards a run gets on the cluster and how the cluster's CPUs and GPUs are shared between them."""

    shards: int
    node_cpus: float
    shards_per_node: int
    shard_gpus: float = 0.0  # what each shard's actor asks Ray for


def cluster_layout(config: EvalConfig, options: RayOptions) -> Layout:
    """The shard count (``options.shards``, else one per node or GPU), the CPUs of the largest node and the
    GPUs of each shard (checked against the backend's needs)."""
    nodes = [n for n in require_ray().nodes() if n.get("Alive")]
    node_gpus = [float(n.get("Resources", {}).get("GPU", 0)) for n in nodes]
    node_cpus = max((float(n.get("Resources", {}).get("CPU", 0)) for n in nodes), default=1.0)
    backend = traits(config.plan.backend)
    k = options.shards or default_shard_count(config.plan.num_envs, nodes=len(nodes), gpus=sum(node_gpus),
                                              backend=config.plan.backend, shard_gpus=options.shard_gpus)  # fmt: skip
    per_node = -(-k // max(1, len(nodes)))
    shard_gpus = gpus_per_shard(backend.shard_gpus, options.shard_gpus, per_node, min(node_gpus, default=0.0))
    backend.check_shard_gpus(shard_gpus)
    return Layout(k, node_cpus, per_node, shard_gpus)


class ShardedRun:
    """The Ray executor of one run segment (see the module docstring): ``plan`` is the segment's plan left,
    with one shard per :class:`Layout` shard; :func:`evaluate_sharded` is the entry point."""

    def __init__(
        self,
        config: EvalConfig,
        run_dir: RunDir,
        plan: RunPlan,
        options: RayOptions,
        layout: Layout,
        *,
        env_kwargs: Mapping[str, Any] | None,
    ):
        self.ray = require_ray()
        self.config = config
        self.run_dir = run_dir
        self.plan = plan
        self.options = options
        self.env_kwargs = dict(env_kwargs or {})
        self.node_cpus = layout.node_cpus
        self.shards_per_node = layout.shards_per_node
        self.shard_gpus = layout.shard_gpus
        self.num_shards = len(plan.shards)
        self.recorded = {row_key(r) for r in run_dir.read_rows()}
        self.env_steps = 0
        self.busy_s: dict[str, float] = {}
        self.server_metadata: dict[str, Any] = {}
        self.video_errors: dict[str, str] = {}
        self.aborted: str | None = None
        self.states = [
            _ShardState(j, plan.shards[j], plan.servers_of(j), [s for s in plan.scene_order() if any(
                plan.slot_queues(s, shard=j))]) for j in range(self.num_shards)
        ]  # fmt: skip
        self.spans: list[tuple[float, float]] = []  # (start, end) epoch seconds of the shards' stepping loops
        self.token = secrets.token_hex(16)
        self.collector = None
        self.t0 = time.perf_counter()
        self.control = RunControl()
        self.bars: Any = None
        self.say: Callable[[str], None] = logger.info

    # -- the executor ---------------------------------------------------------------------------------
    def run(self, segment: RunSegment) -> None:
        self.control, self.bars, self.say = segment.control, segment.bars, segment.say
        total = len(self.plan)
        self.say(f"{total} episode(s) on {self.num_shards} shard(s) of {self.config.plan.num_envs} env(s) in all (Ray)")
        with interruptible():
            self.start()
            self.loop()

    def close(self, segment: RunSegment, error: BaseException | None) -> None:
        """Drain what arrived, stop every actor, and hand the segment its timing and the shards' summary."""
        try:
            if self.collector is not None and error is not None:
                self.drain()  # rows that arrived before the failure
        except Exception as exc:  # noqa: BLE001 - the collector may be gone with the cluster
            logger.warning("rows not yet collected are lost (their episodes run again on --resume): %s", exc)
        self._close_actors()
        segment.aborted = segment.aborted or self.aborted
        if self.env_steps:
            segment.timing.update(
                wall_s=self.loop_wall_s() or time.perf_counter() - self.t0,
                env_steps=self.env_steps,
                busy_s=dict(self.busy_s),
                shards=self.num_shards,
                driver_wall_s=time.perf_counter() - self.t0,
            )
        segment.server_metadata.update(self.server_metadata)
        segment.video_errors.update(self.video_errors)
        segment.extra["shards"] = self.shards_summary()

    # -- set-up ---------------------------------------------------------------------------------------
    def _actor_options(self, st: _ShardState) -> dict[str, Any]:
        opts: dict[str, Any] = {"max_restarts": 0, "max_task_retries": 0, "scheduling_strategy": "SPREAD"}
        backend = traits(self.config.plan.backend)
        if self.shard_gpus:
            opts["num_gpus"] = self.shard_gpus
        opts["num_cpus"] = backend.shard_cpus if backend.shard_cpus is not None else self._cpus(st)
        if self.options.resources:
            opts["resources"] = dict(self.options.resources)
        return opts

    def _env_kwargs(self, st: _ShardState) -> dict[str, Any]:
        kwargs = {k: v for k, v in self.env_kwargs.items() if k != "app_args"}
        if traits(self.config.plan.backend).worker_processes:
            kwargs.setdefault("num_workers", env_workers(len(st.servers), self._cpus(st)))
        return kwargs

    def _cpus(self, st: _ShardState) -> float:
        return cpus_per_shard(len(st.servers), self.node_cpus, self.shards_per_node, self.options.shard_cpus)

    def _new_actor(self, st: _ShardState) -> None:
        st.attempt += 1
        name = actor_name(self.token, st.index, st.attempt)
        remote = self.ray.remote(ShardWorker).options(name=name, **self._actor_options(st))
        st.actor = remote.remote(self.config.plan.backend, self.env_kwargs.get("app_args"), self.options.worker_setup)

    def _queues(self, st: _ShardState, scene: int) -> list[list[PlanEntry]]:
        """The shard's per-slot plan entries of ``scene`` that have no row yet."""
        return [[e for e in q if e.key not in self.recorded] for q in self.plan.slot_queues(scene, shard=st.index)]

    def _skip_done_scenes(self, st: _ShardState) -> bool:
        """Drop the shard's leading scenes that have nothing left to run; True when a scene is left."""
        while st.scenes and not any(self._queues(st, st.scenes[0])):
            st.scenes.pop(0)
        return bool(st.scenes)

    def _submit(self, st: _ShardState, start_line: bool = False) -> None:
        scene = st.scenes[0]
        queues = self._queues(st, scene)
        spec = {
            "config": self.config.to_dict(),
            "shard": st.index,
            "attempt": st.attempt,
            "scene": scene,
            "queues": [[dataclasses.asdict(e) for e in q] for q in queues],
            "servers": st.servers,
            "run_dir": str(self.run_dir.path.resolve()),
            "token": self.token,
            "ship_files": self.options.ship_files,
            "env_kwargs": self._env_kwargs(st),
            "start_line": start_line,
        }
        if self.config.transport.auth_env and os.environ.get(self.config.transport.auth_env):
            spec["auth_token"] = os.environ[self.config.transport.auth_env]  # in the object store only, never logged
        st.ref = st.actor.run_scene.remote(spec, self.collector)

    def start(self) -> None:
        ray = self.ray
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        self.run_dir.write_file(TOKEN_FILE, self.token.encode())
        here = ray.get_runtime_context().get_node_id()
        self.collector = (
            ray.remote(Collector)
            .options(num_cpus=0, scheduling_strategy=NodeAffinitySchedulingStrategy(here, soft=False))
            .remote()
        )
        starting = [st for st in self.states if self._skip_done_scenes(st)]
        ray.get(self.collector.expect_start.remote([st.index for st in starting]), timeout=CALL_TIMEOUT_S)
        for st in starting:
            self._new_actor(st)
            self._submit(st, start_line=True)

    # -- the loop -------------------------------------------------------------------------------------
    def loop(self) -> None:
        ray = self.ray
        stop_deadline: float | None = None
        while True:
            active = [st for st in self.states if st.ref is not None]
            if not active:
                break
            if self.control.stop.is_set() and stop_deadline is None:
                stop_deadline = time.monotonic() + self.options.stop_grace_s
                self.collector.request_stop.remote()
            self.drain()
            ready, _ = ray.wait([st.ref for st in active], num_returns=len(active), timeout=self.options.poll_s)
            ready_ids = {r.hex() for r in ready}
            for st in active:
                if st.ref.hex() in ready_ids:
                    self._finished(st)
            if stop_deadline is not None and time.monotonic() > stop_deadline:
                for st in self.states:
                    if st.ref is not None:
                        self.say(f"shard {st.index}: did not stop within {self.options.stop_grace_s:.0f} s; killed")
                        self._kill(st)
                        st.ref = None
        self.drain()

    def drain(self) -> None:
        """Write every row the collector holds (deduplicated, flushed per episode) and count the steps."""
        while True:
            items, steps, latency = self.ray.get(self.collector.drain.remote(DRAIN_BATCH), timeout=CALL_TIMEOUT_S)
            if steps:
                self.env_steps += steps
                self.bars.steps(steps, latency)
            for _shard, _attempt, payload in items:
                self._write(payload)
            if len(items) < DRAIN_BATCH:
                return

    def _write(self, payload: Mapping[str, Any]) -> None:
        row = dict(payload["row"])
        key = row_key(row)
        if key in self.recorded:  # a push retried after a lost reply
            return
        for rel, data in payload.get("files", {}).items():
            self.run_dir.write_file(_shipped_path(rel), data)
        self.run_dir.append_row(row)
        self.recorded.add(key)
        self.control.record(row)
        self.bars.episode(
            row["success_at_end"],
            row["error"] is not None,
            unused_steps=max(0, self.config.plan.max_steps - int(row["steps"])),
        )

    def _finished(self, st: _ShardState) -> None:
        ray = self.ray
        ref, st.ref = st.ref, None
        self.collector.leave.remote(st.index)  # if it never reached the start line, nobody waits for it
        try:
            result = ray.get(ref, timeout=CALL_TIMEOUT_S)
        except ray.exceptions.RayActorError as exc:
            self.drain()  # rows it pushed before it died
            self._lost(st, first_line(exc))
            return
        except ray.exceptions.RayTaskError as exc:
            logger.warning("shard %d failed:\n%s", st.index, exc)  # the shard's traceback, for debugging
            self.drain()
            cause = exc.cause if getattr(exc, "cause", None) is not None else exc
            self.aborted = self.aborted or f"shard {st.index}: {type(cause).__name__}: {first_line(cause)}"
            self.control.stop.set()
            self._kill(st)
            return
        self._note_where(st)
        if result["env_steps"]:
            self.spans.append((result["loop_end"] - result["wall_s"], result["loop_end"]))
        for url, seconds in result["busy_s"].items():
            self.busy_s[url] = self.busy_s.get(url, 0.0) + seconds
        for url, meta in result["server_metadata"].items():
            self.server_metadata.setdefault(url, meta)
        self.video_errors.update(result.get("video_errors", {}))
        st.scenes.pop(0)
        if result["stopped"] or self.control.stop.is_set() or not self._skip_done_scenes(st):
            self._kill(st)
            return
        if traits(self.config.plan.backend).one_scene_per_process:
            self._kill(st)
            self._new_actor(st)
        self._submit(st)

    def _lost(self, st: _ShardState, reason: str) -> None:
        """The shard's actor died: run the rest on a new actor, or record it as errored."""
        self._kill(st)
        if self.control.stop.is_set():
            return  # stopping anyway: the episodes without a row run on --resume
        if not self._skip_done_scenes(st):
            return  # every episode of the shard has its row
        if st.restarts < self.options.max_restarts:
            st.restarts += 1
            self.say(f"shard {st.index}: actor lost ({reason}); restart {st.restarts}/{self.options.max_restarts}")
            self._new_actor(st)
            self._submit(st)
            return
        why = f"shard {st.index} lost after {st.restarts} restart(s): {reason}"
        self.say(why)
        from dz_gym.envs.scenes import scene_prompt

        for scene in st.scenes:
            for queue in self._queues(st, scene):
                for entry in queue:
                    row = EpisodeRow.of(entry, prompt=scene_prompt(scene), task=task_name(scene),
                                        max_steps=self.config.plan.max_steps, backend=self.config.plan.backend,
                                        error=why, error_event=SHARD_LOST,
                                        shard=st.index, node=st.where.get("node"),
                                        gpu=st.where.get("gpu"))  # fmt: skip
                    self._write({"row": row.to_dict(), "files": {}})
        st.scenes = []

    def _note_where(self, st: _ShardState) -> None:
        try:
            st.where = self.ray.get(st.actor.where.remote(), timeout=CALL_TIMEOUT_S)
        except Exception:  # noqa: BLE001 - informational only
            return
        if st.where.get("node") and st.where["node"] not in st.nodes:
            st.nodes.append(st.where["node"])

    def _kill(self, st: _ShardState) -> None:
        if st.actor is not None:
            try:
                self.ray.kill(st.actor, no_restart=True)
            except Exception as exc:  # noqa: BLE001 - already gone
                logger.debug("shard %d: kill: %s", st.index, exc)
            st.actor = None

    def loop_wall_s(self) -> float | None:
        """Seconds from the first shard's first reset to the last shard's last step (as one process counts its
        stepping loop: actor and simulator start-up excluded); None when no shard returned a result."""
        if not self.spans:
            return None
        return max(end for _, end in self.spans) - min(start for start, _ in self.spans)

    def _close_actors(self) -> None:
        for st in self.states:
            self._kill(st)
        if self.collector is not None:
            try:
                self.ray.kill(self.collector, no_restart=True)
            except Exception as exc:  # noqa: BLE001 - already gone
                logger.debug("collector: kill: %s", exc)
        try:
            (self.run_dir.path / TOKEN_FILE).unlink()
        except OSError:
            pass

    def shards_summary(self) -> dict[str, Any]:
        per_shard = [
            {
                "shard": st.index,
                "slots": list(st.slots),
                "nodes": st.nodes,
                "host": st.where.get("host"),
                "gpu": st.where.get("gpu"),
                "render_devices": st.where.get("render_devices"),
                "actors": st.attempt,
                "restarts": st.restarts,
                "servers": sorted(set(st.servers)),
            }
            for st in self.states
        ]
        nodes = sorted({n for st in self.states for n in st.nodes})
        return {"count": self.num_shards, "nodes": nodes, "gpus_per_shard": self.shard_gpus, "per_shard": per_shard,
                "ray_address": self.options.address}  # fmt: skip


def evaluate_sharded(
    config: EvalConfig,
    run_dir: RunDir,
    servers: Sequence[str] | None = None,
    options: RayOptions | None = None,
    *,
    control: RunControl | None = None,
    progress: bool | None = None,
    command: str = "",
    server_info: Mapping[str, Any] | None = None,
    env_kwargs: Mapping[str, Any] | None = None,
    log: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Run every episode of ``config`` without a row in ``run_dir`` on Ray shards; returns the summary written.

    The arguments are :func:`~dz_gym.eval.evaluate.evaluate`'s (``servers`` default to ``config.policies.servers``),
    plus ``options`` (default: a private local Ray instance, one shard per node).
    """
    servers = list(config.policies.servers if servers is None else servers)
    if not servers:
        raise ValueError(
            "servers: expected at least one policy server URL (in config.policies.servers or the servers argument)"
        )
    check_shardable(config)
    options = options or RayOptions()
    owns_ray = connect(options)
    try:
        layout = cluster_layout(config, options)
        plan = plan_of(config, shards=layout.shards).resolve(servers, servers_per_shard=options.servers_per_shard)
        segment = RunSegment(config, run_dir, plan, servers=servers, control=control, progress=progress, log=log,
                             command=command, server_info=server_info)  # fmt: skip
        run = ShardedRun(config, run_dir, segment.todo, options, layout, env_kwargs=env_kwargs)
        return run_segment(segment, run)
    finally:
        if owns_ray:
            require_ray().shutdown()


def actor_name(token: str, shard: int, attempt: int) -> str:
    """The Ray name of a shard's actor: the run's token (see ``.shards-token``), the shard and the attempt."""
    return f"dz-gym-{token[:12]}-shard{shard}-{attempt}"


def _shipped_path(rel: str) -> str:
    """``rel`` of a file a shard shipped back, checked: a relative path under trajectories/ or videos/."""
    parts = PurePosixPath(rel).parts
    if not parts or PurePosixPath(rel).is_absolute() or ".." in parts or parts[0] not in ("trajectories", "videos"):
        raise ValueError(f"shard file: expected a path under trajectories/ or videos/, got {rel!r}")
    return str(PurePosixPath(*parts))
