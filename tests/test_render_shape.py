"""The embedded simulator renders the views a server asks for: the shape rule, the config and flag, the env
factory, and a new run choosing it from the servers' handshakes (DreamZero runs unchanged)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from dz_gym.cli_types import height_by_width
from dz_gym.envs import droid
from dz_gym.envs.render_shape import render_shape_for
from dz_gym.eval.config import EvalConfig
from dz_gym.eval.run import render_shape_from_servers
from dz_gym.protocol import DREAMZERO_METADATA
from dz_gym.protocol.codec import packb
from dz_gym.protocol.messages import parse_metadata


@pytest.mark.parametrize(
    "asked, rendered",
    [
        (None, (180, 320)),  # no size in the handshake: the default
        ((180, 320), (180, 320)),  # DreamZero
        ((360, 640), (360, 640)),  # FLUX 3 Action's views
        ((540, 640), (360, 640)),  # FLUX's composite is composed of 360x640 views
        ((720, 1280), (720, 1280)),
        ((224, 224), (180, 320)),  # another aspect: rendered as usual, resized with pad
        ((4320, 7680), (180, 320)),  # beyond the renderer's limit
    ],
)
def test_render_shape_for(asked, rendered):
    assert render_shape_for(asked) == rendered


def test_the_config_and_flag_take_a_render_shape_for_the_embedded_simulator_only():
    assert height_by_width("360x640") == [360, 640]
    with pytest.raises(Exception, match="HEIGHTxWIDTH"):
        height_by_width("360")
    assert EvalConfig(backend="mujoco").plan.render_shape is None
    assert EvalConfig(backend="mujoco", render_shape=(360, 640)).plan.render_shape == [360, 640]
    with pytest.raises(ValueError, match="render_shape: expected"):
        EvalConfig(backend="mujoco", render_shape=[8, 8])
    with pytest.raises(ValueError, match="render_shape: Isaac Lab renders its own size"):
        EvalConfig(backend="isaac", render_shape=[360, 640])


def metadata(resolution):
    return parse_metadata(packb({**DREAMZERO_METADATA, "image_resolution": resolution}))


def test_a_new_run_renders_what_its_servers_ask_and_dreamzero_runs_stay_as_they_were():
    config = EvalConfig(backend="mujoco", servers=["ws://127.0.0.1:1/x"])
    assert render_shape_from_servers(config, [metadata([180, 320])] * 2) is None and config.plan.render_shape is None
    assert render_shape_from_servers(config, [metadata([360, 640]), metadata([180, 320])]) is None  # disagree
    assert config.plan.render_shape is None
    assert "360x640" in render_shape_from_servers(config, [metadata([360, 640])] * 2)
    assert config.plan.render_shape == [360, 640]
    chosen = EvalConfig(backend="mujoco", servers=["ws://127.0.0.1:1/x"], render_shape=[720, 1280])
    assert render_shape_from_servers(chosen, [metadata([360, 640])]) is None and chosen.plan.render_shape == [720, 1280]


@pytest.mark.slow  # two short runs of the embedded simulator (about 6 s)
def test_the_embedded_simulator_renders_a_servers_size_end_to_end(tmp_path):
    pytest.importorskip("mujoco")
    from dz_gym.eval import cli
    from dz_gym.server.launch import start_server_thread
    from dz_gym.server.policies import HoldPolicy

    base = ["--num-envs", "1", "--episodes", "1", "--max-steps", "4", "--no-progress", "--no-video", "--no-report"]
    for resolution, saved in (([360, 640], [360, 640]), ([180, 320], None)):
        policy = HoldPolicy(metadata={**DREAMZERO_METADATA, "image_resolution": resolution})
        with start_server_thread(policy) as server:
            root = tmp_path / str(resolution[0])
            url = server.url + "/v1/realtime/robot/openpi"
            assert cli.main([*base, "--server", url, "--output-root", str(root)]) == 0
        (run,) = [p for p in root.iterdir() if p.is_dir()]
        assert json.loads((run / "config.json").read_text())["plan"]["render_shape"] == saved
        trajectory = np.load(run / "trajectories" / "scene1_ep0000.npz")
        assert len(trajectory["actions"]) == 4


def test_the_env_factory_passes_the_render_shape():
    pytest.importorskip("mujoco")
    from dz_gym.eval.scene import default_env_factory

    env = default_env_factory(1, EvalConfig(backend="mujoco", num_envs=1, render_shape=[360, 640]), num_workers=0)
    try:
        obs, _ = env.reset(seed=0)
        assert {tuple(obs[droid.POLICY_GROUP][k].shape) for k in droid.CAMERA_KEYS} == {(1, 360, 640, 3)}
    finally:
        env.close()
