"""One shard of a run, inside a Ray actor: its own simulator batch, its own server connections, rows out.

:class:`ShardWorker` is the actor's class (the driver wraps it with ``ray.remote``). On the Isaac Lab backend
it starts the Isaac app in ``__init__``, before anything imports torch-dependent modules; this module itself
imports neither Ray, torch nor a simulator at import time. :meth:`ShardWorker.run_scene` runs the shard's
plan entries of one scene (its slots' entries, sent by the driver) with the evaluator's own
:func:`~dz_gym.eval.scene.run_scene` and returns when they are done or a stop was requested; the rows carry the
plan's global slot, the shard and the node.

Rows do not go to a file here: the runner writes into a :class:`ShardRunDir`, whose ``append_row`` puts the
row into an :class:`Outbox`. A pusher thread sends ready rows (with their trajectory and video bytes when the
driver's run directory is not visible from this node) to the driver's collector every ``push_interval``
seconds, with a bound on every call, and learns from the reply whether the driver asked to stop. A row is
ready once its video file is closed. Before ``run_scene`` returns, everything is flushed, so when its result
arrives the driver has every row of the call. If the actor dies, rows not yet pushed are lost with it: their
episodes have no row on the driver and run again.

The first call of each shard of a run waits at the start line (:class:`~dz_gym.eval.shards.collector.Collector`)
once its simulator is built and before it connects: the shards then step side by side from the first step.
The wait is bounded (``START_WAIT_S``) and ends early on a stop request.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import shutil
import socket
import tempfile
import threading
import time
from collections import deque
from pathlib import Path
from typing import Any

from dz_gym import host_process
from dz_gym.envs.backends import traits
from dz_gym.envs.devices import GpuPin, pin_gpu, place_options
from dz_gym.eval.config import EvalConfig
from dz_gym.eval.control import RunControl
from dz_gym.eval.plan import PlanEntry
from dz_gym.eval.rundir import RunDir, episode_name
from dz_gym.eval.scene import run_scene

logger = logging.getLogger(__name__)

TOKEN_FILE = ".shards-token"  # written by the driver: a node that reads the same token shares the run directory
PUSH_INTERVAL_S = 0.2
PUSH_TIMEOUT_S = 30.0
FINAL_PUSH_ATTEMPTS = 5
START_WAIT_S = 120.0  # the longest a built shard waits at the start line for the others
START_POLL_S = 0.02


class ShardRunDir(RunDir):
    """The runner's run directory inside a shard: files under ``path``, rows into ``outbox``."""

    def __init__(self, path: str | os.PathLike, outbox: Outbox):
        super().__init__(path)
        self.outbox = outbox

    def append_row(self, row: dict[str, Any]) -> None:
        self.outbox.put(dict(row))

    def append_rows(self, rows) -> None:
        for row in rows:
            self.append_row(row)


class Outbox:
    """Finished episodes and step counts waiting to go to the driver (thread-safe).

    ``meta`` (shard, node, gpu) names the shard in log lines. With ``ship_files`` the row's trajectory and video are read from ``root`` and sent
    as bytes (and deleted here once sent); otherwise they are already in the driver's run directory.
    """

    def __init__(self, root: Path, *, meta: dict[str, Any], ship_files: bool, recorder=None):
        self.root = Path(root)
        self.meta = dict(meta)
        self.ship_files = bool(ship_files)
        self.recorder = recorder
        self._rows: deque[dict[str, Any]] = deque()
        self._lock = threading.Lock()
        self._steps = 0
        self._latency_ms: float | None = None

    def put(self, row: dict[str, Any]) -> None:
        with self._lock:
            self._rows.append(row)

    def steps(self, n: int, last_latency_ms: float | None = None) -> None:
        with self._lock:
            self._steps += int(n)
            if last_latency_ms is not None:
                self._latency_ms = float(last_latency_ms)

    def pending(self) -> int:
        with self._lock:
            return len(self._rows)

    def _ready(self, row: dict[str, Any], final: bool) -> bool:
        if final or self.recorder is None or row.get("video") is None:
            return True
        key = episode_name(row["scene"], row["episode"])
        return key in self.recorder.finished or key in self.recorder.failed

    def take(self, final: bool = False) -> tuple[list[dict[str, Any]], int, float | None]:
        """The ready rows in order (as payloads ``{"row", "files"}``), the steps since the last take, the latency."""
        with self._lock:
            ready = []
            while self._rows and self._ready(self._rows[0], final):
                ready.append(self._rows.popleft())
            steps, self._steps = self._steps, 0
            latency = self._latency_ms
        return [self._payload(row) for row in ready], steps, latency

    def give_back(self, payloads: list[dict[str, Any]], steps: int) -> None:
        """Undo a :meth:`take` whose push failed: the rows go first again, the steps are counted again."""
        with self._lock:
            for payload in reversed(payloads):
                self._rows.appendleft(payload["row"])
            self._steps += steps

    def _payload(self, row: dict[str, Any]) -> dict[str, Any]:
        files: dict[str, bytes] = {}
        if self.recorder is not None and row.get("video") is not None:
            key = episode_name(row["scene"], row["episode"])
            if key in self.recorder.failed:
                row["video"] = None
        if self.ship_files:
            for field in ("trajectory", "video"):
                rel = row.get(field)
                if rel is None:
                    continue
                try:
                    files[rel] = (self.root / rel).read_bytes()
                except OSError as exc:
                    logger.warning(
                        "shard %s: %s of scene %s episode %s unreadable: %s",
                        self.meta.get("shard"),
                        field,
                        row["scene"],
                        row["episode"],
                        exc,
                    )
                    row[field] = None
        return {"row": row, "files": files}

    def delete_files(self, payloads: list[dict[str, Any]]) -> None:
        """Remove shipped files from the staging folder once the driver has them."""
        if not self.ship_files:
            return
        for payload in payloads:
            for rel in payload["files"]:
                try:
                    (self.root / rel).unlink()
                except OSError:
                    pass


