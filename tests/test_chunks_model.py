"""ChunkSchedule against a per-env reference model, through thousands of random operations.

The model below is the schedule's rules in their plainest form: one record per env, every query a loop over
the envs. A random driver sends requests, delivers replies of random lengths after random delays (current
tokens, stale ones, malformed chunks), abandons, drops, ends episodes, counts waits and pops actions with
random active masks, under random horizons, prefetch values, stale bounds, simulated delays and latency-honest
control periods (replies with random round trips, recorded delays replayed); after every
operation each query, counter and statistic of the schedule must equal the model's, and so must every return
value and error. Chunk validation (shape and horizon) is the shared helpers' job; the model calls them too.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from dz_gym.chunks import ChunkSchedule, check_horizon
from dz_gym.errors import DzGymError
from dz_gym.protocol.contract import check_chunk


class ModelSchedule:
    """The reference: per env a chunk (or None), its next row, its window's end and the request in flight."""

    def __init__(self, n, horizon, new_id, prefetch, max_stale_steps, simulated_delay, period=None):
        self.n, self.horizon, self.prefetch, self.delay, self.period = n, horizon, prefetch, simulated_delay, period
        self.simulated = simulated_delay is not None or period is not None
        self.replay = [[] for _ in range(n)]  # latency-honest: recorded delays to use before measuring
        self.stale = 0 if max_stale_steps is None and prefetch == 0 else max_stale_steps
        self.new_id = new_id
        self.chunk = [None] * n
        self.row = [0] * n
        self.end = [0] * n
        self.pending = [None] * n  # [token, step sent, arrived chunk or None, its delay in steps or None: unknown]
        self.tokens = 0
        self.session_ids = [new_id() for _ in range(n)]
        self.step = [0] * n
        self.calls = [0] * n
        self.stats = [([], [0], [0], []) for _ in range(n)]  # delays, wait steps, stale steps, drawn delays
        self.expired = 0  # replies applied with every row in the past (for the coverage test)
        self.replayed = self.measured = 0  # latency-honest delays taken from a replay / from a round trip

    def window_left(self, i):
        return 0 if self.chunk[i] is None else max(0, self.end[i] - self.row[i])

    def usable_left(self, i):
        if self.chunk[i] is None:
            return 0
        limit = len(self.chunk[i])
        if self.stale is not None:
            limit = min(limit, self.end[i] + self.stale)
        if self.pending[i] is None:
            limit = min(limit, self.end[i])
        return max(0, limit - self.row[i])

    def elapsed(self, i):
        """The request's delay has passed (one whose delay is not known yet needs none: it waits)."""
        p = self.pending[i]
        return p is not None and self.step[i] - p[1] >= (p[3] or 0)

    def requests_due(self):
        return [self.pending[i] is None and self.window_left(i) <= self.prefetch for i in range(self.n)]

    def in_flight(self):
        return [p is not None for p in self.pending]

    def must_wait(self):
        out = []
        for i, p in enumerate(self.pending):
            if p is None or p[2] is not None:
                out.append(False)
            else:
                out.append(self.elapsed(i) if self.simulated else self.usable_left(i) == 0)
        return out

    def has_action(self):
        return [self.usable_left(i) > 0 for i in range(self.n)]

    def window_nearly_spent(self):
        return [self.window_left(i) <= self.prefetch for i in range(self.n)]

    def pending_token(self, i):
        return None if self.pending[i] is None else self.pending[i][0]

    def mark_sent(self, i):
        if self.pending[i] is not None:
            raise RuntimeError(f"mark_sent: env {i} already has a request in flight")
        self.tokens += 1
        delay = self.delay
        if self.period is not None and self.replay[i]:
            delay = self.replay[i].pop(0)
            self.stats[i][3].append(delay)
            self.replayed += 1
        self.pending[i] = [self.tokens, self.step[i], None, delay]
        return self.tokens

    def replay_delays(self, i, delays):
        if self.period is None:
            raise RuntimeError("replay_delays: only a latency-honest schedule (control_period_s) measures delays")
        self.replay[i] = [int(d) for d in delays]

    def checked(self, actions, rows=None):
        actions = np.asarray(actions)
        check_chunk(actions, action_dim=8, horizon=rows)
        check_horizon(self.horizon, actions.shape[0])
        return actions

    def deliver(self, i, token, actions, rows=None, latency_s=None):
        actions = self.checked(actions, rows)
        if self.pending[i] is None or self.pending[i][0] != token:
            return False
        if self.period is not None and self.pending[i][3] is None:
            if latency_s is None:
                raise ValueError("latency_s: a latency-honest schedule needs each reply's round trip")
            self.pending[i][3] = max(0, math.ceil(latency_s / self.period - 1e-9))
            self.stats[i][3].append(self.pending[i][3])
            self.measured += 1
        arrived = np.array(actions, dtype=np.float32)
        arrived[:, -1] = arrived[:, -1] > 0.5
        self.pending[i][2] = arrived
        self.apply_arrivals([i])
        return True

    def apply_arrivals(self, env_ids=None):
        for i in range(self.n) if env_ids is None else env_ids:
            p = self.pending[i]
            if p is None or p[2] is None or (self.simulated and not self.elapsed(i)):
                continue
            delay = self.step[i] - p[1]
            self.pending[i] = None
            self.calls[i] += 1
            self.stats[i][0].append(delay)
            if delay >= len(p[2]):
                self.chunk[i] = None
                self.expired += 1
                continue
            self.chunk[i], self.row[i] = p[2], delay
            self.end[i] = min(len(p[2]), delay + self.horizon)

    def accept_chunk(self, i, actions):
        actions = self.checked(actions)
        self.pending[i] = None
        self.deliver(i, self.mark_sent(i), actions, latency_s=0.0)

    def pop_actions(self, active=None):
        active = [True] * self.n if active is None else [bool(a) for a in active]
        for i in range(self.n):
            if active[i] and self.usable_left(i) == 0:
                raise RuntimeError(f"pop_actions: env {i} has no cached action")
        out = np.full((self.n, 8), np.nan, dtype=np.float32)
        for i in range(self.n):
            if active[i]:
                out[i] = self.chunk[i][self.row[i]]
                if self.row[i] >= self.end[i]:
                    self.stats[i][2][0] += 1
                self.row[i] += 1
            elif self.pending[i] is not None:
                self.stats[i][1][0] += 1
            self.step[i] += 1
        return out

    def count_wait(self, env_ids):
        for i in env_ids:
            self.stats[i][1][0] += 1

    def drop_chunk(self, i):
        self.chunk[i] = self.pending[i] = None

    def end_episodes(self, env_ids):
        ended = []
        for i in env_ids:
            ended.append(self.session_ids[i])
            self.drop_chunk(i)
            self.session_ids[i] = self.new_id()
            self.step[i] = self.calls[i] = 0
            self.stats[i] = ([], [0], [0], [])
            self.replay[i] = []
        return ended


