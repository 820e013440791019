"""Per-env action-chunk bookkeeping (pure: no I/O, no clocks, no simulator).

Each env has its own cached chunk, the row of its next action, a session id and its episode's step count. One
mechanism serves the reference client's synchronous semantics and latency hiding:

- A chunk's *window* is the ``open_loop_horizon`` actions it executes, starting at row ``d``, where ``d`` is
  the number of env steps executed between the observation the request carried and the chunk's first use
  (the delay). Synchronously ``d = 0``: rows 0..7 with a horizon of 8.
- An env sends its next request when it has no chunk, or when ``prefetch`` actions are left in its window
  (``prefetch=0``, the default, is the reference client: the server is called at steps 0, 8, 16, ... of
  every episode and the env waits for the reply). Only the envs that are due ask; the others keep using
  their cache, so envs that drifted apart never trigger a "refill everyone" storm.
- With ``prefetch=K > 0`` the env keeps executing while the request is in flight. When the reply is
  delivered at a later step, the rows for the steps already executed are skipped (``d`` = steps since the
  request) and the new window starts there. If the reply is late, the env runs on the previous chunk's
  remaining predicted rows past its window ("stale" steps, at most ``max_stale_steps``; default: until the
  chunk's rows run out) and then must wait.
- ``simulated_delay=D`` makes the delay a fixed number of steps instead of wall-clock time: a reply is
  applied exactly ``D`` steps after its request (held back if it came early; waited for if it is late), and an
  env with no action left meanwhile holds its pose. Results are then reproducible.
- ``control_period_s=P`` (latency-honest) makes each request's delay its own measured round trip in steps,
  ``ceil(latency / P)`` (:func:`honest_delay`): the world keeps moving while the policy thinks, as on a robot
  running at ``1 / P`` Hz. The env stops stepping while its request is in flight (its delay is not known until
  the reply is in; simulated time does not run while nobody knows how far it should), then takes that many
  steps (on the rest of its window with ``prefetch``, else holding its pose) and applies the chunk from that
  row on. Each delay is recorded as soon as it is known (``stats.drawn``); :meth:`ChunkSchedule.replay_delays` hands an env the
  delays an earlier attempt of its episode drew, used in order before any new one is measured, so a rerun
  does not draw new delays.

When an env's episode ends its cache and any request in flight are dropped (a reply for an ended episode is
discarded) and a fresh session id begins; other envs are not touched. Gripper commands are binarized
(> 0.5 -> 1.0, else 0.0) like the reference client. A chunk with fewer rows than ``open_loop_horizon`` raises
:class:`HorizonError`: executing fewer actions than asked for would silently change the experiment.

Example (two envs, synchronous, a horizon of 2 rows; ``chunk`` stands for a server's reply)::

    >>> import numpy as np
    >>> from dz_gym.chunks import ChunkSchedule
    >>> ids = iter(["a0", "b0", "a1"])
    >>> schedule = ChunkSchedule(2, open_loop_horizon=2, session_id_factory=lambda: next(ids))
    >>> chunk = np.zeros((4, 8), dtype=np.float32)
    >>> chunk[:, 0] = [10, 11, 12, 13]
    >>> schedule.requests_due().tolist()
    [True, True]
    >>> for env_id in np.flatnonzero(schedule.requests_due()):
    ...     schedule.accept_chunk(env_id, chunk + env_id)
    >>> schedule.pop_actions()[:, 0].tolist()      # row 0 of each env's chunk
    [10.0, 11.0]
    >>> schedule.pop_actions()[:, 0].tolist()
    [11.0, 12.0]
    >>> schedule.requests_due().tolist()           # both windows of 2 rows are spent
    [True, True]
    >>> schedule.end_episodes([0])                 # env 0's episode ended: a new session id
    ['a0']
    >>> schedule.session_ids
    ['a1', 'b0']
    >>> schedule.accept_chunk(1, chunk[:1])
    Traceback (most recent call last):
    ...
    dz_gym.errors.HorizonError: open_loop_horizon: 2 is longer than the server's chunk of 1 row(s); pass at most 1
"""

