"""``DreamZeroPolicyWrapper``: a remote DreamZero/OpenPI policy driving a batched DROID env.

Example::

    import dz_gym

    env = dz_gym.make_droid_env(backend="mujoco", scene=1, num_envs=8, seed=0)
    env = dz_gym.DreamZeroPolicyWrapper(env, server="ws://127.0.0.1:8000/v1/realtime/robot/openpi")
    obs, info = env.reset(seed=0)
    for _ in range(450):
        obs, reward, terminated, truncated, info = env.step()   # the policy chooses the actions
    env.close()

Each env has its own websocket connection (sessions are spread over the given servers round-robin), a uuid
session id per episode and an action-chunk cache (``dz_gym.chunks``). An env queries the server only when its
cache is spent (steps 0, 8, 16, ... of each episode with ``open_loop_horizon=8``); the envs that need a chunk in
the same step are queried concurrently, the others use their cache. Requests are exactly the reference
single-env client's (``dz_gym.requests``).

``step(action=None)``: the policy's actions are executed. ``step(action)``: the caller's ``(N, 8)`` action is
executed instead, while the policy is still queried on its usual schedule so that its bookkeeping (cursors,
sessions) stays in sync; the policy's proposal for this step is in ``info["policy_action"]``. To see the
proposal *before* acting (residual RL: your action = proposal + residual), call ``propose()`` first; the next
``step`` uses that same proposal.

Like Isaac Lab, the env resets finished envs inside ``step`` (same-step autoreset): the returned observation of
a finished env belongs to its next episode, and its chunk cache and session id are renewed; other envs are
untouched. The wrapper never sends ``reset`` over the wire (a shared connection would lose every session).

``info`` adds, per env (arrays with a leading ``num_envs``): ``policy_called`` (this step sent a request),
``chunk_received`` and ``chunk_latency_s`` (a reply was taken in this step, and its round trip; NaN otherwise),
``chunk_sent_at``/``chunk_received_at`` (its ``time.perf_counter()`` stamps), ``session_id`` (of the episode the
step belonged to),
``policy_action``, ``policy_error`` (None or the error's one-line text) and ``integrity_event`` (None,
``"server_error"``, ``"connection_lost"``, ``"timeout"``, ``"protocol_error"``, or ``"reconnect_failed"``).
An env whose server call failed holds its pose for that step and asks again at its next step (after a bounded
reconnect when the connection broke); its episode is flagged, the other envs carry on.

Latency hiding (opt-in, ``dz_gym.chunks`` has the exact rules): with ``prefetch=K`` an env sends its next
request when K actions are left in its window and keeps executing; the reply's rows for the steps executed
meanwhile are skipped. A late reply lets the env run on the previous chunk's remaining rows (at most
``max_stale_steps``), then it waits. ``simulated_delay=D`` replaces wall-clock delay by exactly D steps, for
reproducible comparisons under latency. ``info["policy_held"]`` marks envs that held their pose this step
and, for envs whose episode ended, ``info["chunk_stats"]`` gives the per-chunk delays and the wait and stale
step counts of that episode.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import logging
import warnings
from collections.abc import Sequence
from typing import Any
from urllib.parse import urlparse

import gymnasium as gym
import numpy as np
from gymnasium.vector import AutoresetMode

from dz_gym.chunks import ChunkSchedule, new_session_id
from dz_gym.envs import droid
from dz_gym.errors import DzGymError, HandshakeError, ProtocolError, RequestTimeout, ServerError
from dz_gym.protocol import ServerMetadata
from dz_gym.requests import build_requests, hold_actions, is_torch_tensor, to_numpy, validate_policy_obs
from dz_gym.transport import SessionPool, TransportConfig

logger = logging.getLogger(__name__)

DEFAULT_SERVER = "ws://127.0.0.1:8000/v1/realtime/robot/openpi"


def check_server_capabilities(metadata: ServerMetadata, url: str, num_envs: int) -> list[str]:
    """Raise ``HandshakeError`` when a server cannot take what the wrapper sends; return warnings.

    The wrapper sends two external views and a wrist view, a session id per episode, and executes absolute
    joint-position actions.
    """
    problems = []
    if metadata.n_external_cameras is not None and metadata.n_external_cameras > 2:
        problems.append(f"n_external_cameras={metadata.n_external_cameras} (the DROID rig has 2)")
    if metadata.needs_stereo_camera:
        problems.append("needs_stereo_camera=true (the DROID rig has no stereo camera)")
    if metadata.action_space not in (None, "joint_position"):
        problems.append(f"action_space={metadata.action_space!r} (the DROID env takes 'joint_position')")
    if metadata.image_resolution is not None:
        height, width = metadata.image_resolution
        if height < 1 or width < 1:
            problems.append(f"image_resolution={list(metadata.image_resolution)} (expected positive sizes)")
    if problems:
        raise HandshakeError(f"server {url}: cannot serve the DROID client: " + "; ".join(problems))
    notes = []
    path = urlparse(url).path
    if num_envs > 1 and metadata.needs_session_id and path in ("", "/"):
        notes.append(
            f"server {url} looks like DreamZero's own server (no path, session ids): it holds ONE global "
            f"session, so {num_envs} interleaved envs reset its state at every switch; serve with vLLM-Omni "
            "or run one env per server"
        )
    return notes


def _resolve_prompts(prompt: str | Sequence[str] | None, env: Any, num_envs: int) -> list[str]:
    if prompt is None:
        scene = getattr(env.unwrapped, "scene", None)
        if not isinstance(getattr(scene, "prompt", None), str):
            raise ValueError("prompt: the env has no scene prompt; pass prompt='...'")
        return [scene.prompt] * num_envs
    if isinstance(prompt, str):
        return [prompt] * num_envs
    prompts = list(prompt)
    if len(prompts) != num_envs or not all(isinstance(p, str) for p in prompts):
        raise ValueError(f"prompt: expected a string or {num_envs} strings, got {prompt!r}")
    return prompts


def _event_of(error: BaseException) -> str:
    if isinstance(error, ServerError):
        return "server_error"
    if isinstance(error, RequestTimeout):
        return "timeout"
    if isinstance(error, ProtocolError):
        return "protocol_error"
    return "connection_lost"


@dataclasses.dataclass
class _Proposal:
    """The policy's actions for one step and what producing them took (see ``propose``)."""

    actions: np.ndarray  # (N, 8) float32
    active: np.ndarray  # (N,) bool: envs that execute a cached row (the others hold their pose)
    flags: tuple  # called, delivered, latency, errors, events


