"""Shards on GPUs, on a local Ray instance that declares two GPUs (a logical resource: this machine has none)
and renders with OSMesa, so the EGL device id each shard is given is checked, never opened: every shard
records the GPU Ray gave it in its rows, its rendering processes (the actor, or the env's worker processes)
run with that GPU's ``MUJOCO_EGL_DEVICE_ID``, and the rows are the same whatever the shard count and the
number of GPUs they are spread over.

One Ray instance and one reference server for the module; each run is short (2 envs, 4 episodes of 16 steps).
"""

from __future__ import annotations

import os

import pytest

LOOPBACK_ENV = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "RAY_USAGE_STATS_ENABLED": "0"}
for _key, _value in LOOPBACK_ENV.items():  # read by Ray at import: node addresses become 127.0.0.1
    os.environ.setdefault(_key, _value)

pytest.importorskip("mujoco")
ray = pytest.importorskip("ray")

from dz_gym.eval.config import EvalConfig  # noqa: E402
from dz_gym.eval.row import VOLATILE, comparable  # noqa: E402
from dz_gym.eval.rundir import RunDir  # noqa: E402
from dz_gym.eval.shards.driver import evaluate_sharded  # noqa: E402
from dz_gym.eval.shards.options import RayOptions  # noqa: E402
from dz_gym.server.launch import start_server_process  # noqa: E402

PATH = "/v1/realtime/robot/openpi"


def stable(rows):
    """What the runs share whatever the shard count and the GPUs: every field but the volatile ones (the node
    and the GPU are volatile) and the shard; the global slot, the server and the files' paths stay."""
    return comparable(rows, ignore={"shard"})


@pytest.fixture(scope="module")
def two_gpus():
    """A private Ray instance with 2 CPUs and 2 declared GPUs; its workers render with OSMesa."""
    if ray.is_initialized():
        ray.shutdown()
    rendering = {"MUJOCO_GL": "osmesa", "PYOPENGL_PLATFORM": "osmesa"}
    ray.init(
        address="local",
        num_cpus=2,
        num_gpus=2,
        include_dashboard=False,
        runtime_env={"env_vars": rendering},
    )
    try:
        yield
    finally:
        ray.shutdown()


@pytest.fixture(scope="module")
def server():
    with start_server_process(["--policy", "reference", "--quiet"]) as srv:
        yield srv.url + PATH


def run(server, root, **options):
    cfg = EvalConfig(scenes=[1], episodes=4, num_envs=2, max_steps=16, video=False, report=False, policy="reference")
    run_dir = RunDir.create(root, cfg)
    summary = evaluate_sharded(
        cfg, run_dir, [server], RayOptions(address="local", **options), progress=False, log=lambda _: None
    )
    assert summary["complete"] and summary["aborted"] is None
    rows = run_dir.read_rows()
    assert len(rows) == 4 and all(r["error"] is None and r["steps"] == 16 for r in rows)
    return rows, summary["shards"]


@pytest.mark.slow  # 8-17 s; runs in the first environment's pass
def test_shards_render_on_their_gpus_and_rows_do_not_depend_on_k_or_the_gpus(two_gpus, server, tmp_path):
    # the MuJoCo default on a node with 2 GPUs: one shard per GPU, a whole GPU each
    spread, shards = run(server, tmp_path / "spread")
    assert shards["count"] == 2 and shards["gpus_per_shard"] == 1.0
    by_shard = {s["shard"]: s for s in shards["per_shard"]}
    assert {by_shard[0]["gpu"], by_shard[1]["gpu"]} == {"0", "1"}
    for r in spread:
        assert r["gpu"] == by_shard[r["shard"]]["gpu"]
    for s in shards["per_shard"]:  # one CPU each: the actor renders itself, with its GPU's EGL device id
        assert [d["egl_device_id"] for d in s["render_devices"]] == [s["gpu"]]
        assert s["render_devices"][0]["backend"] == "osmesa"

    # one shard on one GPU, its envs in two worker processes: both inherit the GPU's EGL device id
    single, shards = run(server, tmp_path / "one", shards=1, shard_gpus=1)
    (only,) = shards["per_shard"]
    assert only["gpu"] in ("0", "1") and {r["gpu"] for r in single} == {only["gpu"]}
    assert [d["egl_device_id"] for d in only["render_devices"]] == [only["gpu"]] * 2

    # two shards sharing GPUs (half a GPU each), and no GPU at all
    shared, shards = run(server, tmp_path / "half", shard_gpus=0.5)
    assert shards["count"] == 2 and shards["gpus_per_shard"] == 0.5
    assert all(r["gpu"] in ("0", "1") for r in shared)
    none, shards = run(server, tmp_path / "none", shards=2, shard_gpus=0)
    assert {r["gpu"] for r in none} == {None}
    assert all(d["egl_device_id"] is None for s in shards["per_shard"] for d in s["render_devices"])

    assert "gpu" in VOLATILE and "node" in VOLATILE  # declared where the row is
    assert stable(spread) == stable(single) == stable(shared) == stable(none)
