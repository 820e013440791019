"""Several scenes of one run plan side by side in one process: every scene's batch open, stepped in turn.

The run plan numbers an A/B run's pairs (and a race's groups) with the scenes interleaved: episode 0 of every
scene, then episode 1, ... (:func:`~dz_gym.eval.plan.pair_order`), and the sequential test folds them in that
order (:mod:`dz_gym.eval.ab`). Were the scenes run one after another, the test would wait for the last scene
before it could fold a second pair, and every episode of the earlier scenes would run whatever the evidence.
So the in-process executor builds every scene's batch at once (each with its own env, wrapper and
:class:`~dz_gym.eval.runner.SceneRunner`, as :func:`~dz_gym.eval.scene.run_scene` builds one) and steps them
round-robin, one step of each batch in turn: the scenes advance in step and the test can stop in any of
them. A batch's ended episodes are replaced only once every batch has made its step, so that when a row of
any scene ends the test, no scene has started an episode after it (with the scenes in step, their row
counts at the stop then differ by at most a batch's episodes in flight).

Why a batch per scene, not the env slots split over the scenes: a scene's episodes keep the slots, seeds and
servers the plan gives them (slot ``k % num_envs`` of that scene's batch), so the rows are the ones the
scenes would write run in turn, only written in another order; and a backend builds one scene per env. The
cost is ``num_envs`` envs per scene held at once (the embedded simulator's worker processes per batch) and
``num_envs`` sessions per scene at the servers. A scene whose entries are done keeps its (idle) batch until
the last one ends; the sequential test's stop reaches every batch at its next step (the runner drains).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Sequence
from typing import Any

from dz_gym.eval.config import EvalConfig
from dz_gym.eval.plan import PlanEntry
from dz_gym.eval.runner import SceneRunner
from dz_gym.eval.scene import scene_batch
from dz_gym.eval.signals import interruptible
from dz_gym.eval.timing import SceneResult, side_by_side

__all__ = ["run_side_by_side", "step_in_turn"]

RETRY_POLL_S = 0.05  # every batch waits for a refused session's retry time: look again after this long


def step_in_turn(runners: Sequence[SceneRunner]) -> SceneResult:
    """Begin every runner, then one :meth:`~dz_gym.eval.runner.SceneRunner.tick` of each in turn until all
    are done (or stopped), the slots whose episode ended refilled only once every runner has stepped
    (:meth:`~dz_gym.eval.runner.SceneRunner.refill`); every begun runner is ended (its rows written), also on
    failure.

    The result's ``wall_s`` runs from the first begin to the end of the stepping, before the runners' ends
    write what their episode writers still hold: the span :meth:`~dz_gym.eval.runner.SceneRunner.run` times
    for one batch, so that a run's rate does not depend on its executor. (At N = 1024 envs ending on the same
    step, that write is 1024 trajectory files after the last step, 0.3-0.5 s on an ext4 disk.)"""
    begun: list[SceneRunner] = []
    t0 = time.perf_counter()
    stepped_until: float | None = None
    try:
        with interruptible():
            for runner in runners:
                begun.append(runner)
                runner.begin()
            active = list(runners)
            for runner in runners:
                runner.hold_starts = True
            while active:
                active = [runner for runner in active if runner.tick()]
                for runner in active:  # every scene's rows of this step are in: a stop on any of them starts nothing
                    runner.refill()
                if active and not any(runner.stepping for runner in active):  # all wait for a session's retry
                    active[0].control.stop.wait(RETRY_POLL_S)
            stepped_until = time.perf_counter()
    finally:
        results, failure = [], None
        for runner in begun:
            try:
                results.append(runner.end())
            except Exception as exc:  # noqa: BLE001 - end the other scenes too (their rows), then raise
                failure = failure or exc
        if failure is not None:
            raise failure
    return side_by_side(results, (stepped_until or time.perf_counter()) - t0)


def run_side_by_side(
    config: EvalConfig,
    scenes: Sequence[tuple[int, Sequence[Sequence[PlanEntry]]]],
    slot_servers: Sequence[str],
    **kwargs: Any,
) -> SceneResult:
    """Run each ``(scene, queues)`` (per slot, that scene's plan entries) on a batch of its own, the batches
    side by side (see the module docstring); ``kwargs``: :func:`~dz_gym.eval.scene.scene_batch`'s. The
    batches are built in turn (a stop during that ends the call with nothing run) and closed at the end."""
    if not scenes:
        raise ValueError("scenes: expected at least one (scene, queues)")
    with contextlib.ExitStack() as stack:
        runners = []
        for scene, queues in scenes:
            runner = stack.enter_context(scene_batch(config, scene, queues, slot_servers, **kwargs))
            if runner is None:  # a stop while the simulator was built
                return SceneResult(int(scenes[0][0]), stopped=True)
            runners.append(runner)
        return step_in_turn(runners)
