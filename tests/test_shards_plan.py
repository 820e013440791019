"""Sharded runs' side of the run plan (pure): slot ranges, the one-process episode map kept, servers per slot
and per shard, shard sizes; the row outbox of a shard; Ray stays unimported without --ray and its absence is
one clear line."""

from __future__ import annotations

import subprocess
import sys
import threading
from collections import deque

import numpy as np
import pytest

from dz_gym.eval.plan import build_plan, slot_ranges
from dz_gym.eval.shards import MISSING_RAY, RayMissingError, require_ray
from dz_gym.eval.shards.collector import Collector
from dz_gym.eval.shards.plan import cpus_per_shard, default_shard_count, env_workers, gpus_per_shard
from dz_gym.eval.shards.worker import Outbox


def test_slot_ranges_cover_the_slots_once():
    for n in (1, 2, 5, 8, 64, 257):
        for k in range(1, min(n, 9) + 1):
            ranges = slot_ranges(n, k)
            assert len(ranges) == k and ranges[0][0] == 0 and ranges[-1][1] == n
            assert all(a < b for a, b in ranges) and all(ranges[i][1] == ranges[i + 1][0] for i in range(k - 1))
            widths = [b - a for a, b in ranges]
            assert max(widths) - min(widths) <= 1


def plan(n, k, episodes=23, scenes=(1, 3), servers=("ws://h0",), **kw):
    return build_plan(scenes=list(scenes), episodes=episodes, num_envs=n, seed=0, servers=list(servers), shards=k,
                      **kw)  # fmt: skip


@pytest.mark.parametrize("n,k", [(8, 2), (5, 2), (7, 3), (3, 3), (1, 1)])
def test_every_episode_keeps_its_one_process_slot_and_order(n, k):
    one = plan(n, 1)
    sharded = plan(n, k).remaining([{"scene": 3, "episode": e} for e in (1, 3, 4)])  # a resume: some rows there
    for scene in (1, 3):
        one_process = one.remaining([{"scene": 3, "episode": e} for e in (1, 3, 4)]).slot_queues(scene)
        seen = []
        for j, (start, _) in enumerate(sharded.shards):
            for local, queue in enumerate(sharded.slot_queues(scene, shard=j)):
                assert [e.episode for e in queue] == [e.episode for e in one_process[start + local]]
                assert all(e.shard == j and e.slot == start + local for e in queue)
                seen.extend(e.episode for e in queue)
        assert sorted(seen) == [
            e.episode for e in one.scene_entries(scene) if (scene, e.episode) not in {(3, 1), (3, 3), (3, 4)}
        ]  # fmt: skip  (each planned episode in exactly one shard)


def test_shard_scenes_and_episodes():
    p = plan(2, 2, episodes=4, scenes=(1, 2)).remaining([{"scene": 2, "episode": e} for e in (0, 2)])
    assert p.shards == ((0, 1), (1, 2))
    assert [[e.episode for e in q] for q in p.slot_queues(1, shard=0)] == [[0, 2]]
    assert [[e.episode for e in q] for q in p.slot_queues(2, shard=1)] == [[1, 3]]
    assert p.slot_queues(2, shard=0) == [[]]


@pytest.mark.parametrize(
    "n,k,needle",
    [(2, 3, "shards: expected at most num_envs=2"), (2, 0, "shards: expected an integer >= 1"), (0, 1, "num_envs")],
)
def test_bad_shard_counts_are_one_line_errors(n, k, needle):
    with pytest.raises(ValueError, match=needle):
        slot_ranges(n, k)


def test_servers_follow_global_slots_or_per_shard_groups():
    urls = [f"ws://h{i}:8000/p" for i in range(4)]
    p = plan(6, 2, episodes=10, scenes=(1,), servers=urls)  # slots 0-2 and 3-5
    assert p.servers_of(0) == [urls[0], urls[1], urls[2]]
    assert p.servers_of(1) == [urls[3], urls[0], urls[1]]  # as slot g % 4 in one process
    assert all(e.server == urls[e.slot % 4] for e in p.entries)
    grouped = plan(6, 2, episodes=10, scenes=(1,), servers=urls, servers_per_shard=2)
    assert grouped.servers_of(0) == [urls[0], urls[1], urls[0]]
    assert grouped.servers_of(1) == [urls[2], urls[3], urls[2]]
    with pytest.raises(ValueError, match="servers_per_shard: expected at most the 4 servers"):
        plan(6, 2, servers=urls, servers_per_shard=5)
    unresolved = plan(6, 2, servers=())  # the layout alone: its servers come once they run
    assert unresolved.slot_servers == () and [len(q) for q in unresolved.slot_queues(1, shard=1)] == [4, 4, 3]
    with pytest.raises(ValueError, match="servers: expected at least one"):
        unresolved.resolve(())


