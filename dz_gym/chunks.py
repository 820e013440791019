"""Per-env action-chunk bookkeeping (pure: no I/O, no clocks, no simulator).

Each env has its own cached chunk, a cursor into it, a session id and an episode counter. The replan rule
is the reference single-env client's: an env asks for a new chunk when it has none or when its cursor has
reached ``open_loop_horizon`` (so the server is called at steps 0, 8, 16, ... of every episode). Only the
envs that need a chunk ask; the others keep consuming their cache, so envs that drifted apart never trigger
a "refill everyone" storm.

When an env's episode ends its cache is dropped and a fresh session id begins; the other envs are not
touched. The gripper command is binarized (> 0.5 -> 1.0, else 0.0) like the reference client.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterable

import numpy as np

from dz_gym.envs import droid


def new_session_id() -> str:
    """A fresh uuid4 session id, as DreamZero clients send."""
    return str(uuid.uuid4())


def binarize_gripper(actions: np.ndarray) -> np.ndarray:
    """Copy of ``actions`` with the last column mapped to 1.0 where > 0.5, else 0.0."""
    out = np.array(actions, dtype=np.float32, copy=True)
    out[..., -1] = (out[..., -1] > droid.GRIPPER_CLOSE_THRESHOLD).astype(np.float32)
    return out


class ChunkSchedule:
    """Chunk caches, cursors and session ids of ``num_envs`` envs.

    Typical use per control step::

        need = schedule.needs_chunk()            # (N,) bool: which envs must query the server now
        for i in np.flatnonzero(need): schedule.accept_chunk(i, chunk_from_server_i)
        actions = schedule.pop_actions()         # (N, 8) float32, one row per env, cursors advance
        ... env.step(actions) ...
        schedule.end_episodes(done_env_ids)      # drop caches, rotate session ids
    """

    def __init__(
        self,
        num_envs: int,
        open_loop_horizon: int = droid.DEFAULT_OPEN_LOOP_HORIZON,
        session_id_factory: Callable[[], str] = new_session_id,
    ):
        if int(num_envs) < 1:
            raise ValueError(f"num_envs: expected an integer >= 1, got {num_envs!r}")
        if int(open_loop_horizon) < 1:
            raise ValueError(f"open_loop_horizon: expected an integer >= 1, got {open_loop_horizon!r}")
        self.num_envs = int(num_envs)
        self.open_loop_horizon = int(open_loop_horizon)
        self._new_session_id = session_id_factory
        self._chunks: list[np.ndarray | None] = [None] * self.num_envs
        self._cursor = np.zeros(self.num_envs, dtype=np.int64)
        self.session_ids: list[str] = [session_id_factory() for _ in range(self.num_envs)]
        self.episode_index = np.zeros(self.num_envs, dtype=np.int64)
        self.episode_step = np.zeros(self.num_envs, dtype=np.int64)
        self.server_calls = np.zeros(self.num_envs, dtype=np.int64)  # in the current episode

    # -- queries ---------------------------------------------------------------------------------
    def usable_length(self, env_id: int) -> int:
        """How many actions of env ``env_id``'s chunk are executed before it replans."""
        chunk = self._chunks[env_id]
        return 0 if chunk is None else min(self.open_loop_horizon, len(chunk))

    def needs_chunk(self) -> np.ndarray:
        """``(N,)`` bool: envs without a usable cached action for their next step."""
        return np.array(
            [self._cursor[i] >= self.usable_length(i) for i in range(self.num_envs)], dtype=bool
        )

    def has_chunk(self, env_id: int) -> bool:
        """Whether env ``env_id`` currently holds a chunk (spent or not)."""
        return self._chunks[env_id] is not None

    def cursor(self, env_id: int) -> int:
        """Actions of the current chunk already executed by env ``env_id``."""
        return int(self._cursor[env_id])

    # -- updates ---------------------------------------------------------------------------------
    def accept_chunk(self, env_id: int, actions: np.ndarray) -> None:
        """Install a new chunk ``(H, 8)`` for env ``env_id`` and rewind its cursor."""
        actions = np.asarray(actions)
        if actions.ndim != 2 or actions.shape[1] != droid.ACTION_DIM or actions.shape[0] < 1:
            raise ValueError(f"actions: expected shape (H>=1, {droid.ACTION_DIM}), got {actions.shape}")
        self._chunks[env_id] = binarize_gripper(actions)
        self._cursor[env_id] = 0
        self.server_calls[env_id] += 1

    def pop_actions(self, active: np.ndarray | None = None) -> np.ndarray:
        """One action per env, ``(N, 8)`` float32; every env counts one executed step.

        ``active`` (``(N,)`` bool, default all) selects the envs that consume their cached action; the
        rows of the others are NaN and their cursors stay (the caller fills those rows, e.g. with a hold
        action for an env whose server call failed).
        """
        active = np.ones(self.num_envs, dtype=bool) if active is None else np.asarray(active, dtype=bool)
        starving = active & self.needs_chunk()
        if starving.any():
            raise RuntimeError(f"pop_actions: envs {np.flatnonzero(starving).tolist()} have no cached action")
        out = np.full((self.num_envs, droid.ACTION_DIM), np.nan, dtype=np.float32)
        for i in np.flatnonzero(active):
            out[i] = self._chunks[i][self._cursor[i]]
        self._cursor[active] += 1
        self.episode_step += 1
        return out

    def drop_chunk(self, env_id: int) -> None:
        """Forget env ``env_id``'s chunk (e.g. after a server error) so it asks again."""
        self._chunks[env_id] = None
        self._cursor[env_id] = 0

    def end_episodes(self, env_ids: Iterable[int]) -> list[str]:
        """End the episodes of ``env_ids``: drop caches, start new session ids. Returns the old ids."""
        ended = []
        for i in env_ids:
            i = int(i)
            ended.append(self.session_ids[i])
            self._chunks[i] = None
            self._cursor[i] = 0
            self.session_ids[i] = self._new_session_id()
            self.episode_index[i] += 1
            self.episode_step[i] = 0
            self.server_calls[i] = 0
        return ended

    def reset_all(self) -> None:
        """End every env's episode (an explicit batched ``reset()``)."""
        self.end_episodes(range(self.num_envs))