def counter_ids():
    count = iter(range(1_000_000))
    return lambda: f"s{next(count)}"


def outcome(call):
    """``("ok", value)`` or ``("error", type, message)`` of ``call()``."""
    try:
        return ("ok", call())
    except (DzGymError, RuntimeError, ValueError) as exc:
        return ("error", type(exc), str(exc))


def same(got, want):
    assert got[0] == want[0], (got, want)
    if got[0] == "error":
        assert got[1:] == want[1:]
        return
    got, want = got[1], want[1]
    if isinstance(want, np.ndarray):
        assert isinstance(got, np.ndarray) and got.dtype == np.float32 and got.shape == want.shape
        np.testing.assert_array_equal(got, want)
    else:
        assert type(got) is type(want) and got == want, (got, want)


def check_agree(schedule: ChunkSchedule, model: ModelSchedule) -> None:
    for query in ("requests_due", "in_flight", "must_wait", "has_action", "window_nearly_spent"):
        got = getattr(schedule, query)()
        assert got.dtype == bool and got.shape == (model.n,)
        assert got.tolist() == getattr(model, query)(), query
        got[:] = ~got  # a fresh array each call: changing it changes nothing
    for i in range(model.n):
        same(("ok", schedule.pending_token(i)), ("ok", model.pending_token(i)))
        stats = schedule.stats[i]
        assert (stats.delays, stats.wait_steps, stats.stale_steps, stats.drawn) == (
            model.stats[i][0],
            model.stats[i][1][0],
            model.stats[i][2][0],
            model.stats[i][3],
        )
        assert all(type(d) is int for d in stats.delays + stats.drawn)
    assert schedule.episode_step.tolist() == model.step and schedule.server_calls.tolist() == model.calls
    assert schedule.session_ids == model.session_ids


def random_chunk(rng, horizon):
    actions = rng.normal(size=(int(rng.integers(horizon, horizon + 12)), 8)).astype(np.float32)
    actions[:, -1] = rng.choice([0.0, 0.5, 0.5001, 1.0, 0.2], size=len(actions))
    return actions


def random_active(rng, schedule):
    mode = rng.integers(4)
    if mode == 0:
        return None
    has = schedule.has_action()
    if mode == 1:
        return has
    mask = rng.random(len(has)) < 0.7
    return has & mask if mode == 2 else mask


