"""Finished episodes are written on a background thread: the trajectory file, then the row, in order.

:func:`trajectory_arrays` gives the trajectory file's arrays of a finished episode.

At the end of an episode the runner used to compress the trajectory (``np.savez_compressed``) and append and
``fsync`` the row on the stepping thread: about 2 ms an episode, which at N = 256 envs ending on the same step
stalled every env for half a second per episode. :class:`EpisodeWriter` takes them off that thread. It keeps
the run directory's order (a row is appended only after its trajectory is on disk, rows in the order the
episodes finished) and its bound: at most ``max_pending`` episodes wait; a full queue makes the runner wait for
the disk. A write that fails is raised in the runner's thread at the next :meth:`submit` or at :meth:`close`,
as it would have been raised there before. :meth:`close` writes everything pending first.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Mapping
from typing import Any

import numpy as np

_CLOSE = object()


class EpisodeWriter:
    """Writes ``(trajectory, row)`` pairs of ``run_dir`` on one thread, in submission order."""

    def __init__(self, run_dir, max_pending: int = 4096):
        self.run_dir = run_dir
        self._queue: queue.Queue = queue.Queue(maxsize=max(1, int(max_pending)))
        self._error: BaseException | None = None  # the failure not yet raised in the caller's thread
        self._failed = False  # after a failure nothing more is written, even once the error was raised
        self._thread = threading.Thread(target=self._loop, name="dz-gym-episode-writer", daemon=True)
        self._thread.start()
        self._closed = False

    def submit(
        self, scene: int, episode: int, arm: str | None, arrays: Mapping[str, np.ndarray], row: dict[str, Any]
    ) -> None:
        """Queue one finished episode (``row["trajectory"]`` must be its ``trajectory_relpath``)."""
        self._raise_pending_error()
        if self._closed:
            raise RuntimeError("EpisodeWriter: closed")
        self._queue.put((scene, episode, arm, arrays, row))

    def close(self) -> None:
        """Write everything queued, stop the thread, and raise the first write error if there was one."""
        if not self._closed:
            self._closed = True
            self._queue.put(_CLOSE)
            self._thread.join()
        self._raise_pending_error()

    def _raise_pending_error(self) -> None:
        if self._error is not None:
            error, self._error = self._error, None
            raise error

    def _loop(self) -> None:
        while True:
            item = self._queue.get()
            if item is _CLOSE:
                return
            if self._failed:  # rows keep their order: none after the one that failed
                continue
            scene, episode, arm, arrays, row = item
            try:
                self.run_dir.save_trajectory(scene, episode, arrays, arm)
                self.run_dir.append_row(row)
            except BaseException as exc:  # noqa: BLE001 - handed to the runner's thread
                self._failed = True
                self._error = exc


def trajectory_arrays(ep: Any) -> dict[str, np.ndarray]:
    """The trajectory file's arrays of a finished episode (the runner's per-step record of it)."""
    arrays = {
        "actions": np.stack(ep.actions).astype(np.float32),
        "joint_pos": np.stack(ep.joints).astype(np.float32),
        "gripper_pos": np.stack(ep.gripper).astype(np.float32),
        "policy_called": np.asarray(ep.called, dtype=bool),
        "chunk_latency_ms": np.asarray(ep.latency_ms, dtype=np.float32),
        "success": np.asarray(ep.success, dtype=bool),
        "reward": np.asarray(ep.reward, dtype=np.float32),
        "seed": np.int64(ep.seed),
    }
    if ep.object_pos:
        arrays["object_pos"] = np.stack(ep.object_pos).astype(np.float32)
    if ep.container_pos:
        arrays["container_pos"] = np.stack(ep.container_pos).astype(np.float32)
    if ep.tcp_pos:
        arrays["tcp_pos"] = np.stack(ep.tcp_pos).astype(np.float32)
    if ep.object_quat:
        arrays["object_quat"] = np.stack(ep.object_quat).astype(np.float32)
    if ep.object_start_pos is not None:
        arrays["object_start_pos"] = ep.object_start_pos
    if ep.milestones is not None:  # first step per milestone, -1 where never reached
        arrays["milestone_names"] = np.asarray(list(ep.milestones), dtype=np.str_)
        arrays["milestone_first_step"] = np.asarray(list(ep.milestones.values()), dtype=np.int64)
    return arrays
