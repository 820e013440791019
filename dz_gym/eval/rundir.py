"""The run directory: where an evaluation's files live, and the only module of the evaluator that writes them.

Layout (paths inside rows and the summary are relative to the run directory)::

    RUN_DIR/
      config.json                      the EvalConfig (what --resume reloads)
      episodes.jsonl                   one row per finished episode, appended and flushed per episode
      trajectories/scene1_ep0003.npz   per-episode arrays (actions, joints, gripper, server calls, latencies,
                                       poses and milestones); an A/B run's files end in _a / _b
      videos/scene1_ep0003.mp4         per-episode video strip (right | wrist | left), 15 fps
      summary.json                     per scene and overall results, rewritten at the end of every run segment
      attempts.jsonl                   one line per errored attempt that was run again (--episode-retries)

``episodes.jsonl`` is the source of truth: the summary is recomputed from it. Every other file is written to a
temporary name and renamed, so a crash never leaves a half-written trajectory or summary behind; a crash while
appending a row can leave a truncated last line, which :meth:`RunDir.read_rows` skips with a warning (that
episode is simply run again on resume); any other line that is not a JSON row is an error naming its line.
While a run or a resume writes the directory it holds ``.lock`` (:mod:`dz_gym.eval.runlock`).
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from dz_gym.eval.config import EvalConfig
from dz_gym.eval.npz import npz_bytes

logger = logging.getLogger(__name__)

CONFIG_FILE = "config.json"
ROWS_FILE = "episodes.jsonl"
SUMMARY_FILE = "summary.json"
ATTEMPTS_FILE = "attempts.jsonl"


def episode_name(scene: int, episode: int, arm: str | None = None) -> str:
    """The stem shared by an episode's trajectory and video: ``scene1_ep0003`` (``scene1_ep0003_b`` for arm
    B of an A/B run)."""
    return f"scene{int(scene)}_ep{int(episode):04d}" + (f"_{arm}" if arm else "")


_PLAIN = frozenset({str, int, bool, type(None)})  # returned as they are


def _to_json(value: Any) -> Any:
    """Plain JSON types for numpy scalars/arrays, tuples and paths (NaN becomes null).

    The plain types (exactly ``str``, ``int``, ``bool``, ``None``, a float, a dict, a list or a tuple) are told
    by their type first, before the ``isinstance`` chain (``Mapping`` is an abstract class: each check of it
    is slow): the episode writer converts every row it appends, about 70 values a row, on a thread that
    shares the interpreter lock with the stepping loop."""
    kind = type(value)
    if kind in _PLAIN:
        return value
    if kind is float:
        return value if value == value else None
    if kind is dict:
        return {k if type(k) is str else str(k): v if type(v) in _PLAIN else _to_json(v) for k, v in value.items()}
    if kind is list or kind is tuple:
        return [v if type(v) in _PLAIN or (type(v) is float and v == v) else _to_json(v) for v in value]
    return _to_json_any(value)


def _to_json_any(value: Any) -> Any:
    """:func:`_to_json` of a value of any other type."""
    if isinstance(value, Mapping):
        return {str(k): _to_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_to_json(v) for v in value]
    if isinstance(value, np.ndarray):
        return _to_json(value.tolist())
    if isinstance(value, np.generic):
        return _to_json(value.item())
    if isinstance(value, float) and value != value:
        return None
    if isinstance(value, Path):
        return str(value)
    return value


def _write_atomic(path: Path, data: bytes) -> None:
    """Write ``data`` to a temporary name, then rename it to ``path``; a failed write (a full disk) leaves
    ``path`` as it was and no temporary file behind. The temporary name is this process's and thread's own:
    the scene processes of a run, side by side, write the same files (``config.json``) at the same time."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