class _Tally:
    """The runner's progress object inside a shard: counts steps into the outbox, draws nothing."""

    enabled = False

    def __init__(self, outbox: Outbox):
        self.outbox = outbox

    def steps(self, n: int, last_latency_ms: float | None = None) -> None:
        self.outbox.steps(n, last_latency_ms)

    def episode(self, success_at_end, errored, unused_steps: int = 0) -> None:
        pass

    def write(self, message: str) -> None:
        logger.info("%s", message)

    def close(self) -> None:
        pass


class Pusher:
    """Sends the outbox to the driver's collector every ``interval`` s; sets ``stop`` when the driver asks."""

    def __init__(
        self,
        collector,
        shard: int,
        attempt: int,
        outbox: Outbox,
        stop: threading.Event,
        interval: float = PUSH_INTERVAL_S,
        timeout: float = PUSH_TIMEOUT_S,
    ):
        self.collector = collector
        self.shard = shard
        self.attempt = attempt
        self.outbox = outbox
        self.stop = stop
        self.interval = interval
        self.timeout = timeout
        self.lost: str | None = None  # why the collector cannot be reached any more
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._loop, name=f"dz-gym-shard{shard}-push", daemon=True)

    def start(self) -> Pusher:
        self._thread.start()
        return self

    def push_once(self, final: bool = False) -> bool:
        """One bounded push; False when it failed (the rows stay in the outbox)."""
        import ray

        payloads, steps, latency = self.outbox.take(final)
        try:
            stop = ray.get(
                self.collector.push.remote(self.shard, self.attempt, payloads, steps, latency), timeout=self.timeout
            )
        except ray.exceptions.RayActorError as exc:  # the driver is gone: nobody takes rows any more
            self.outbox.give_back(payloads, steps)
            self.lost = f"collector lost: {exc}".splitlines()[0]
            self.stop.set()
            return False
        except (ray.exceptions.GetTimeoutError, ray.exceptions.RayError) as exc:
            self.outbox.give_back(payloads, steps)
            logger.warning("shard %d: push to the driver failed (%s); retrying", self.shard, type(exc).__name__)
            return False
        self.outbox.delete_files(payloads)
        if stop:
            self.stop.set()
        return True

    def _loop(self) -> None:
        while not self._done.wait(self.interval):
            if self.lost is None:
                self.push_once()

    def close(self) -> bool:
        """Stop the thread, then push everything left (bounded attempts); True when all of it arrived."""
        self._done.set()
        self._thread.join(self.timeout + 5)
        for _ in range(FINAL_PUSH_ATTEMPTS):
            if self.lost is not None:
                return False
            if self.push_once(final=True) and not self.outbox.pending():
                return True
        return False


