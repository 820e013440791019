"""One evaluation run from Python, exactly as ``dz-gym-eval`` runs it: :func:`run_eval`.

``dz-gym-eval`` parses its flags into an :class:`~dz_gym.eval.config.EvalConfig`, calls :func:`run_eval` and maps
the :class:`RunResult` to its exit status; everything between is here, in this order, so that a failure before
the run leaves nothing behind:

0. **the outputs and the ledger** (:mod:`dz_gym.eval.opening`): the output root (or the resumed run directory)
   can be written, else ``usage``; a resumed run's lock is taken and its rows checked against the plan, else
   ``aborted`` (one line); a finished run is ``complete`` at once, nothing started;
1. **preflight** (:mod:`dz_gym.eval.preflight`): the backend can run here, every ``--log`` tracker is installed (W&B: with its credentials and a writable ``WANDB_DIR``),
   every external server completes the handshake; else ``aborted`` with the one-line reason, nothing written;
2. **the executor**: scene processes (:class:`~dz_gym.eval.processes.SceneProcesses`, one ``dz-gym-eval`` child
   per scene) when the backend needs one scene per process (Isaac Lab) or ``execution.process_per_scene`` asks
   for it and the run has several scenes; Ray shards with ``execution.ray``; else in this process;
3. **the embedded servers** (:class:`~dz_gym.eval.embedded.EmbeddedServers`) for a config that names policies
   instead of servers (scene processes start their own, in each child), stopped when the run ends;
4. **the run directory**: a new one under ``output_root``, or ``run_dir`` resumed (its config saved again);
5. **the run**, with the ``--log`` trackers (:mod:`dz_gym.eval.tracking`) hooked on its rows; the summary is
   written whatever ends it.

Example (two scenes, the embedded simulator and the embedded reference server, as ``dz-gym-eval --scene 1
--scene 2 --num-envs 4 --episodes 4`` does)::

    from dz_gym.eval.config import EvalConfig
    from dz_gym.eval.run import run_eval

    result = run_eval(EvalConfig(scenes=[1, 2], num_envs=4, episodes=4), output_root="runs/dz_gym_eval")
    print(result.status, result.run_dir.path, result.summary["overall"]["success_at_end"])
"""

from __future__ import annotations

import dataclasses
import shutil
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from dz_gym.envs import droid
from dz_gym.errors import HorizonError, UnknownServer, first_line
from dz_gym.eval.config import EvalConfig
from dz_gym.eval.control import RunControl
from dz_gym.eval.flag_table import DEFAULT_OUTPUT_ROOT
from dz_gym.eval.opening import check_outputs, open_ledger
from dz_gym.eval.rundir import RunDir
from dz_gym.eval.signals import interruptible

__all__ = ["STATUSES", "RunResult", "run_eval"]

STATUSES = ("complete", "incomplete", "interrupted", "aborted", "usage")
EmbeddedServersLike = Any  # an entered EmbeddedServers: servers, servers_b, arm_servers, info


@dataclasses.dataclass
class RunResult:
    """How a run ended. ``status``: ``complete`` (every planned episode has a row), ``incomplete`` (a part of a
    run: ``only_scenes``), ``interrupted`` (a stop request; the rows so far are kept), ``aborted`` (a preflight
    check, an embedded server, the error budget or a failure outside an episode: ``error`` says which, in one
    line), ``usage`` (the config cannot run against these servers: an open-loop horizon longer than their
    chunks, or a server no profile matches without ``--server-kind``). ``run_dir`` is None when nothing was written; ``exception`` is what ended the run, if anything."""

    status: str
    run_dir: RunDir | None = None
    summary: dict[str, Any] | None = None
    error: str | None = None
    exception: BaseException | None = None


def _default_say(message: str) -> None:
    print(f"dz-gym-eval: {message}", file=sys.stderr, flush=True)


