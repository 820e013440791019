"""Client cost of request rounds at large N: the profiled wrapper on the toy env against a hold server process.

:class:`~dz_gym.testing.toy_env.ToyDroidEnv` with N envs and 180x320 views (no simulator: the env's own step
is a few numpy writes) runs under :class:`~dz_gym.profiled_wrapper.ProfiledPolicyWrapper` with a
:class:`~dz_gym.transport.SessionPool` of N sessions, against ``dz-gym-serve --policy hold`` in a process of its
own (its CPU is not counted). Every 8th batch step is a request round of N ~0.5 MB requests, encoded and
handed off in one ``submit_many``, as ``dz-gym-eval --profile`` runs them. After two warm-up rounds it
prints, per request, the profile's ``encode`` (caller's thread) and ``send`` (the loop thread's websocket
writes, wall time) stages, the client process's CPU (all threads, the env's steps included), the loop
thread's CPU and the page faults, and the wall time per batch step.

Usage: python benchmarks/bench_round.py [--num-envs 256] [--steps 48]
"""

from __future__ import annotations

import argparse
import json
import resource
import time

from dz_gym.profiled_wrapper import ProfiledPolicyWrapper
from dz_gym.profiling import StageProfiler
from dz_gym.server.launch import start_server_process
from dz_gym.testing.toy_env import ToyDroidEnv
from dz_gym.transport import SessionPool, TransportConfig

PATH = "/v1/realtime/robot/openpi"  # vLLM-Omni's route: sessions by id, so the N envs share one server
WARMUP_STEPS = 16  # two request rounds: connections opened, the heap grown to a round's size


def thread_cpu(thread_id: int):
    clock = time.pthread_getcpuclockid(thread_id)
    return lambda: time.clock_gettime(clock)


def run(num_envs: int, steps: int) -> dict:
    server = start_server_process(["--policy", "hold", "--workers", "8", "--quiet"], timeout=60)
    try:
        env = ToyDroidEnv(num_envs, max_episode_length=100_000, image_shape=(180, 320))
        profiler = StageProfiler()
        pool = SessionPool([server.url + PATH], num_envs, TransportConfig(request_timeout=120))
        wrapper = ProfiledPolicyWrapper(env, client=pool, profiler=profiler, image_resolution=None)
        try:
            wrapper.reset(seed=0)
            for _ in range(WARMUP_STEPS):
                wrapper.step()
            loop_cpu = thread_cpu(pool.loop_thread_id)
            stages = ("encode", "send")
            before = {s: profiler.total(s) for s in stages}
            requests0, faults0 = profiler.requests, resource.getrusage(resource.RUSAGE_SELF).ru_minflt
            wall0, cpu0, loop0 = time.perf_counter(), time.process_time(), loop_cpu()
            for _ in range(steps):
                wrapper.step()
            wall, cpu, loop = time.perf_counter() - wall0, time.process_time() - cpu0, loop_cpu() - loop0
            requests = profiler.requests - requests0
            faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults0
            per_request = {f"{s}_ms": (profiler.total(s) - before[s]) / requests * 1e3 for s in stages}
        finally:
            wrapper.close()
    finally:
        server.stop(10)
    return {
        "num_envs": num_envs,
        "requests": requests,
        **per_request,
        "client_cpu_ms": cpu / requests * 1e3,
        "loop_cpu_ms": loop / requests * 1e3,
        "page_faults": faults / requests,
        "wall_ms_per_step": wall / steps * 1e3,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num-envs", type=int, default=256, help="envs and sessions (default 256)")
    parser.add_argument("--steps", type=int, default=48, help="measured batch steps after the warm-up (default 48)")
    args = parser.parse_args()
    row = run(args.num_envs, args.steps)
    print(json.dumps({k: round(v, 3) if isinstance(v, float) else v for k, v in row.items()}))


if __name__ == "__main__":
    main()
