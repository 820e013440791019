"""Sharded runs on a local two-node Ray cluster on loopback (``ray.cluster_utils.Cluster``), against the
reference server and the embedded MuJoCo simulator: rows equal a one-process run and come from both nodes,
a shard killed mid-run loses nothing (re-run by a new actor, or recorded as errored with the reason), a stop
request (what the first Ctrl-C does) then a resume completes the run with the same rows.

One cluster and one reference server for the module; every run is short (2 envs, 6 episodes of 16 steps).
The in-process stop + resume (the CLI test covers Ctrl-C + resume in every environment) and the Isaac Lab
stand-in run (its actors import torch) are marked slow.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path

import numpy as np
import pytest

LOOPBACK_ENV = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "RAY_USAGE_STATS_ENABLED": "0"}
for _key, _value in LOOPBACK_ENV.items():  # read by Ray at import: node addresses become 127.0.0.1
    os.environ.setdefault(_key, _value)

pytest.importorskip("mujoco")
ray = pytest.importorskip("ray")

from eval_process import BOUND_S, Evaluator  # noqa: E402

from dz_gym.eval import cli  # noqa: E402
from dz_gym.eval.config import EvalConfig  # noqa: E402
from dz_gym.eval.control import RunControl  # noqa: E402
from dz_gym.eval.evaluate import evaluate  # noqa: E402
from dz_gym.eval.row import EpisodeRow, comparable  # noqa: E402
from dz_gym.eval.rundir import RunDir  # noqa: E402
from dz_gym.eval.shards.driver import actor_name, evaluate_sharded  # noqa: E402
from dz_gym.eval.shards.options import RayOptions  # noqa: E402
from dz_gym.eval.shards.worker import TOKEN_FILE  # noqa: E402
from dz_gym.server.launch import start_server_process, start_server_thread  # noqa: E402
from dz_gym.server.policies import load_policy  # noqa: E402
from dz_gym.testing.gated import GatedPolicy  # noqa: E402

PATH = "/v1/realtime/robot/openpi"


def config(**kw) -> EvalConfig:
    values = {"scenes": [1], "episodes": 6, "num_envs": 2, "max_steps": 16, "video": False, "report": False}
    values["policy"] = "reference"
    values.update(kw)
    return EvalConfig(**values)


def stable(rows, *ignore):
    """What a sharded run and a one-process run of the same plan share (not the shard, not the server URL: the
    CLI runs start their own, nor where files went)."""
    return comparable(rows, ignore={"server", "shard", "video", "trajectory", *ignore})


@pytest.fixture(scope="module")
def cluster():
    """Two Ray nodes on 127.0.0.1 (one CPU each), this process connected as the driver."""
    from ray.cluster_utils import Cluster

    os.environ.setdefault("MUJOCO_GL", "egl")
    # One declared GPU per node: the Isaac Lab stand-in's shards ask for one each; MuJoCo shards share a node's
    # GPUs (one each here: EGL device 0, the one this machine has).
    head = {"num_cpus": 1, "num_gpus": 1, "resources": {"node_a": 1}, "include_dashboard": False}
    cluster = Cluster(initialize_head=True, head_node_args=head)
    try:
        cluster.add_node(num_cpus=1, num_gpus=1, resources={"node_b": 1})
        ray.init(address=cluster.address)
        assert {n["NodeManagerAddress"] for n in ray.nodes()} == {"127.0.0.1"}
        yield cluster
    finally:
        ray.shutdown()
        cluster.shutdown()


@pytest.fixture(scope="module")
def server():
    with start_server_process(["--policy", "reference", "--quiet"]) as srv:
        yield srv.url + PATH


@pytest.fixture(scope="module")
def one_process(server, tmp_path_factory):
    """The reference: the same run in one process."""
    cfg = config()
    run = RunDir.create(tmp_path_factory.mktemp("one"), cfg)
    evaluate(cfg, run, [server], progress=False, log=lambda _: None)
    return run


def sharded(cluster, server, root, cfg=None, control=None, **options):
    """A sharded run against ``server`` (a URL, or a list: slot i talks to server i % len)."""
    cfg = cfg or config()
    run = RunDir.create(root, cfg)
    options.setdefault("shards", 2)
    opts = RayOptions(address=cluster.address, **options)
    servers = [server] if isinstance(server, str) else list(server)
    summary = evaluate_sharded(cfg, run, servers, opts, control=control, progress=False, log=lambda _: None)
    return run, summary


def test_rows_equal_a_one_process_run_and_come_from_both_nodes(cluster, server, one_process, tmp_path):
    run, _ = sharded(cluster, server, tmp_path, cfg=config(video=True, report=True), ship_files=True)
    rows, ref = run.read_rows(), one_process.read_rows()
    assert stable(rows) == stable(ref)
    assert all(r["error"] is None and r["steps"] == 16 for r in rows)
    by_episode = {r["episode"]: r for r in ref}
    for r in rows:
        assert r["env"] == by_episode[r["episode"]]["env"] == r["episode"] % 2  # the one-process slot
        assert r["shard"] == r["env"]  # two shards of one slot each
        ours, theirs = (
            np.load(run.path / r["trajectory"]),
            np.load(one_process.path / by_episode[r["episode"]]["trajectory"]),
        )
        np.testing.assert_array_equal(ours["actions"], theirs["actions"])
        np.testing.assert_array_equal(ours["joint_pos"], theirs["joint_pos"])
        assert (run.path / r["video"]).stat().st_size > 0  # shipped back from the shard as bytes
    nodes = {r["node"] for r in rows}
    assert len(nodes) == 2 and {r["node"] for r in rows if r["shard"] == 0} != {
        r["node"] for r in rows if r["shard"] == 1
    }
    on_disk = json.loads((run.path / "summary.json").read_text())
    assert on_disk["shards"]["count"] == 2 and set(on_disk["shards"]["nodes"]) == nodes
    assert on_disk["complete"] and not on_disk["interrupted"] and on_disk["aborted"] is None
    assert on_disk["overall"]["episodes"] == 6 and on_disk["env_steps_per_s"] > 0
    assert not (run.path / TOKEN_FILE).exists()
    assert "complete" in (run.path / "report.html").read_text()  # written once, as one process writes it


def _kill_shard_after_its_first_row(run_root, shard: int, gate: GatedPolicy):
    """An ``on_row`` hook that kills ``shard``'s actor (Ray's kill: the process exits) once its first row is in,
    then opens ``gate``: the shard's own server, which answers its first episode's inferences only, so the shard is
    certainly still running (held in its second episode) when it is killed, however fast the machine is."""
    state = {"killed": 0}

    def on_row(row):
        if row.get("shard") == shard and not state["killed"]:
            (run_dir,) = [p for p in run_root.iterdir() if p.is_dir()]
            token = (run_dir / TOKEN_FILE).read_text().strip()
            ray.kill(ray.get_actor(actor_name(token, shard, 1)), no_restart=True)
            state["killed"] += 1
            gate.open()

    return on_row, state


@pytest.fixture
def shard1_gated(server):
    """[the module's server, a server for shard 1 (slot 1) that holds all but its first episode's 2 inferences]."""
    gate = GatedPolicy(load_policy("reference"), free=config().plan.max_steps // 8)
    with start_server_thread(gate) as srv:
        yield [server, srv.url + PATH], gate
        gate.open()


@pytest.mark.slow  # about 7 s on 2 cores; runs in the first environment's pass
def test_a_killed_shard_loses_nothing(cluster, shard1_gated, one_process, tmp_path):
    servers, gate = shard1_gated
    control = RunControl(config().error_budget)
    control.on_row, state = _kill_shard_after_its_first_row(tmp_path, 1, gate)
    run, summary = sharded(cluster, servers, tmp_path, control=control)
    rows = run.read_rows()
    assert state["killed"] == 1
    assert {r["server"] for r in rows if r["shard"] == 1} == {servers[1]}
    assert len(rows) == 6 and len({r["episode"] for r in rows}) == 6  # no row lost, none twice
    assert stable(rows) == stable(one_process.read_rows())  # the killed shard's episodes re-ran on a new actor
    assert [s["restarts"] for s in summary["shards"]["per_shard"]] == [0, 1]
    assert summary["complete"] and summary["aborted"] is None


def test_a_shard_lost_beyond_its_restarts_is_recorded_errored(cluster, shard1_gated, tmp_path):
    servers, gate = shard1_gated
    control = RunControl(None)
    control.on_row, state = _kill_shard_after_its_first_row(tmp_path, 1, gate)
    run, summary = sharded(cluster, servers, tmp_path, control=control, max_restarts=0)
    rows = run.read_rows()
    assert state["killed"] == 1 and len(rows) == 6 and len({r["episode"] for r in rows}) == 6
    errored = [r for r in rows if r["error"] is not None]
    assert errored and all(r["shard"] == 1 and r["error_event"] == "shard_lost" for r in errored)
    assert all(r["error"].startswith("shard 1 lost after 0 restart(s)") for r in errored)
    assert all(r["error"] is None for r in rows if r["shard"] == 0)
    assert summary["overall"]["errored"] == len(errored) and summary["complete"]
    # A lost episode's row is an errored row like any other: every field of the schema, the plan's slot.
    for r in errored:
        assert set(r) == set(rows[0]) and EpisodeRow.from_dict(r).to_dict() == r
        ran = next(r for r in rows if r["shard"] == 0)  # and the configuration of the rows that ran
        assert (r["backend"], r["policy"]) == (ran["backend"], ran["policy"]) == (config().plan.backend, "reference")
        assert r["task"] == "DROID-CubeInBowl" and r["env"] == r["episode"] % 2 and r["error_step"] == 0


@pytest.mark.slow
def test_stop_then_resume_equals_an_uninterrupted_run(cluster, one_process, tmp_path):
    # 6 episodes of 2 inferences: the gate answers the first 4 (the first row needs them) and, once the stop is
    # set, 11 in all, so the run can neither finish before the stop nor complete after it, however fast it is.
    policy = GatedPolicy(load_policy("reference"), free=4)
    control = RunControl(config().error_budget)

    def on_row(row):
        control.stop.set()  # what the first Ctrl-C does
        policy.allow(11)

    control.on_row = on_row
    with start_server_thread(policy) as srv:
        server = srv.url + PATH
        run, summary = sharded(cluster, server, tmp_path, control=control)
        first = run.read_rows()
        assert summary["interrupted"] and not summary["complete"] and 1 <= len(first) < 6
        policy.open()
        resumed = evaluate_sharded(
            config(),
            RunDir.open(run.path),
            [server],
            RayOptions(address=cluster.address, shards=2),
            progress=False,
            log=lambda _: None,
        )
    rows = run.read_rows()
    assert resumed["complete"] and not resumed["interrupted"] and len(rows) == 6
    assert rows[: len(first)] == first  # finished rows are kept as they were
    assert stable(rows) == stable(one_process.read_rows())
    assert len(resumed["segments"]) == 2


@pytest.mark.slow  # about 15 s on 2 cores; runs in the first environment's pass
def test_cli_ctrl_c_then_resume_on_the_cluster(cluster, one_process, tmp_path):
    """dz-gym-eval --ray ADDRESS in a process of its own: Ctrl-C stops every shard (exit 130, summary written,
    finished rows kept), then --resume on the same cluster completes the run with the one-process rows.

    The run cannot finish before the signal, nor after it before the shards have stopped: the server (in this
    process) answers 4 of the 12 inferences the run needs, and after Ctrl-C 11 in all; so at least one
    episode is done when the signal is sent (4 answers over two shards of one env, 2 per episode) and at most
    five when the run stops."""
    policy = GatedPolicy(load_policy("reference"), free=4)
    with start_server_thread(policy) as srv:
        flags = ["--server", srv.url + PATH, "--ray", cluster.address, "--shards", "2", "--num-envs", "2"]
        flags += ["--episodes", "6", "--max-steps", "16", "--no-video", "--no-report", "--no-progress"]
        run_proc = Evaluator([*flags, "--output-root", str(tmp_path)])
        try:
            assert policy.held.wait(BOUND_S), "the run never reached its 5th inference"
            rows_file = wait_for_rows(tmp_path, 1, run_proc.proc)
            run_proc.signal_group(signal.SIGINT)  # like Ctrl-C in a terminal: the whole process group gets it
            run_proc.wait_for_line("stopping after this step")
            policy.allow(11)  # the steps in flight complete; the run still cannot
            code, out, err = run_proc.finish()
        finally:
            policy.open()
            if run_proc.proc.poll() is None:
                os.killpg(run_proc.proc.pid, signal.SIGKILL)
                run_proc.proc.wait(timeout=30)
        assert code == 130, err[-2000:]
        run = RunDir(rows_file.parent)
        summary = json.loads((run.path / "summary.json").read_text())
        first = run.read_rows()
        assert summary["interrupted"] and not summary["complete"] and summary["shards"]["count"] == 2
        assert 1 <= len(first) <= 5 and "INTERRUPTED" in out
        assert cli.main(["--resume", str(run.path), "--ray", cluster.address, "--shards", "2", "--no-progress"]) == 0
    rows = run.read_rows()
    assert len(rows) == 6 and rows[: len(first)] == first
    assert {r["policy"] for r in rows} == {"external"}  # --server: the reference's policy, on a server not its own
    assert stable(rows, "policy") == stable(one_process.read_rows(), "policy")


def wait_for_rows(root, count: int, proc) -> Path:
    """The run's episodes.jsonl once it has ``count`` rows (bounded; fails if the process ends first)."""
    deadline = time.monotonic() + BOUND_S
    while time.monotonic() < deadline and proc.poll() is None:
        found = list(root.glob("*/episodes.jsonl"))
        if found and found[0].read_text().count("\n") >= count:
            return found[0]
        time.sleep(0.05)
    pytest.fail(f"no {count} row(s) within {BOUND_S} s (exit status {proc.poll()})")