def preflight(config: EvalConfig, metadata: list | None = None) -> str | None:
    """Why ``config`` cannot run here (one line), or None; nothing is written either way. The servers'
    handshakes go into ``metadata`` when given."""
    from dz_gym.eval.plan import is_url
    from dz_gym.eval.preflight import check_backend, check_servers
    from dz_gym.eval.tracking import log_problem

    urls = config.policies.servers + config.policies.servers_b + [v for _, v in config.arm_table() if is_url(v)]
    return (check_backend(config.plan.backend) or log_problem(config.outputs.log)
            or check_servers(urls, config.transport_config(), metadata))  # fmt: skip


def _asked_resolution(config: EvalConfig, meta) -> tuple[int, int] | None:
    """The view size a server asks for: its profile's (FLUX servers' handshakes name none), else its
    handshake's ``image_resolution``; None where its handshake matches no profile (the run says so later)."""
    from dz_gym.protocol.profiles import detect_profile

    try:
        profile = detect_profile(getattr(meta, "raw", None), server_kind=config.policies.server_kind)
    except UnknownServer:
        return None
    return profile.render_resolution or getattr(meta, "image_resolution", None)


def render_shape_from_servers(config: EvalConfig, metadata: list) -> str | None:
    """A new run on the embedded simulator without ``--render-shape`` renders the views its servers ask for
    (:func:`~dz_gym.envs.render_shape.render_shape_for` of their profiles' or handshakes' ``image_resolution``) when they
    all ask for the same size and it is not the default: sets ``config.plan.render_shape`` and says so (a line), else
    None. DreamZero's 180x320 (and a handshake that names no size) leave the config as it was."""
    from dz_gym.envs.backends import traits
    from dz_gym.envs.render_shape import render_shape_for

    if config.plan.render_shape is not None or not traits(config.plan.backend).render_shape_kwarg or not metadata:
        return None
    shapes = {render_shape_for(_asked_resolution(config, meta)) for meta in metadata}
    if len(shapes) != 1 or (shape := shapes.pop()) == tuple(droid.DEFAULT_EMBEDDED_IMAGE_SHAPE):
        return None
    config.plan.render_shape = list(shape)
    return f"the servers ask for {shape[0]}x{shape[1]} views: the embedded simulator renders at that size"


def _status(summary: Mapping[str, Any] | None) -> str:
    if summary is None:
        return "aborted"
    if summary.get("interrupted"):
        return "interrupted"
    if summary.get("aborted"):
        return "aborted"
    return "complete" if summary.get("complete") else "incomplete"


def _open_logs(config: EvalConfig, run_dir: RunDir, control: RunControl | None):
    """The ``--log`` trackers of this run segment, hooked on ``control``'s rows; None without ``--log``."""
    if not config.outputs.log:
        return None
    from dz_gym.eval.tracking import open_logs

    log = open_logs(config.outputs.log, run_dir.path, config.to_flat_dict(), config.outputs.log_project)
    if control is not None:
        log.attach(control)
    return log


def _close_logs(log, run_dir: RunDir, summary: Mapping[str, Any] | None) -> None:
    if log is not None:
        log.finish(run_dir.path, run_dir.read_rows(), summary if summary is not None else run_dir.read_summary())


def _open_run_dir(config: EvalConfig, run_dir: RunDir | str | Path | None, output_root, quiet: bool, say):
    """(the run directory, whether it is new): a new one, or the resumed one with the config saved again."""
    retries = config.retries_assumption()
    if run_dir is None:
        made = RunDir.create(output_root or DEFAULT_OUTPUT_ROOT, config)
        say(f"run directory {made.path}")
        if retries is not None:
            say(f"--episode-retries {retries['episode_retries']} assumes {retries['assumes']}")
        return made, True
    resumed = run_dir if isinstance(run_dir, RunDir) else RunDir(run_dir)
    resumed.save_config(config)
    if not quiet:
        say(f"resuming {resumed.path}")
        if retries is not None:
            say(f"--episode-retries {retries['episode_retries']} assumes {retries['assumes']}")
    return resumed, False


