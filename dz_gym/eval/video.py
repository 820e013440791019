"""Per-episode mp4 videos written by a background thread, so encoding never stalls the simulator.

Each frame is a strip of three views at 15 fps, in ``droid.VIDEO_STRIP_KEYS`` order: the external camera left
of the robot (``external_cam``, sent as ``exterior_image_0_left``) | wrist | the external camera right of the
robot (``external_cam_2``); the reference client's strip has the same order. The stepping
loop only builds the strip (one ``np.concatenate`` per recorded env, which also copies the pixels out of the
env's buffers) and hands it to a bounded queue; a single writer thread feeds one ffmpeg process per open
video (imageio-ffmpeg), so the encoding itself runs in other processes. The queue is bounded: if the encoders
fall far behind, the stepping loop waits instead of growing memory without limit.

Example::

    recorder = VideoRecorder(fps=15)
    recorder.open("scene1_ep0000", "run/videos/scene1_ep0000.mp4")
    for frame in frames:
        recorder.add("scene1_ep0000", frame)       # (H, W, 3) uint8
    recorder.finish("scene1_ep0000")               # returns at once; the file is closed in the background
    recorder.close()                               # waits for every video
"""

from __future__ import annotations

import logging
import os
import queue
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from dz_gym.envs import droid

logger = logging.getLogger(__name__)

VIDEO_VIEW_SHAPE = (180, 320)  # each view of the strip, (H, W)
_STOP = object()


def strip_frames(policy_obs: Mapping[str, Any], slots: Sequence[int]) -> dict[int, np.ndarray]:
    """The video strip of each env slot in ``slots`` from ``obs["policy"]``: ``{slot: (H, 3W, 3) uint8}``.

    Views are resized with pad to 180x320 when they have another size (e.g. Isaac Lab's 720x1280), on the
    tensors' device before the host copy.
    """
    if len(slots) == 0:
        return {}
    index = np.asarray(slots, dtype=np.int64)
    native = all(
        isinstance(policy_obs[camera], np.ndarray) and tuple(policy_obs[camera].shape[1:3]) == VIDEO_VIEW_SHAPE
        for camera in droid.VIDEO_STRIP_KEYS
    )
    if native:
        views = [policy_obs[camera][index] for camera in droid.VIDEO_STRIP_KEYS]
    else:
        from dz_gym.requests import resized_views

        resized = resized_views(policy_obs, list(slots), VIDEO_VIEW_SHAPE)
        views = [resized[camera] for camera in droid.VIDEO_STRIP_KEYS]
    strips = np.concatenate(views, axis=2)  # (len(slots), H, 3W, 3), a fresh copy
    return {int(slot): strips[row] for row, slot in enumerate(slots)}


class VideoRecorder:
    """Background mp4 writer for many concurrent videos, addressed by a key (e.g. ``"scene1_ep0003"``).

    ``open``/``add``/``finish``/``abort`` only enqueue; the writer thread does the work. Errors of one video
    (e.g. a full disk) are logged, that video is dropped, and its key lands in :attr:`failed`; the others
    carry on. :meth:`close` waits for every queued frame, closes the finished videos and deletes the ones
    never finished.
    """

    def __init__(self, fps: int = droid.CONTROL_HZ, max_queued_frames: int = 128):
        self.fps = int(fps)
        self._queue: queue.Queue = queue.Queue(maxsize=max_queued_frames)
        self._writers: dict[str, Any] = {}
        self._paths: dict[str, Path] = {}
        self._frames: dict[str, int] = {}
        self.failed: dict[str, str] = {}
        self.finished: dict[str, int] = {}  # key -> frames written, for videos closed successfully
        self._lock = threading.Lock()
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="dz-gym-video", daemon=True)
        self._thread.start()

    # -- producer side (the stepping loop) --------------------------------------------------------------
    def open(self, key: str, path: str | os.PathLike) -> None:
        """Start a new video ``key`` written to ``path`` (its folder is created)."""
        self._put(("open", key, Path(path)))

    def add(self, key: str, frame: np.ndarray) -> None:
        """Append one ``(H, W, 3)`` uint8 frame (the array must not be modified afterwards)."""
        self._put(("frame", key, frame))

    def finish(self, key: str) -> None:
        """Close video ``key`` (in the background)."""
        self._put(("finish", key, None))

    def abort(self, key: str) -> None:
        """Close video ``key`` and delete its file (an episode that did not complete)."""
        self._put(("abort", key, None))

    def close(self, timeout: float | None = 120.0) -> None:
        """Write every queued frame, close the finished videos, delete those never finished (partial: their
        episode did not end, e.g. a second Ctrl-C interrupted the cleanup), and stop the thread (waits up to
        ``timeout`` seconds)."""
        if self._closed:
            return
        self._closed = True
        self._queue.put(_STOP)
        self._thread.join(timeout)
        if self._thread.is_alive():
            logger.warning("video writer did not finish within %s s; some videos may be incomplete", timeout)

    def _put(self, item) -> None:
        if self._closed:
            raise RuntimeError("VideoRecorder is closed")
        self._queue.put(item)

    # -- consumer side (the writer thread) --------------------------------------------------------------
    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is _STOP:
                break
            op, key, payload = item
            try:
                if op == "open":
                    self._open(key, payload)
                elif op == "frame":
                    writer = self._writers.get(key)
                    if writer is not None:
                        writer.append_data(payload)
                        self._frames[key] += 1
                elif op == "finish":
                    self._close_writer(key, delete=False)
                elif op == "abort":
                    self._close_writer(key, delete=True)
            except Exception as exc:  # noqa: BLE001 - one broken video must not stop the others
                logger.warning("video %s: %s: %s", key, type(exc).__name__, exc)
                with self._lock:
                    self.failed[key] = f"{type(exc).__name__}: {exc}"
                self._close_writer(key, delete=True, quiet=True)
        for key in list(self._writers):  # never finished: its episode did not end, so the file is partial
            self._close_writer(key, delete=True, quiet=True)

    def _open(self, key: str, path: Path) -> None:
        import imageio.v2 as imageio

        if key in self._writers:
            self._close_writer(key, delete=False)
        path.parent.mkdir(parents=True, exist_ok=True)
        self._writers[key] = imageio.get_writer(
            str(path),
            fps=self.fps,
            codec="libx264",
            quality=7,
            macro_block_size=2,
            pixelformat="yuv420p",
            ffmpeg_log_level="error",
        )
        self._paths[key] = path
        self._frames[key] = 0

    def _close_writer(self, key: str, *, delete: bool, quiet: bool = False) -> None:
        writer = self._writers.pop(key, None)
        path = self._paths.pop(key, None)
        frames = self._frames.pop(key, 0)
        if writer is None:
            return
        try:
            writer.close()
        except Exception as exc:  # noqa: BLE001
            if not quiet:
                raise
            logger.debug("video %s: close failed: %s", key, exc)
            delete = True
        if delete:
            if path is not None and path.exists():
                path.unlink()
        else:
            with self._lock:
                self.finished[key] = frames


