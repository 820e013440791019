"""Where the evaluator's stages are timed into a :class:`~dz_gym.profiling.StageProfiler`.

- :func:`instrument_env`: on Isaac Lab (an env with ``isaac_env``), ``physics`` is the simulation's
  substeps (``sim.step``) and ``render`` the observation manager's compute, where the cameras render and
  the images are gathered; each waits for the GPU at its end, so its kernels are charged to it. Other
  backends keep both inside ``env_step``.
- :func:`timed_requests`: the due envs' requests with their host copy (``gpu_to_host``; ``preprocess``
  when the server asks for another resolution) and building (``build``) timed apart.
- :func:`device_sync`, :func:`server_ms`, :func:`encoded_size`: what the wrapper needs around them.

Profiling adds one GPU synchronisation per stage boundary: a profiled run is a little slower than an
unprofiled one, and its table says where the time goes, not how fast the run can be.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from dz_gym.profiling import StageProfiler
from dz_gym.protocol.profiles import ServerProfile
from dz_gym.protocol.request_batch import RequestBatch
from dz_gym.requests import HostMemory, assemble_requests, proprio, resized_views

__all__ = ["device_sync", "encoded_size", "instrument_env", "server_ms", "timed_requests"]


def device_sync(env: Any) -> Callable[[], None] | None:
    """A call that waits for the env's GPU work, or None for a host env."""
    device = str(getattr(getattr(env, "unwrapped", env), "device", "cpu"))
    if not device.startswith("cuda"):
        return None
    import torch

    return functools.partial(torch.cuda.synchronize, device)


def encoded_size(requests: Mapping[int, Mapping[str, Any]]) -> int:
    """The requests' array bytes (their encoded size less the msgpack framing's few hundred bytes each); a
    :class:`~dz_gym.protocol.request_batch.RequestBatch` counts its columns without building its requests."""
    if isinstance(requests, RequestBatch):
        return requests.array_bytes()
    return sum(int(v.nbytes) for request in requests.values() for v in request.values() if isinstance(v, np.ndarray))


def server_ms(reply: Any) -> float | None:
    """A reply's ``server_timing.infer_ms``; None when the server sent none."""
    timing = getattr(reply, "server_timing", None)
    value = timing.get("infer_ms") if isinstance(timing, dict) else None
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def timed_requests(
    profiler: StageProfiler,
    policy: Mapping[str, Any],
    env_ids: Sequence[int],
    *,
    prompts: Sequence[str],
    session_ids: Sequence[str],
    image_resolution: tuple[int, int] | None,
    image_keys: Mapping[str, str] | None,
    host_memory: HostMemory | None = None,
    profile: ServerProfile | None = None,
) -> Mapping[int, dict]:
    """:func:`dz_gym.requests.build_requests`, its parts timed (see the module docstring); ``profile`` is the
    server's, as there."""
    with profiler.stage("gpu_to_host" if image_resolution is None else "preprocess"):
        views = resized_views(policy, env_ids, image_resolution, host_memory=host_memory)
    with profiler.stage("gpu_to_host"):
        joints, gripper = proprio(policy)
    with profiler.stage("build"):
        return assemble_requests(views, joints, gripper, env_ids, prompts=prompts, session_ids=session_ids,
                                 image_keys=image_keys, profile=profile)  # fmt: skip


def _timed(profiler: StageProfiler, stage: str, call: Callable, sync, active: Callable[[], bool]) -> Callable:
    @functools.wraps(call)
    def timed(*args, **kwargs):
        if not active():
            return call(*args, **kwargs)
        start = time.perf_counter()
        try:
            return call(*args, **kwargs)
        finally:
            if sync is not None:
                sync()
            profiler.add(stage, time.perf_counter() - start)

    timed.__dz_gym_profiled__ = True
    return timed


def instrument_env(env: Any, profiler: StageProfiler, active: Callable[[], bool] = lambda: True) -> list[str]:
    """Time an Isaac Lab env's physics and rendering into ``profiler`` while ``active()`` (the wrapper's env
    step: resets are not counted) by instance attributes only (the classes are untouched; a later call, e.g.
    the next run on the same env, replaces the earlier hooks); the hooks
    installed, e.g. ``["physics: sim.step", "render: observation_manager.compute"]``."""
    isaac = getattr(getattr(env, "unwrapped", env), "isaac_env", None)
    if isaac is None:
        return []
    sync = device_sync(env)
    hooks = []
    for stage, owner_name, method in (("physics", "sim", "step"), ("render", "observation_manager", "compute")):
        owner = getattr(isaac, owner_name, None)
        call = getattr(owner, method, None)
        if call is None:
            continue
        if getattr(call, "__dz_gym_profiled__", False):  # an earlier profiler's hook: time into this one now
            call = call.__wrapped__
        setattr(owner, method, _timed(profiler, stage, call, sync, active))
        hooks.append(f"{stage}: {owner_name}.{method}")
    return hooks