def operate(rng, schedule, model, issued) -> str:
    """One random operation on both, with the same arguments; their outcomes must agree. Returns its name,
    with ``":error"`` when it raised."""
    n, horizon = model.n, model.horizon
    i = int(rng.integers(n))
    op = rng.choice(["pop", "send", "deliver", "apply", "accept", "abandon", "drop", "end", "wait", "replay"],
                    p=[0.33, 0.16, 0.22, 0.08, 0.04, 0.05, 0.03, 0.04, 0.04, 0.01])  # fmt: skip
    if op == "pop":
        active = random_active(rng, schedule)
        got = outcome(lambda: schedule.pop_actions(active))
        same(got, outcome(lambda: model.pop_actions(active)))
        return f"pop:{got[0]}"
    elif op == "send":
        got = outcome(lambda: schedule.mark_sent(i))
        same(got, outcome(lambda: model.mark_sent(i)))
        if got[0] == "ok":
            issued.append((i, got[1]))
    elif op == "deliver" and issued:
        env_id, token = issued[-1 - int(rng.integers(min(len(issued), 4)))]  # mostly recent: in flight or late
        actions = random_chunk(rng, horizon)
        kind = rng.random()
        if kind < 0.04:
            actions = actions[: horizon - 1]  # shorter than the horizon (empty when the horizon is 1)
        elif kind < 0.06:
            actions = actions[:, :7]
        rows = None if rng.random() < 0.8 else int(len(actions) + rng.integers(-1, 2))
        latency = None if rng.random() < 0.03 else float(rng.choice([0.0, rng.uniform(0, 0.6), 0.2]))
        same(outcome(lambda: schedule.deliver(env_id, token, actions, rows=rows, latency_s=latency)),
             outcome(lambda: model.deliver(env_id, token, actions, rows, latency)))  # fmt: skip
    elif op == "apply":
        ids = None if rng.random() < 0.6 else rng.integers(n, size=int(rng.integers(1, 2 * n + 1))).tolist()
        schedule.apply_arrivals(ids)
        model.apply_arrivals(ids)
    elif op == "accept":
        actions = random_chunk(rng, horizon)
        same(outcome(lambda: schedule.accept_chunk(i, actions)), outcome(lambda: model.accept_chunk(i, actions)))
    elif op == "abandon":
        schedule.abandon(i)
        model.pending[i] = None
    elif op == "drop":
        schedule.drop_chunk(i)
        model.drop_chunk(i)
    elif op == "end":
        ids = sorted(set(rng.integers(n, size=int(rng.integers(1, n + 1))).tolist()))
        same(("ok", schedule.end_episodes(np.array(ids))), ("ok", model.end_episodes(ids)))
    elif op == "wait":
        ids = rng.integers(n, size=int(rng.integers(0, n + 1))).tolist()
        schedule.count_wait(ids)
        model.count_wait(ids)
    elif op == "replay":
        delays = rng.integers(0, 6, size=int(rng.integers(0, 4))).tolist()
        same(outcome(lambda: schedule.replay_delays(i, delays)), outcome(lambda: model.replay_delays(i, delays)))
    return str(op)


def random_settings(rng):
    horizon = int(rng.integers(1, 7))
    return dict(
        num_envs=int(rng.integers(1, 7)),
        open_loop_horizon=horizon,
        prefetch=int(rng.integers(0, horizon)),
        max_stale_steps=None if rng.random() < 0.4 else int(rng.integers(0, 5)),
        **[
            {},
            {"simulated_delay": int(rng.integers(0, 5))},
            {"control_period_s": float(rng.choice([1 / 15, 0.1, 0.05]))},
        ][int(rng.integers(3))],
    )


def model_of(settings):
    return ModelSchedule(settings["num_envs"], settings["open_loop_horizon"], counter_ids(), settings["prefetch"],
                         settings["max_stale_steps"], settings.get("simulated_delay"),
                         settings.get("control_period_s"))  # fmt: skip


@pytest.mark.parametrize("seed", range(12))
def test_schedule_agrees_with_the_per_env_model_through_random_operations(seed):
    rng = np.random.default_rng(seed)
    for _ in range(8):
        settings = random_settings(rng)
        schedule = ChunkSchedule(session_id_factory=counter_ids(), **settings)
        model = model_of(settings)
        issued: list[tuple[int, int]] = []
        for _ in range(250):
            operate(rng, schedule, model, issued)
            check_agree(schedule, model)


def test_the_random_driver_reaches_every_interesting_state():
    """The operations above are not vacuous: stale rows, waits, held replies, expired replies, chunks of
    different lengths side by side, pops that must fail, and latency-honest delays measured and replayed all
    occur."""
    seen = dict.fromkeys(["stale", "wait", "held", "expired", "mixed_lengths", "pop_error", "late_reply",
                          "measured", "replayed"], 0)  # fmt: skip
    rng = np.random.default_rng(1234)
    for _ in range(40):
        settings = random_settings(rng)
        schedule = ChunkSchedule(session_id_factory=counter_ids(), **settings)
        model = model_of(settings)
        issued: list[tuple[int, int]] = []
        for _ in range(250):
            calls = sum(model.calls)
            seen["pop_error"] += operate(rng, schedule, model, issued) == "pop:error"
            seen["held"] += sum(p is not None and p[2] is not None for p in model.pending)
            seen["mixed_lengths"] += len({len(c) for c in model.chunk if c is not None}) > 1
            seen["late_reply"] += sum(model.calls) > calls and any(s[0] and s[0][-1] > 0 for s in model.stats)
        seen["stale"] += sum(s[2][0] for s in model.stats)
        seen["wait"] += sum(s[1][0] for s in model.stats)
        seen["expired"] += model.expired
        seen["measured"] += model.measured
        seen["replayed"] += model.replayed
    assert all(count > 0 for count in seen.values()), seen