def mp4_problem(path: str | os.PathLike) -> str | None:
    """Why the file at ``path`` is not a complete mp4 (one line), or None: its top-level boxes must tile the
    file exactly and include ``ftyp`` and ``moov`` (an encoder stopped early leaves no ``moov``: "moov atom
    not found" for every player)."""
    try:
        size = os.path.getsize(path)
        kinds, offset = set(), 0
        with open(path, "rb") as f:
            while offset < size:
                f.seek(offset)
                head = f.read(16)
                if len(head) < 8:
                    return f"a torn box at byte {offset}"
                length, kind = int.from_bytes(head[:4], "big"), head[4:8]
                if length == 1 and len(head) == 16:
                    length = int.from_bytes(head[8:16], "big")
                elif length == 0:
                    length = size - offset
                if length < 8 or offset + length > size:
                    return f"a torn {kind.decode('latin-1')!r} box at byte {offset}"
                kinds.add(kind)
                offset += length
    except OSError as exc:
        return f"unreadable ({type(exc).__name__}: {exc.strerror or exc})"
    missing = [k.decode() for k in (b"ftyp", b"moov") if k not in kinds]
    return f"no {' and no '.join(missing)} box (not finished)" if missing else None


def video_problem(run_path: str | os.PathLike, rel: str) -> str | None:
    """Why the video a row links (``rel``, inside run directory ``run_path``) cannot be played, or None: the file
    is missing, or not a complete mp4 (:func:`mp4_problem`). A resume withdraws such a link
    (:func:`withdraw_broken_videos`); the report does not link it."""
    path = Path(run_path) / rel
    return "missing (not finished)" if not path.exists() else mp4_problem(path)


def withdraw_broken_videos(run_dir, rows: Sequence[Mapping[str, Any]], reasons: Mapping[str, str] | None = None):
    """Rows of ``run_dir`` that link a video that is missing or not a complete mp4 (:func:`mp4_problem`) get
    ``video: null`` (``episodes.jsonl`` rewritten atomically) and the file is deleted; returns, per video
    withdrawn (its name, e.g. ``scene1_ep0003``), why: ``reasons``' entry for it (the recorder's error)
    where there is one."""
    reasons = dict(reasons or {})
    out: dict[str, str] = {}
    kept = []
    for row in rows:
        rel = row.get("video")
        problem = video_problem(run_dir.path, rel) if rel else None
        if problem is None:
            kept.append(row)
            continue
        key = Path(rel).stem
        out[key] = reasons.get(key) or f"{rel}: {problem}"
        Path(run_dir.path, rel).unlink(missing_ok=True)
        kept.append({**row, "video": None})
    if out:
        logger.warning("%s: %d video(s) could not be read and are unlinked from their rows", run_dir.path, len(out))
        run_dir.rewrite_rows(kept)
    return out