class ShardWorker:
    """A Ray actor running one shard (see the module docstring). ``app_args``: Isaac Lab's launcher flags;
    ``setup``: called first (``RayOptions.worker_setup``).

    A shard given GPUs runs on the first of them (:func:`~dz_gym.envs.devices.pin_gpu`): the rendering
    variables (``MUJOCO_EGL_DEVICE_ID``) go into this process's environment before any simulator is imported,
    so the env's worker processes (started with ``spawn``) inherit them, and the simulator's torch device
    (Isaac Lab's ``--device``) becomes that GPU's CUDA index here."""

    def __init__(self, backend: str, app_args=None, setup=None):
        self.backend = backend
        if setup is not None:  # the user's set-up comes first, before any simulator module is imported
            setup()
        import ray

        self.pin = pin_actor()
        app_args = place_options(app_args, traits(backend).device_option, self.pin)
        traits(backend).start_app(app_args)  # Isaac Sim: before any torch-dependent import in this process
        self.app_args = app_args
        self.node_id = ray.get_runtime_context().get_node_id()
        self.render_devices: list[dict[str, Any]] | None = None  # the last env's, where the backend says

    def where(self) -> dict[str, Any]:
        """Where this actor runs: the Ray node id, its GPU (None without one), the host name, the process id and
        its last env's rendering processes (MuJoCo: the GL backend and EGL device of each)."""
        return {
            "node": self.node_id,
            "gpu": self.pin.gpu,
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "render_devices": self.render_devices,
        }

    def run_scene(self, spec: dict[str, Any], collector) -> dict[str, Any]:
        """Run one scene's entries of this shard (``spec`` from the driver); returns the timing of the loop."""
        from dz_gym.eval.video import VideoRecorder

        queues = [[PlanEntry(**e) for e in q] for q in spec["queues"]]
        config = dataclasses.replace(EvalConfig.from_dict(spec["config"]), num_envs=len(queues))
        if config.transport.auth_env and spec.get("auth_token") and not os.environ.get(config.transport.auth_env):
            os.environ[config.transport.auth_env] = spec["auth_token"]
        ship = spec.get("ship_files")
        shared = _sees_run_dir(spec["run_dir"], spec["token"]) if ship is None else not ship
        root = Path(spec["run_dir"]) if shared else Path(tempfile.mkdtemp(prefix=f"dz-gym-shard{spec['shard']}-"))
        recorder = VideoRecorder() if config.outputs.video else None
        shard = int(spec["shard"])
        placement = {"shard": shard, "node": self.node_id, "gpu": self.pin.gpu}
        outbox = Outbox(root, meta=placement, ship_files=not shared, recorder=recorder)
        control = RunControl(None)
        pusher = Pusher(collector, shard, int(spec["attempt"]), outbox, control.stop).start()
        env_kwargs = place_options(dict(spec.get("env_kwargs") or {}), traits(self.backend).device_option, self.pin)
        if traits(self.backend).starts_app and self.app_args is not None:
            env_kwargs.setdefault("app_args", self.app_args)
        out: dict[str, Any] = {"scene": spec["scene"], "env_steps": 0, "wall_s": 0.0, "loop_end": time.time(),
                               "busy_s": {}, "stopped": False, "server_metadata": {}, "video_errors": {},
                               "shared_run_dir": shared}  # fmt: skip

        def built(env) -> None:  # the simulator is up: note its rendering processes, then the start line
            self.render_devices = getattr(env, "render_devices", None)
            if spec.get("start_line"):
                wait_at_start_line(collector, shard, control.stop)

        try:
            with host_process.applied():  # the evaluator's opt-in, as in the in-process executor
                result = run_scene(config, spec["scene"], queues, list(spec["servers"]), env_kwargs=env_kwargs,
                                   server_metadata=out["server_metadata"], before_connect=built,
                                   run_dir=ShardRunDir(root, outbox), control=control, recorder=recorder,
                                   progress=_Tally(outbox), placement=placement)  # fmt: skip
            out.update(env_steps=result.env_steps, wall_s=result.wall_s, busy_s=dict(result.busy_s),
                       stopped=result.stopped, loop_end=time.time())  # fmt: skip
        finally:
            if recorder is not None:
                recorder.close()
                out["video_errors"] = dict(recorder.failed)
            delivered = pusher.close()
            if not shared and delivered:
                shutil.rmtree(root, ignore_errors=True)
        if not delivered:
            raise RuntimeError(
                f"shard {spec['shard']}: {outbox.pending()} row(s) could not be sent to the driver"
                + (f" ({pusher.lost})" if pusher.lost else "")
            )
        return out


def pin_actor() -> GpuPin:
    """Pin this Ray actor's process to the first GPU Ray gave it (:func:`~dz_gym.envs.devices.pin_gpu`): set
    its rendering variables in ``os.environ`` (inherited by the processes it starts) and return the pin."""
    import ray

    pin = pin_gpu(ray.get_gpu_ids(), os.environ.get("CUDA_VISIBLE_DEVICES"))
    os.environ.update(pin.environ)
    return pin


def wait_at_start_line(collector, shard: int, stop: threading.Event, timeout: float = START_WAIT_S) -> bool:
    """Tell the collector this shard is built, then wait until every shard is (bounded by ``timeout``, ended by
    ``stop``); returns whether the start was given. A collector that cannot be reached ends the wait."""
    import ray

    deadline = time.monotonic() + timeout
    try:
        started = ray.get(collector.arrive.remote(shard), timeout=PUSH_TIMEOUT_S)
        while not started and not stop.is_set() and time.monotonic() < deadline:
            time.sleep(START_POLL_S)
            started = ray.get(collector.started.remote(), timeout=PUSH_TIMEOUT_S)
    except ray.exceptions.RayError as exc:
        logger.warning("shard %d: start line unavailable (%s); starting now", shard, type(exc).__name__)
        return False
    if not started and not stop.is_set():
        logger.warning("shard %d: other shards not built after %.0f s; starting now", shard, timeout)
    return bool(started)


def _sees_run_dir(path: str, token: str) -> bool:
    """Whether this node sees the driver's run directory (same machine or a shared file system)."""
    try:
        return (Path(path) / TOKEN_FILE).read_text().strip() == token
    except OSError:
        return False