TESTS_DIR = str(Path(__file__).resolve().parent)  # where the stand-ins live (test code, not in the package)


def _isaac_standin_setup() -> None:
    """Runs first in every shard's actor: serve the Isaac Lab 2.2 stand-in modules in that process."""
    import tempfile
    from pathlib import Path

    if TESTS_DIR not in sys.path:
        sys.path.insert(0, TESTS_DIR)
    import isaac_stubs

    isaac_stubs.install("2.2", isaac_stubs.make_sim_evals_checkout(Path(tempfile.mkdtemp()) / "sim-evals"))


@pytest.mark.slow
def test_isaac_shards_one_gpu_each_and_a_fresh_actor_per_scene(cluster, tmp_path):
    """The Isaac Lab path against the stand-in: one shard per GPU by default, each actor starts its own app
    (after the user's set-up) and builds one scene, the next scene gets a new actor."""
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the set-up travels by value
    with start_server_process(["--policy", "hold", "--quiet"]) as srv:
        cfg = EvalConfig(
            scenes=[1, 2],
            episodes=2,
            num_envs=2,
            max_steps=16,
            video=True,
            report=False,
            backend="isaac",
            servers=[srv.url + PATH],
        )
        run = RunDir.create(tmp_path, cfg)
        summary = evaluate_sharded(
            cfg,
            run,
            None,
            RayOptions(address=cluster.address, worker_setup=_isaac_standin_setup),
            env_kwargs={"device": "cpu", "check_gpu": False, "image_shape": (4, 6)},
            progress=False,
            log=lambda _: None,
        )
    rows = run.read_rows()
    assert summary["complete"] and summary["aborted"] is None and summary["shards"]["count"] == 2
    assert sorted((r["scene"], r["episode"]) for r in rows) == [(1, 0), (1, 1), (2, 0), (2, 1)]
    assert all(r["error"] is None and r["steps"] == 16 and r["shard"] == r["env"] for r in rows)
    assert len({r["node"] for r in rows}) == 2
    assert [s["actors"] for s in summary["shards"]["per_shard"]] == [2, 2]  # one per scene
    assert all((run.path / r["video"]).stat().st_size > 0 for r in rows)