from __future__ import annotations

import math
import uuid
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import numpy as np

from dz_gym.envs import droid
from dz_gym.errors import HorizonError
from dz_gym.protocol.contract import check_chunk


def check_horizon(open_loop_horizon: int, chunk_length: int, where: str = "") -> None:
    """Raise :class:`HorizonError` when a chunk of ``chunk_length`` rows cannot fill the horizon."""
    if int(chunk_length) < int(open_loop_horizon):
        raise HorizonError(open_loop_horizon, chunk_length, where)


def honest_delay(latency_s: float, control_period_s: float) -> int:
    """The steps a robot at ``1 / control_period_s`` Hz takes while a request ``latency_s`` long is in flight:
    ``ceil(latency / period)`` (0 for an instant reply).

    >>> honest_delay(0.2, 1 / 15), honest_delay(0.0, 1 / 15), honest_delay(1 / 15, 1 / 15)
    (3, 0, 1)
    """
    latency_s, control_period_s = float(latency_s), float(control_period_s)
    if not math.isfinite(latency_s) or latency_s < 0:
        raise ValueError(f"latency_s: expected a finite number >= 0, got {latency_s!r}")
    if not math.isfinite(control_period_s) or control_period_s <= 0:
        raise ValueError(f"control_period_s: expected a finite number > 0, got {control_period_s!r}")
    # a latency that is a whole number of periods up to float rounding takes that many steps, not one more
    return max(0, math.ceil(latency_s / control_period_s - 1e-9))


def new_session_id() -> str:
    """A fresh uuid4 session id, as DreamZero clients send."""
    return str(uuid.uuid4())


def binarize_gripper(actions: np.ndarray) -> np.ndarray:
    """Copy of ``actions`` with the last column mapped to 1.0 where > 0.5, else 0.0."""
    out = np.array(actions, dtype=np.float32, copy=True)
    out[..., -1] = (out[..., -1] > droid.GRIPPER_CLOSE_THRESHOLD).astype(np.float32)
    return out


@dataclass
class EpisodeChunkStats:
    """Per-episode latency-hiding record of one env."""

    delays: list[int] = field(default_factory=list)  # d of each chunk, in steps
    # latency-honest: each request's delay in steps once known (measured or replayed), in request order, also
    # one whose chunk the episode's end left unused (what a rerun replays)
    drawn: list[int] = field(default_factory=list)
    wait_steps: int = 0  # steps at which the env had to wait (or hold) for a reply
    stale_steps: int = 0  # steps executed past a chunk's window