def _child_argv(serve_args: Sequence[str], progress: bool | None) -> list[str]:
    """The flags a scene's child process needs beyond its run directory's config."""
    out = [f"--serve-arg={arg}" for arg in serve_args]
    if progress is not None:
        out.append("--progress" if progress else "--no-progress")
    return out


def _scene_processes(config, run_dir: RunDir, argv, command: str, say, at_once: int | None = None) -> RunResult:
    """Each scene in a fresh ``dz-gym-eval --resume RUN_DIR --only-scene S`` process, ``at_once`` of them at the
    same time (default: all, side by side), as one run segment of this process (the children start their own
    embedded servers; this process plans the scenes only)."""
    from dz_gym.eval.plan import plan_of
    from dz_gym.eval.processes import SceneProcesses
    from dz_gym.eval.segment import RunSegment, run_segment

    plan = plan_of(config)  # the children resolve its servers: their own embedded ones, or the config's
    plain = lambda line: say(line.removeprefix("dz-gym-eval: "))  # noqa: E731 - the executor's lines name the command
    segment = RunSegment(config, run_dir, plan, servers=config.policies.servers, servers_b=config.policies.servers_b,
                         progress=False, log=plain, command=command, inherit=True)  # fmt: skip
    executor = SceneProcesses(argv, command, plain, at_once)
    summary = None
    log = _open_logs(config, run_dir, None)  # the children's rows are logged from the run directory at the end
    try:
        summary = run_segment(segment, executor)
    except KeyboardInterrupt:
        summary = run_dir.read_summary()
    finally:
        _close_logs(log, run_dir, summary)
    from dz_gym.eval.flags import EXIT_ABORTED, EXIT_INTERRUPTED, EXIT_OK, EXIT_USAGE

    code = executor.exit_code(summary)
    status = {EXIT_OK: "complete", EXIT_INTERRUPTED: "interrupted", EXIT_USAGE: "usage", EXIT_ABORTED: "aborted"}
    # a child says its own usage error
    error = None if code in (EXIT_OK, EXIT_USAGE) else (summary or {}).get("aborted")
    return RunResult(status[code], run_dir, summary, error)


def _in_this_process(config, run_dir: RunDir, servers: EmbeddedServersLike, control: RunControl) -> RunResult:
    """The in-process or sharded run of an open run directory, with its trackers; errors become the result."""
    from dz_gym.eval.evaluate import evaluate

    run = config.execution
    log = None if run.only_scenes else _open_logs(config, run_dir, control)  # a scene's child: its parent logs
    summary = None
    try:
        summary = evaluate(config, run_dir, servers.servers, servers_b=servers.servers_b,
                           arm_servers=servers.arm_servers, server_info=servers.info, control=control,
                           progress=run.progress, command=run.command)  # fmt: skip
    except KeyboardInterrupt:
        summary = run_dir.read_summary() or {"interrupted": True}
        summary["interrupted"] = True
    except Exception as exc:  # noqa: BLE001 - the result says what ended the run; the summary is written
        _close_logs(log, run_dir, None)
        if isinstance(exc, (HorizonError, UnknownServer)):
            return RunResult("usage", run_dir, run_dir.read_summary(), first_line(exc), exc)
        return RunResult("aborted", run_dir, run_dir.read_summary(), f"{type(exc).__name__}: {first_line(exc)}", exc)
    _close_logs(log, run_dir, summary)
    return RunResult(_status(summary), run_dir, summary, summary.get("aborted") or None)


