"""Worker processes of the embedded simulator: shared-memory buffers and a compact command pipe.

Each worker owns an :class:`~dz_gym.envs.mujoco.sim.EnvGroup` (a contiguous slice of the batch) and its
own renderer (:class:`~dz_gym.envs.mujoco.render.BatchRenderer`), created inside the worker: a GL context must not cross a fork, so workers start
with ``spawn`` (or ``forkserver``) and this module's :func:`worker_main` is their importable entry point.
Commands and results travel through one shared-memory block (:class:`Buffers`): the main process writes
ops, actions, seeds and the render mask, sends a few bytes down each pipe, and reads states and images
the workers wrote in place. Pipes carry only short byte strings (no pickled objects after start-up).

Start-up: a worker replies ``b"ready <json>"`` once its group is built, the JSON being
:func:`~dz_gym.envs.mujoco.gl.rendering_device` in the worker (the GL backend and EGL device it renders with).
Pipe protocol (main -> worker / reply): ``b"run"`` -> ``b"ok"``; ``b"perturb <env> <kind> <distance>"``
-> ``b"ok 1"`` / ``b"ok 0"``; ``b"close"`` -> ``b"ok"`` and the worker exits. Any failure replies
``b"error <traceback>"``; a failure to create the renderer at start-up replies ``b"glerror <message>"``.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import signal
import traceback
from multiprocessing import shared_memory
from multiprocessing.connection import Connection, wait

import numpy as np

from dz_gym.envs.mujoco import gl
from dz_gym.errors import WorkerError
from dz_gym.spawning import start_worker

_ALIGN = 64


class Buffers:
    """Named numpy arrays laid out in one block of shared memory (or of private memory, in-process)."""

    def __init__(self, fields: dict[str, tuple[tuple[int, ...], str]], shared: bool, name: str | None = None):
        self.fields = fields
        offsets, total = {}, 0
        for key, (shape, dtype) in fields.items():
            offsets[key] = total
            size = int(np.prod(shape)) * np.dtype(dtype).itemsize
            total += (size + _ALIGN - 1) // _ALIGN * _ALIGN
        self.size = max(total, _ALIGN)
        self.owner = name is None
        self.shm: shared_memory.SharedMemory | None = None
        if shared:
            if name is None:
                self.shm = shared_memory.SharedMemory(create=True, size=self.size)
            else:
                self.shm = shared_memory.SharedMemory(name=name)
            buffer = self.shm.buf
        else:
            buffer = bytearray(self.size)
        self.arrays = {
            key: np.ndarray(shape, dtype=dtype, buffer=buffer, offset=offsets[key])
            for key, (shape, dtype) in fields.items()
        }
        if self.owner:
            for array in self.arrays.values():
                array[...] = 0

    @property
    def name(self) -> str | None:
        return None if self.shm is None else self.shm.name

    def close(self) -> None:
        """Drop the arrays and release the block (the owner also unlinks it)."""
        self.arrays = {}
        if self.shm is not None:
            self.shm.close()
            if self.owner:
                try:
                    self.shm.unlink()
                except FileNotFoundError:
                    pass
            self.shm = None


def worker_main(conn: Connection, config, fields, shm_name: str) -> None:
    """Entry point of a worker process: build the group, then serve commands until ``b"close"``."""
    from dz_gym.envs.mujoco.sim import EnvGroup

    # A Ctrl-C in the terminal reaches the whole process group; the main process decides what it means (an
    # evaluator finishes the current step and closes the env), so a worker must not die under it. Workers
    # still end on b"close" or when the main process goes away (EOF on the pipe).
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # Attaching registers the block with the resource tracker the worker shares with its parent (spawn
    # and forkserver pass it on), which already tracks it: the creator alone unlinks it.
    buffers = Buffers(fields, shared=True, name=shm_name)
    group = None
    try:
        group = EnvGroup(config, buffers.arrays)
    except gl.RenderingUnavailable as exc:
        conn.send_bytes(b"glerror " + exc.detail.encode())
        buffers.close()
        return
    except Exception:  # noqa: BLE001
        conn.send_bytes(b"error " + traceback.format_exc().encode())
        buffers.close()
        return
    conn.send_bytes(b"ready " + json.dumps(gl.rendering_device()).encode())
    try:
        while True:
            try:
                message = conn.recv_bytes()
            except (EOFError, OSError):
                break
            if message == b"close":
                conn.send_bytes(b"ok")
                break
            try:
                if message == b"run":
                    group.run()
                    conn.send_bytes(b"ok")
                elif message.startswith(b"perturb "):
                    _, env, kind, distance = message.decode().split(" ")
                    applied = group.perturb(int(env), kind, None if distance == "none" else float(distance))
                    conn.send_bytes(b"ok 1" if applied else b"ok 0")
                else:
                    conn.send_bytes(b"error unknown command " + message[:40])
            except Exception:  # noqa: BLE001 - report every failure to the main process
                conn.send_bytes(b"error " + traceback.format_exc().encode())
    finally:
        group.close()
        buffers.close()


class WorkerPool:
    """Worker processes, each serving one contiguous slice of the batch through shared ``buffers``."""

    def __init__(self, configs: list, buffers: Buffers, start_method: str, worker_env: dict[str, str]):
        self.buffers = buffers
        context = mp.get_context(start_method)
        self.conns: list[Connection] = []
        self.procs: list[mp.process.BaseProcess] = []
        for k, config in enumerate(configs):
            parent, child = context.Pipe()
            proc = context.Process(
                target=worker_main,
                args=(child, config, buffers.fields, buffers.name),
                name=f"dz-gym-mujoco-{k}",
                daemon=True,
            )
            # the caller's script is not run again in the worker, which inherits worker_env and starts with
            # SIGINT blocked (worker_main then ignores it)
            start_worker(proc, worker_env)
            child.close()
            self.conns.append(parent)
            self.procs.append(proc)
        try:
            replies = self._gather(timeout=300.0)
        except WorkerError as exc:
            self.close()
            raise WorkerError(f"{exc} during start-up; pass num_workers=0 to step the envs in this process") from None
        gl_errors = [r for r in replies if r.startswith(b"glerror ")]
        errors = [r for r in replies if r.startswith(b"error ")]
        if gl_errors or errors:
            self.close()
            if gl_errors:
                detail = gl_errors[0][len(b"glerror ") :].decode(errors="replace")
                raise gl.unavailable(detail, tried=[worker_env.get("MUJOCO_GL", "")])
            raise WorkerError(f"mujoco worker failed to start: {_last_line(errors[0])}\n{errors[0].decode()}")
        self.render_devices = [json.loads(r[len(b"ready ") :] or b"{}") for r in replies]

    def _gather(self, timeout: float | None = None, conns: list[Connection] | None = None) -> list[bytes]:
        """One reply from each pipe in ``conns`` (default: all), failing fast if a worker dies."""
        conns = self.conns if conns is None else conns
        pending = {id(c): (c, self.procs[self.conns.index(c)]) for c in conns}
        replies: dict[int, bytes] = {}
        while pending:
            handles = [c for c, _ in pending.values()] + [p.sentinel for _, p in pending.values()]
            ready = wait(handles, timeout=timeout)
            if not ready:
                raise WorkerError(f"mujoco workers did not answer within {timeout} s")
            for key, (conn, proc) in list(pending.items()):
                if conn in ready or conn.poll():
                    try:
                        replies[key] = conn.recv_bytes()
                    except (EOFError, OSError):
                        raise WorkerError(f"mujoco worker {proc.name} exited (code {proc.exitcode})") from None
                    del pending[key]
                elif proc.sentinel in ready:
                    proc.join(0.1)
                    raise WorkerError(f"mujoco worker {proc.name} exited (code {proc.exitcode})")
        return [replies[id(c)] for c in conns]

    def run(self) -> None:
        """Every worker applies the ops in the buffers to its envs; returns when all are done."""
        for conn in self.conns:
            conn.send_bytes(b"run")
        for reply in self._gather():
            if reply != b"ok":
                raise WorkerError(f"mujoco worker: {_last_line(reply)}\n{reply.decode(errors='replace')}")

    def perturb(self, worker: int, env: int, kind: str, distance: float | None) -> bool:
        conn = self.conns[worker]
        conn.send_bytes(f"perturb {env} {kind} {'none' if distance is None else repr(float(distance))}".encode())
        (reply,) = self._gather(conns=[conn])
        if not reply.startswith(b"ok "):
            text = _last_line(reply)
            if "ValueError" in text:
                raise ValueError(text.split("ValueError: ", 1)[-1])
            raise WorkerError(f"mujoco worker: {text}")
        return reply == b"ok 1"

    def close(self, timeout: float = 5.0) -> None:
        """Ask every worker to exit, then join them (terminating any that hang)."""
        for conn, proc in zip(self.conns, self.procs):
            if proc.is_alive():
                try:
                    conn.send_bytes(b"close")
                except (BrokenPipeError, OSError):
                    pass
        for conn, proc in zip(self.conns, self.procs):
            try:
                if conn.poll(timeout):
                    conn.recv_bytes()
            except (EOFError, OSError):
                pass
            proc.join(timeout)
            if proc.is_alive():
                proc.terminate()
                proc.join(timeout)
            conn.close()
        self.conns, self.procs = [], []


def _last_line(reply: bytes) -> str:
    text = reply.decode(errors="replace").strip()
    return text.splitlines()[-1] if text else "(empty reply)"