class ChunkSchedule:
    """Chunk caches, next rows, requests in flight and session ids of ``num_envs`` envs.

    Synchronous use per control step (``prefetch=0``; the module docstring has a runnable example)::

        for i in np.flatnonzero(schedule.requests_due()): schedule.accept_chunk(i, chunk_from_server_i)
        actions = schedule.pop_actions()         # (N, 8) float32, one row per env
        ... env.step(actions) ...
        schedule.end_episodes(done_env_ids)      # drop caches, rotate session ids

    With requests in flight: ``token = mark_sent(i)`` when env i's request leaves, ``deliver(i, token, chunk)``
    when its reply is in, ``must_wait()`` says which envs cannot step before their reply, ``has_action()``
    which envs have a row to execute this step (the others hold their pose).

    The state is held in arrays over the envs, so each per-step query is one expression over all of them
    (no loop in Python over N envs) and each per-reply update touches one env: the chunks share one
    ``(N, rows, 8)`` buffer, grown when a longer chunk arrives, with each env's length (0: no chunk; its row and
    window end are then 0 too, so every query gives it no action and an empty window).
    """

    def __init__(
        self,
        num_envs: int,
        open_loop_horizon: int = droid.DEFAULT_OPEN_LOOP_HORIZON,
        session_id_factory: Callable[[], str] = new_session_id,
        *,
        prefetch: int = 0,
        max_stale_steps: int | None = None,
        simulated_delay: int | None = None,
        control_period_s: float | None = None,
    ):
        if int(num_envs) < 1:
            raise ValueError(f"num_envs: expected an integer >= 1, got {num_envs!r}")
        if int(open_loop_horizon) < 1:
            raise ValueError(f"open_loop_horizon: expected an integer >= 1, got {open_loop_horizon!r}")
        if not 0 <= int(prefetch) < int(open_loop_horizon):
            raise ValueError(f"prefetch: expected an integer in [0, {open_loop_horizon}), got {prefetch!r}")
        if max_stale_steps is not None and int(max_stale_steps) < 0:
            raise ValueError(f"max_stale_steps: expected an integer >= 0 or None, got {max_stale_steps!r}")
        if simulated_delay is not None and int(simulated_delay) < 0:
            raise ValueError(f"simulated_delay: expected an integer >= 0 or None, got {simulated_delay!r}")
        if control_period_s is not None:
            if simulated_delay is not None:
                raise ValueError("control_period_s: a latency-honest schedule measures its delays; "
                                 "pass it or simulated_delay, not both")  # fmt: skip
            if not (math.isfinite(float(control_period_s)) and float(control_period_s) > 0):
                raise ValueError(f"control_period_s: expected a number > 0 or None, got {control_period_s!r}")
        n = self.num_envs = int(num_envs)
        self.open_loop_horizon = int(open_loop_horizon)
        self.prefetch = int(prefetch)
        if max_stale_steps is None and int(prefetch) == 0:
            max_stale_steps = 0  # the reference semantics: wait for the reply, never run past the window
        self.max_stale_steps = None if max_stale_steps is None else int(max_stale_steps)
        self.simulated_delay = None if simulated_delay is None else int(simulated_delay)
        self.control_period_s = None if control_period_s is None else float(control_period_s)
        # delays counted in steps (fixed or measured) rather than by when replies are delivered
        self.simulated_time = simulated_delay is not None or control_period_s is not None
        self._new_session_id = session_id_factory
        # the cached chunks: rows of env i's chunk in _actions[i, :_length[i]]
        self._actions = np.zeros((n, self.open_loop_horizon, droid.ACTION_DIM), dtype=np.float32)
        self._length = np.zeros(n, dtype=np.int64)
        self._row = np.zeros(n, dtype=np.int64)  # next row to execute
        self._window_end = np.zeros(n, dtype=np.int64)  # first row past the window
        # the requests in flight: token and step sent; a reply held back until its simulated delay has passed
        self._in_flight = np.zeros(n, dtype=bool)
        self._token = np.zeros(n, dtype=np.int64)
        self._sent_step = np.zeros(n, dtype=np.int64)
        self._arrived = np.zeros(n, dtype=bool)
        self._arrived_chunks: list[np.ndarray | None] = [None] * n
        # in simulated time, the delay in steps of each request in flight: fixed, replayed, or measured when
        # its reply is in (0 until then, so an env whose delay is not known yet waits for its reply)
        self._delay = np.zeros(n, dtype=np.int64)
        self._measured = np.zeros(n, dtype=bool)  # the delay of the request in flight is to be measured
        self._replay: list[deque[int]] = [deque() for _ in range(n)]
        self._tokens = 0
        self.session_ids: list[str] = [session_id_factory() for _ in range(n)]
        self.episode_step = np.zeros(n, dtype=np.int64)
        self.server_calls = np.zeros(n, dtype=np.int64)  # chunks received this episode
        self.stats = [EpisodeChunkStats() for _ in range(n)]
        self._all_envs = np.arange(n)

    # -- queries ---------------------------------------------------------------------------------
    def _window_spent(self) -> np.ndarray:
        """``(N,)`` bool: envs with at most ``prefetch`` rows left in their window (an env without a chunk has
        none left)."""
        return self._window_end - self._row <= self.prefetch

    def _usable_end(self) -> np.ndarray:
        """``(N,)``: each env's first row it may not execute: its window's end, or while a reply is awaited,
        up to ``max_stale_steps`` rows past it (within the chunk). A window never ends past its chunk."""
        if self.max_stale_steps == 0:
            return self._window_end
        stale_end = self._length
        if self.max_stale_steps is not None:
            stale_end = np.minimum(stale_end, self._window_end + self.max_stale_steps)
        return np.where(self._in_flight, stale_end, self._window_end)

    def requests_due(self) -> np.ndarray:
        """``(N,)`` bool: envs that should send a request now (none in flight, window nearly spent)."""
        return ~self._in_flight & self._window_spent()

    def in_flight(self) -> np.ndarray:
        """``(N,)`` bool: envs with a request whose chunk has not been applied yet."""
        return self._in_flight.copy()

    def _delay_elapsed(self) -> np.ndarray:
        """``(N,)`` bool: envs whose request in flight was sent at least its delay in steps ago."""
        return self._in_flight & (self.episode_step - self._sent_step >= self._delay)

    def must_wait(self) -> np.ndarray:
        """``(N,)`` bool: envs that cannot take their next step before their reply is delivered."""
        if not self.simulated_time:  # (replies are then applied when delivered: none is held)
            return self._in_flight & (self._usable_end() <= self._row)
        return self._in_flight & ~self._arrived & self._delay_elapsed()

    def pending_token(self, env_id: int) -> int | None:
        """Token of env ``env_id``'s request in flight, or None."""
        return int(self._token[env_id]) if self._in_flight[env_id] else None

    def has_action(self) -> np.ndarray:
        """``(N,)`` bool: envs that can execute a cached action this step."""
        return self._usable_end() > self._row

    def window_nearly_spent(self) -> np.ndarray:
        """``(N,)`` bool: envs that will send a request at their next step unless one is in flight."""
        return self._window_spent()

    def views_due(self) -> np.ndarray:
        """``(N,)`` bool: envs whose next observation a request may read (so whose views must be rendered).

        Those with none in flight whose window is nearly spent (they send at their next step), and those in
        flight whose reply, were it applied at the next step, would leave at most ``prefetch`` rows of window:
        a reply that late makes them ask again at once (its length taken as the current chunk's). The others
        in flight need no views: with ``prefetch`` > 0 that is most of the steps a request is in flight, which
        :meth:`window_nearly_spent` would render every time.
        """
        delay = self.episode_step - self._sent_step  # the delay of a reply applied at the next step
        length = np.where(self._length > 0, self._length, self.open_loop_horizon)
        window_after = np.minimum(length, delay + self.open_loop_horizon) - delay
        late = window_after <= self.prefetch
        if self.simulated_time:  # a held reply is applied only once its delay has passed
            late &= delay >= self._delay
        return np.where(self._in_flight, late, self._window_spent())

    # -- updates ---------------------------------------------------------------------------------
    def mark_sent(self, env_id: int) -> int:
        """Record that env ``env_id``'s request left now; returns its token for :meth:`deliver`."""
        if self._in_flight[env_id]:
            raise RuntimeError(f"mark_sent: env {env_id} already has a request in flight")
        self._tokens += 1
        self._in_flight[env_id] = True
        self._token[env_id] = self._tokens
        self._sent_step[env_id] = self.episode_step[env_id]
        if self.simulated_delay is not None:
            self._delay[env_id] = self.simulated_delay
        elif self.control_period_s is not None:
            replay = self._replay[env_id]
            self._measured[env_id] = not replay
            self._delay[env_id] = replay.popleft() if replay else 0
            if not self._measured[env_id]:  # a replayed delay is known now
                self.stats[env_id].drawn.append(int(self._delay[env_id]))
        return self._tokens

    def replay_delays(self, env_id: int, delays: Iterable[int]) -> None:
        """Latency-honest: env ``env_id``'s next requests take ``delays`` (steps, in order; recorded by an
        earlier attempt of its episode) instead of measuring theirs; later ones are measured again. Call it
        at the start of the episode (ending it forgets what is left)."""
        if self.control_period_s is None:
            raise RuntimeError("replay_delays: only a latency-honest schedule (control_period_s) measures delays")
        values = [int(d) for d in delays]
        if any(d < 0 for d in values):
            raise ValueError(f"delays: expected integers >= 0, got {values!r}")
        self._replay[env_id] = deque(values)

    def deliver(
        self, env_id: int, token: int, actions: np.ndarray, *, rows: int | None = None, latency_s: float | None = None
    ) -> bool:
        """Hand env ``env_id`` the reply to request ``token``; False when it was discarded.

        A reply to a request of an episode that has ended (or was abandoned) is discarded. Otherwise the
        chunk is applied now, or, under a simulated delay, once the delay has passed (latency-honest: the
        delay from ``latency_s``, the request's round trip, unless the env replays recorded delays). Raises
        :class:`~dz_gym.errors.ProtocolError` for a chunk that is not ``(H, 8)`` (``H == rows`` where the
        server announced a fixed horizon; :func:`dz_gym.protocol.contract.check_chunk`) and
        :class:`HorizonError` for one shorter than ``open_loop_horizon``.
        """
        actions = self._checked(actions, rows)
        if not self._in_flight[env_id] or self._token[env_id] != token:
            return False
        if not self.simulated_time:
            self._apply(env_id, actions)
        else:
            if self._measured[env_id]:
                if latency_s is None:
                    raise ValueError("latency_s: a latency-honest schedule needs each reply's round trip")
                self._delay[env_id] = honest_delay(latency_s, self.control_period_s)
                self._measured[env_id] = False
                self.stats[env_id].drawn.append(int(self._delay[env_id]))
            self._arrived[env_id] = True
            self._arrived_chunks[env_id] = np.array(actions, dtype=np.float32)  # the caller's array may change
            self.apply_arrivals([env_id])
        return True

    def _checked(self, actions: np.ndarray, rows: int | None = None) -> np.ndarray:
        actions = np.asarray(actions)
        check_chunk(actions, action_dim=droid.ACTION_DIM, horizon=rows)
        check_horizon(self.open_loop_horizon, actions.shape[0])
        return actions

    def apply_arrivals(self, env_ids: Iterable[int] | None = None) -> None:
        """Switch envs to their arrived chunks whose (simulated) delay has passed."""
        if not self.simulated_time:
            return  # replies are applied when delivered: none is held
        if env_ids is None:
            env_ids = np.flatnonzero(self._arrived & self._delay_elapsed()).tolist()
        for i in env_ids:
            if self._arrived[i] and self.episode_step[i] - self._sent_step[i] >= self._delay[i]:
                self._apply(i, self._arrived_chunks[i])

    def _apply(self, env_id: int, chunk: np.ndarray) -> None:
        """Make ``chunk`` (the reply to env ``env_id``'s request in flight) its cache, gripper binarized, from
        the row of the current step on (none if every row is in the past)."""
        delay = int(self.episode_step[env_id] - self._sent_step[env_id])
        self.abandon(env_id)
        self.server_calls[env_id] += 1
        self.stats[env_id].delays.append(delay)
        length = len(chunk)
        if delay >= length:  # every row is in the past: ask again
            self._clear_chunk(env_id)
            return
        if length > self._actions.shape[1]:
            grown = np.zeros((self.num_envs, length, droid.ACTION_DIM), dtype=np.float32)
            grown[:, : self._actions.shape[1]] = self._actions
            self._actions = grown
        rows = self._actions[env_id, :length]
        rows[:] = chunk
        rows[:, -1] = rows[:, -1] > droid.GRIPPER_CLOSE_THRESHOLD  # as binarize_gripper, in place
        self._length[env_id] = length
        self._row[env_id] = delay
        self._window_end[env_id] = min(length, delay + self.open_loop_horizon)

    def _clear_chunk(self, env_id: int) -> None:
        self._length[env_id] = self._row[env_id] = self._window_end[env_id] = 0

    def abandon(self, env_id: int) -> None:
        """Forget env ``env_id``'s request in flight (it failed); a late reply to it is discarded."""
        self._in_flight[env_id] = self._arrived[env_id] = self._measured[env_id] = False
        self._arrived_chunks[env_id] = None
        self._delay[env_id] = 0

    def accept_chunk(self, env_id: int, actions: np.ndarray) -> None:
        """Shortcut for a request sent now whose reply is already in (delay 0; under a simulated delay
        the chunk is applied ``simulated_delay`` steps later, like any other reply; latency-honest, its round
        trip counts as instant)."""
        actions = self._checked(actions)
        self.abandon(env_id)
        token = self.mark_sent(env_id)
        self.deliver(env_id, token, actions, latency_s=0.0)

    def pop_actions(self, active: np.ndarray | None = None) -> np.ndarray:
        """One action per env, ``(N, 8)`` float32; every env counts one executed step.

        ``active`` (``(N,)`` bool, default all) selects the envs that consume a cached action; the rows of
        the others are NaN and their rows stay (the caller fills them, e.g. with a hold action for an env
        whose server call failed or that waits out a simulated delay). Raises ``RuntimeError`` (and changes
        nothing) when an active env has no cached action.
        """
        n = self.num_envs
        usable_end, window_end = self._usable_end(), self._window_end
        if active is None:  # every env: whole arrays, no gather of the state
            ids, rows = self._all_envs, self._row
        else:
            active = np.asarray(active, dtype=bool).reshape(-1)
            if active.shape != (n,):
                raise ValueError(f"active: expected shape ({n},), got {active.shape}")
            ids = np.flatnonzero(active)
            rows, usable_end, window_end = self._row[ids], usable_end[ids], window_end[ids]
        missing = rows >= usable_end
        if missing.any():
            raise RuntimeError(f"pop_actions: env {ids[np.argmax(missing)]} has no cached action")
        if ids.size == n:
            out = self._actions[ids, rows]
        else:
            out = np.full((n, droid.ACTION_DIM), np.nan, dtype=np.float32)
            out[ids] = self._actions[ids, rows]
            for i in np.flatnonzero(~active & self._in_flight).tolist():
                self.stats[i].wait_steps += 1
        for i in ids[rows >= window_end].tolist():
            self.stats[i].stale_steps += 1
        self._row[ids] = rows + 1
        self.episode_step += 1
        return out

    def count_wait(self, env_ids: Iterable[int]) -> None:
        """Record that ``env_ids`` blocked on their replies before this step."""
        for i in env_ids:
            self.stats[i].wait_steps += 1

    def drop_chunk(self, env_id: int) -> None:
        """Forget env ``env_id``'s chunk and request in flight (e.g. after a server error)."""
        self._clear_chunk(env_id)
        self.abandon(env_id)

    def end_episodes(self, env_ids: Iterable[int]) -> list[str]:
        """End the episodes of ``env_ids``: drop caches and requests in flight, start new session ids.

        Returns the ended episodes' session ids.
        """
        ended = []
        for i in env_ids:
            i = int(i)
            ended.append(self.session_ids[i])
            self.drop_chunk(i)
            self._replay[i].clear()
            self.session_ids[i] = self._new_session_id()
            self.episode_step[i] = 0
            self.server_calls[i] = 0
            self.stats[i] = EpisodeChunkStats()
        return ended
