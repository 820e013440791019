"""Client overhead of DreamZeroPolicyWrapper per env-step, excluding the env and the server.

Runs the wrapper on the Isaac stand-in (torch CPU tensors, 720x1280 views, as Isaac Lab delivers them) against a
zero-latency reference server in another process, at N=1 and N=8. The env's own step is timed separately
and subtracted; the server runs in its own process, so what remains is the client: preprocessing, request
building, encoding, the transport (both threads) and the chunk bookkeeping. Two figures:

- per replanning env: client CPU on steps that query the server / envs that queried (target < 1 ms);
- per cached step: client CPU per env on steps that only use the cache (target < 50 us).

Views of 720x1280 (Isaac Lab's cameras) include the resize to 180x320 on the CPU; views of 180x320 (the
embedded simulator's default) need none, which isolates the rest of the client. A last measurement times cached
steps alone on an env that replays one step (no env cost, no stand-in tensors to validate afresh).

Baseline, in the same process: the reference single-env client's per-step logic (openpi-client
``resize_with_pad`` and ``msgpack_numpy`` over a synchronous websocket) on the same stand-in and server.

Usage: python benchmarks/bench_wrapper.py [--steps 96]
"""

from __future__ import annotations

import argparse
import time
import uuid

import gymnasium as gym
import numpy as np
import torch

from dz_gym.server.launch import start_server_process
from dz_gym.testing.isaac_standin import IsaacDroidStandIn
from dz_gym.wrapper import DreamZeroPolicyWrapper

PATH = "/v1/realtime/robot/openpi"


class TimedEnv(gym.Wrapper):
    """Accumulates the CPU time of the env's own step (all threads of this process)."""

    def __init__(self, env):
        super().__init__(env)
        self.cpu = 0.0

    def step(self, action):
        start = time.process_time()
        out = self.env.step(action)
        self.cpu += time.process_time() - start
        return out


def measure_wrapper(url: str, num_envs: int, steps: int, image_shape=(720, 1280)) -> tuple[float, float]:
    base = IsaacDroidStandIn(scene=1, num_envs=num_envs, max_episode_length=10_000, image_shape=image_shape)
    timed = TimedEnv(base)
    env = DreamZeroPolicyWrapper(timed, server=url + PATH)
    env.reset(seed=0)
    replan_cpu = cached_cpu = 0.0
    replan_envs = cached_steps = 0
    for _ in range(steps):
        env_cpu_before = timed.cpu
        start = time.process_time()
        _, _, _, _, info = env.step()
        client = time.process_time() - start - (timed.cpu - env_cpu_before)
        called = int(info["policy_called"].sum())
        if called:
            replan_cpu += client
            replan_envs += called
        else:
            cached_cpu += client
            cached_steps += num_envs
    env.close()
    return replan_cpu / replan_envs, cached_cpu / max(cached_steps, 1)


class ReplayEnv(gym.Wrapper):
    """Steps the env once, then returns that step's result again: an env that costs nothing."""

    def __init__(self, env):
        super().__init__(env)
        self.last = None

    def step(self, action):
        if self.last is None:
            self.last = self.env.step(action)
        return self.last


def measure_cached_isolated(url: str, num_envs: int, steps: int = 5000) -> float:
    """Client CPU per env-step on cached steps with a no-op env (nothing else runs in this process)."""
    base = IsaacDroidStandIn(scene=1, num_envs=num_envs, max_episode_length=10_000, image_shape=(180, 320))
    env = DreamZeroPolicyWrapper(ReplayEnv(base), server=url + PATH, open_loop_horizon=24)
    env.reset(seed=0)
    env.step()  # the one request of the chunk
    cpu = 0.0
    for _ in range(steps // 20):
        for _ in range(20):  # rows 1..20 of the 24-row window: no request
            start = time.process_time()
            env.step()
            cpu += time.process_time() - start
        env.reset(seed=0)
        env.step()
    env.close()
    return cpu / ((steps // 20) * 20 * num_envs)


def measure_reference(url: str, steps: int) -> tuple[float, float]:
    import websockets.sync.client
    from openpi_client import image_tools, msgpack_numpy

    env = IsaacDroidStandIn(scene=1, num_envs=1, max_episode_length=10_000)
    obs, _ = env.reset(seed=0)
    packer = msgpack_numpy.Packer()
    session = str(uuid.uuid4())
    replan_cpu = cached_cpu = 0.0
    replans = cached = 0
    with websockets.sync.client.connect(url + PATH, compression=None, max_size=None) as conn:
        msgpack_numpy.unpackb(conn.recv())
        chunk, completed = None, 0
        for _ in range(steps):
            start = time.process_time()
            policy = obs["policy"]
            views = [
                policy[k][0].clone().detach().cpu().numpy() for k in ("external_cam", "external_cam_2", "wrist_cam")
            ]
            joints = policy["arm_joint_pos"][0].clone().detach().cpu().numpy()
            gripper = policy["gripper_pos"][0].clone().detach().cpu().numpy()
            replan = chunk is None or completed >= 8
            if replan:
                completed = 0
                request = {
                    "observation/exterior_image_0_left": image_tools.resize_with_pad(views[0], 180, 320),
                    "observation/exterior_image_1_left": image_tools.resize_with_pad(views[1], 180, 320),
                    "observation/wrist_image_left": image_tools.resize_with_pad(views[2], 180, 320),
                    "observation/joint_position": joints.astype(np.float64),
                    "observation/cartesian_position": np.zeros(6),
                    "observation/gripper_position": gripper.astype(np.float64),
                    "prompt": "put the cube in the bowl",
                    "session_id": session,
                    "endpoint": "infer",
                }
                conn.send(packer.pack(request))
                chunk = np.asarray(msgpack_numpy.unpackb(conn.recv()), dtype=np.float32)
            action = np.array(chunk[completed], copy=True)
            completed += 1
            action[-1] = 1.0 if action[-1] > 0.5 else 0.0
            tensor = torch.tensor(action, dtype=torch.float32)[None]
            elapsed = time.process_time() - start
            if replan:
                replan_cpu += elapsed
                replans += 1
            else:
                cached_cpu += elapsed
                cached += 1
            obs, *_ = env.step(tensor)
    return replan_cpu / replans, cached_cpu / max(cached, 1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=96, help="env steps per measurement (a replan every 8)")
    args = parser.parse_args()
    with start_server_process(["--policy", "hold", "--workers", "8", "--quiet"]) as server:
        measure_wrapper(server.url, 1, 16)  # warm-up: imports, first connections, caches
        ref_replan, ref_cached = measure_reference(server.url, args.steps)
        print(
            f"reference single-env client : {ref_replan * 1e3:7.3f} ms per replanning env, "
            f"{ref_cached * 1e6:7.1f} us per cached step"
        )
        for n, shape in ((1, (720, 1280)), (8, (720, 1280)), (1, (180, 320)), (8, (180, 320))):
            replan, cached = measure_wrapper(server.url, n, args.steps, shape)
            print(
                f"DreamZeroPolicyWrapper N={n} {shape[0]}x{shape[1]} views: {replan * 1e3:7.3f} ms per replanning env "
                f"(target < 1 ms; {replan / ref_replan:.2f}x the reference), "
                f"{cached * 1e6:7.1f} us per cached env-step (target < 50 us)"
            )
        for n in (1, 8):
            cached = measure_cached_isolated(server.url, n)
            print(f"DreamZeroPolicyWrapper N={n} cached steps on a no-op env: {cached * 1e6:7.1f} us per env-step")


if __name__ == "__main__":
    main()
