"""The runner's per-step record of the whole batch, from which each finished episode's columns are cut (pure).

Appending each env's values of every step to its episode's lists cost the runner about 15 Python calls per
env and step: at N = 1024 envs that was more time per batch step than the simulator's physics.
:class:`StepLog` takes each batch step's already converted ``(N, ...)`` arrays instead, once per field (one
copy into a chunk of ``chunk_steps`` steps, no per-env work), and remembers per env slot the step index its
episode began at. When an episode ends, :meth:`StepLog.episodes` slices its steps out of the chunks (one
fancy index per field and chunk for all the episodes that began at the same step), giving what the per-episode
lists gave: the per-step values in step order, of the field's dtype.

A field may be missing (None) at some steps (an env that does not report a pose): an episode's column then
has only the steps where it was there, as the lists had, and is None where it never was. Memory stays
bounded: at each :meth:`StepLog.append` the chunks that end before the first step of the oldest running
episode are dropped (with episodes of at most ``max_steps`` steps, at most ``ceil(max_steps / chunk_steps) + 1``
chunks are kept). :meth:`StepLog.keep_first` keeps per slot a value of the episode's first step that has it (the object's
start position, the env's seed).

>>> import numpy as np
>>> log = StepLog(2, chunk_steps=2)
>>> log.start([0, 1])
>>> for t in range(3):
...     log.append({"reward": np.array([t, 10 * t], dtype=np.float64), "pose": None if t == 1 else np.eye(2)[:, :1]},
...                live=[0, 1])
>>> log.start([1])   # slot 1's next episode begins at step 3
>>> log.append({"reward": np.array([3.0, 30.0]), "pose": None}, live=[0, 1])
>>> [e["reward"].tolist() for e in log.episodes([0, 1])], log.episodes([0])[0]["pose"].tolist(), log.steps([0, 1]).tolist()
([[0.0, 1.0, 2.0, 3.0], [30.0]], [[1.0], [1.0]], [4, 1])
>>> log.episodes([1])[0]["pose"] is None
True
>>> log.keep_first("seed", np.array([7, 8]), [0, 1]).tolist(), log.keep_first("seed", np.array([0, 9]), [0, 1]).tolist()
([0, 1], [])
>>> log.start([1])
>>> log.keep_first("seed", np.array([0, 9]), [0, 1]).tolist(), log.episodes([0, 1])[1]["seed"].tolist()
([1], 9)
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping, Sequence

import numpy as np

__all__ = ["StepLog"]


class _Chunk:
    """``size`` consecutive batch steps from ``start``: per field a ``(size, N, ...)`` array and a ``(size,)``
    mask of the steps that had it (the arrays are made at the field's first step in the chunk)."""

    def __init__(self, start: int, size: int):
        self.start = start
        self.size = size
        self.columns: dict[str, np.ndarray] = {}
        self.present: dict[str, np.ndarray] = {}

    def put(self, row: int, name: str, column: np.ndarray, num_envs: int) -> None:
        array = self.columns.get(name)
        if array is None:
            if column.ndim < 1 or column.shape[0] != num_envs:
                raise ValueError(f"step log: {name!r} expected an array of shape ({num_envs}, ...), got {column.shape}")
            array = self.columns[name] = np.empty((self.size, *column.shape), dtype=column.dtype)
            self.present[name] = np.zeros(self.size, dtype=bool)
        elif column.shape != array.shape[1:]:
            raise ValueError(
                f"step log: {name!r} expected shape {array.shape[1:]} like its earlier steps, got {column.shape}"
            )
        array[row] = column
        self.present[name][row] = True


class StepLog:
    """Per-step ``(N, ...)`` columns of a batch of ``num_envs`` env slots (see the module docstring)."""

    def __init__(self, num_envs: int, chunk_steps: int = 64):
        if int(chunk_steps) < 1:
            raise ValueError(f"chunk_steps: expected a positive number of steps, got {chunk_steps}")
        self.num_envs = int(num_envs)
        self.chunk_steps = int(chunk_steps)
        self.count = 0  # batch steps appended so far; the next one gets this index
        self.begin = np.zeros(self.num_envs, dtype=np.int64)  # per slot: the first step of its episode
        self._chunks: deque[_Chunk] = deque()
        self._names: dict[str, None] = {}  # every field appended so far, in order (None where never there)
        self._once: dict[str, tuple[np.ndarray, np.ndarray]] = {}  # name -> (per-slot values, which are set)

    def start(self, slots: Sequence[int] | np.ndarray) -> None:
        """Episodes begin on ``slots`` at the next step (their first-step values are forgotten)."""
        slots = np.asarray(slots, dtype=np.int64)
        self.begin[slots] = self.count
        for _, known in self._once.values():
            known[slots] = False

    def steps(self, slots: Sequence[int] | np.ndarray) -> np.ndarray:
        """How many steps the episodes on ``slots`` have taken (every running episode steps at every step)."""
        return self.count - self.begin[np.asarray(slots, dtype=np.int64)]

    @property
    def kept_steps(self) -> int:
        """How many steps the chunks still held cover (what bounds the memory)."""
        return sum(chunk.size for chunk in self._chunks)

    def append(self, columns: Mapping[str, np.ndarray | None], live: Sequence[int] | np.ndarray) -> None:
        """Add one batch step: per field an ``(N, ...)`` array, or None where the step has none. ``live``: the
        slots whose episode runs at this step; steps no live episode reaches back to are dropped first."""
        live = np.asarray(live, dtype=np.int64)
        oldest = int(self.begin[live].min()) if live.size else self.count
        while self._chunks and self._chunks[0].start + self._chunks[0].size <= oldest:
            self._chunks.popleft()
        if not self._chunks or self._chunks[-1].start + self._chunks[-1].size <= self.count:
            self._chunks.append(_Chunk(self.count, self.chunk_steps))
        chunk = self._chunks[-1]
        row = self.count - chunk.start
        for name, column in columns.items():
            self._names.setdefault(name)
            if column is not None:
                chunk.put(row, name, np.asarray(column), self.num_envs)
        self.count += 1

    def keep_first(self, name: str, column: np.ndarray | None, slots: Sequence[int] | np.ndarray) -> np.ndarray:
        """Keep ``column``'s values (``(N, ...)``) for those of ``slots`` whose episode has none kept yet;
        returns those slots (none where ``column`` is None)."""
        slots = np.asarray(slots, dtype=np.int64)
        if column is None:
            return slots[:0]
        column = np.asarray(column)
        entry = self._once.get(name)
        if entry is None:
            entry = self._once[name] = (np.zeros_like(column), np.zeros(self.num_envs, dtype=bool))
        values, known = entry
        new = slots[~known[slots]]
        values[new] = column[new]
        known[new] = True
        return new

    def first(self, name: str, slot: int) -> np.ndarray | None:
        """The value :meth:`keep_first` kept for ``slot``'s episode, or None."""
        entry = self._once.get(name)
        if entry is None or not entry[1][slot]:
            return None
        return entry[0][slot].copy()

    def episodes(self, slots: Sequence[int] | np.ndarray) -> list[dict[str, np.ndarray | None]]:
        """Per slot of ``slots``, its episode's columns so far: field -> ``(T, ...)`` array of the steps that
        had the field (in step order), or None where none had it; and per :meth:`keep_first` name the value
        kept (or None). The names of the two kinds must differ."""
        slots = np.asarray(slots, dtype=np.int64)
        out: list[dict[str, np.ndarray | None]] = [{} for _ in range(slots.size)]
        begins = self.begin[slots]
        order = np.argsort(begins, kind="stable")
        for group in np.split(order, np.flatnonzero(np.diff(begins[order])) + 1):
            if not group.size:
                continue
            columns = self._cut(int(begins[group[0]]), slots[group])
            for j, k in enumerate(group.tolist()):
                out[k] = {name: None if array is None else array[j] for name, array in columns.items()}
                out[k].update((name, self.first(name, int(slots[k]))) for name in self._once)
        return out

    def _cut(self, begin: int, slots: np.ndarray) -> dict[str, np.ndarray | None]:
        """The steps ``begin .. count - 1`` of ``slots`` (episodes that began together): field -> ``(M, T, ...)``
        (one contiguous block; each slot's row is a view of it), or None."""
        chunks = [c for c in self._chunks if c.start + c.size > begin and c.start < self.count]
        if begin < self.count and (not chunks or chunks[0].start > begin):
            raise ValueError(f"step log: step {begin} was dropped (an episode began there but was not live)")
        out: dict[str, np.ndarray | None] = {}
        for name in self._names:
            parts, masks = [], []
            for chunk in chunks:
                if name not in chunk.columns:
                    continue
                lo, hi = max(begin, chunk.start) - chunk.start, min(self.count, chunk.start + chunk.size) - chunk.start
                parts.append(chunk.columns[name][lo:hi, slots])
                masks.append(chunk.present[name][lo:hi])
            mask = np.concatenate(masks) if masks else np.zeros(0, dtype=bool)
            if not mask.any():
                out[name] = None
                continue
            data = np.concatenate(parts) if len(parts) > 1 else parts[0]
            if not mask.all():
                data = data[mask]
            out[name] = np.ascontiguousarray(np.moveaxis(data, 0, 1))
        return out
