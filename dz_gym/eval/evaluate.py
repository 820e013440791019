"""One evaluation run (or the rest of one, on resume): the run plan, an executor, then ``summary.json``.

:func:`evaluate` is the in-process (and Ray) executor under :func:`dz_gym.eval.run.run_eval`, the one entry
point of a run (which also chooses a process per scene, starts the embedded servers and opens the run
directory): it takes an :class:`EvalConfig`, a run directory and the policy servers' URLs, makes the run plan
(:mod:`dz_gym.eval.plan`) and runs it as one run segment (:mod:`dz_gym.eval.segment`) with the in-process
executor, :class:`InProcess`: one env batch per scene (the scenes side by side, stepped in turn:
:mod:`dz_gym.eval.sidebyside`, this process opted in to :mod:`dz_gym.host_process`'s settings meanwhile), each
wrapped in :class:`~dz_gym.wrapper.DreamZeroPolicyWrapper`, whose :class:`~dz_gym.eval.runner.SceneRunner` runs
the plan's entries that have no row yet. The segment always (also
on Ctrl-C, an exhausted error budget or a crash) rewrites ``summary.json`` from every row of
``episodes.jsonl``. With ``ray_options`` the same plan runs as shards on Ray
(:func:`dz_gym.eval.shards.driver.evaluate_sharded`). It warns (through ``log``) when more envs share a server
than it keeps sessions resident (``config.transport.server_max_sessions``) and, from the first replies, when an env may
wait longer between requests than the servers' idle timeout (``config.transport.server_idle_timeout``).

An A/B run (``config.ab``: ``servers_b``, or ``policy_b`` on the embedded servers) runs every seed under both
arms on neighbouring env slots, through one :class:`~dz_gym.eval.clients.ArmRouter` (``servers_b``: arm B's
URLs); with ``config.stats.sequential`` a :class:`~dz_gym.eval.ab.PairTracker` stops starting episodes once the
sequential test decides. The summary then has ``arms`` (per arm, per scene and overall), ``comparison`` (the
JSON of ``dz-gym-compare``) and ``sequential`` (the test's decision and why the run stopped).

A repeated stop signal (see :mod:`dz_gym.eval.signals`) may interrupt the stepping loop and the waits on the
network, never the simulator's start-up or the writing of the results.

Example::

    from dz_gym.eval.config import EvalConfig
    from dz_gym.eval.evaluate import evaluate
    from dz_gym.eval.rundir import RunDir

    config = EvalConfig(scenes=[1], episodes=4, num_envs=2, max_steps=48, video=False,
                        servers=["ws://127.0.0.1:8000/v1/realtime/robot/openpi"])
    summary = evaluate(config, RunDir.create("runs", config))
    print(summary["overall"]["success_at_end"])
"""

from __future__ import annotations

import dataclasses
import logging
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from dz_gym import host_process
from dz_gym.eval.config import EvalConfig
from dz_gym.eval.control import RunControl
from dz_gym.eval.executors import RAY_SHARDS, SCENE_PROCESSES, choose_executor
from dz_gym.eval.plan import plan_of, servers_of_arms
from dz_gym.eval.rundir import RunDir
from dz_gym.eval.scene import EnvFactory, default_env_factory
from dz_gym.eval.segment import RunSegment, run_segment
from dz_gym.eval.shared import SharedTest
from dz_gym.eval.sidebyside import run_side_by_side
from dz_gym.eval.summary import pair_tracker
from dz_gym.eval.video import VideoRecorder

__all__ = ["InProcess", "default_env_factory", "evaluate", "python_command"]

logger = logging.getLogger(__name__)


class InProcess:
    """The in-process executor: the segment's scenes side by side, one env batch each, in this process
    (:mod:`dz_gym.eval.sidebyside`)."""

    def __init__(self, env_factory: EnvFactory | None = None, env_kwargs: Mapping[str, Any] | None = None):
        self.env_factory = env_factory
        self.env_kwargs = dict(env_kwargs or {})
        self.recorder: VideoRecorder | None = None

    def run(self, segment: RunSegment) -> None:
        config, todo = segment.config, segment.todo
        self.recorder = VideoRecorder() if config.outputs.video else None
        scenes = [(scene, todo.slot_queues(scene)) for scene in todo.scene_order()]
        for scene, queues in scenes:
            segment.say(f"scene {scene}: {sum(len(q) for q in queues)} episode(s) on {config.plan.num_envs} env(s)")
        if len(scenes) > 1:
            segment.say(f"scenes {', '.join(str(s) for s, _ in scenes)} side by side, a batch each")
        processes = config.transport_process_count()
        if processes:
            chosen = " (chosen for the envs and cores; --transport-processes 0: none)"
            segment.say(f"transport: {processes} worker processes a connection pool"
                        + (chosen if config.transport.processes is None else ""))  # fmt: skip
        with host_process.applied():  # the evaluator's opt-in (or the settings this process chose already)
            result = run_side_by_side(
                config,
                scenes,
                todo.servers_of(),
                env_factory=self.env_factory,
                env_kwargs=self.env_kwargs,
                server_metadata=segment.server_metadata,
                run_dir=segment.run_dir,
                control=segment.control,
                recorder=self.recorder,
                progress=segment.bars,
                pairs=segment.pairs,
            )
        segment.dropped.extend(result.dropped)
        segment.add_time(result.wall_s, result.env_steps, result.busy_s)

    def close(self, segment: RunSegment, error: BaseException | None) -> None:
        if self.recorder is not None:
            self.recorder.close()
            segment.video_errors.update(self.recorder.failed)


