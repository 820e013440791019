"""The backend registry (dz_gym.envs.backends): each backend's traits, ``auto``, and that eval/ asks the
registry instead of branching on a backend's name."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import dz_gym
from dz_gym.envs import backends


def test_traits_of_each_backend():
    isaac, mujoco = backends.traits("isaac"), backends.traits("mujoco")
    assert isaac.one_scene_per_process and isaac.starts_app and isaac.named_tasks and isaac.shard_gpus == 1
    assert not mujoco.one_scene_per_process and not mujoco.starts_app and mujoco.worker_processes
    assert mujoco.config_kwargs == {"seed": "seed", "max_episode_length": "max_steps"}
    assert backends.NAMES == ("auto", "isaac", "mujoco")
    with pytest.raises(ValueError, match="backend: expected one of auto, isaac, mujoco, got 'auto'"):
        backends.traits("auto")  # resolve it first


def test_auto_picks_the_first_importable_backend(monkeypatch):
    monkeypatch.setattr(backends.BackendTraits, "available", lambda self: self.name == "isaac")
    assert backends.resolve("auto") == "isaac" and backends.auto_reason("isaac") == "Isaac Lab is importable"
    monkeypatch.setattr(backends.BackendTraits, "available", lambda self: False)
    assert backends.resolve("auto") == "mujoco" and backends.auto_reason("mujoco") == "Isaac Lab is not importable"
    assert backends.resolve("isaac") == "isaac"  # an explicit choice is kept even when not importable


def test_default_shard_count_follows_shard_gpus():
    isaac, mujoco = backends.traits("isaac"), backends.traits("mujoco")
    assert mujoco.shard_count(8, nodes=3, gpus=0) == 3 and isaac.shard_count(8, nodes=3, gpus=4) == 4
    # MuJoCo shares the GPUs: one shard per GPU where there are more GPUs than nodes, else one per node
    assert mujoco.shard_count(8, nodes=2, gpus=4) == 4 and mujoco.shard_count(8, nodes=3, gpus=2) == 3
    assert mujoco.shard_count(64, nodes=1, gpus=4, shard_gpus=0.25) == 16  # --shard-gpus 0.25: 4 per GPU
    assert mujoco.shard_count(8, nodes=2, gpus=4, shard_gpus=0) == 2  # --shard-gpus 0: no GPU, one per node
    assert isaac.shard_count(2, nodes=1, gpus=8) == 2  # at most one shard per env slot
    half = backends.dataclasses.replace(isaac, shard_gpus=0.5)  # e.g. a per-backend default below one GPU
    assert half.shard_count(8, nodes=1, gpus=3) == 6
    with pytest.raises(ValueError, match="needs 0.5 GPUs per shard"):
        half.shard_count(8, nodes=1, gpus=0)


def test_a_mujoco_shard_renders_on_one_gpu_at_most():
    mujoco, isaac = backends.traits("mujoco"), backends.traits("isaac")
    mujoco.check_shard_gpus(1)
    mujoco.check_shard_gpus(0.25)
    with pytest.raises(
        ValueError, match="shard_gpus: the embedded MuJoCo simulator uses at most 1 GPU per shard, got 2"
    ):
        mujoco.check_shard_gpus(2)
    isaac.check_shard_gpus(2)  # Isaac Lab takes what it is given
    assert isaac.device_option == "device" and not mujoco.device_option


def test_the_registry_builds_the_env_of_make_droid_env():
    env = dz_gym.make_droid_env(backend="mujoco", scene=1, num_envs=1, seed=3, image_shape=(24, 32))
    try:
        assert env.num_envs == 1 and env.scene.scene_id == 1
    finally:
        env.close()
    with pytest.raises(ValueError, match="backend: expected one of"):
        dz_gym.make_droid_env(backend="gazebo")


def _backend_name_comparisons(path: Path) -> list[str]:
    """``x == "isaac"``-like comparisons (and ``in (...)`` of such names) in one source file."""
    names = set(backends.REGISTRY)
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if not isinstance(node, ast.Compare):
            continue
        for right in [node.left, *node.comparators]:
            items = right.elts if isinstance(right, (ast.Tuple, ast.List, ast.Set)) else [right]
            if any(isinstance(i, ast.Constant) and i.value in names for i in items):
                found.append(f"{path.name}:{node.lineno}")
    return found


def test_eval_has_no_branch_on_a_backend_name():
    eval_dir = Path(dz_gym.__file__).parent / "eval"
    found = [hit for path in sorted(eval_dir.rglob("*.py")) for hit in _backend_name_comparisons(path)]
    assert found == []