def run_eval(
    config: EvalConfig,
    *,
    run_dir: RunDir | str | Path | None = None,
    output_root: str | Path | None = None,
    on_line: Callable[[str], None] | None = None,
) -> RunResult:
    """Run ``config`` (or the rest of ``run_dir``, resumed) as ``dz-gym-eval`` does; see the module docstring.

    ``output_root``: where a new run directory is made (default ``runs/dz_gym_eval``); ``on_line``: where the
    lines for the user go (default: stderr). How this process runs it is ``config.execution``
    (:class:`~dz_gym.eval.config.ExecutionSettings`: a process per scene, Ray shards, the embedded servers'
    arguments, progress bars, the env factory, the stop control ...): ``env_factory`` builds each scene's env in
    this process, called as ``env_factory(scene, config, **env_kwargs)`` with the scene's id and the run's
    :class:`~dz_gym.eval.config.EvalConfig`; it returns a batched env of ``config.plan.num_envs`` envs that follows
    :mod:`dz_gym.envs.base` (same-step autoreset, ``set_episode_seeds``; e.g. ``gym.make_vec(id,
    num_envs=config.plan.num_envs, max_episode_steps=config.plan.max_steps, seed=config.plan.seed)`` or
    :func:`~dz_gym.eval.scene.default_env_factory`, the default)."""
    say = on_line or _default_say
    run = config.execution
    if run.command is None:
        from dz_gym.eval.evaluate import python_command

        config = dataclasses.replace(config, execution=dataclasses.replace(run, command=python_command()))
    control = config.execution.control or RunControl(config.error_budget)
    resumed = run_dir if run_dir is None or isinstance(run_dir, RunDir) else RunDir(run_dir)
    problem = check_outputs(config, resumed, output_root)
    if problem is not None:  # before anything starts: nothing is written
        return RunResult("usage", error=problem)
    plain = lambda line: say(line.removeprefix("dz-gym-eval: "))  # noqa: E731 - a segment's lines name the command
    ledger = open_ledger(config, resumed, part=bool(run.only_scenes), say=plain)
    if ledger.error is not None:
        return RunResult("aborted", error=ledger.error)
    if ledger.finished:
        return RunResult("complete", resumed, ledger.summary)
    try:
        return _run(config, resumed, output_root, control, say)
    finally:
        ledger.release()


def _run(config: EvalConfig, run_dir, output_root, control: RunControl, say) -> RunResult:
    """:func:`run_eval` once the outputs and the ledger are checked (the resumed run's lock held)."""
    metadata: list = []
    try:
        with interruptible():
            problem = preflight(config, metadata)
    except KeyboardInterrupt:
        return RunResult("interrupted", error="stopped before the run started; nothing was written")
    if problem is not None:
        return RunResult("aborted", error=problem)
    if run_dir is None and (line := render_shape_from_servers(config, metadata)) is not None:
        say(line)  # a resumed run keeps the render shape its config saved
    if control.stop.is_set():
        return RunResult("interrupted", error="stopped before the run started; nothing was written")
    from dz_gym.eval.executors import SCENE_PROCESSES, choose_executor

    run = config.execution
    if choose_executor(config) == SCENE_PROCESSES:  # the children start their own embedded servers
        opened, created = _open_run_dir(config, run_dir, output_root, False, say)
        child = list(run.argv) if run.argv is not None else _child_argv(run.serve_args, run.progress)
        result = _scene_processes(config, opened, child, run.command, say, run.scene_processes)
        if result.status == "usage" and created and not opened.read_rows():  # a child's horizon error: nothing ran
            shutil.rmtree(opened.path, ignore_errors=True)
            result.run_dir = None
        return result
    from dz_gym.eval.embedded import EmbeddedServers

    servers = EmbeddedServers(config, run.serve_args, say)
    try:
        with interruptible():
            servers.__enter__()
    except KeyboardInterrupt:
        return RunResult("interrupted", error="stopped before the run started; nothing was written")
    except (RuntimeError, OSError, ValueError) as exc:
        return RunResult("aborted", error=f"cannot start the embedded server: {first_line(exc)}", exception=exc)
    try:
        if control.stop.is_set():
            return RunResult("interrupted", error="stopped before the run started; nothing was written")
        opened, created = _open_run_dir(config, run_dir, output_root, bool(run.only_scenes), say)
        result = _in_this_process(config, opened, servers, control)
    finally:
        servers.close()
    if result.status == "usage" and created and not opened.read_rows():
        shutil.rmtree(opened.path, ignore_errors=True)  # nothing ran: leave nothing behind
        result.run_dir = None
    return result
