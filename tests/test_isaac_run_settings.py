"""A run's settings reach the isaac backend: ``--max-steps`` becomes Isaac Lab's time-out (above 450 too) and
the run's seed Isaac Lab's ``cfg.seed``; on the stand-in modules (Isaac Sim cannot run here)."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")

import isaac_stubs
from isaac_helpers import SMALL

from dz_gym.envs.isaac import launch
from dz_gym.eval.config import EvalConfig
from dz_gym.eval.scene import default_env_factory


@pytest.fixture
def world(tmp_path):
    root = isaac_stubs.make_sim_evals_checkout(tmp_path / "sim-evals")
    launch._forget_app_for_tests()
    installed = isaac_stubs.install("3.0", root)
    yield installed
    for env in installed.envs:
        env.close()
    isaac_stubs.uninstall()
    launch._forget_app_for_tests()


@pytest.mark.parametrize("max_steps", [40, 600])
def test_max_steps_and_seed_of_the_run_reach_isaac_lab(world, max_steps):
    config = EvalConfig(backend="isaac", num_envs=2, max_steps=max_steps, seed=11, video=False)
    env = default_env_factory(1, config, device="cpu", check_gpu=False, image_shape=SMALL)
    try:
        assert env.max_episode_length == max_steps and world.env.max_episode_length == max_steps
        assert env.cfg.seed == 11
        assert "seed: 11" in env.patches and any(p.endswith(f"({max_steps} steps)") for p in env.patches)
    finally:
        env.close()


def test_a_bad_seed_is_one_line_naming_it(world):
    from dz_gym.envs.isaac.config import set_seed

    class Cfg:
        seed = None

    for bad in (-1, 1.5, True):
        with pytest.raises(ValueError, match=r"^seed: expected an integer >= 0, got "):
            set_seed(Cfg(), bad)
    assert set_seed(Cfg(), 3) == "seed: 3"


def test_cfg_overrides_are_refused_where_no_hydra_reads_them(world):
    from dz_gym.envs.isaac import make_env

    with pytest.raises(ValueError, match=r"^cfg_overrides: Hydra overrides are taken by the kit-less tasks"):
        make_env(1, num_envs=2, device="cpu", check_gpu=False, cfg_overrides=["env.scene_id=2"])


def test_bad_cfg_overrides_are_one_line_naming_the_field():
    from dz_gym.envs.isaac.kitless import check_overrides

    assert check_overrides(["env.scene_id=2", "env.a.b=[1,2]"]) == ("env.scene_id=2", "env.a.b=[1,2]")
    for bad in ("env.scene_id=2", ["env.scene_id"], ["=2"], [3], None):
        with pytest.raises(ValueError, match=r"^cfg_overrides: expected "):
            check_overrides(bad)
