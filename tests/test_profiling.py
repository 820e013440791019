"""The per-stage profiler (``dz-gym-eval --profile``) and the one-transfer host copy of the due views.

- :class:`~dz_gym.profiling.StageProfiler`'s arithmetic on known sums;
- the profiled wrapper gives the same actions and infos as the plain one (it only times);
- a real ``--profile`` run of the embedded MuJoCo backend against the embedded reference server: every stage
  is reported with a non-negative time, the caller's stages add up to the wall time, the counts match the
  rows, and the table names every stage. No speed is asserted;
- ``resized_views`` on torch tensors (one transfer into one host buffer) equals the per-camera host copies.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from dz_gym.envs import droid
from dz_gym.profiled_wrapper import ProfiledPolicyWrapper
from dz_gym.profiling import CALLER_STAGES, OFF_THREAD_STAGES, STAGES, StageProfiler, format_table
from dz_gym.requests import contiguous_runs, resized_views
from dz_gym.server.policies import HoldPolicy
from dz_gym.testing.memory_client import MemoryPolicyClient
from dz_gym.testing.toy_env import ToyDroidEnv
from dz_gym.wrapper import DreamZeroPolicyWrapper


def test_report_arithmetic():
    p = StageProfiler()
    p.add("env_step", 0.4)
    p.add("physics", 0.1)
    p.add("render", 0.2)
    p.add("encode", 0.05)
    p.add_wrapper(0.6)
    for requests in (2, 0, 2, 0):
        p.step_done(requests, 1000 * requests)
    p.reply(0.30, 250.0)
    p.reply(0.20, None)
    r = p.report(1.0, cpu_s=0.5)
    st = r["stages"]
    assert (r["steps"], r["rounds"], r["requests"], r["request_bytes"]) == (4, 2, 4, 4000)
    assert st["env_step"]["per_step_ms"] == pytest.approx(100.0)
    assert st["env_step"]["per_round_ms"] == pytest.approx(200.0)
    assert st["env_other"]["total_s"] == pytest.approx(0.1)
    assert st["bookkeeping"]["total_s"] == pytest.approx(0.4)  # the wall time outside the wrapper
    assert st["server"]["total_s"] == pytest.approx(0.25)
    assert st["network"]["total_s"] == pytest.approx(0.25)  # 0.5 s of round trips less the server's 0.25
    assert r["caller_s"] == pytest.approx(0.85)
    assert r["unaccounted_s"] == pytest.approx(0.15)
    assert r["cpu_ms_per_request"] == pytest.approx(125.0)
    assert st["send"]["share"] is None and st["encode"]["share"] == pytest.approx(0.05)
    table = format_table(r)
    for stage in STAGES:
        assert stage in table
    # the server's and the network's times overlap across requests in flight: the table gives them per request
    rows = {line.split()[0]: line.split()[1:] for line in table.splitlines()[2:] if line.split()}
    assert rows["network"][:3] == ["-", "-", "-"] and float(rows["network"][3]) == pytest.approx(62.5)
    assert rows["server"][:3] == ["-", "-", "-"] and float(rows["send"][0]) == pytest.approx(0.0)
    p.add("write_tail", 0.15)  # measured outside the wrapper: out of bookkeeping, which is what is left
    tail = p.report(1.0)
    assert tail["stages"]["bookkeeping"]["total_s"] == pytest.approx(0.25)
    assert tail["stages"]["write_tail"]["total_s"] == pytest.approx(0.15)
    assert tail["caller_s"] == pytest.approx(0.85) and tail["stages"]["write_tail"]["share"] == pytest.approx(0.15)
    with pytest.raises(ValueError, match="stage: expected one of"):
        p.add("bookkeeping", 1.0)  # derived, never added
    with pytest.raises(ValueError, match="stage: expected one of"):
        p.add("nope", 1.0)
    with pytest.raises(TypeError, match="profiler: expected"):
        ProfiledPolicyWrapper(ToyDroidEnv(1), client=MemoryPolicyClient(HoldPolicy(), num_envs=1), profiler=object())


def _run(wrapper_cls, **kwargs):
    env = ToyDroidEnv(3, max_episode_length=12, image_shape=(18, 32))
    wrapper = wrapper_cls(env, client=MemoryPolicyClient(HoldPolicy(), num_envs=3), prefetch=2,
                          session_id_factory=iter(f"s{i}" for i in range(100)).__next__, **kwargs)  # fmt: skip
    wrapper.reset(seed=0)
    wrapper.set_idle([False, False, True])
    out = []
    for _ in range(30):
        _, reward, terminated, truncated, info = wrapper.step()
        out.append((info["policy_action"].copy(), info["policy_called"].copy(), np.asarray(reward).copy(),
                    np.asarray(terminated).copy(), list(info["session_id"])))  # fmt: skip
    wrapper.close()
    return out


def test_profiled_wrapper_changes_nothing():
    profiler = StageProfiler()
    plain, profiled = _run(DreamZeroPolicyWrapper), _run(ProfiledPolicyWrapper, profiler=profiler)
    for a, b in zip(plain, profiled, strict=True):
        for x, y in zip(a, b, strict=True):
            np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
    called = sum(int(step[1].sum()) for step in plain)
    assert profiler.steps == 30 and profiler.requests == called > 0


@pytest.mark.slow
@pytest.mark.parametrize("processes", [0, 2])
def test_profile_flag_end_to_end(tmp_path, capsys, processes):
    """With ``--transport-processes`` the workers' sends are in ``send`` and their CPU is the transport's;
    the hand-off to them is part of ``encode``."""
    pytest.importorskip("mujoco")
    from dz_gym.eval import cli
    from dz_gym.eval.rundir import RunDir

    args = ["--num-envs", "2", "--episodes", "2", "--max-steps", "16", "--scene", "1", "--no-video", "--no-report",
            "--no-progress", "--profile", "--output-root", str(tmp_path),
            "--transport-processes", str(processes)]  # fmt: skip
    assert cli.main(args) == 0
    printed = capsys.readouterr().out
    (run_path,) = [p for p in tmp_path.iterdir() if p.is_dir()]
    report = json.loads((run_path / "profile.json").read_text())["scenes"]["1"]
    rows = RunDir(run_path).read_rows()
    assert report["steps"] == 16 and report["num_envs"] == 2
    assert report["requests"] == sum(r["server_calls"] for r in rows) == report["replies"] > 0
    assert report["rounds"] == 2  # both envs ask at steps 0 and 8
    stages = report["stages"]
    assert set(stages) == set(STAGES)
    for name, row in stages.items():
        for key in ("total_s", "per_step_ms", "per_round_ms", "per_request_ms"):
            assert row[key] >= 0.0, (name, key)
    # in-process, submit is the hand-off to the loop thread; with processes, the copies and the pipe writes
    for name in ("env_step", "encode", "submit", "wait", "send", "network", "bookkeeping", "reset", "write_tail"):
        assert stages[name]["total_s"] > 0.0, name  # write_tail: the runner's end waited for the episode writer
    caller = sum(stages[s]["total_s"] for s in CALLER_STAGES if s not in ("physics", "render", "env_other"))
    assert caller == pytest.approx(report["caller_s"])
    assert caller <= report["wall_s"] * (1 + 1e-6) + 1e-6  # the caller's stages never exceed the wall time
    assert report["caller_s"] + report["unaccounted_s"] == pytest.approx(report["wall_s"])
    assert all(stages[s]["share"] is None for s in OFF_THREAD_STAGES)
    assert report["cpu_s"] > 0
    # the loop thread's clock is exact; the workers' (/proc, in clock ticks) may read 0 over so short a run
    assert report["loop_cpu_s"] > 0 if processes == 0 else report["loop_cpu_s"] >= 0
    assert report["request_bytes"] >= report["requests"] * 3 * 180 * 320 * 3
    assert "profile of scene 1 (N=2)" in printed and "client CPU" in printed and "collector pauses:" in printed
    assert len(report["collector"]["passes"]) == len(report["collector"]["seconds"]) == 3
    for name in ("env_step", "gpu_to_host", "encode", "wait", "send", "bookkeeping"):
        assert name in printed


def _per_camera(policy, ids, resolution):
    """The views as the per-camera, per-run host copies give them (what resized_views did before)."""
    import torch

    from dz_gym.preprocess import resize_with_pad_to_numpy

    out = {}
    for camera in droid.CAMERA_KEYS:
        parts = []
        for start, stop in contiguous_runs(ids):
            block = policy[camera][start:stop]
            parts.append(block.numpy().copy() if resolution is None else resize_with_pad_to_numpy(block, *resolution))
        out[camera] = np.concatenate(parts)
        assert isinstance(policy[camera], torch.Tensor)
    return out


@pytest.mark.parametrize("resolution", [None, (12, 20)])
def test_views_one_transfer_equal_per_camera_copies(resolution):
    torch = pytest.importorskip("torch")
    gen = torch.Generator().manual_seed(0)
    policy = {camera: torch.randint(0, 256, (7, 18, 32, 3), generator=gen, dtype=torch.uint8)
              for camera in droid.CAMERA_KEYS}  # fmt: skip
    ids = [5, 0, 1, 3, 6]  # unsorted, with gaps: runs (0,2), (3,4), (5,7)
    views = resized_views(policy, ids, resolution)
    expected = _per_camera(policy, ids, resolution)
    for camera in droid.CAMERA_KEYS:
        np.testing.assert_array_equal(views[camera], expected[camera])
        assert views[camera].flags.c_contiguous and views[camera].dtype == np.uint8
        assert views[camera][1].flags.c_contiguous  # each env's view goes to msgpack as one buffer


class _Sim:
    def __init__(self):
        self.calls = 0

    def step(self, render=False):
        self.calls += 1


class _Observations:
    def compute(self, update_history=False):
        return {"policy": {}}


class _IsaacLike:
    """What instrument_env reads of an Isaac Lab env (the real one needs a GPU): sim.step, observation_manager."""

    def __init__(self):
        self.isaac_env = self
        self.sim = _Sim()
        self.observation_manager = _Observations()
        self.unwrapped = self


def test_env_hooks_count_inside_the_step_only_and_rebind():
    from dz_gym.profile_hooks import instrument_env

    env = _IsaacLike()
    first, second = StageProfiler(), StageProfiler()
    stepping = [False]
    assert instrument_env(env, first, active=lambda: stepping[0]) == [
        "physics: sim.step",
        "render: observation_manager.compute",
    ]
    env.sim.step(render=False)  # outside a step (a reset): not counted
    stepping[0] = True
    env.sim.step(render=False)
    env.observation_manager.compute(update_history=True)
    assert first.total("physics") > 0 and first.total("render") > 0 and env.sim.calls == 2
    before = first.total("physics")
    instrument_env(env, second)  # a second run on the same env times into its own profiler
    env.sim.step()
    assert first.total("physics") == before and second.total("physics") > 0 and env.sim.calls == 3
    assert instrument_env(object(), second) == []


def test_batches_sent_as_dicts_are_counted_by_why_and_shown():
    profiler = StageProfiler()
    assert profiler.report(1.0)["batches_as_dicts"] == {}
    for why in ("views outside the view memory", "no frame template", "views outside the view memory"):
        profiler.batch_as_dicts(why)
    report = profiler.report(1.0)
    assert report["batches_as_dicts"] == {"views outside the view memory": 2, "no frame template": 1}
    assert "batches sent as dicts (views outside the view memory): 2" in format_table(report)
