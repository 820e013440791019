"""Runs one scene's episodes on a wrapped batched env: fixed per-slot quotas, per-episode seeds, rows.

Unbiased accounting: the run plan (:mod:`dz_gym.eval.plan`) gives every episode its seed and its env slot
(episode ``k`` of a scene: seed ``seed + k``, slot ``k % num_envs``); each slot runs its plan entries in order,
and a slot whose quota is done idles (holds its pose, sends no requests, its results are ignored) until the
others finish. Nothing depends on which episodes finish first,
so for a deterministic policy the rows do not depend on ``num_envs`` (only the ``env`` and timing fields do).
The seed of a slot's next episode is queued with the env's ``set_episode_seeds`` as soon as its current
episode starts, so it applies whether that episode ends by the env's own time-out (same-step autoreset) or
by an explicit partial reset. Before each step the env hears which slots have nothing more queued
(``set_last_episodes``, where it has the hook): an autoreset that ends such a slot's last episode renders
nothing and takes no hold step, as nobody reads the next episode's frames (an episode queued again after an
error restarts from an explicit reset, which always renders).

An episode ends when the env reports ``terminated``/``truncated``, after ``max_steps`` steps (partial reset
of that env), or at the first failed server call of that env (server error, lost connection, timeout,
protocol error). Such an attempt is run again from its reset on the same seed and slot, up to
``episode_retries`` times (the attempt leaves no row; it is logged in the run directory's ``attempts.jsonl``,
so a resume continues the count); the slot idles for one loop turn and restarts the episode with a partial
reset (a fresh session; the wrapper has already done its bounded reconnect). What still errors is recorded as
errored, and the slot moves on to its next episode. A session the server refused (``session_refused``:
nothing ran) goes through the same re-queueing, bounded in time instead: it waits idle until
``admission_retry_at`` (recorded only past ``admission_wait``). Either way the episode keeps its seed, slot
and plan position, so its row is the one a run without errors writes; ``attempts`` and ``retried_events``
say what happened before. The row's ``error_event`` names the cause (``dz_gym.records.INTEGRITY_EVENTS``), the same for every env;
``reconnects`` and ``retries`` count the connections reopened and the requests re-sent after server errors
during the episode (a reconnect may restart the policy's context on vLLM-Omni, which keys sessions per
connection). In a latency-honest run (the wrapper's ``latency_honest_hz``) the request delays an attempt drew are
logged with it, and the episode's next attempt (in this run or on resume) replays them before measuring new
ones, so running an episode again draws no new delays for the requests already recorded.

The runner uses only the wrapper's public surface (``set_idle``, ``render_policy``, ``episode_stats``,
``server_url``, ``admission_retry_at``, ``session_ids``, ``last_obs``, ``replay_delays``, the step's ``info``);
it never reconnects. Its parts, a module each: what each slot runs next (:class:`~dz_gym.eval.slots.SlotQueues`:
the queues, the waiting slots, the stop of an adaptive test), the retried attempts
(:class:`~dz_gym.eval.attempts.Attempts`), the per-step values (:class:`~dz_gym.eval.steplog.StepLog`), an
episode and its row (:class:`~dz_gym.eval.episode.EpisodeInProgress`), the writing off the loop
(:class:`~dz_gym.eval.writer.EpisodeWriter`) and the stop request and error budget
(:class:`~dz_gym.eval.control.RunControl`); the runner steps the batch and starts and ends the episodes.

A/B runs (entries with an ``arm``): episode ``k`` runs twice, under arm A on slot ``2j`` and under arm B on
slot ``2j + 1`` with ``j = k % (num_envs / 2)`` (the plan's): the two runs of a seed are on neighbouring slots,
at about the same time, in the same batch. Rows then carry ``arm``. With a
:class:`~dz_gym.eval.ab.PairTracker` that stops (the sequential test decided, on a row of this scene or, with
the scenes side by side, of another), no new episode starts; an
episode in progress whose twin has already run or is running finishes, one whose twin has not started is
dropped (no row; listed in ``SceneResult.dropped``), so no pair is left half-finished by the stop.

Rows also carry ``task`` (the name of the scene's task, e.g. ``place_spoon_in_sink`` for scene 101) and
``milestones`` (name -> first episode step reached, or null; from ``info["milestones"]``, every name the env
reports, including a task's own); trajectories keep the milestones' first steps and the poses they are
checked on (``object_pos``, ``object_quat``, ``container_pos``, ``tcp_pos``, ``object_start_pos``).

Per finished episode the runner writes, in order: the trajectory file, the video (closed in the background)
and its row in ``episodes.jsonl`` (an :class:`~dz_gym.eval.row.EpisodeRow`); the trajectory and the row are written by an
:class:`~dz_gym.eval.writer.EpisodeWriter` thread (in that order), off the stepping loop, and all of them are
on disk when :meth:`SceneRunner.run` returns. A stop request (Ctrl-C) or an exhausted error budget ends the scene at the
next step boundary; episodes in progress are dropped (no row; their partial videos are deleted) and run again
on ``--resume``.
"""