@pytest.mark.slow  # about 6 s on 2 cores; runs in the first environment's pass
def test_user_named_resources_place_the_shards(cluster, server, tmp_path):
    """--ray-resource: shards land only on the nodes that have the resource (here the second node)."""
    (node_b,) = [n["NodeID"] for n in ray.nodes() if n.get("Alive") and "node_b" in n.get("Resources", {})]
    cfg = config(episodes=2, num_envs=1)
    run, summary = sharded(cluster, server, tmp_path, cfg=cfg, shards=1, resources={"node_b": 1})
    rows = run.read_rows()
    assert len(rows) == 2 and {r["node"] for r in rows} == {node_b} and summary["shards"]["nodes"] == [node_b]


@pytest.mark.slow  # about 7 s on 2 cores; runs in the first environment's pass
def test_uneven_shards_keep_the_one_process_slots(cluster, server, one_process, tmp_path):
    """3 envs on 2 shards (2 + 1 slots): every episode still runs on slot k % 3, and the rows equal one process."""
    run, summary = sharded(cluster, server, tmp_path, cfg=config(num_envs=3))
    rows = run.read_rows()
    assert stable(rows, "env") == stable(one_process.read_rows(), "env")  # the one process ran 2 envs
    assert all(r["env"] == r["episode"] % 3 and r["shard"] == (0 if r["env"] < 2 else 1) for r in rows)
    assert [s["slots"] for s in summary["shards"]["per_shard"]] == [[0, 2], [2, 3]]


def test_start_line_holds_a_built_shard_until_every_shard_is_built(cluster):
    import threading

    from dz_gym.eval.shards.collector import Collector
    from dz_gym.eval.shards.worker import wait_at_start_line

    collector = ray.remote(Collector).options(num_cpus=0).remote()
    try:
        ray.get(collector.expect_start.remote([0, 1]), timeout=60)
        stop = threading.Event()
        assert wait_at_start_line(collector, 0, stop, timeout=0.3) is False  # shard 1 not built: bounded wait
        result = []
        waiter = threading.Thread(target=lambda: result.append(wait_at_start_line(collector, 0, stop, timeout=60)))
        waiter.start()
        waiter.join(0.3)
        assert waiter.is_alive() and not result  # still waiting for shard 1
        assert wait_at_start_line(collector, 1, stop, timeout=60) is True  # the last one releases everybody
        waiter.join(60)
        assert result == [True]
        ray.get(collector.expect_start.remote([0, 1]), timeout=60)
        stop.set()  # a stop request ends the wait at once
        assert wait_at_start_line(collector, 0, stop, timeout=60) is False
    finally:
        ray.kill(collector)
