"""One scene's batch, as every executor builds it: the env, the policy client, the wrapper, the runner.

:func:`run_scene` is the body shared by the in-process executor (:mod:`dz_gym.eval.evaluate`) and a Ray shard
(:mod:`dz_gym.eval.shards.worker`): it builds the scene's batched env (:func:`default_env_factory` unless the
caller passes another), connects it to the servers the run plan gives its slots (an A/B run's two arms behind
one :class:`~dz_gym.eval.clients.ArmRouter`; a run that sends sampling fields through
:class:`~dz_gym.eval.clients.RequestFields`), runs the slots' plan entries with
:class:`~dz_gym.eval.runner.SceneRunner` and closes everything, also on failure. :func:`scene_batch` is the
same batch held open, for an executor that steps several scenes' batches side by side
(:mod:`dz_gym.eval.sidebyside`). The pools of the batch get the host-process settings in effect
(:mod:`dz_gym.host_process`: page-locking of their view memory).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from dz_gym import host_process
from dz_gym.eval.config import EnvFactory, EvalConfig
from dz_gym.eval.plan import PlanEntry
from dz_gym.eval.runner import SceneRunner
from dz_gym.eval.signals import interruptible, shielded
from dz_gym.eval.summary import metadata_dict
from dz_gym.eval.timing import SceneResult

__all__ = ["EnvFactory", "default_env_factory", "policy_client", "run_scene", "scene_batch"]


def default_env_factory(scene: int, config: EvalConfig, **backend_kwargs: Any):
    """``make_droid_env`` for ``config.plan.backend``; the embedded simulator gets the episode length directly, and
    its views' size when ``config.plan.render_shape`` sets one."""
    from dz_gym.envs.backends import traits

    backend = traits(config.plan.backend)
    kwargs = dict(backend_kwargs)
    for keyword, field in backend.config_kwargs.items():
        kwargs.setdefault(keyword, config.get(field))
    if config.plan.render_shape is not None:
        kwargs.setdefault(backend.render_shape_kwarg, tuple(config.plan.render_shape))
    return backend.make_env(scene, config.plan.num_envs, **kwargs)


def policy_client(config: EvalConfig, slot_servers: Sequence[str]):
    """The policy client of an A/B run, of a run that sends sampling fields or of one that spreads its
    sessions over worker processes (None: the wrapper's default).

    ``slot_servers``: the server of each env slot (the plan's); in an A/B run slot ``2j`` is arm A's slot ``j``
    and ``2j + 1`` arm B's; with ``K`` named arms slot ``K j + i`` is arm ``i``'s slot ``j``."""
    if not (
        config.armed
        or config.policies.policy_seed
        or config.policies.num_inference_steps is not None
        or config.transport_process_count()
    ):
        return None
    from dz_gym.eval.clients import build_client

    servers = list(slot_servers)
    arms = config.arms
    per_arm = len(servers) // max(1, len(arms))
    by_arm = {arm: [servers[len(arms) * j + i] for j in range(per_arm)] for i, arm in enumerate(arms)}
    arm_a, arm_b = (by_arm["a"], by_arm["b"]) if config.ab else (servers, [])
    return build_client(arm_a, arm_b, len(servers), config.transport_config(), policy_seed=config.policies.policy_seed,
                        num_inference_steps=config.policies.num_inference_steps,
                        arm_servers=by_arm if config.policies.arm_specs else None,
                        host=host_process.in_effect())  # fmt: skip


def _wrapper(env, config: EvalConfig, slot_servers: Sequence[str], client, profiler=None):
    from dz_gym.wrapper import DreamZeroPolicyWrapper

    connection = {"client": client} if client is not None else {"server": list(slot_servers),
                                                                 "transport": config.transport_config()}  # fmt: skip
    if profiler is not None:
        from dz_gym.profiled_wrapper import ProfiledPolicyWrapper

        connection["profiler"] = profiler
    return (DreamZeroPolicyWrapper if profiler is None else ProfiledPolicyWrapper)(
        env,
        **connection,
        open_loop_horizon=config.schedule.open_loop_horizon,
        server_kind=config.policies.server_kind,
        prefetch=config.schedule.prefetch,
        simulated_delay=config.schedule.simulated_delay,
        latency_honest_hz=config.latency_honest_hz,
        max_stale_steps=config.schedule.max_stale_steps,
    )


