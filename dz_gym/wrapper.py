"""``DreamZeroPolicyWrapper``: a remote DreamZero/OpenPI policy driving a batched DROID env.

Example with an embedded reference server (``policy=``; ``server=URL`` for a real one)::

    import gymnasium as gym
    import dz_gym

    env = dz_gym.DreamZeroPolicyWrapper(gym.make_vec("dz_gym/DROID-CubeInBowl-v0", num_envs=8), policy="reference")
    obs, info = env.reset(seed=0)
    for _ in range(450):
        obs, reward, terminated, truncated, info = env.step()   # the policy chooses the actions
    env.close()

The same loop runs without sockets on an in-process policy client and a toy env (both in
:mod:`dz_gym.testing`); env 1 is set idle, so it holds its pose and sends nothing:

>>> from dz_gym.records import EpisodeStats
>>> from dz_gym.server.policies import HoldPolicy
>>> from dz_gym.testing.memory_client import MemoryPolicyClient
>>> from dz_gym.testing.toy_env import ToyDroidEnv
>>> env = ToyDroidEnv(2, max_episode_length=10, image_shape=(18, 32))
>>> wrapper = DreamZeroPolicyWrapper(env, client=MemoryPolicyClient(HoldPolicy(), num_envs=2))
>>> obs, info = wrapper.reset(seed=0)
>>> wrapper.set_idle([False, True])
>>> for _ in range(9):
...     obs, reward, terminated, truncated, info = wrapper.step()
>>> wrapper.episode_stats(0).chunks, wrapper.episode_stats(0).delays, wrapper.episode_stats(1).chunks
(2, (0, 0), 0)
>>> obs, reward, terminated, truncated, info = wrapper.step()   # step 10: the env's episodes end
>>> info["_chunk_stats"].tolist(), info["chunk_stats"]["chunks"].tolist()
([True, True], [2, 0])
>>> EpisodeStats.from_info(info, 0).chunks, wrapper.server_url(0), wrapper.is_connected(0)
(2, 'memory://policy', True)
>>> wrapper.close()

Each env has its own connection (spread over the servers round-robin), a uuid session id per episode and an
action-chunk cache (``dz_gym.chunks``): it asks only when its cache is spent (steps 0, 8, 16, ... with
``open_loop_horizon=8``), the envs due in one step concurrently, with the reference client's requests
(``dz_gym.requests``), through a :class:`~dz_gym.policy_client.PolicyClient` (the websocket pool by default).

``step()`` executes the policy's actions, ``step(action)`` your ``(N, 8)`` action (the policy is still asked on
its schedule; its proposal: ``info["policy_action"]``, or ``propose()`` before the step, for residual RL).

Like Isaac Lab, the env resets finished envs inside ``step`` (same-step autoreset): their returned observation
belongs to the next episode, with a new chunk cache and session id. No ``reset`` is ever sent over the wire.
The wrapper is a ``gymnasium.vector.VectorEnv`` declaring ``AutoresetMode.SAME_STEP``, so Gymnasium's vector
wrappers go around it (``gymnasium.wrappers.vector.RecordEpisodeStatistics(wrapper)``; their ``step(None)``
runs the policy's actions), and as Gymnasium's same-step vector envs do, ``info["final_info"]`` (masked by
``info["_final_info"]``) holds the step's info of the envs that ended, with the env's ``final_obs`` where it
gives one (:mod:`dz_gym.envs.vector_info`; the embedded simulator renders the last frames for it under
``render_policy = "all"``, not under the default ``"due"``, which renders only the frames the policy reads). ``env`` may also be one env of ``gym.make(id)``: it runs as a batch
of one in Gymnasium's ``SyncVectorEnv`` (:mod:`dz_gym.envs.adapter`). Gymnasium's ``SyncVectorEnv`` goes under
the wrapper (``SyncVectorEnv(fns, autoreset_mode=AutoresetMode.SAME_STEP)`` of ``gym.make`` envs), not around
it: the wrapper is a batch already, and its policy chooses the actions a ``SyncVectorEnv`` would hand in.

``info`` is in Gymnasium's vector form (a ``_key`` mask beside each key, :mod:`dz_gym.envs.vector_info`) and adds,
per env: ``policy_called`` (this step sent a request), ``chunk_received`` and ``chunk_latency_s`` (a reply was
taken in this step, and its round trip; NaN otherwise), ``chunk_sent_at``/``chunk_received_at`` (its
``time.perf_counter()`` stamps), ``session_id`` (of the episode the step belonged to), ``policy_action``,
``policy_held`` (the env held its pose), ``episode_flagged``, ``policy_error`` (None or the error's one-line
text) and ``integrity_event`` (None or the failure's cause, one of :data:`INTEGRITY_EVENTS`: ``"server_error"``,
``"connection_lost"``, ``"timeout"``, ``"protocol_error"``; the same cause gives the same name whatever happened
next). An env whose server call failed holds its pose for that step and asks again at its next step (after a
bounded reconnect when the connection broke); its episode is flagged, the other envs carry on. For the envs
whose episode ended in the step, ``info["chunk_stats"]`` holds their :class:`EpisodeStats` as arrays, masked
by ``info["_chunk_stats"]`` (which envs).

A chunk shorter than ``open_loop_horizon`` stops the run at its first reply (:class:`~dz_gym.errors.HorizonError`,
one line; the evaluator exits 2). A policy contract announced in the handshake (:mod:`dz_gym.protocol.contract`)
is checked before the first request; with ``open_loop_horizon=None`` its chunk length caps the default 8. A
refused session (:class:`~dz_gym.errors.SessionRefused`) makes its env hold and wait (:mod:`dz_gym.admission`,
:meth:`admission_retry_at`); the evaluator restarts such an episode.

The server's profile (:mod:`dz_gym.protocol.profiles`; :attr:`DreamZeroPolicyWrapper.profile`), chosen from its
handshake or named by ``server_kind``, decides the requests' keys, camera layout and resolution, the chunk's
geometry (a chunk of another shape where the profile fixes it is an error of that episode), the default
open-loop horizon (the actions the profile executes: 8 for DreamZero, 32 for FLUX) and whether an ended
session is released with a reset (never on servers without one). A handshake that matches no profile is a
one-line :class:`~dz_gym.errors.HandshakeError`.

Latency hiding (opt-in; the rules: :mod:`dz_gym.chunks`): ``prefetch=K`` asks for the next chunk K actions
before the window ends, ``max_stale_steps`` bounds the steps run on a late chunk's previous rows, and
``simulated_delay=D`` replaces wall-clock delay by exactly D steps (reproducible comparisons under latency), and
``latency_honest_hz=F`` by each request's own round trip in steps of a robot at F Hz (``ceil(latency * F)``:
the world keeps moving while the policy thinks; :meth:`replay_delays` reuses an earlier attempt's delays).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import logging
import time
import warnings
from collections.abc import Sequence
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.vector import AutoresetMode, VectorEnv

from dz_gym.admission import Admission
from dz_gym.capabilities import check_handshake, single_session_note
from dz_gym.chunks import ChunkSchedule, HorizonError, new_session_id
from dz_gym.envs import droid
from dz_gym.envs.adapter import as_wrappable
from dz_gym.envs.episodes import resolve_env_ids
from dz_gym.envs.vector_info import with_final, with_masks
from dz_gym.errors import DzGymError, ProtocolError, RequestTimeout, SessionRefused
from dz_gym.policy_client import Outcome, PolicyClient
from dz_gym.policy_source import DEFAULT_SERVER, open_client, server_urls
from dz_gym.protocol import ServerMetadata
from dz_gym.protocol.profiles import resolve_server_kind
from dz_gym.protocol.request_batch import RequestBatch
from dz_gym.records import INTEGRITY_EVENTS, EpisodeCounters, EpisodeStats, StepRecord, event_of
from dz_gym.requests import (
    build_requests,
    checked_actions,
    env_actions,
    hold_actions,
    resolve_prompts,
    space_views_bytes,
    to_numpy,
    validate_policy_obs,
    views_bytes,
)
from dz_gym.server_terms import agree_terms
from dz_gym.transport import TransportConfig
from dz_gym.transport.rules import breaks_connection

__all__ = [
    "DEFAULT_SERVER",
    "INTEGRITY_EVENTS",
    "RENDER_POLICIES",
    "DreamZeroPolicyWrapper",
    "EpisodeStats",
    "HorizonError",
    "event_of",
]

logger = logging.getLogger(__name__)


# "due": render only the envs that send a request at their next step (the wrapper reads no other images);
# "all": render every env every step (a recorder that reads every frame).
RENDER_POLICIES = ("due", "all")


@dataclasses.dataclass
class _InFlight:
    token: int  # the schedule's token of the request
    future: concurrent.futures.Future[Outcome]


@dataclasses.dataclass
class _Proposal:
    """The policy's actions for one step and what producing them took (see ``propose``)."""

    actions: np.ndarray  # (N, 8) float32
    active: np.ndarray  # (N,) bool: envs that execute a cached row (the others hold their pose)
    record: StepRecord