def test_default_shards_and_cpus():
    assert default_shard_count(8, nodes=3, gpus=0, backend="mujoco") == 3
    assert default_shard_count(2, nodes=3, gpus=0, backend="mujoco") == 2
    assert default_shard_count(8, nodes=2, gpus=4, backend="isaac") == 4
    with pytest.raises(ValueError, match="isaac backend needs one GPU per shard"):
        default_shard_count(8, nodes=2, gpus=0, backend="isaac")
    assert cpus_per_shard(4, 16) == 4 and cpus_per_shard(32, 16) == 16 and cpus_per_shard(4, 0.5) == 1
    assert cpus_per_shard(32, 16, shards_per_node=4) == 4 and cpus_per_shard(4, 2, shards_per_node=2) == 1
    assert cpus_per_shard(4, 16, requested=2.5) == 2.5
    assert env_workers(4, 1) == 0 and env_workers(4, 2) == 2 and env_workers(3, 8) == 3


def test_gpus_per_shard_shares_a_nodes_gpus_so_every_shard_fits():
    share = lambda k, gpus: gpus_per_shard(None, None, k, gpus)  # noqa: E731 - MuJoCo's default
    assert share(16, 0) == 0.0 and share(1, 0.5) == 0.0  # no whole GPU on some node: none (today's behaviour)
    assert share(1, 4) == share(4, 4) == 1.0  # enough GPUs: one each
    assert share(16, 4) == 0.25 and share(16, 1) == 0.0625 and share(8, 2) == 0.25
    assert share(6, 4) == 0.5  # ceil(6/4) = 2 a GPU: 0.5 each, so all 6 fit on 4 GPUs
    for k, gpus in ((3, 1), (6, 1), (7, 1), (12, 4), (5, 2), (16, 3)):
        each = share(k, gpus)
        assert int(1 / each + 1e-9) * gpus >= k  # Ray fits floor(1/each) shards on a GPU: all k of them fit
        assert each * -(-k // gpus) <= 1.0
    assert gpus_per_shard(1.0, None, 8, 0) == 1.0  # Isaac Lab: its default, whatever the nodes
    assert gpus_per_shard(1.0, 0.5, 8, 4) == gpus_per_shard(None, 0.5, 8, 0) == 0.5  # --shard-gpus wins
    with pytest.raises(ValueError, match="shard_gpus: expected a number >= 0"):
        gpus_per_shard(None, -1, 1, 1)


class _Recorder:
    def __init__(self):
        self.finished: dict[str, int] = {}
        self.failed: dict[str, str] = {}


def _row(episode: int, env: int, video: bool = True) -> dict:
    return {
        "scene": 1,
        "episode": episode,
        "env": env,
        "shard": 1,
        "node": "n1",
        "trajectory": f"trajectories/scene1_ep{episode:04d}.npz",
        "video": f"videos/scene1_ep{episode:04d}.mp4" if video else None,
    }


def test_outbox_ships_rows_in_order_once_their_video_is_closed(tmp_path):
    recorder = _Recorder()
    box = Outbox(tmp_path, meta={"shard": 1, "node": "n1"}, ship_files=True, recorder=recorder)
    for k in (0, 1):
        for rel in _row(k, 0).values():
            if isinstance(rel, str):
                (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
                (tmp_path / rel).write_bytes(f"{rel}".encode())
    box.put(_row(0, 5))  # rows come with the plan's global slot, their shard and node (the runner's placement)
    box.put(_row(1, 4))
    box.steps(5, 12.0)
    payloads, steps, latency = box.take()
    assert payloads == [] and steps == 5 and latency == 12.0  # episode 0's video is still being written
    recorder.finished["scene1_ep0001"] = 16
    assert box.take()[0] == []  # order is kept: episode 1 waits for episode 0
    recorder.failed["scene1_ep0000"] = "disk full"
    payloads, steps, _ = box.take()
    assert [p["row"]["episode"] for p in payloads] == [0, 1] and steps == 0
    first, second = payloads
    assert first["row"]["env"] == 5 and first["row"]["shard"] == 1 and first["row"]["node"] == "n1"  # unchanged
    assert first["row"]["video"] is None and list(first["files"]) == ["trajectories/scene1_ep0000.npz"]
    assert second["files"]["videos/scene1_ep0001.mp4"] == b"videos/scene1_ep0001.mp4"
    box.give_back(payloads, 3)  # a failed push: everything is sent again, in order, unchanged
    again, steps, _ = box.take()
    assert [p["row"]["episode"] for p in again] == [0, 1] and steps == 3 and again[0]["row"]["env"] == 5
    box.delete_files(again)
    assert not (tmp_path / "videos/scene1_ep0001.mp4").exists()


def test_outbox_is_thread_safe(tmp_path):
    box = Outbox(tmp_path, meta={"shard": 0, "node": "n"}, ship_files=False)
    got: deque = deque()

    def produce(offset):
        for k in range(200):
            box.put(_row(offset + k, 0, video=False))
            box.steps(1)

    threads = [threading.Thread(target=produce, args=(i * 1000,)) for i in range(4)]
    for t in threads:
        t.start()
    total_steps = 0
    while any(t.is_alive() for t in threads) or box.pending():
        payloads, steps, _ = box.take()
        got.extend(p["row"]["episode"] for p in payloads)
        total_steps += steps
    for t in threads:
        t.join()
    payloads, steps, _ = box.take()
    got.extend(p["row"]["episode"] for p in payloads)
    total_steps += steps
    assert sorted(got) == sorted(i * 1000 + k for i in range(4) for k in range(200)) and total_steps == 800
    assert np.all(np.diff([e for e in got if e < 1000]) > 0)  # one producer's rows stay in order


def test_start_line_waits_for_every_expected_shard_or_its_failure():
    collector = Collector()
    assert collector.started()  # nothing expected: nobody waits (restarted actors, later scenes)
    collector.expect_start([0, 1, 2])
    assert collector.arrive(0) is False and collector.arrive(0) is False and not collector.started()
    assert collector.arrive(2) is False
    collector.leave(1)  # shard 1's actor failed before it was built
    assert collector.started() and collector.arrive(1)
    collector.expect_start([0, 1])
    assert not collector.started()
    collector.request_stop()  # a stop request ends every wait
    assert collector.started()


def test_without_ray_flags_ray_is_not_imported():
    code = (
        "import sys; import dz_gym.eval.cli, dz_gym.eval.evaluate, dz_gym.eval.shards, dz_gym.eval.shards.plan, "
        "dz_gym.eval.shards.worker, dz_gym.eval.shards.collector, dz_gym.eval.shards.options, "
        "dz_gym.eval.shards.driver; dz_gym.eval.cli.build_parser(isaac_args=False).parse_args(['--num-envs', '2']); "
        "sys.exit(1 if 'ray' in sys.modules else 0)"
    )
    assert subprocess.run([sys.executable, "-c", code], timeout=120, check=False).returncode == 0


def test_missing_ray_is_one_clear_line(monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # makes `import ray` fail as if it were not installed
    with pytest.raises(RayMissingError) as info:
        require_ray()
    assert str(info.value) == MISSING_RAY and "\n" not in MISSING_RAY and 'pip install "dz-gym[ray]"' in MISSING_RAY


@pytest.mark.parametrize(
    "argv,needle",
    [
        (["--shards", "2"], "--shards: only with --ray ADDRESS|local"),
        (["--ray", "local", "--num-envs", "2", "--shards", "3"], "--shards: expected at most --num-envs=2 shards"),
        (["--ray", "local", "--ray-resource", "gpu_node=x"], "--ray-resource: expected NAME=AMOUNT"),
        (["--ray", "local", "--shard-restarts", "-1"], "--shard-restarts: expected an integer >= 0"),
        (["--ray", "local", "--servers-per-shard", "0"], "--servers-per-shard: expected an integer >= 1"),
        (["--shard-gpus", "1"], "--shard-gpus: only with --ray ADDRESS|local"),
        (["--ray", "local", "--shard-gpus", "1.5"], "--shard-gpus: expected a number >= 0, at most 1 or a whole"),
        (["--ray", "local", "--shard-gpus", "-0.5"], "--shard-gpus: expected a number >= 0"),
        (["--ray", "local", "--shard-gpus", "2"], "--shard-gpus: the embedded MuJoCo simulator uses at most 1 GPU"),
    ],
)
def test_bad_ray_flags_exit_2_with_one_line(capsys, argv, needle):
    from dz_gym.eval import cli

    with pytest.raises(SystemExit) as info:
        cli.main(["--backend", "mujoco", *argv])
    err = capsys.readouterr().err.strip()
    assert info.value.code == 2 and needle in err and len(err.splitlines()) == 1, err


def test_shard_gpus_flag_sets_ray_options():
    import argparse

    from dz_gym.eval.config import EvalConfig
    from dz_gym.eval.shards.options import RAY_FLAGS, ray_options_from_args

    parser = argparse.ArgumentParser()
    for flag in RAY_FLAGS:
        flag.add(parser)
    config = EvalConfig(num_envs=8, backend="mujoco")
    options = ray_options_from_args(parser, parser.parse_args(["--ray", "local", "--shard-gpus", "0.25"]), config)
    assert options.shard_gpus == 0.25
    assert ray_options_from_args(parser, parser.parse_args(["--ray", "local"]), config).shard_gpus is None


def test_ray_flag_without_ray_installed_is_a_usage_error(capsys, monkeypatch):
    import importlib.util

    from dz_gym.eval import cli

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a, **k: None if name == "ray" else real(name, *a, **k)
    )
    with pytest.raises(SystemExit) as info:
        cli.main(["--backend", "mujoco", "--ray", "local"])
    err = capsys.readouterr().err.strip()
    assert info.value.code == 2 and 'pip install "dz-gym[ray]"' in err and len(err.splitlines()) == 1