class DreamZeroPolicyWrapper(gym.Wrapper):
    """Query a remote DreamZero/OpenPI policy for a batched DROID env (see the module docstring)."""

    def __init__(
        self,
        env: gym.Env,
        server: str | Sequence[str] = DEFAULT_SERVER,
        prompt: str | Sequence[str] | None = None,
        open_loop_horizon: int = droid.DEFAULT_OPEN_LOOP_HORIZON,
        transport: TransportConfig | None = None,
        image_resolution: tuple[int, int] | None | str = "server",
        session_id_factory=new_session_id,
        prefetch: int = 0,
        max_stale_steps: int | None = None,
        simulated_delay: int | None = None,
    ):
        super().__init__(env)
        base = env.unwrapped
        self.num_envs = int(base.num_envs)
        self.max_episode_length = int(getattr(base, "max_episode_length", droid.MAX_EPISODE_LENGTH))
        self.servers = [server] if isinstance(server, str) else list(server)
        if not self.servers or not all(isinstance(url, str) and url for url in self.servers):
            raise ValueError(f"server: expected a ws:// or wss:// URL or a list of them, got {server!r}")
        self.prompts = _resolve_prompts(prompt, env, self.num_envs)
        self.schedule = ChunkSchedule(
            self.num_envs,
            open_loop_horizon,
            session_id_factory,
            prefetch=prefetch,
            max_stale_steps=max_stale_steps,
            simulated_delay=simulated_delay,
        )
        self._in_flight: dict[int, tuple[int, concurrent.futures.Future]] = {}
        self.open_loop_horizon = self.schedule.open_loop_horizon
        self.metadata = dict(env.metadata)
        self.metadata["autoreset_mode"] = AutoresetMode.SAME_STEP
        self.single_observation_space = getattr(base, "single_observation_space", None)
        self.single_action_space = getattr(base, "single_action_space", None)
        self.render_all = False  # set by recorders that read every env's images every step
        # Envs that hold their pose and never query the server (an evaluator's slots whose quota is done).
        self.idle_envs = np.zeros(self.num_envs, dtype=bool)
        self._obs: dict | None = None
        self._proposal: _Proposal | None = None  # the next step's policy actions, once computed
        self.episode_flagged = np.zeros(self.num_envs, dtype=bool)

        transport = transport or TransportConfig()
        self._reply_bound = transport.request_timeout + transport.close_timeout + 10.0
        self.pool = SessionPool(self.servers, self.num_envs, transport)
        try:
            self.server_metadata: list[ServerMetadata] = self.pool.connect()
            for env_id, meta in enumerate(self.server_metadata):
                for note in check_server_capabilities(meta, self.pool.url(env_id), self.num_envs):
                    if env_id < len(self.servers):  # once per server
                        warnings.warn(note, stacklevel=2)
            self.image_resolution = self._resolve_resolution(image_resolution)
        except BaseException:
            self.pool.close()
            raise

    def _resolve_resolution(self, image_resolution) -> tuple[int, int] | None:
        if image_resolution != "server":
            if image_resolution is None:
                return None
            height, width = (int(v) for v in image_resolution)
            return height, width
        resolutions = {meta.image_resolution for meta in self.server_metadata}
        if len(resolutions) != 1:
            raise HandshakeError(f"servers disagree on image_resolution: {sorted(map(str, resolutions))}")
        resolution = resolutions.pop()
        return None if resolution is None else (int(resolution[0]), int(resolution[1]))

    # -- Gymnasium API --------------------------------------------------------------------------------
    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        """Reset the env (all envs, or ``options["env_ids"]``) and start new sessions for the reset envs."""
        base = self.env.unwrapped
        if hasattr(base, "set_render_mask"):
            base.set_render_mask(None)
        obs, info = self.env.reset(seed=seed, options=options)
        self._proposal = None
        env_ids = None if not options else options.get("env_ids")
        ids = range(self.num_envs) if env_ids is None else [int(i) for i in np.atleast_1d(to_numpy(env_ids))]
        self.schedule.end_episodes(ids)
        self.episode_flagged[list(ids)] = False
        validate_policy_obs(obs[droid.POLICY_GROUP], self.num_envs)
        self._obs = obs
        info = dict(info)
        info["session_id"] = np.array(self.schedule.session_ids, dtype=object)
        return obs, info

    def step(self, action=None):
        """Step every env once; ``action=None`` executes the policy's actions (see the module docstring)."""
        if self._obs is None:
            raise RuntimeError("step: call reset() first")
        policy_obs = self._obs[droid.POLICY_GROUP]
        proposal = self._proposal or self._propose(policy_obs)
        self._proposal = None
        called, delivered, latency, errors, events = proposal.flags
        active, policy_action = proposal.active, proposal.actions
        executed = policy_action if action is None else self._validate_action(action)
        session_ids = np.array(self.schedule.session_ids, dtype=object)

        base = self.env.unwrapped
        if hasattr(base, "set_render_mask"):
            base.set_render_mask(None if self.render_all else self.schedule.window_nearly_spent() & ~self.idle_envs)
        obs, reward, terminated, truncated, info = self.env.step(self._to_env_action(executed, policy_obs))

        done = np.asarray(to_numpy(terminated), dtype=bool).reshape(-1) | np.asarray(
            to_numpy(truncated), dtype=bool
        ).reshape(-1)
        info = dict(info)
        info.update(
            policy_called=called,
            chunk_received=delivered,
            chunk_latency_s=latency,
            chunk_sent_at=self._stamps[:, 0].copy(),
            chunk_received_at=self._stamps[:, 1].copy(),
            session_id=session_ids,
            policy_action=policy_action,
            policy_held=~active,
            policy_error=np.array(errors, dtype=object),
            integrity_event=np.array(events, dtype=object),
            episode_flagged=self.episode_flagged.copy(),
        )
        done_ids = np.flatnonzero(done)
        if done_ids.size:
            info["chunk_stats"] = {int(i): self.schedule.stats[i] for i in done_ids}
            self.schedule.end_episodes(done_ids)
            self.episode_flagged[done_ids] = False
        validate_policy_obs(obs[droid.POLICY_GROUP], self.num_envs)
        self._obs = obs
        return obs, reward, terminated, truncated, info

    def propose(self) -> np.ndarray:
        """The policy's ``(N, 8)`` actions for the next step, before taking it.

        Queries the server where a chunk is due, exactly as ``step()`` would; the following ``step()`` uses
        this proposal (``step()`` executes it, ``step(action)`` executes yours, e.g. the proposal plus a
        learned residual). Calling it again before stepping returns the same actions. ``reset()`` discards it.
        """
        if self._obs is None:
            raise RuntimeError("propose: call reset() first")
        if self._proposal is None:
            self._proposal = self._propose(self._obs[droid.POLICY_GROUP])
        return self._proposal.actions.copy()

    def _propose(self, policy_obs) -> _Proposal:
        flags = self._advance_policy(policy_obs)
        active = self.schedule.has_action() & ~self.idle_envs
        actions = self.schedule.pop_actions(active=active)
        if not active.all():
            actions[~active] = hold_actions(policy_obs)[~active]
        return _Proposal(actions, active, flags)

    def close(self):
        """Close every connection, then the env."""
        try:
            self.pool.close()
        finally:
            super().close()

    # -- internals ------------------------------------------------------------------------------------
    def _advance_policy(self, policy_obs):
        """Send due requests, take in replies, wait where an env cannot step without its reply."""
        n = self.num_envs
        called = np.zeros(n, dtype=bool)
        delivered = np.zeros(n, dtype=bool)
        latency = np.full(n, np.nan)
        self._stamps = np.full((n, 2), np.nan)  # sent_at, received_at (perf_counter) of replies taken in
        errors: list[str | None] = [None] * n
        events: list[str | None] = [None] * n
        if self._in_flight:
            self._take_replies(list(self._in_flight), False, delivered, latency, errors, events)

        due = np.flatnonzero(self.schedule.requests_due() & ~self.idle_envs).tolist()
        if due:
            requests = build_requests(
                policy_obs,
                due,
                prompts=self.prompts,
                session_ids=self.schedule.session_ids,
                image_resolution=self.image_resolution,
            )
            for env_id in due:
                token = self.schedule.mark_sent(env_id)
                self._in_flight[env_id] = (token, self.pool.submit(env_id, requests[env_id]))
            called[due] = True

        if not self._in_flight and not self.schedule.in_flight().any():
            return called, delivered, latency, errors, events  # every env runs on its cache this step
        waiting = np.flatnonzero(self.schedule.must_wait()).tolist()
        if self.schedule.simulated_delay is None:  # in simulated time only held steps count as waiting
            self.schedule.count_wait([i for i in waiting if not called[i]])
        self._take_replies(waiting, True, delivered, latency, errors, events)
        self.schedule.apply_arrivals()
        return called, delivered, latency, errors, events

    def _take_replies(self, env_ids, block, delivered, latency, errors, events) -> None:
        """Deliver the finished replies of ``env_ids`` (waiting for them when ``block``)."""
        futures = [self._in_flight[i][1] for i in env_ids if i in self._in_flight]
        if block and futures:
            # The transport bounds each request; this bound only guards against a reply that never resolves.
            concurrent.futures.wait(futures, timeout=self._reply_bound)
        for env_id in env_ids:
            token, future = self._in_flight.get(env_id, (None, None))
            if future is None:
                continue
            if not future.done():
                if not block:
                    continue
                future.cancel()
                del self._in_flight[env_id]
                error = RequestTimeout(f"env {env_id}: no reply within {self._reply_bound:g} s")
                self._record_failure(env_id, token, error, np.nan, errors, events, latency)
                continue
            del self._in_flight[env_id]
            outcome = future.result()
            self._stamps[env_id] = (outcome.sent_at, outcome.received_at)
            error = outcome.error
            if error is None:
                try:
                    if self.schedule.deliver(env_id, token, outcome.reply.actions):
                        delivered[env_id] = True
                        latency[env_id] = outcome.latency_s
                    continue
                except ValueError as exc:
                    error = ProtocolError(str(exc))
            self._record_failure(env_id, token, error, outcome.latency_s, errors, events, latency)

    def _record_failure(self, env_id, token, error, latency_s, errors, events, latency) -> None:
        """Flag env ``env_id``'s episode for a failed request and reconnect when the connection broke."""
        if self.schedule.pending_token(env_id) != token:
            return  # a failure of an ended episode's request does not concern the new episode
        self.schedule.abandon(env_id)
        latency[env_id] = latency_s
        errors[env_id] = str(error)
        events[env_id] = _event_of(error)
        self.episode_flagged[env_id] = True
        logger.warning("env %d: policy call failed (%s): %s", env_id, events[env_id], error)
        if not (isinstance(error, ServerError) and not error.fatal):
            events[env_id] = self._reconnect(env_id) or events[env_id]

    def _reconnect(self, env_id: int) -> str | None:
        """Bounded reconnect of env ``env_id``'s session; returns an event name when it failed."""
        try:
            self.pool.reconnect(env_id)
        except (DzGymError, OSError) as exc:
            logger.warning("env %d: reconnect failed: %s", env_id, exc)
            return "reconnect_failed"
        return None

    def _validate_action(self, action) -> np.ndarray:
        array = to_numpy(action).astype(np.float32, copy=False)
        if array.shape != (self.num_envs, droid.ACTION_DIM):
            raise ValueError(f"action: expected shape ({self.num_envs}, {droid.ACTION_DIM}), got {array.shape}")
        return array

    @staticmethod
    def _to_env_action(actions: np.ndarray, policy_obs):
        reference = policy_obs[droid.JOINT_KEY]
        if is_torch_tensor(reference):
            import torch

            return torch.as_tensor(actions, dtype=torch.float32, device=reference.device)
        return actions

    @property
    def session_ids(self) -> list[str]:
        """The current session id of every env."""
        return list(self.schedule.session_ids)

    @property
    def last_obs(self):
        """The observation the next ``step`` will act on."""
        return self._obs