def evaluate(
    config: EvalConfig,
    run_dir: RunDir,
    servers: Sequence[str] | None = None,
    *,
    env_factory: EnvFactory | None = None,
    control: RunControl | None = None,
    progress: bool | None = None,
    command: str = "",
    server_info: Mapping[str, Any] | None = None,
    only_scenes: Sequence[int] | None = None,
    env_kwargs: Mapping[str, Any] | None = None,
    log: Callable[[str], None] | None = None,
    ray_options: Any = None,
    servers_b: Sequence[str] | None = None,
    arm_servers: Mapping[str, Sequence[str]] | None = None,
) -> dict[str, Any]:
    """Run every episode of ``config`` that has no row in ``run_dir`` yet; returns the summary written.

    ``servers`` are the policy servers' URLs (default ``config.policies.servers``; the command line passes the
    embedded server's URL here);
    ``env_factory(scene, config, **env_kwargs)`` builds the batched env (default:
    :func:`default_env_factory`; ``env_kwargs`` go to the backend, e.g. Isaac Lab's ``app_args``);
    ``control`` carries the stop request and the error budget (a fresh one when None); ``progress`` turns
    the bars on/off (None: bars on a TTY, else a progress line every 30 s); ``only_scenes`` restricts this
    call to some scenes (a process per scene, the other scenes' processes running at once: the parent then
    writes the report, and a sequential test or race also reads their rows, :mod:`dz_gym.eval.shared`);
    ``command`` and ``server_info`` are recorded in the summary; ``log`` receives the lines for the user (default: above the
    progress bars, on stderr); ``ray_options`` (a :class:`~dz_gym.eval.shards.options.RayOptions`) runs the
    episodes as shards on a Ray cluster instead, with the same rows and the same run directory
    (``docs/ray.md``); ``servers_b``: arm B's URLs of an A/B run (default ``config.policies.servers_b``; the command
    line passes the second embedded server's); ``arm_servers``: per arm of a ``--arm`` run its URLs (default:
    the arms' own URLs; the command line passes the embedded servers' of the arms that name a policy).

    Raises what ended the run early (after writing the summary): ``KeyboardInterrupt`` on a repeated stop
    signal, or the simulator's/wrapper's error (the summary then says ``aborted``).
    """
    given = {"env_factory": env_factory, "only_scenes": only_scenes, "ray": ray_options, "env_kwargs": env_kwargs}
    given = {name: value for name, value in given.items() if value is not None}  # None: the config's
    if given:
        config = dataclasses.replace(config, execution=dataclasses.replace(config.execution, **given))
    run = config.execution
    executor = choose_executor(config)
    if executor == SCENE_PROCESSES:
        logger.warning("backend %s needs a process per scene; evaluate() runs every scene in this one: "
                       "dz_gym.eval.run.run_eval starts the scene processes as dz-gym-eval does",
                       config.plan.backend)  # fmt: skip
    if executor == RAY_SHARDS:  # K shards on a Ray cluster (dz_gym.eval.shards); Ray is imported only there
        from dz_gym.eval.shards.driver import evaluate_sharded

        return evaluate_sharded(config, run_dir, servers, run.ray, control=control, progress=progress,
                                command=command, server_info=server_info, env_kwargs=run.env_kwargs, log=log)  # fmt: skip
    named = servers_of_arms(config, arm_servers) if config.policies.arm_specs else {}  # per named arm, its URLs
    if named and servers is None:
        servers = list(dict.fromkeys(url for urls in named.values() for url in urls))
    servers = list(config.policies.servers if servers is None else servers)
    if not servers:
        raise ValueError(
            "servers: expected at least one policy server URL (in config.policies.servers or the servers argument)"
        )
    servers_b = list(config.policies.servers_b if servers_b is None else servers_b)
    if config.ab and not servers_b:
        raise ValueError(
            "servers_b: an A/B run needs arm B's policy server URLs (in config.policies.servers_b or servers_b)"
        )
    plan = plan_of(config).resolve(servers, servers_b if config.ab else (), arm_servers=named)
    if run.only_scenes is not None:
        plan = plan.only_scenes(run.only_scenes)
    segment = RunSegment(config, run_dir, plan, servers=servers, servers_b=servers_b if config.ab else (),
                         control=control, progress=progress, log=log, command=command, server_info=server_info,
                         report=config.outputs.report and run.only_scenes is None)  # fmt: skip
    if run.only_scenes is not None and segment.pairs is not None:  # other processes run the other scenes at once
        segment.pairs = SharedTest(lambda rows: pair_tracker(config, rows), run_dir, run.only_scenes)
    return run_segment(segment, InProcess(run.env_factory, run.env_kwargs))


def python_command(argv: Sequence[str] | None = None) -> str:
    """The command line of this process, quoted for a shell."""
    import shlex

    args = list(sys.argv if argv is None else argv)
    return shlex.join(args)