@contextlib.contextmanager
def scene_batch(
    config: EvalConfig,
    scene: int,
    queues: Sequence[Sequence[PlanEntry]],
    slot_servers: Sequence[str],
    *,
    env_factory: EnvFactory | None = None,
    env_kwargs: Mapping[str, Any] | None = None,
    server_metadata: dict[str, Any],
    before_connect: Callable[[Any], None] | None = None,
    **runner_kwargs: Any,
) -> Iterator[SceneRunner | None]:
    """Build ``scene``'s batch of ``len(queues)`` envs, connect it and yield its runner (None: a stop came
    while the simulator was built); everything is closed on the way out (see :func:`run_scene`)."""
    arms = config.arms
    if any(e.arm not in (None, *arms) for q in queues for e in q):
        raise ValueError(f"queues: expected arms in {arms}")
    factory = env_factory or default_env_factory
    env = factory(scene, config, **dict(env_kwargs or {}))
    wrapper = runner = None
    try:
        with interruptible():  # not while the batch is held: another scene's simulator may be starting then
            if before_connect is not None:
                before_connect(env)
            profiler = None
            if not runner_kwargs["control"].stop.is_set():
                client = policy_client(config, slot_servers)
                if config.outputs.profile:
                    from dz_gym.eval.profile_run import ProfileRun

                    profiler = ProfileRun(scene, runner_kwargs["run_dir"])
                wrapper = _wrapper(env, config, slot_servers, client, None if profiler is None else profiler.profiler)
                for i in range(wrapper.num_envs):  # each server's metadata once (N envs share a few servers)
                    if (url := wrapper.server_url(i)) not in server_metadata:
                        server_metadata[url] = {**metadata_dict(wrapper.server_metadata[i]),
                                                "profile": wrapper.profile.name,
                                                "open_loop_horizon": wrapper.open_loop_horizon}  # fmt: skip
                runner = SceneRunner(wrapper, scene=scene, queues=queues, max_steps=config.plan.max_steps,
                                     backend=config.plan.backend,
                                     on_episode_start=getattr(client, "begin_episode", None),
                                     episode_retries=config.errors.episode_retries, **runner_kwargs)  # fmt: skip
        # --profile: the span is this batch's whole stepping (with scenes side by side the process's CPU time
        # in it is every scene's)
        with contextlib.nullcontext() if profiler is None else profiler.span(wrapper):
            yield runner
    finally:
        with shielded():
            if wrapper is not None:
                wrapper.close()
            else:
                env.close()


def run_scene(
    config: EvalConfig,
    scene: int,
    queues: Sequence[Sequence[PlanEntry]],
    slot_servers: Sequence[str],
    **kwargs: Any,
) -> SceneResult:
    """Run ``queues`` (per slot, the plan entries of ``scene``) on a fresh batch of ``len(queues)`` envs.

    ``kwargs``: :func:`scene_batch`'s. ``server_metadata`` receives each server URL's metadata (the first seen
    per URL); ``before_connect(env)`` is called once the simulator is built, before the first connection (a
    shard's start line); the rest go to :class:`~dz_gym.eval.runner.SceneRunner` (``run_dir``, ``control``,
    ``recorder``, ``progress``, ``pairs``, ``placement``). Building the simulator is not interruptible (its
    workers start whole); the rest is, and everything is closed on the way out."""
    with scene_batch(config, scene, queues, slot_servers, **kwargs) as runner:
        if runner is None:
            return SceneResult(int(scene), stopped=True)
        with interruptible():
            return runner.run()
