"""One evaluation run (or the rest of one, on resume): scenes in turn, then ``summary.json``.

:func:`evaluate` is the programmatic entry point behind ``dz-gym-eval``: it takes an :class:`EvalConfig`, a run
directory and the policy servers' URLs, creates one env per scene (in turn), wraps it in
:class:`~dz_gym.wrapper.DreamZeroPolicyWrapper`, lets :class:`~dz_gym.eval.runner.SceneRunner` run the episodes
that have no row yet, and always (also on Ctrl-C, an exhausted error budget or a crash) rewrites
``summary.json`` from every row of ``episodes.jsonl``. It warns (through ``log``) when more envs share a server
than it keeps sessions resident (``config.server_max_sessions``) and, from the first replies, when an env may
wait longer between requests than the servers' idle timeout (``config.server_idle_timeout``).

An A/B run (``config.ab``: ``servers_b``, or ``policy_b`` on the embedded servers) runs every seed under both
arms on neighbouring env slots, through one :class:`~dz_gym.eval.clients.ArmRouter` (``servers_b``: arm B's
URLs); with ``config.sequential`` a :class:`~dz_gym.eval.ab.PairTracker` stops starting episodes once the
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
import platform
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from importlib import metadata as importlib_metadata
from typing import Any

from dz_gym.eval.capacity import IdleGapCheck, envs_per_server, session_warning
from dz_gym.eval.config import EvalConfig
from dz_gym.eval.progress import Progress
from dz_gym.eval.results import summarize
from dz_gym.eval.rundir import RunDir
from dz_gym.eval.runner import RunControl, SceneRunner
from dz_gym.eval.signals import interruptible, shielded
from dz_gym.eval.video import VideoRecorder

logger = logging.getLogger(__name__)

EnvFactory = Callable[..., Any]  # (scene, config, **env_kwargs) -> batched env


def default_env_factory(scene: int, config: EvalConfig, **backend_kwargs: Any):
    """``make_droid_env`` for ``config.backend``; the embedded simulator gets the episode length directly."""
    from dz_gym.envs.backends import traits

    backend = traits(config.backend)
    kwargs = dict(backend_kwargs)
    for keyword, field in backend.config_kwargs.items():
        kwargs.setdefault(keyword, getattr(config, field))
    return backend.make_env(scene, config.num_envs, **kwargs)


def remaining_episodes(config: EvalConfig, rows: Sequence[Mapping[str, Any]]) -> dict[int, list]:
    """Per scene, the planned episodes without a row (rows of errored episodes count as done); in an A/B
    run ``(episode, arm)`` items."""
    if config.ab:
        done_ab = {(int(r["scene"]), int(r["episode"]), r.get("arm")) for r in rows}
        return {
            s: [(k, arm) for k in range(config.episodes) for arm in config.arms if (s, k, arm) not in done_ab]
            for s in config.scenes
        }
    done = {(int(r["scene"]), int(r["episode"])) for r in rows}
    return {s: [k for k in range(config.episodes) if (s, k) not in done] for s in config.scenes}


def pair_tracker(config: EvalConfig, rows: Sequence[Mapping[str, Any]]):
    """The :class:`~dz_gym.eval.ab.PairTracker` of an A/B run, rebuilt from its rows (None otherwise)."""
    if not config.ab:
        return None
    from dz_gym.eval.ab import PairTracker

    # The test's pair order: the scenes interleaved (episode-major), so that it never decides before every
    # scene has contributed its share, even when the scenes run one after another.
    order = [(scene, k) for k in range(config.episodes) for scene in config.scenes]
    return PairTracker(sequential=config.sequential, alpha=config.alpha, max_pairs=config.sequential_max_pairs,
                       rows=rows, order=order, min_difference=config.min_difference, power=config.power)  # fmt: skip


def _ab_summary(
    config: EvalConfig, rows: Sequence[Mapping[str, Any]], dropped: Sequence[Mapping[str, Any]]
) -> dict[str, Any]:
    """``arms``, ``comparison`` and ``sequential`` of an A/B run's summary (see :func:`evaluate`); ``dropped``:
    the episodes cut off by the sequential stop (no row)."""
    from dz_gym.eval.results import summarize_arms
    from dz_gym.stats.comparison import compare_rows

    labels = {}
    for arm, servers, policy in (("a", config.servers, config.policy), ("b", config.servers_b, config.policy_b)):
        labels[arm] = f"arm {arm.upper()} (" + (", ".join(servers) if servers else f"policy {policy}") + ")"
    planned = {s: config.episodes for s in config.scenes}
    out: dict[str, Any] = {"arms": summarize_arms(rows, config.arms, planned=planned)}
    out["arms"]["labels"] = labels  # what each arm ran (also comparison.arms)
    out["comparison"] = compare_rows(rows, labels=labels)
    tracker = pair_tracker(config, rows)
    finished = not any(remaining_episodes(config, rows)[s] for s in config.scenes)
    out["sequential"] = tracker.summary(rows, planned_pairs=config.episodes * len(config.scenes), finished=finished)
    if out["sequential"] is not None:
        out["sequential"]["dropped"] = [dict(d) for d in dropped]
        if tracker.stopped:
            out["complete"] = True  # the test decided: the episodes it did not need are not missing
    return out


def versions() -> dict[str, str]:
    """Versions of Python, the platform and the packages that shape results."""
    out = {"python": platform.python_version(), "platform": platform.platform()}
    for name in ("dz-gym", "numpy", "gymnasium", "websockets", "msgpack", "mujoco", "torch", "isaaclab", "imageio"):
        try:
            out[name] = importlib_metadata.version(name)
        except importlib_metadata.PackageNotFoundError:
            continue
    return out


def _metadata_dict(meta: Any) -> dict[str, Any]:
    if dataclasses.is_dataclass(meta):
        return dataclasses.asdict(meta)
    return dict(meta) if isinstance(meta, Mapping) else {"value": repr(meta)}


def build_summary(
    config: EvalConfig,
    run_dir: RunDir,
    *,
    segments: list[dict[str, Any]],
    extra: Mapping[str, Any],
) -> dict[str, Any]:
    """``summary.json`` of the whole run directory: every row, every run segment's timing.

    The rates come from the counts the summary reports: ``env_steps_per_s = env_steps_taken / wall_s``
    (``env_steps_taken`` also counts the steps of episodes an interruption dropped, which have no row).
    """
    rows = run_dir.read_rows()
    wall = sum(seg["wall_s"] for seg in segments)
    stepped = sum(seg["env_steps"] for seg in segments)
    busy: dict[str, float] = {}
    for seg in segments:
        for url, seconds in seg.get("busy_s", {}).items():
            busy[url] = busy.get(url, 0.0) + seconds
    from dz_gym.envs.scenes import scene_prompt

    prompts = {s: scene_prompt(s) for s in config.scenes}
    planned = {s: config.episodes for s in config.scenes}
    if config.ab:
        planned = {s: config.episodes * len(config.arms) for s in config.scenes}
    fields = dict(extra)
    dropped = fields.pop("dropped", [])
    fields["segments"] = segments
    fields["config"] = config.to_dict()
    summary = summarize(
        rows, planned=planned, prompts=prompts, wall_s=wall or None, stepped=stepped, busy_s=busy, extra=fields
    )
    if config.ab:
        summary.update(_ab_summary(config, rows, dropped))
    return summary


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
) -> dict[str, Any]:
    """Run every episode of ``config`` that has no row in ``run_dir`` yet; returns the summary written.

    ``servers`` are the policy servers' URLs (default ``config.servers``; the command line passes the
    embedded server's URL here);
    ``env_factory(scene, config, **env_kwargs)`` builds the batched env (default:
    :func:`default_env_factory`; ``env_kwargs`` go to the backend, e.g. Isaac Lab's ``app_args``);
    ``control`` carries the stop request and the error budget (a fresh one when None); ``progress`` turns
    the bars on/off (None: bars on a TTY, else a progress line every 30 s); ``only_scenes`` restricts this
    call to some scenes (a process per scene); ``command`` and ``server_info`` are recorded in the summary;
    ``log`` receives the lines for the user (default: above the progress bars, on stderr);
    ``ray_options`` (a :class:`~dz_gym.eval.shards.options.RayOptions`) runs the episodes as shards on a Ray
    cluster instead, with the same rows and the same run directory (``docs/ray.md``); ``servers_b``: arm B's
    URLs of an A/B run (default ``config.servers_b``; the command line passes the second embedded server's).

    Raises what ended the run early (after writing the summary): ``KeyboardInterrupt`` on a repeated stop
    signal, or the simulator's/wrapper's error (the summary then says ``aborted``).
    """
    from dz_gym.wrapper import DreamZeroPolicyWrapper

    if ray_options is not None:  # K shards on a Ray cluster (dz_gym.eval.shards); Ray is imported only there
        if env_factory is not None or only_scenes is not None:
            raise ValueError("ray_options: a sharded run builds its envs in its shards (no env_factory, only_scenes)")
        from dz_gym.eval.shards.driver import evaluate_sharded

        return evaluate_sharded(
            config,
            run_dir,
            servers,
            ray_options,
            control=control,
            progress=progress,
            command=command,
            server_info=server_info,
            env_kwargs=env_kwargs,
            log=log,
        )
    servers = list(config.servers if servers is None else servers)
    if not servers:
        raise ValueError("servers: expected at least one policy server URL (in config.servers or the servers argument)")
    servers_b = list(config.servers_b if servers_b is None else servers_b)
    if config.ab and not servers_b:
        raise ValueError("servers_b: an A/B run needs arm B's policy server URLs (in config.servers_b or servers_b)")
    factory = env_factory or default_env_factory
    run_dir.repair_rows()
    rows = run_dir.read_rows()
    previous = run_dir.read_summary() or {}
    segments = list(previous.get("segments", []))
    if control is None:
        control = RunControl(config.error_budget)
    control.errored = sum(1 for r in rows if r.get("error") is not None)
    todo = remaining_episodes(config, rows)
    pairs = pair_tracker(config, rows)
    if pairs is not None and pairs.stopped:
        todo = {s: [] for s in todo}  # the sequential test has decided (a resumed run): nothing left to run
    dropped: list[dict[str, Any]] = list((previous.get("sequential") or {}).get("dropped", []))
    scenes = [s for s in config.scenes if only_scenes is None or s in only_scenes]
    total = sum(len(todo[s]) for s in scenes)
    say_later: list[Callable[[str], None]] = []
    idle_check = IdleGapCheck(
        config.envs_per_server() if config.ab else envs_per_server(config.num_envs, len(servers)),
        config.server_idle_timeout,
        lambda line: say_later[0](line),
    )
    bars = Progress(total, total * config.max_steps, enabled=progress, on_latency=idle_check.observe)
    say = log or bars.write
    say_later.append(say)
    per_arm = config.num_envs // 2 if config.ab else config.num_envs  # an A/B run: half the slots per arm
    crowded = session_warning(per_arm, servers, config.server_max_sessions)
    if crowded is None and config.ab:
        crowded = session_warning(per_arm, servers_b, config.server_max_sessions)
    if crowded is not None:
        say(f"dz-gym-eval: warning: {crowded}")
    recorder = VideoRecorder() if config.video else None
    segment = {
        "started_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "wall_s": 0.0,
        "env_steps": 0,
        "busy_s": {},
    }
    server_metadata: dict[str, Any] = {}
    aborted: str | None = None
    error: BaseException | None = None
    try:
        for scene in scenes:
            if not todo[scene]:
                continue
            if control.stop.is_set() or (pairs is not None and pairs.stopped):
                break
            say(f"scene {scene}: {len(todo[scene])} episode(s) on {config.num_envs} env(s)")
            env = factory(scene, config, **dict(env_kwargs or {}))  # not interruptible: workers start whole
            wrapper = None
            try:
                with interruptible():
                    if control.stop.is_set():
                        break
                    client = _client(config, servers, servers_b)
                    wrapper = DreamZeroPolicyWrapper(
                        env,
                        **(
                            {"client": client}
                            if client is not None
                            else {"server": list(servers), "transport": config.transport_config()}
                        ),
                        open_loop_horizon=config.open_loop_horizon,
                        prefetch=config.prefetch,
                        simulated_delay=config.simulated_delay,
                        max_stale_steps=config.max_stale_steps,
                    )
                    for i in range(wrapper.num_envs):  # one entry per server URL
                        server_metadata.setdefault(wrapper.server_url(i), _metadata_dict(wrapper.server_metadata[i]))
                    runner = SceneRunner(
                        wrapper,
                        scene=scene,
                        episodes=todo[scene],
                        seed=config.seed,
                        max_steps=config.max_steps,
                        run_dir=run_dir,
                        control=control,
                        recorder=recorder,
                        progress=bars,
                        pairs=pairs,
                        on_episode_start=getattr(client, "begin_episode", None),
                    )
                    result = runner.run()
                    dropped.extend(result.dropped)
            finally:
                with shielded():
                    if wrapper is not None:
                        wrapper.close()
                    else:
                        env.close()
            segment["wall_s"] += result.wall_s
            segment["env_steps"] += result.env_steps
            for url, seconds in result.busy_s.items():
                segment["busy_s"][url] = segment["busy_s"].get(url, 0.0) + seconds
    except BaseException as exc:  # noqa: BLE001 - record what happened, write the summary, then re-raise
        error = exc
        if isinstance(exc, KeyboardInterrupt) or (control.stop.is_set() and control.aborted is None):
            control.stop.set()  # a stop request, or a failure that came with it (a worker got the signal too)
        else:
            aborted = f"{type(exc).__name__}: {exc}"
    finally:
        with shielded():
            bars.close()
            if recorder is not None:
                recorder.close()
            if segment["env_steps"] or segment["wall_s"]:
                segments.append(segment)
            summary = write_run_summary(
                config,
                run_dir,
                segments,
                control=control,
                aborted=aborted,
                command=command,
                servers=servers,
                server_info=server_info,
                server_metadata=server_metadata or previous.get("server_metadata", {}),
                video_errors=dict(recorder.failed) if recorder is not None else {},
                say=say,
                **({"servers_b": list(servers_b)} if config.ab else {}),
                dropped=dropped,
            )
    if error is not None:
        raise error
    return summary


def write_run_summary(
    config: EvalConfig,
    run_dir: RunDir,
    segments: list[dict[str, Any]],
    *,
    control: RunControl,
    aborted: str | None,
    command: str,
    servers: Sequence[str],
    server_info: Mapping[str, Any] | None,
    server_metadata: Mapping[str, Any],
    video_errors: Mapping[str, Any],
    say: Callable[[str], None] | None = None,
    **more: Any,
) -> dict[str, Any]:
    """The last step of a run, in one process or on shards: ``summary.json`` (how the run ended, what ran it,
    ``more`` path-specific fields), then ``report.html`` unless ``config.report`` is off. Returns the summary."""
    aborted = aborted or control.aborted
    extra = {
        "interrupted": control.interrupted and aborted is None,
        "aborted": aborted,
        "command": command,
        "backend": config.backend,
        "servers": list(servers),
        "server": dict(server_info or {}),
        "server_metadata": dict(server_metadata),
        "video_errors": dict(video_errors),
        "versions": versions(),
        **more,
    }
    summary = build_summary(config, run_dir, segments=segments, extra=extra)
    run_dir.write_summary(summary)
    if config.report:
        from dz_gym.report import write_report_safely

        write_report_safely(run_dir.path, say)
    return summary


def _client(config: EvalConfig, servers: Sequence[str], servers_b: Sequence[str]):
    """The policy client of an A/B run or of a run that sends sampling fields; None: the wrapper's default."""
    if not (config.ab or config.policy_seed or config.num_inference_steps is not None):
        return None
    from dz_gym.eval.clients import build_client

    return build_client(servers, servers_b if config.ab else (), config.num_envs, config.transport_config(),
                        policy_seed=config.policy_seed, num_inference_steps=config.num_inference_steps)  # fmt: skip


def python_command(argv: Sequence[str] | None = None) -> str:
    """The command line of this process, quoted for a shell."""
    import shlex

    args = list(sys.argv if argv is None else argv)
    return shlex.join(args)
