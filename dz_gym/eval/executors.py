"""Which executor runs a run segment's plan: :func:`choose_executor`, the one place that decides.

Three executors run the same plan into the same rows (:mod:`dz_gym.eval.segment`): in this process
(:class:`~dz_gym.eval.evaluate.InProcess`, the scenes side by side), one ``dz-gym-eval`` child process per scene
(:class:`~dz_gym.eval.processes.SceneProcesses`: a simulator that builds one scene per process, Isaac Lab, or
``--process-per-scene``), or shards on Ray (:class:`~dz_gym.eval.shards.driver.ShardedRun`, ``--ray``). The
choice reads only the config: its backend, its scenes and how this process runs it (``config.execution``).
:func:`dz_gym.eval.run.run_eval` and :func:`dz_gym.eval.evaluate.evaluate` both ask here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from dz_gym.eval.config import EvalConfig

__all__ = ["EXECUTORS", "IN_PROCESS", "RAY_SHARDS", "SCENE_PROCESSES", "choose_executor"]

IN_PROCESS = "in-process"
SCENE_PROCESSES = "scene-processes"
RAY_SHARDS = "ray-shards"
EXECUTORS = (IN_PROCESS, SCENE_PROCESSES, RAY_SHARDS)


def choose_executor(config: EvalConfig) -> str:
    """The executor of ``config``'s plan, one of :data:`EXECUTORS`.

    Ray shards when ``execution.ray`` is set; else a process per scene when the run has several scenes and the
    backend builds one scene per process (``one_scene_per_process``) or ``execution.process_per_scene`` says so,
    unless this process is itself one scene's (``only_scenes``) or builds its envs with an ``env_factory`` (which
    cannot cross into another process); else in this process.

    >>> from dz_gym.eval.config import EvalConfig
    >>> choose_executor(EvalConfig(scenes=[1, 2], backend="mujoco"))
    'in-process'
    >>> choose_executor(EvalConfig(scenes=[1, 2], backend="mujoco", process_per_scene=True))
    'scene-processes'
    """
    from dz_gym.envs.backends import traits

    run = config.execution
    if run.ray is not None:
        return RAY_SHARDS
    wanted = (
        traits(config.plan.backend).one_scene_per_process if run.process_per_scene is None else run.process_per_scene
    )
    if wanted and len(config.plan.scenes) > 1 and not run.only_scenes and run.env_factory is None:
        return SCENE_PROCESSES
    return IN_PROCESS
