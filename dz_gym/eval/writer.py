"""Finished episodes are written on a background thread: the trajectory file, then the row, in order.

At the end of an episode the runner used to compress the trajectory (``np.savez_compressed``; the writer now stores
it, :mod:`dz_gym.eval.npz`) and append and ``fsync`` the row on the stepping thread, so when N envs ended on the
same step every env waited until all N were on disk. :class:`EpisodeWriter` takes them off that thread. It keeps the
run directory's order (a row is appended only after its trajectory is on disk, rows in the order the episodes
finished) and its bound: at most ``max_pending`` episodes wait; a full queue makes the runner wait for the disk. The
writer takes every episode waiting at once (up to :data:`MAX_BATCH`): their trajectories, then their rows in one
append with one ``fsync`` (at N = 1024 envs ending on the same step, an ``fsync`` per row was a millisecond each, on
a thread that shares the interpreter lock with the stepping loop). A write that fails is raised in the runner's
thread at the next :meth:`submit` or at :meth:`close`, as it would have been raised there before. :meth:`close`
writes everything pending first.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

_CLOSE = object()
MAX_BATCH = 512  # episodes whose rows go to disk in one append and one fsync
Arrays = Mapping[str, np.ndarray] | Callable[[], Mapping[str, np.ndarray]]
"""A trajectory's arrays, or the function that packs them (called on the writer's thread)."""


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

    def submit(self, scene: int, episode: int, arm: str | None, arrays: Arrays, row: dict[str, Any]) -> None:
        """Queue one finished episode (``row["trajectory"]`` must be its ``trajectory_relpath``). ``arrays`` may
        be the function that packs them: it runs on the writer's thread (at N = 1024 envs ending on the same
        step the runner would pack 1024 trajectories before the next step could start); an
        error it raises is a write error."""
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
            batch, closing = self._take_batch()
            if not self._failed and batch:
                self._write(batch)
            if closing:
                return

    def _take_batch(self) -> tuple[list[tuple], bool]:
        """The next queued episode and every other one already waiting (up to :data:`MAX_BATCH`), and
        whether the close marker came with them."""
        batch: list[tuple] = []
        item = self._queue.get()
        while True:
            if item is _CLOSE:
                return batch, True
            batch.append(item)
            if len(batch) >= MAX_BATCH:
                return batch, False
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                return batch, False

    def _write(self, batch: list[tuple]) -> None:
        """The batch's trajectories in order, then the rows of those on disk, in one append (one ``fsync``);
        after a failure, nothing more (rows keep their order: none after the one that failed)."""
        rows = []
        try:
            for scene, episode, arm, arrays, row in batch:
                self.run_dir.save_trajectory(scene, episode, arrays() if callable(arrays) else arrays, arm)
                rows.append(row)
        except BaseException as exc:  # noqa: BLE001 - handed to the runner's thread
            self._fail(exc)
        try:
            self.run_dir.append_rows(rows)
        except BaseException as exc:  # noqa: BLE001 - handed to the runner's thread
            self._fail(exc)

    def _fail(self, exc: BaseException) -> None:
        if not self._failed:
            self._failed = True
            self._error = exc