class RunDir:
    """Files of one run directory (see the module docstring)."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        self._made: set[Path] = set()  # folders made by save_trajectory (one mkdir per folder, not per file)

    # -- creation -----------------------------------------------------------------------------------
    @classmethod
    def create(cls, output_root: str | os.PathLike, config: EvalConfig) -> RunDir:
        """A new, uniquely named run directory under ``output_root`` holding ``config.json``."""
        root = Path(output_root)
        stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
        scenes = "-".join(str(s) for s in config.plan.scenes)
        for attempt in range(1000):
            name = f"{stamp}_scene{scenes}" + (f"_{attempt}" if attempt else "")
            path = root / name
            try:
                path.mkdir(parents=True, exist_ok=False)
                break
            except FileExistsError:
                continue
        else:
            raise RuntimeError(f"output_root: cannot create a new run directory under {root}")
        run = cls(path)
        run.save_config(config)
        return run

    @classmethod
    def open(cls, path: str | os.PathLike) -> RunDir:
        """An existing run directory (for ``--resume``); one-line error when it is not one."""
        run = cls(path)
        if not (run.path / CONFIG_FILE).is_file():
            raise ValueError(f"resume: {path} is not a dz-gym-eval run directory (no {CONFIG_FILE})")
        return run

    # -- config -------------------------------------------------------------------------------------
    def save_config(self, config: EvalConfig) -> None:
        _write_atomic(self.path / CONFIG_FILE, (json.dumps(config.to_dict(), indent=2) + "\n").encode())

    def load_config(self) -> EvalConfig:
        try:
            data = json.loads((self.path / CONFIG_FILE).read_text())
        except (OSError, json.JSONDecodeError) as exc:
            raise ValueError(f"resume: cannot read {self.path / CONFIG_FILE}: {exc}") from None
        return EvalConfig.from_dict(data)

    # -- rows ---------------------------------------------------------------------------------------
    def append_row(self, row: Mapping[str, Any]) -> None:
        """:meth:`append_rows` of one row."""
        self.append_rows([row])

    def append_rows(self, rows: Sequence[Mapping[str, Any]]) -> None:
        """Append episode rows, in order, and flush them to disk (one ``fsync``) before returning; the lines go
        in one ``write`` on an ``O_APPEND`` descriptor, so rows that processes of one run (one per scene) append
        at once never mix. The episode writer hands over every row finished since its last write: at N = 1024
        envs ending together, one ``fsync`` per row was a millisecond each on the writer's thread."""
        if not rows:
            return
        data = "".join(json.dumps(_to_json(row), allow_nan=False, separators=(",", ":")) + "\n" for row in rows)
        data = data.encode("utf-8")
        fd = os.open(self.path / ROWS_FILE, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            written = os.write(fd, data)
            if written != len(data):  # a regular file takes it whole unless the disk is full
                raise OSError(f"{self.path / ROWS_FILE}: wrote {written} of {len(data)} bytes of {len(rows)} row(s)")
            os.fsync(fd)
        finally:
            os.close(fd)

    def append_attempt(self, record: Mapping[str, Any]) -> None:
        """Append one errored attempt that is run again (scene, episode, arm, attempt, error), flushed."""
        line = json.dumps(_to_json(record), allow_nan=False, separators=(",", ":")) + "\n"
        with open(self.path / ATTEMPTS_FILE, "a", encoding="utf-8") as f:
            f.write(line)
            f.flush()

    def read_attempts(self) -> list[dict[str, Any]]:
        """The errored attempts run again so far (a resume continues their counts); unreadable lines skipped."""
        path = self.path / ATTEMPTS_FILE
        if not path.exists():
            return []
        out = []
        for line in path.read_text(encoding="utf-8").splitlines():
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(record, dict):
                out.append(record)
        return out

    def read_rows(self) -> list[dict[str, Any]]:
        """Every complete row of ``episodes.jsonl`` (a truncated last line is skipped)."""
        return [row for _, row in self.read_numbered_rows()]

    def read_numbered_rows(self) -> list[tuple[int, Any]]:
        """Every complete row of ``episodes.jsonl`` with its line number; a truncated last line is skipped, any
        other line that is not UTF-8 JSON is a one-line ``ValueError`` ``PATH:LINE: why``."""
        path = self.path / ROWS_FILE
        if not path.exists():
            return []
        rows = []
        lines = path.read_bytes().split(b"\n")
        if lines and not lines[-1]:
            lines.pop()
        for number, raw in enumerate(lines, 1):
            try:
                line = raw.decode("utf-8")
                if not line.strip():
                    continue
                rows.append((number, json.loads(line)))
            except (UnicodeDecodeError, json.JSONDecodeError) as exc:
                if number == len(lines):
                    logger.warning("%s: skipping a truncated last line (that episode will run again)", path)
                    continue
                what = "not UTF-8 text" if isinstance(exc, UnicodeDecodeError) else "not a JSON row"
                raise ValueError(f"{path}:{number}: {what}") from None
        return rows

    def repair_rows(self) -> None:
        """Drop a torn last line of ``episodes.jsonl`` (no newline at its end, or not a JSON row) so that
        appends start on a fresh line after the last complete row."""
        path = self.path / ROWS_FILE
        if not path.exists():
            return
        data = path.read_bytes()
        body, _, last = data.rstrip(b"\n").rpartition(b"\n")
        keep = data
        if data and not data.endswith(b"\n"):
            keep = data[: data.rfind(b"\n") + 1]
        elif last.strip():
            try:
                json.loads(last.decode("utf-8"))
            except (UnicodeDecodeError, json.JSONDecodeError):
                keep = body + b"\n" if body else b""
        if keep != data:
            _write_atomic(path, keep)

    def rewrite_rows(self, rows: list[Mapping[str, Any]]) -> None:
        """Replace ``episodes.jsonl`` with ``rows`` in one atomic rename (a row's file link withdrawn)."""
        lines = [json.dumps(_to_json(r), allow_nan=False, separators=(",", ":")) + "\n" for r in rows]
        _write_atomic(self.path / ROWS_FILE, "".join(lines).encode("utf-8"))

    # -- per-episode files --------------------------------------------------------------------------
    def trajectory_relpath(self, scene: int, episode: int, arm: str | None = None) -> str:
        return f"trajectories/{episode_name(scene, episode, arm)}.npz"

    def video_relpath(self, scene: int, episode: int, arm: str | None = None) -> str:
        return f"videos/{episode_name(scene, episode, arm)}.mp4"

    def save_trajectory(
        self, scene: int, episode: int, arrays: Mapping[str, np.ndarray], arm: str | None = None
    ) -> str:
        """Write one episode's arrays (an npz of stored members, :mod:`dz_gym.eval.npz`; atomically); returns the
        relative path."""
        rel = self.trajectory_relpath(scene, episode, arm)
        path = self.path / rel
        if path.parent not in self._made:
            path.parent.mkdir(parents=True, exist_ok=True)
            self._made.add(path.parent)
        tmp = path.with_name(f".{path.stem}.tmp.npz")
        data = npz_bytes(arrays)
        try:
            with open(tmp, "wb") as f:
                f.write(data)
            os.replace(tmp, path)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        return rel

    def write_file(self, rel: str | os.PathLike, data: bytes) -> Path:
        """Write ``data`` to ``rel`` (a path inside the run directory; its folder is created) atomically:
        a file a shard shipped back, the page of the report, the shards' token. Returns the path."""
        parts = Path(rel).parts
        if not parts or Path(rel).is_absolute() or ".." in parts:
            raise ValueError(f"run directory file: expected a relative path inside {self.path}, got {str(rel)!r}")
        path = self.path.joinpath(*parts)
        path.parent.mkdir(parents=True, exist_ok=True)
        _write_atomic(path, data)
        return path

    def video_path(self, scene: int, episode: int, arm: str | None = None) -> Path:
        """Where an episode's video goes (its folder created): the video recorder streams into this file."""
        path = self.path / self.video_relpath(scene, episode, arm)
        path.parent.mkdir(parents=True, exist_ok=True)
        return path

    # -- summary ------------------------------------------------------------------------------------
    def write_summary(self, summary: Mapping[str, Any]) -> None:
        data = json.dumps(_to_json(summary), indent=2, allow_nan=False) + "\n"
        _write_atomic(self.path / SUMMARY_FILE, data.encode())

    def read_summary(self) -> dict[str, Any] | None:
        path = self.path / SUMMARY_FILE
        if not path.exists():
            return None
        try:
            return json.loads(path.read_text())
        except (OSError, json.JSONDecodeError):
            logger.warning("%s: unreadable; previous run segments' timing is lost", path)
            return None
