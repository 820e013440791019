"""The driver of a sharded run: starts the shards' actors on a Ray cluster, collects their rows, one run directory.

:func:`evaluate_sharded` is the Ray counterpart of :func:`dz_gym.eval.evaluate.evaluate` (same inputs, same
outputs): it plans the shards (:mod:`dz_gym.eval.shards.plan`), starts one
:class:`~dz_gym.eval.shards.worker.ShardWorker` actor per shard (spread over the nodes, or on the nodes with
the resources the user names; ``num_cpus`` = the shard's env workers on MuJoCo; ``num_gpus``: one on Isaac
Lab, a share of the node's GPUs on MuJoCo, or ``--shard-gpus``),
lets each run its scenes in turn (a fresh actor per scene on Isaac Lab: one scene per process), drains the
:class:`~dz_gym.eval.shards.collector.Collector` every ``poll`` seconds and appends every new row to the one
``episodes.jsonl`` (flushed per episode; trajectories and videos shipped back are written next to it), with
one set of progress bars. ``summary.json`` is written at the end, also after Ctrl-C, an exhausted error budget
or a crash, with the shard count and the nodes used.

Faults: a shard whose actor dies (process killed, node lost) loses no row the driver has; the rest of its
episodes run on a new actor (at most ``max_restarts`` times per shard), then are recorded as errored with the
reason. An exception inside a shard (e.g. a server that cannot be reached) aborts the run, as in one process.
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
from pathlib import Path, PurePosixPath
from typing import Any

from dz_gym.envs.backends import traits
from dz_gym.eval.capacity import IdleGapCheck, envs_per_server, session_warning
from dz_gym.eval.config import EvalConfig
from dz_gym.eval.evaluate import remaining_episodes, write_run_summary
from dz_gym.eval.progress import Progress
from dz_gym.eval.rundir import RunDir, _write_atomic
from dz_gym.eval.runner import RunControl
from dz_gym.eval.shards import plan as planning
from dz_gym.eval.shards import require_ray
from dz_gym.eval.shards.collector import Collector
from dz_gym.eval.shards.options import RayOptions, check_shardable
from dz_gym.eval.shards.plan import Shard, cpus_per_shard, env_workers, plan_shards, shard_servers
from dz_gym.eval.shards.worker import TOKEN_FILE, ShardWorker
from dz_gym.eval.signals import interruptible, shielded

logger = logging.getLogger(__name__)

FORWARDED_ENV = ("MUJOCO_GL", "PYOPENGL_PLATFORM")  # the simulator's rendering set-up, for every shard
LOOPBACK_ENV = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"  # "0": Ray's node address is 127.0.0.1 (read at import)
DRAIN_BATCH = 64
CALL_TIMEOUT_S = 60.0


@dataclasses.dataclass
class _ShardState:
    shard: Shard
    servers: list[str]
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


class ShardedRun:
    """One sharded run segment (see the module docstring); :func:`evaluate_sharded` is the entry point."""

    def __init__(
        self,
        config: EvalConfig,
        run_dir: RunDir,
        servers: Sequence[str],
        options: RayOptions,
        *,
        control: RunControl,
        bars: Progress,
        env_kwargs: Mapping[str, Any] | None,
        say: Callable[[str], None],
    ):
        self.ray = require_ray()
        self.config = config
        self.run_dir = run_dir
        self.servers = list(servers)
        self.options = options
        self.control = control
        self.bars = bars
        self.env_kwargs = dict(env_kwargs or {})
        self.say = say
        self.recorded = {(int(r["scene"]), int(r["episode"])) for r in run_dir.read_rows()}
        self.env_steps = 0
        self.busy_s: dict[str, float] = {}
        self.server_metadata: dict[str, Any] = {}
        self.video_errors: dict[str, str] = {}
        self.aborted: str | None = None
        self.states: list[_ShardState] = []
        self.spans: list[tuple[float, float]] = []  # (start, end) epoch seconds of the shards' stepping loops
        self.token = secrets.token_hex(16)
        self.collector = None
        self.num_shards = 0
        self.shard_gpus = 0.0  # what each shard's actor asks Ray for (planned)

    # -- set-up ---------------------------------------------------------------------------------------
    def plan(self, todo: Mapping[int, Sequence[int]]) -> None:
        ray = self.ray
        nodes = [n for n in ray.nodes() if n.get("Alive")]
        node_gpus = [float(n.get("Resources", {}).get("GPU", 0)) for n in nodes]
        self.node_cpus = max((float(n.get("Resources", {}).get("CPU", 0)) for n in nodes), default=1.0)
        backend = traits(self.config.backend)
        k = self.options.shards or planning.default_shard_count(
            self.config.num_envs,
            nodes=len(nodes),
            gpus=sum(node_gpus),
            backend=self.config.backend,
            shard_gpus=self.options.shard_gpus,
        )
        shards = plan_shards(todo, self.config.num_envs, k)
        self.num_shards = k
        self.shards_per_node = -(-k // max(1, len(nodes)))
        self.shard_gpus = planning.gpus_per_shard(
            backend.shard_gpus, self.options.shard_gpus, self.shards_per_node, min(node_gpus, default=0.0)
        )
        backend.check_shard_gpus(self.shard_gpus)
        for shard in shards:
            servers = shard_servers(self.servers, shard, self.options.servers_per_shard)
            self.states.append(_ShardState(shard, servers, shard.scenes()))

    def _actor_options(self, shard: Shard) -> dict[str, Any]:
        opts: dict[str, Any] = {"max_restarts": 0, "max_task_retries": 0, "scheduling_strategy": "SPREAD"}
        backend = traits(self.config.backend)
        if self.shard_gpus:
            opts["num_gpus"] = self.shard_gpus
        opts["num_cpus"] = backend.shard_cpus if backend.shard_cpus is not None else self._cpus(shard)
        if self.options.resources:
            opts["resources"] = dict(self.options.resources)
        return opts

    def _env_kwargs(self, shard: Shard) -> dict[str, Any]:
        kwargs = {k: v for k, v in self.env_kwargs.items() if k != "app_args"}
        if traits(self.config.backend).worker_processes:
            kwargs.setdefault("num_workers", env_workers(shard.num_envs, self._cpus(shard)))
        return kwargs

    def _cpus(self, shard: Shard) -> float:
        return cpus_per_shard(shard.num_envs, self.node_cpus, self.shards_per_node, self.options.shard_cpus)

    def _new_actor(self, st: _ShardState) -> None:
        st.attempt += 1
        name = actor_name(self.token, st.shard.index, st.attempt)
        remote = self.ray.remote(ShardWorker).options(name=name, **self._actor_options(st.shard))
        st.actor = remote.remote(self.config.backend, self.env_kwargs.get("app_args"), self.options.worker_setup)

    def _queues(self, st: _ShardState, scene: int) -> list[list[int]]:
        """The shard's per-slot episodes of ``scene`` that have no row yet."""
        return [[k for k in q if (scene, k) not in self.recorded] for q in st.shard.queues[scene]]

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
            "shard": st.shard.index,
            "attempt": st.attempt,
            "scene": scene,
            "queues": queues,
            "slot_start": st.shard.start,
            "servers": st.servers,
            "run_dir": str(self.run_dir.path.resolve()),
            "token": self.token,
            "ship_files": self.options.ship_files,
            "env_kwargs": self._env_kwargs(st.shard),
            "start_line": start_line,
        }
        if self.config.auth_env and os.environ.get(self.config.auth_env):
            spec["auth_token"] = os.environ[self.config.auth_env]  # in the object store only, never logged
        st.ref = st.actor.run_scene.remote(spec, self.collector)

    def start(self) -> None:
        ray = self.ray
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        _write_atomic(self.run_dir.path / TOKEN_FILE, self.token.encode())
        here = ray.get_runtime_context().get_node_id()
        self.collector = (
            ray.remote(Collector)
            .options(num_cpus=0, scheduling_strategy=NodeAffinitySchedulingStrategy(here, soft=False))
            .remote()
        )
        starting = [st for st in self.states if self._skip_done_scenes(st)]
        ray.get(self.collector.expect_start.remote([st.shard.index for st in starting]), timeout=CALL_TIMEOUT_S)
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
                        self.say(
                            f"shard {st.shard.index}: did not stop within {self.options.stop_grace_s:.0f} s; killed"
                        )
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
        key = (int(row["scene"]), int(row["episode"]))
        if key in self.recorded:  # a push retried after a lost reply
            return
        for rel, data in payload.get("files", {}).items():
            path = _safe_path(self.run_dir.path, rel)
            path.parent.mkdir(parents=True, exist_ok=True)
            _write_atomic(path, data)
        self.run_dir.append_row(row)
        self.recorded.add(key)
        self.control.record(row)
        self.bars.episode(
            row["success_at_end"],
            row["error"] is not None,
            unused_steps=max(0, self.config.max_steps - int(row["steps"])),
        )

    def _finished(self, st: _ShardState) -> None:
        ray = self.ray
        ref, st.ref = st.ref, None
        self.collector.leave.remote(st.shard.index)  # if it never reached the start line, nobody waits for it
        try:
            result = ray.get(ref, timeout=CALL_TIMEOUT_S)
        except ray.exceptions.RayActorError as exc:
            self.drain()  # rows it pushed before it died
            self._lost(st, _first_line(exc))
            return
        except ray.exceptions.RayTaskError as exc:
            logger.warning("shard %d failed:\n%s", st.shard.index, exc)  # the shard's traceback, for debugging
            self.drain()
            cause = exc.cause if getattr(exc, "cause", None) is not None else exc
            self.aborted = self.aborted or f"shard {st.shard.index}: {type(cause).__name__}: {_first_line(cause)}"
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
        if traits(self.config.backend).one_scene_per_process:
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
            self.say(
                f"shard {st.shard.index}: actor lost ({reason}); restart {st.restarts}/{self.options.max_restarts}"
            )
            self._new_actor(st)
            self._submit(st)
            return
        why = f"shard {st.shard.index} lost after {st.restarts} restart(s): {reason}"
        self.say(why)
        for scene in st.scenes:
            for local, queue in enumerate(st.shard.queues[scene]):
                for k in queue:
                    if (scene, k) not in self.recorded:
                        self._write({"row": self._lost_row(st, scene, k, local, why), "files": {}})
        st.scenes = []

    def _lost_row(self, st: _ShardState, scene: int, episode: int, local: int, why: str) -> dict[str, Any]:
        from dz_gym.envs.scenes import scene_prompt

        return {
            "scene": scene,
            "episode": episode,
            "seed": self.config.seed + episode,
            "env": st.shard.start + local,
            "prompt": scene_prompt(scene),
            "server": st.servers[local],
            "session_id": "",
            "steps": 0,
            "max_steps": self.config.max_steps,
            "ended_by": "error",
            "success_at_end": None,
            "success_any_step": None,
            "first_success_step": None,
            "server_calls": 0,
            "server_errors": 0,
            "latency_ms": None,
            "latencies_ms": [],
            "error": why,
            "error_event": "shard_lost",
            "error_step": 0,
            "env_seed": None,
            "final_object_pos": None,
            "final_container_pos": None,
            "started_at": None,
            "wall_s": 0.0,
            "trajectory": None,
            "video": None,
            "chunk_delays": [],
            "wait_steps": 0,
            "stale_steps": 0,
            "shard": st.shard.index,
            "node": st.where.get("node"),
            "gpu": st.where.get("gpu"),
        }

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
                logger.debug("shard %d: kill: %s", st.shard.index, exc)
            st.actor = None

    def loop_wall_s(self) -> float | None:
        """Seconds from the first shard's first reset to the last shard's last step (as one process counts its
        stepping loop: actor and simulator start-up excluded); None when no shard returned a result."""
        if not self.spans:
            return None
        return max(end for _, end in self.spans) - min(start for start, _ in self.spans)

    def close(self) -> None:
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
                "shard": st.shard.index,
                "slots": [st.shard.start, st.shard.stop],
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

    The arguments are :func:`~dz_gym.eval.evaluate.evaluate`'s (``servers`` default to ``config.servers``),
    plus ``options`` (default: a private local Ray instance, one shard per node).
    """
    servers = list(config.servers if servers is None else servers)
    if not servers:
        raise ValueError("servers: expected at least one policy server URL (in config.servers or the servers argument)")
    check_shardable(config)
    options = options or RayOptions()
    owns_ray = connect(options)
    run_dir.repair_rows()
    rows = run_dir.read_rows()
    previous = run_dir.read_summary() or {}
    segments = list(previous.get("segments", []))
    if control is None:
        control = RunControl(config.error_budget)
    control.errored = sum(1 for r in rows if r.get("error") is not None)
    todo = remaining_episodes(config, rows)
    total = sum(len(v) for v in todo.values())
    say_later: list[Callable[[str], None]] = []  # the same capacity warnings as one process
    idle_check = IdleGapCheck(
        envs_per_server(config.num_envs, len(servers)), config.server_idle_timeout, lambda line: say_later[0](line)
    )
    bars = Progress(total, total * config.max_steps, enabled=progress, on_latency=idle_check.observe)
    say = log or bars.write
    say_later.append(say)
    crowded = session_warning(config.num_envs, servers, config.server_max_sessions)
    if crowded is not None:
        say(f"dz-gym-eval: warning: {crowded}")
    run = None
    error: BaseException | None = None
    aborted: str | None = None
    segment = {
        "started_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "wall_s": 0.0,
        "env_steps": 0,
        "busy_s": {},
    }
    t0 = time.perf_counter()
    try:
        run = ShardedRun(config, run_dir, servers, options, control=control, bars=bars, env_kwargs=env_kwargs, say=say)
        run.plan(todo)
        if total:
            say(f"{total} episode(s) on {run.num_shards} shard(s) of {config.num_envs} env(s) in all (Ray)")
            with interruptible():
                run.start()
                run.loop()
        aborted = run.aborted
    except BaseException as exc:  # noqa: BLE001 - record what happened, write the summary, then re-raise
        error = exc
        if isinstance(exc, KeyboardInterrupt):
            control.stop.set()
        else:
            aborted = f"{type(exc).__name__}: {_first_line(exc)}"
    finally:
        with shielded():
            summary = _finish(
                config,
                run_dir,
                servers,
                run,
                control,
                bars,
                segments,
                segment,
                previous,
                t0,
                aborted,
                error,
                command,
                server_info,
                say,
            )
        if owns_ray:
            require_ray().shutdown()
    if error is not None:
        raise error
    return summary


def _finish(
    config: EvalConfig,
    run_dir: RunDir,
    servers: list[str],
    run: ShardedRun | None,
    control: RunControl,
    bars: Progress,
    segments: list[dict[str, Any]],
    segment: dict[str, Any],
    previous: Mapping[str, Any],
    t0: float,
    aborted: str | None,
    error: BaseException | None,
    command: str,
    server_info: Mapping[str, Any] | None,
    say: Callable[[str], None],
) -> dict[str, Any]:
    """Drain what arrived, stop every actor, write ``summary.json`` and ``report.html`` (the ``finally`` of
    :func:`evaluate_sharded`)."""
    if run is not None:
        try:
            if run.collector is not None and error is not None:
                run.drain()  # rows that arrived before the failure
        except Exception as exc:  # noqa: BLE001 - the collector may be gone with the cluster
            logger.warning("rows not yet collected are lost (their episodes run again on --resume): %s", exc)
        run.close()
    bars.close()
    if run is not None and run.env_steps:
        segment.update(
            wall_s=run.loop_wall_s() or time.perf_counter() - t0,
            env_steps=run.env_steps,
            busy_s=dict(run.busy_s),
            shards=run.num_shards,
            driver_wall_s=time.perf_counter() - t0,
        )
        segments.append(segment)
    return write_run_summary(
        config,
        run_dir,
        segments,
        control=control,
        aborted=aborted,
        command=command,
        servers=servers,
        server_info=server_info,
        server_metadata=(run.server_metadata if run is not None else {}) or previous.get("server_metadata", {}),
        video_errors=run.video_errors if run is not None else {},
        say=say,
        shards=run.shards_summary() if run is not None else previous.get("shards"),
    )


def actor_name(token: str, shard: int, attempt: int) -> str:
    """The Ray name of a shard's actor: the run's token (see ``.shards-token``), the shard and the attempt."""
    return f"dz-gym-{token[:12]}-shard{shard}-{attempt}"


def _safe_path(root: Path, rel: str) -> Path:
    """``root / rel`` for a file a shard shipped back: a relative path under trajectories/ or videos/."""
    parts = PurePosixPath(rel).parts
    if not parts or PurePosixPath(rel).is_absolute() or ".." in parts or parts[0] not in ("trajectories", "videos"):
        raise ValueError(f"shard file: expected a path under trajectories/ or videos/, got {rel!r}")
    return root.joinpath(*parts)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