class DreamZeroPolicyWrapper(gym.Wrapper, VectorEnv):
    """Query a remote DreamZero/OpenPI policy for a batched DROID env (see the module docstring).

    ``env``: a batched DROID env, Isaac Lab's ``ManagerBasedRLEnv``, a same-step ``gymnasium.vector.VectorEnv``
    or one ``gym.make`` env (:mod:`dz_gym.envs.adapter`). ``server``: a ``ws://``/``wss://`` URL or a list (envs
    spread round-robin; default :data:`DEFAULT_SERVER`) with ``transport`` its bounds; or ``client``: any
    :class:`~dz_gym.policy_client.PolicyClient` with one slot per env; or ``policy``: ``"reference"``, ``"hold"``
    or ``module:factory`` served by an embedded server in its own process, or a policy object (one with
    ``infer(obs) -> {"actions": ...}``, an openpi ``BasePolicy`` too) served on a thread of this one
    (:mod:`dz_gym.server.embedded`); ``close()`` stops it.

    What a runner uses besides the Gymnasium API: :meth:`set_idle` / :attr:`idle_envs`, :attr:`render_policy`,
    :meth:`episode_stats`, :meth:`server_url`, :meth:`is_connected`, :meth:`ensure_connected`, :meth:`reconnect`,
    :meth:`admission_retry_at`, :attr:`admitted_sessions`, :attr:`session_ids`, :attr:`last_obs`,
    :attr:`prompts`, :attr:`server_metadata`, :attr:`server_notes`, :attr:`profile`. ``server_kind``: a name
    of :data:`~dz_gym.protocol.profiles.PROFILES` (None or ``"auto"``: from the handshake).
    """

    def __init__(
        self,
        env: gym.Env,
        server: str | Sequence[str] | None = None,
        prompt: str | Sequence[str] | None = None,
        open_loop_horizon: int | None = None,
        transport: TransportConfig | None = None,
        image_resolution: tuple[int, int] | None | str = "server",
        session_id_factory=new_session_id,
        prefetch: int = 0,
        max_stale_steps: int | None = None,
        simulated_delay: int | None = None,
        *,
        latency_honest_hz: float | None = None,
        client: PolicyClient | None = None,
        policy: str | None = None,
        server_kind: str | None = None,
    ):
        env = as_wrappable(env)
        super().__init__(env)
        base = env.unwrapped
        self.num_envs = int(base.num_envs)
        self.max_episode_length = int(getattr(base, "max_episode_length", droid.MAX_EPISODE_LENGTH))
        servers = server_urls(server, client, policy, transport, self.num_envs)
        self.embedded_server = None
        self.prompts = resolve_prompts(prompt, env, self.num_envs)
        self.server_kind = resolve_server_kind(server_kind)
        if latency_honest_hz is not None and not float(latency_honest_hz) > 0:
            raise ValueError(f"latency_honest_hz: expected a control rate > 0 (Hz) or None, got {latency_honest_hz!r}")
        self.latency_honest_hz = None if latency_honest_hz is None else float(latency_honest_hz)
        period_s = None if latency_honest_hz is None else 1.0 / float(latency_honest_hz)

        def schedule(horizon: int) -> ChunkSchedule:
            return ChunkSchedule(
                self.num_envs,
                horizon,
                session_id_factory,
                prefetch=prefetch,
                max_stale_steps=max_stale_steps,
                simulated_delay=simulated_delay,
                control_period_s=period_s,
            )

        # built now to refuse bad arguments before connecting; rebuilt if the servers' contract shortens it
        self._schedule = schedule(droid.DEFAULT_OPEN_LOOP_HORIZON if open_loop_horizon is None else open_loop_horizon)
        self.open_loop_horizon = self._schedule.open_loop_horizon
        self.metadata = dict(env.metadata)
        self.metadata["autoreset_mode"] = AutoresetMode.SAME_STEP
        self.single_observation_space = getattr(base, "single_observation_space", None)
        self.single_action_space = getattr(base, "single_action_space", None)
        self._render_policy = "due"
        self._idle = np.zeros(self.num_envs, dtype=bool)
        self._in_flight: dict[int, _InFlight] = {}
        self._obs: dict | None = None
        self._proposal: _Proposal | None = None  # the next step's policy actions, once computed
        self._counters = [EpisodeCounters() for _ in range(self.num_envs)]
        self.episode_flagged = np.zeros(self.num_envs, dtype=bool)
        self.server_notes: list[str] = []  # warnings about the servers, also issued with warnings.warn
        self._used = np.zeros(self.num_envs, dtype=bool)  # the current episode sent a request

        self._client, self.embedded_server = open_client(servers, client, policy, transport, self.num_envs)
        try:
            self.server_metadata: list[ServerMetadata] = self._client.connect()
            urls = [self._client.url(i) for i in range(self.num_envs)]
            self.servers = list(dict.fromkeys(urls))
            self._envs_on = {url: urls.count(url) for url in self.servers}
            self._unjudged = set(self.servers)  # servers whose first reply has not been seen
            for env_id, meta in enumerate(self.server_metadata):
                check_handshake(meta, urls[env_id])
            shape = getattr(self.single_action_space, "shape", None)
            terms = agree_terms(self.server_metadata, urls, server_kind=self.server_kind,
                                open_loop_horizon=open_loop_horizon, image_resolution=image_resolution,
                                action_dim=int(shape[-1]) if shape else droid.ACTION_DIM)  # fmt: skip
            self.profile, self._reply_rows = terms.profile, terms.reply_rows
            if terms.open_loop_horizon != self.open_loop_horizon:
                self._schedule = schedule(terms.open_loop_horizon)
                self.open_loop_horizon = terms.open_loop_horizon
            self.image_resolution = terms.image_resolution
        except BaseException:
            self._client.close()
            self._stop_embedded()
            raise
        config, bound = self._client.config or TransportConfig(), self._client.reply_bound
        self._reply_bound = float(config.request_bound() if bound is None else bound)
        self._admission = Admission(config)

    # -- Gymnasium API --------------------------------------------------------------------------------
    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        """Reset the env (all envs, or ``options["env_ids"]``, or Gymnasium's ``options["reset_mask"]``) and start
        new sessions for the reset envs."""
        base = self.env.unwrapped
        if hasattr(base, "set_render_mask"):
            base.set_render_mask(None)
        if ahead := space_views_bytes(self.env.observation_space, self.image_resolution):
            self._client.reserve_host_memory(ahead, wait=False)  # made while the env resets
        obs, info = self.env.reset(seed=seed, options=options)
        self._proposal = None
        self._end_episodes(resolve_env_ids(self.num_envs, None, options).tolist())  # env_ids or reset_mask
        validate_policy_obs(obs[droid.POLICY_GROUP], self.num_envs)
        self._client.reserve_host_memory(views_bytes(obs[droid.POLICY_GROUP], self.image_resolution))
        self._obs = obs
        info = dict(info)
        info["session_id"] = np.array(self._schedule.session_ids, dtype=object)
        return obs, with_masks(info, self.num_envs)

    def step(self, action=None):
        """Step every env once; ``action=None`` executes the policy's actions (see the module docstring)."""
        if self._obs is None:
            raise RuntimeError("step: call reset() first")
        policy_obs = self._obs[droid.POLICY_GROUP]
        proposal = self._proposal or self._propose(policy_obs)
        self._proposal = None
        record = proposal.record
        executed = proposal.actions if action is None else checked_actions(action, self.num_envs)
        session_ids = np.array(self._schedule.session_ids, dtype=object)

        base = self.env.unwrapped
        if hasattr(base, "set_render_mask"):
            render_all = self._render_policy == "all"
            base.set_render_mask(None if render_all else self._schedule.views_due() & ~self._idle)
        obs, reward, terminated, truncated, info = self.env.step(env_actions(executed, policy_obs))

        ended = [np.asarray(to_numpy(flags), dtype=bool).reshape(-1) for flags in (terminated, truncated)]
        done = ended[0] | ended[1]
        info = dict(info)
        info.update(record.info_columns(), session_id=session_ids, policy_action=proposal.actions,
                    policy_held=~proposal.active, episode_flagged=self.episode_flagged.copy())  # fmt: skip
        done_ids = np.flatnonzero(done)
        if done_ids.size:
            ended = {int(i): self.episode_stats(int(i)) for i in done_ids}
            info["chunk_stats"] = EpisodeStats.to_info(ended, self.num_envs)
            info["_chunk_stats"] = done.copy()
            self._end_episodes(done_ids)
        validate_policy_obs(obs[droid.POLICY_GROUP], self.num_envs)
        self._obs = obs
        return obs, reward, terminated, truncated, with_masks(with_final(info, done), self.num_envs)

    def propose(self) -> np.ndarray:
        """The policy's ``(N, 8)`` actions for the next step, before taking it.

        Queries the server where a chunk is due, exactly as ``step()`` would; the following ``step()`` uses
        this proposal (``step()`` executes it, ``step(action)`` executes yours, e.g. the proposal plus a
        learned residual). Calling it again before stepping returns the same actions. ``reset()`` discards it;
        after a partial reset (``options={"env_ids": ...}``) the other envs then skip the row it had taken from
        their chunks, so reset some envs before ``propose()`` or after ``step()``, not in between.
        """
        if self._obs is None:
            raise RuntimeError("propose: call reset() first")
        if self._proposal is None:
            self._proposal = self._propose(self._obs[droid.POLICY_GROUP])
        return self._proposal.actions.copy()

    def close(self):
        """Close every connection (the policy client), then the env, then the embedded server (if any)."""
        self.closed = True  # VectorEnv's flag, which Gymnasium's vector wrappers read
        with contextlib.ExitStack() as stack:  # each runs even when the one before raised
            stack.callback(self._stop_embedded)
            stack.callback(super().close)
            self._client.close()

    def __del__(self) -> None:
        # VectorEnv closes itself from its finalizer; the wrapper closes on close(), never from garbage
        # collection, which may run in any thread (the policy client's connections live on their own).
        return None

    # -- what runners use -----------------------------------------------------------------------------
    @property
    def client(self) -> PolicyClient:
        """The policy client (one slot per env)."""
        return self._client

    @property
    def idle_envs(self) -> np.ndarray:
        """``(N,)`` bool copy: envs that hold their pose and never query the server (see :meth:`set_idle`)."""
        return self._idle.copy()

    def set_idle(self, mask) -> None:
        """Mark envs idle (``(N,)`` bool): they hold their pose, send no request and are not rendered.

        For a runner's slots whose quota of episodes is done while the others finish. An idle env's
        request already in flight is still taken in. Takes effect from the next proposal (a ``propose()``
        already made keeps its actions).
        """
        mask = np.asarray(to_numpy(mask), dtype=bool).reshape(-1)
        if mask.shape != (self.num_envs,):
            raise ValueError(f"idle mask: expected shape ({self.num_envs},), got {mask.shape}")
        self._idle = mask.copy()

    @property
    def render_policy(self) -> str:
        """Which envs the env renders each step: ``"due"`` (default: those that send a request at their
        next step, whose images the wrapper reads) or ``"all"`` (every env, for a video recorder)."""
        return self._render_policy

    @render_policy.setter
    def render_policy(self, value: str) -> None:
        if value not in RENDER_POLICIES:
            raise ValueError(f"render_policy: expected one of {', '.join(RENDER_POLICIES)}, got {value!r}")
        self._render_policy = value

    def episode_stats(self, env_id: int) -> EpisodeStats:
        """Env ``env_id``'s current episode so far (a snapshot: later steps do not change it)."""
        i = int(env_id)
        chunk = self._schedule.stats[i]
        counters = self._counters[i]
        return EpisodeStats(
            session_id=self._schedule.session_ids[i],
            steps=int(self._schedule.episode_step[i]),
            chunks=int(self._schedule.server_calls[i]),
            delays=tuple(int(d) for d in chunk.delays),
            drawn_delays=tuple(int(d) for d in chunk.drawn),
            wait_steps=int(chunk.wait_steps),
            stale_steps=int(chunk.stale_steps),
            latencies_s=tuple(counters.latencies_s),
            reconnects=counters.reconnects,
            retries=counters.retries,
            reconnect_failures=counters.reconnect_failures,
            flagged=bool(self.episode_flagged[i]),
        )

    def replay_delays(self, env_id: int, delays) -> None:
        """Latency-honest runs: env ``env_id``'s episode, just started, takes ``delays`` (steps, recorded by an
        earlier attempt of the same episode) for its first requests instead of measuring new ones."""
        self._schedule.replay_delays(int(env_id), delays)

    def server_url(self, env_id: int) -> str:
        """The server env ``env_id`` talks to."""
        return self._client.url(int(env_id))

    def is_connected(self, env_id: int) -> bool:
        """Whether env ``env_id``'s connection is open."""
        return self._client.is_connected(int(env_id))

    def reconnect(self, env_id: int) -> bool:
        """Reopen env ``env_id``'s connection now (bounded by the transport); False when that failed (logged).
        Counted in the episode's ``reconnects`` (or ``reconnect_failures``)."""
        i = int(env_id)
        try:
            self.server_metadata[i] = self._client.reconnect(i)
        except (DzGymError, OSError) as exc:
            logger.warning("env %d: reconnect failed: %s", i, exc)
            self._counters[i].reconnect_failures += 1
            return False
        self._counters[i].reconnects += 1
        return True

    def ensure_connected(self, env_id: int) -> bool:
        """Reconnect env ``env_id`` if its connection is closed (e.g. before a new episode, after a failed
        reconnect while a server restarted); whether it is connected afterwards."""
        return self.is_connected(env_id) or self.reconnect(env_id)

    def admission_retry_at(self, env_id: int) -> float | None:
        """``time.monotonic()`` after which env ``env_id`` asks again for a session its server refused; None
        when it does not wait (never refused, admitted since, or gave up after ``admission_wait``)."""
        return self._admission.retry_at(int(env_id))

    @property
    def admitted_sessions(self) -> dict[str, int]:
        """Per server URL, the most sessions of this wrapper it had admitted at once (one per env at most)."""
        return self._admission.peak

    @property
    def session_ids(self) -> list[str]:
        """The current session id of every env."""
        return list(self._schedule.session_ids)

    @property
    def last_obs(self):
        """The observation the next ``step`` will act on."""
        return self._obs

    # -- internals ------------------------------------------------------------------------------------
    def _stop_embedded(self) -> None:
        if self.embedded_server is not None:
            self.embedded_server.stop()

    def _note(self, note: str) -> None:  # told once: a warning (logged under logging.captureWarnings)
        self.server_notes.append(note)
        warnings.warn(note, UserWarning, stacklevel=3)

    def _end_episodes(self, env_ids) -> None:
        ids = [int(i) for i in env_ids]
        for i, session_id in zip(ids, self._schedule.end_episodes(ids)):
            if self._used[i] and self.profile.supports_reset:
                self._client.end_session(i, session_id)
            self._admission.ended(i)
            self._counters[i] = EpisodeCounters()
            self.ensure_connected(i)  # an earlier reconnect may have failed while a server restarted
        self._used[ids] = False
        self.episode_flagged[ids] = False

    def _propose(self, policy_obs) -> _Proposal:
        record = self._advance_policy(policy_obs)
        active = self._schedule.has_action() & ~self._idle
        actions = self._schedule.pop_actions(active=active)
        if not active.all():
            actions[~active] = hold_actions(policy_obs)[~active]
        return _Proposal(actions, active, record)

    def _advance_policy(self, policy_obs) -> StepRecord:
        """Send due requests, take in replies, wait where an env cannot step without its reply."""
        record = StepRecord.empty(self.num_envs)
        finished = [env_id for env_id, flight in self._in_flight.items() if flight.future.done()]
        if finished:  # (with prefetch most of the envs are in flight at most steps, few of them finished)
            self._take_replies(finished, False, record)

        due = np.flatnonzero(self._schedule.requests_due() & ~self._idle).tolist()
        if self._admission.waiting:
            now = time.monotonic()
            due = [i for i in due if self._admission.may_ask(i, now)]
        if due:
            requests = self._requests(policy_obs, due)
            self._used[due] = True
            tokens = [self._schedule.mark_sent(env_id) for env_id in due]
            futures = self._client.submit_batch(requests, due)
            for env_id, token, future in zip(due, tokens, futures):
                self._in_flight[env_id] = _InFlight(token, future)
            record.called[due] = True

        if not self._in_flight and not self._schedule.in_flight().any():
            return record  # every env runs on its cache this step
        waiting = self._schedule.must_wait()
        if not self._schedule.simulated_time:  # in simulated time only held steps count as waiting
            self._schedule.count_wait(np.flatnonzero(waiting & ~record.called).tolist())
        self._take_replies(np.flatnonzero(waiting).tolist(), True, record)
        self._schedule.apply_arrivals()
        return record

    def _requests(self, policy_obs, due: list[int]) -> RequestBatch:
        """The requests of the ``due`` envs (at least one), keyed by env id."""
        return build_requests(policy_obs, due, prompts=self.prompts, session_ids=self._schedule.session_ids,
                              image_resolution=self.image_resolution,
                              image_keys=getattr(self.env.unwrapped, "request_image_keys", None),
                              host_memory=self._client.host_memory, profile=self.profile)  # fmt: skip

    def _take_replies(self, env_ids: list[int], block: bool, record: StepRecord) -> None:
        """Settle the finished requests of ``env_ids`` into ``record`` (waiting for them when ``block``)."""
        flights = [(i, flight) for i in env_ids if (flight := self._in_flight.get(i)) is not None]
        if block and flights:
            # The client bounds each request; this bound only guards against a reply that never resolves. The
            # wait runs in slices of at most a second so a stop signal's handler runs promptly whichever thread
            # the signal reached.
            deadline = time.monotonic() + self._reply_bound
            pending = {flight.future for _, flight in flights}
            while pending and (left := deadline - time.monotonic()) > 0:
                _, pending = concurrent.futures.wait(pending, timeout=min(left, 1.0))
        if not block:
            flights = [(i, flight) for i, flight in flights if flight.future.done()]
        # replies before failures, so a refusal is told with the sessions admitted in the same step counted
        flights.sort(key=lambda item: not item[1].future.done() or item[1].future.result().error is not None)
        for env_id, flight in flights:
            del self._in_flight[env_id]
            if not flight.future.done():
                flight.future.cancel()
                error = RequestTimeout(f"env {env_id}: no reply within {self._reply_bound:g} s")
                self._settle_failure(env_id, flight.token, error, np.nan, record)
                continue
            self._settle(env_id, flight.token, flight.future.result(), record)

    def _settle(self, env_id: int, token: int, outcome: Outcome, record: StepRecord) -> None:
        """Apply one finished request's outcome: deliver its chunk, or record its failure."""
        counters = self._counters[env_id]
        if self._schedule.pending_token(env_id) == token:  # not a late reply of an ended episode
            counters.reconnects += int(getattr(outcome, "reconnects", 0))
            counters.retries += int(getattr(outcome, "retries", 0))
        record.sent_at[env_id], record.received_at[env_id] = outcome.sent_at, outcome.received_at
        error = outcome.error
        if error is None:
            url = self._client.url(env_id)
            try:
                delivered = self._schedule.deliver(env_id, token, outcome.reply.actions,
                                                   rows=self._reply_rows.get(url), latency_s=outcome.latency_s)  # fmt: skip
            except HorizonError as exc:
                raise HorizonError(exc.horizon, exc.chunk_length, f"server {url}") from None
            except ProtocolError as exc:
                error = ProtocolError(f"reply from {url}: {exc}")
            else:
                if delivered:
                    record.delivered[env_id] = True
                    record.latency_s[env_id] = outcome.latency_s
                    counters.latencies_s.append(float(outcome.latency_s))
                self._admission.admitted(env_id, url)
                if url in self._unjudged:
                    self._judge_server(url, env_id, outcome)
                return
        self._settle_failure(env_id, token, error, outcome.latency_s, record)

    def _judge_server(self, url: str, env_id: int, outcome: Outcome) -> None:
        """Once per server, on its first reply: warn when it behaves like DreamZero's single-session server."""
        self._unjudged.discard(url)
        note = single_session_note(self.server_metadata[env_id], url, outcome.reply, self._envs_on[url])
        if note is not None:
            self._note(note)

    def _settle_failure(self, env_id: int, token: int, error: BaseException, latency_s: float, record) -> None:
        """Flag env ``env_id``'s episode for a failed request and reconnect when the connection broke."""
        if self._schedule.pending_token(env_id) != token:
            return  # a failure of an ended episode's request does not concern the new episode
        self._schedule.abandon(env_id)
        if isinstance(error, SessionRefused):
            error = self._admission.refused(env_id, self._client.url(env_id), error)
        event = event_of(error)
        record.latency_s[env_id] = latency_s
        record.errors[env_id] = str(error)
        record.events[env_id] = event
        if np.isfinite(latency_s):
            self._counters[env_id].latencies_s.append(float(latency_s))
        self.episode_flagged[env_id] = True
        level = logging.INFO if self._admission.retry_at(env_id) is not None else logging.WARNING  # a wait
        logger.log(level, "env %d: policy call failed (%s): %s", env_id, event, error)
        if breaks_connection(error):
            self.reconnect(env_id)