from __future__ import annotations

import functools
import logging
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from dz_gym.envs import droid
from dz_gym.eval.attempts import Attempts
from dz_gym.eval.control import RunControl
from dz_gym.eval.episode import EpisodeInProgress as _Episode
from dz_gym.eval.episode import iso_time, measures, step_columns
from dz_gym.eval.plan import PlanEntry
from dz_gym.eval.progress import Progress
from dz_gym.eval.rundir import RunDir, episode_name
from dz_gym.eval.slots import SlotQueues
from dz_gym.eval.step_outcome import StepOutcome, info_column, milestone_columns
from dz_gym.eval.steplog import StepLog
from dz_gym.eval.timing import SceneResult, union_seconds
from dz_gym.eval.video import VideoRecorder, strip_frames
from dz_gym.eval.writer import EpisodeWriter
from dz_gym.records import SESSION_REFUSED, EpisodeStats
from dz_gym.requests import proprio

logger = logging.getLogger(__name__)


def task_name(scene: int) -> str | None:
    """The task name of a scene id (``DROID-CubeInBowl`` for scene 1, ``place_spoon_in_sink`` for 101)."""
    try:
        from dz_gym.envs.scenes import task_for

        return task_for(int(scene)).name
    except (ImportError, ValueError):
        return None


class SceneRunner:
    """Run the given episodes of one scene on ``wrapper`` (a :class:`~dz_gym.wrapper.DreamZeroPolicyWrapper`).

    ``queues``: per env slot of ``wrapper``, the :class:`~dz_gym.eval.plan.PlanEntry` items it runs, in order
    (:meth:`~dz_gym.eval.plan.RunPlan.slot_queues`: the scene's entries still without a row; a shard's local
    slots run its global slots' entries). ``placement`` (e.g. a shard's ``shard`` and ``node``) goes into
    every row. ``pairs`` (A/B): the :class:`~dz_gym.eval.ab.PairTracker` fed with every row;
    ``on_episode_start(slot, seed)``: called as each episode starts (per-episode request fields).
    ``episode_retries``: how many times an attempt that ended by an infrastructure error runs again.
    ``backend``: the simulator backend every row names (the config's).
    """

    def __init__(
        self,
        wrapper,
        *,
        scene: int,
        queues: Sequence[Sequence[PlanEntry]],
        max_steps: int,
        run_dir: RunDir,
        control: RunControl,
        recorder: VideoRecorder | None = None,
        progress: Progress | None = None,
        pairs: Any = None,
        on_episode_start: Callable[[int, int], None] | None = None,
        placement: Mapping[str, Any] | None = None,
        episode_retries: int = 0,
        backend: str | None = None,
    ):
        self.wrapper = wrapper
        self.base = wrapper.unwrapped
        if not hasattr(self.base, "set_episode_seeds"):
            raise TypeError("env: the evaluator needs set_episode_seeds() (see dz_gym.envs.base) for per-episode seeds")
        self.num_envs = int(wrapper.num_envs)
        self.scene = int(scene)
        if len(queues) != self.num_envs:
            raise ValueError(f"queues: expected one entry list per env slot ({self.num_envs}), got {len(queues)}")
        if any(e.scene != self.scene for q in queues for e in q):
            raise ValueError(f"queues: expected entries of scene {self.scene} only")
        self.slots = SlotQueues(queues)  # what each slot runs next
        self.episodes = sorted({k for k, _ in self.slots.todo})
        self.placement = dict(placement or {})
        self.max_steps = int(max_steps)
        self.backend = backend
        self.run_dir = run_dir
        self.control = control
        self.recorder = recorder
        self.progress = progress
        # slots with nothing queued run their last episode: their autoreset's frames are read by nobody
        self._set_last_episodes = getattr(self.base, "set_last_episodes", None)
        self._current: list[_Episode | None] = [None] * self.num_envs
        self._live = np.zeros(self.num_envs, dtype=bool)  # which slots run an episode (_current is not None)
        self._log = StepLog(self.num_envs)  # the per-step values of every running episode
        self._warned_seed = False
        self.pairs = pairs
        self.on_episode_start = on_episode_start
        self.task = task_name(self.scene)
        self._result: SceneResult | None = None
        self._writer: EpisodeWriter | None = None
        self.episode_retries = int(episode_retries)
        self._attempts = Attempts(run_dir.read_attempts(), self.scene, self.slots.todo, self.episode_retries,
                                  run_dir.append_attempt)  # fmt: skip
        self.hold_starts = False  # True: the caller runs refill() after each step (scenes side by side)
        self._ended: list[tuple[int, bool]] = []  # slots whose episode ended at the last step, and autoreset
        self._idle_due = False

    # -- the loop -------------------------------------------------------------------------------------
    def run(self) -> SceneResult:
        """Run every queued entry (or until a stop); the rows are on disk when it returns."""
        try:
            self.begin()
            while self.tick():
                pass
        finally:
            self.end()
        return self._result

    def begin(self) -> None:
        """Reset the batch and start each slot's first entry (:meth:`run` is begin, :meth:`tick` till False,
        :meth:`end`; an executor that runs several scenes side by side calls them itself)."""
        self._result, self._t0 = SceneResult(self.scene), time.perf_counter()
        first = self.slots.first()
        if not first:
            return
        self._writer = EpisodeWriter(self.run_dir)
        self.base.set_episode_seeds(first, [self.slots.next_seed(slot) for slot in first])
        self.wrapper.render_policy = "all" if self.recorder is not None else "due"
        self._set_idle()
        self.wrapper.reset()
        for slot in first:
            self._start(slot, self.slots.pop(slot))
        self._set_idle()

    def tick(self) -> bool:
        """One step of the batch (or a wait for a refused session's retry); False once done or stopped."""
        result = self._result
        if not (self._live.any() or self.slots.waiting):
            return False
        if self.control.stop.is_set():
            result.stopped = True
            return False
        if not self.slots.draining and getattr(self.pairs, "stopped", False):  # another scene's row ended the test
            self._drop_unpaired()
        self._resume_waiting()
        if self._live.any():
            self._step(result)
        return True

    @property
    def stepping(self) -> bool:
        """Whether an episode is running (else the batch at most waits for refused sessions' retries)."""
        return bool(self._live.any())

    def end(self) -> SceneResult:
        """Drop the episodes still running (no row), and write the finished ones; returns the scene's result."""
        result = self._result
        if self._writer is None:  # nothing was queued, or end() already ran
            return result
        if sys.exc_info()[1] is None:
            result.wall_s = time.perf_counter() - self._t0
            result.busy_s = {url: union_seconds(spans) for url, spans in result.intervals.items()}
        self.slots.waiting.clear()  # refused episodes not restarted yet run again on resume
        for slot, ep in enumerate(self._current):
            if ep is not None:  # stopped mid-episode: no row; it runs again on resume
                if self.recorder is not None and ep.video_key is not None:
                    self.recorder.abort(ep.video_key)
                self._clear(slot)
        self.wrapper.set_idle(np.zeros(self.num_envs, dtype=bool))
        if self._set_last_episodes is not None:
            self._set_last_episodes(None)
        self._close_writer()
        return result

    def _close_writer(self) -> None:
        """Write the finished episodes still queued (``--profile``: timed as ``write_tail``); a write error is
        raised unless another one is on its way."""
        writer, self._writer = self._writer, None
        if sys.exc_info()[1] is None:
            profiler, start = getattr(self.wrapper, "profiler", None), time.perf_counter()
            writer.close()
            if profiler is not None:
                profiler.add("write_tail", time.perf_counter() - start)
            return
        try:
            writer.close()
        except Exception as exc:  # noqa: BLE001 - the exception in flight is the one to report
            logger.warning("writing finished episodes failed as well: %s", exc)

    def _set_idle(self) -> None:
        self.wrapper.set_idle(~self._live)

    def _clear(self, slot: int) -> _Episode:
        """The slot's episode, which is over (finished, dropped or re-queued): the slot runs none now."""
        ep, self._current[slot] = self._current[slot], None
        self._live[slot] = False
        return ep

    def _step(self, result: SceneResult) -> None:
        """One batch step: the whole batch's values go into the step log once; the episodes that ended are
        finished (or re-queued), in slot order."""
        wrapper = self.wrapper
        active = np.flatnonzero(self._live)
        policy_obs = wrapper.last_obs[droid.POLICY_GROUP]
        joints, gripper = proprio(policy_obs)
        if self.recorder is not None:
            for slot, frame in strip_frames(policy_obs, active.tolist()).items():
                self.recorder.add(self._current[slot].video_key, frame)

        if self._set_last_episodes is not None:
            self._set_last_episodes(self.slots.last_episodes())
        _, reward, terminated, truncated, info = wrapper.step()

        out = StepOutcome.read(reward, terminated, truncated, info, self.num_envs)
        latency_ms = out.latency_ms
        self._log.append(step_columns(info, joints, gripper, out.reward, latency_ms, out.success, out.success_any),
                         active)  # fmt: skip
        self._keep_first_values(info, active)
        self._account_busy(result, info)
        result.env_steps += len(active)
        if self.progress is not None:
            seen = latency_ms[active][np.isfinite(latency_ms[active])]
            self.progress.steps(len(active), seen[-1] if seen.size else None)

        ended = out.ends(active, self._log.steps(active), self.max_steps).tolist()
        finished = [(slot, *out.end_of(slot)) for slot in ended]
        for slot, *_ in finished:
            self._current[slot].server_errors += int(out.failed[slot])
        milestones = milestone_columns(info) if finished else None
        columns = self._log.episodes([slot for slot, *_ in finished])
        for (slot, error, event, ended_by), episode_columns in zip(finished, columns, strict=True):
            # a done env's record comes with the step's info; one ended here is still the wrapper's current one
            stats = EpisodeStats.from_info(info, slot) if out.done[slot] else wrapper.episode_stats(slot)
            if event == SESSION_REFUSED and self._defer(slot):
                continue
            if error is not None and event != SESSION_REFUSED and self._retry(slot, error, event, stats.drawn_delays):
                continue
            if milestones is not None:  # this step's info is the finished episode's (before any autoreset)
                self._current[slot].milestones = {name: int(steps[slot]) for name, steps in milestones.items()}
            self._finish(slot, error, event, ended_by, episode_columns, stats)
            self._ended.append((slot, bool(out.done[slot])))  # done: the env has already reset itself (autoreset)
        self._idle_due = self._idle_due or bool(finished)
        if not self.hold_starts:
            self.refill()

    def _keep_first_values(self, info: Mapping[str, Any], active: np.ndarray) -> None:
        """Keep each episode's first reported object start position and env seed (warn, once per scene, when
        the env's seed is not the one the evaluator asked for)."""
        self._log.keep_first("object_start_pos", info_column(info, "object_start_pos"), active)
        env_seed = info_column(info, "episode_seed")
        new = self._log.keep_first("episode_seed", env_seed, active)
        for slot in [] if self._warned_seed else new.tolist():
            ep = self._current[slot]
            if int(env_seed[slot]) != ep.seed:
                self._warned_seed = True
                logger.warning("scene %d episode %d: the env reports seed %d, the evaluator asked for %d",
                               self.scene, ep.episode, int(env_seed[slot]), ep.seed)  # fmt: skip
                break

    def refill(self) -> None:
        """Start the next entry of each slot whose episode ended at the last step; none once the sequential
        test has stopped. With ``hold_starts`` the caller calls it, after every scene of a side-by-side run has
        stepped, so that a stop on any scene's row of that step comes before any new episode."""
        ended, self._ended = self._ended, []
        if self.slots.draining or (ended and getattr(self.pairs, "stopped", False)):  # the test stopped: nothing new
            ended = []
            self._drop_unpaired()
        starts = [(slot, self.slots.pop(slot), autoreset) for slot, autoreset in ended if self.slots.has_next(slot)]
        to_reset = [slot for slot, _, autoreset in starts if not autoreset]
        if to_reset:
            self.wrapper.reset(options={"env_ids": np.asarray(to_reset, dtype=np.int64)})
        for slot, item, _ in starts:
            self._start(slot, item)
        if self._idle_due:
            self._idle_due = False
            self._set_idle()

    def _defer(self, slot: int) -> bool:
        """The server refused the slot's session: unless the wrapper gave up waiting, drop the attempt (no
        row) and queue the episode again; whether it did."""
        if self.wrapper.admission_retry_at(slot) is None:
            return False
        self._requeue(slot)
        return True

    def _retry(self, slot: int, error: str, event: str | None, delays: Sequence[int] = ()) -> bool:
        """The slot's attempt ended by an infrastructure error: unless its retries are used up, log it (with
        the request ``delays`` it drew), drop the attempt (no row) and start the episode again from its reset;
        whether it did."""
        ep = self._current[slot]
        attempt = self._attempts.retry(scene=ep.scene, episode=ep.episode, arm=ep.arm, seed=ep.seed,
                                       steps=self._steps(slot), error_event=event, error=error,
                                       started_at=iso_time(ep.started_at), delays=delays)  # fmt: skip
        if attempt is None:
            return False
        logger.info("scene %d episode %d%s: %s; running it again from its reset (retry %d of %d)", ep.scene,
                    ep.episode, f" arm {ep.arm}" if ep.arm else "", error, attempt, self.episode_retries)  # fmt: skip
        self._requeue(slot)
        return True

    def _requeue(self, slot: int) -> None:
        """Drop the slot's attempt (no row, its video deleted) and queue its episode first, to start again when
        :meth:`_resume_waiting` finds its time has come."""
        ep = self._clear(slot)
        if self.recorder is not None and ep.video_key is not None:
            self.recorder.abort(ep.video_key)
        self.slots.requeue(slot, ep.entry)

    def _resume_waiting(self) -> None:
        """Restart the waiting slots whose retry time has come; with nothing to step, sleep (<= 1 s) till one."""
        waiting = self.slots.waiting
        if self.slots.draining:
            waiting.clear()
        if not waiting:
            return
        now = time.monotonic()
        retry = {slot: self.wrapper.admission_retry_at(slot) or now for slot in waiting}
        ready = sorted(slot for slot, at in retry.items() if at <= now)
        if not ready:
            if not self.stepping and not self.hold_starts:  # side by side, the caller waits (other scenes step)
                self.control.stop.wait(min(min(retry.values()) - now, 1.0))
            return
        waiting.difference_update(ready)
        items = [(slot, self.slots.pop(slot)) for slot in ready]
        self.base.set_episode_seeds(ready, [entry.seed for _, entry in items])
        self.wrapper.reset(options={"env_ids": np.asarray(ready, dtype=np.int64)})
        for slot, item in items:
            self._start(slot, item)
        self._set_idle()

    def _drop_unpaired(self) -> None:
        """After a sequential stop: clear every queue and drop each running episode whose twin has not
        started (it could never be paired); running pairs finish."""
        self.slots.drain()
        if not getattr(self.pairs, "pairs_twins", True):  # no twins to wait for (--select-best): running ones finish
            return
        for slot, ep in enumerate(self._current):
            if ep is None or ep.arm is None:
                continue
            if not self.slots.twin_pending(ep.episode, ep.arm):  # running, finished, or done before a resume
                continue
            if self.recorder is not None and ep.video_key is not None:
                self.recorder.abort(ep.video_key)
            self._clear(slot)
            if self._result is not None:
                self._result.dropped.append({"scene": ep.scene, "episode": ep.episode, "seed": ep.seed, "arm": ep.arm,
                                             "steps": self._steps(slot)})  # fmt: skip
        self._set_idle()

    def _account_busy(self, result: SceneResult, info: Mapping[str, Any]) -> None:
        """Record each reply's request interval per server; a server is counted busy while any request of
        ours is outstanding there (exact for a server that serves one request at a time)."""
        sent = np.asarray(info.get("chunk_sent_at", ()), dtype=np.float64)
        received = np.asarray(info.get("chunk_received_at", ()), dtype=np.float64)
        for slot in np.flatnonzero(np.isfinite(sent) & np.isfinite(received)):
            url = self.wrapper.server_url(int(slot))
            result.intervals.setdefault(url, []).append((float(sent[slot]), float(received[slot])))

    # -- episode boundaries ---------------------------------------------------------------------------
    def _start(self, slot: int, entry: PlanEntry) -> None:
        """Begin ``entry`` on ``slot`` (its env was just reset) and queue the slot's next seed."""
        episode, arm = entry.episode, entry.arm
        self.slots.started(entry)
        if self.slots.has_next(slot):
            self.base.set_episode_seeds([slot], [self.slots.next_seed(slot)])
        if self.on_episode_start is not None:
            self.on_episode_start(slot, entry.seed)
        key = None
        if self.recorder is not None:
            key = episode_name(self.scene, episode, arm)
            self.recorder.open(key, self.run_dir.video_path(self.scene, episode, arm))
        self._current[slot] = _Episode(
            entry=entry,
            slot=slot,
            scene=self.scene,
            episode=episode,
            seed=entry.seed,
            prompt=self.wrapper.prompts[slot],
            session_id=self.wrapper.session_ids[slot],
            started_at=time.time(),
            t0=time.perf_counter(),
            video_key=key,
            arm=arm,
            task=self.task,
        )
        self._live[slot] = True
        self._log.start([slot])
        drawn = self._attempts.delays(episode, arm)
        if drawn and getattr(self.wrapper, "latency_honest_hz", None) is not None:
            self.wrapper.replay_delays(slot, drawn)  # a rerun takes the delays its earlier attempt measured

    def _steps(self, slot: int) -> int:
        """How many steps the slot's episode has taken."""
        return int(self._log.steps([slot])[0])

    def _finish(
        self, slot: int, error: str | None, event: str | None, ended_by: str, columns: dict, stats: EpisodeStats | None
    ) -> None:
        """Write the slot's finished episode (``columns``: its steps, from the step log): trajectory, video, row."""
        steps, ep = self._steps(slot), self._clear(slot)
        trajectory = self.run_dir.trajectory_relpath(self.scene, ep.episode, ep.arm)
        video = None
        if self.recorder is not None:
            self.recorder.finish(ep.video_key)
            video = self.run_dir.video_relpath(self.scene, ep.episode, ep.arm)
        row = ep.row(steps=steps, seen=measures(columns, error is not None), error=error, event=event,
                     ended_by=ended_by, trajectory_path=trajectory, video=video, stats=stats,
                     retried=self._attempts.events(ep.episode, ep.arm), max_steps=self.max_steps,
                     backend=self.backend, server=self.wrapper.server_url(ep.slot), placement=self.placement)  # fmt: skip
        self._writer.submit(self.scene, ep.episode, ep.arm, functools.partial(ep.arrays, columns), row)
        self.control.record(row)
        if self.pairs is not None and self.pairs.add(row):
            self.slots.draining = True  # refill() drops what is queued and the unpaired episodes
        out = getattr(self.pairs, "eliminated_arms", None)  # --select-best: drop the eliminated arms' entries
        if out:
            self.slots.drop_arms(out)
        if self.progress is not None:
            self.progress.episode(row["success_at_end"], error is not None, unused_steps=self.max_steps - steps)
