"""Command-line handling of dz-gym-eval: bad flags end with one line and exit status 2; resume checks."""

from __future__ import annotations

import pytest

from dz_gym.eval import cli
from dz_gym.eval.config import EvalConfig
from dz_gym.eval.rundir import RunDir


def usage_error(capsys, argv) -> str:
    with pytest.raises(SystemExit) as exc:
        cli.main(argv)
    assert exc.value.code == 2
    lines = [line for line in capsys.readouterr().err.strip().splitlines() if line.startswith("dz-gym-eval: error")]
    assert len(lines) == 1
    return lines[0]


@pytest.mark.parametrize(
    "argv, needle",
    [
        (["--scene", "4"], "--scene"),
        (["--num-envs", "0"], "--num-envs"),
        (["--episodes", "-3"], "--episodes"),
        (["--max-steps", "x"], "--max-steps"),
        (["--request-timeout", "0"], "--request-timeout"),
        (["--backend", "gpu"], "--backend"),
        (["--server", "http://127.0.0.1:1"], "--server"),
        (["--server", "ws://127.0.0.1:1", "--host", "10.0.0.1"], "--server"),
        (["--server", "ws://127.0.0.1:1", "--policy", "hold"], "--policy"),
        (["--port", "70000"], "--port"),
        (["--path", "no-slash"], "--path"),
        (["--prefetch", "8"], "prefetch: expected an integer in [0, 8)"),
        (["--auth-env", "MY-TOKEN=abc"], "auth_env"),
        (["--prefetch", "-1"], "--prefetch"),
        (["--simulated-delay", "x"], "--simulated-delay"),
    ],
)
def test_bad_flags_exit_2_with_one_line(capsys, argv, needle):
    assert needle in usage_error(capsys, argv)


def test_resume_needs_a_run_directory(capsys, tmp_path):
    assert "not a dz-gym-eval run directory" in usage_error(capsys, ["--resume", str(tmp_path)])


def test_resume_refuses_settings_that_change_results(capsys, tmp_path):
    config = EvalConfig(scenes=[1], episodes=4, num_envs=2, seed=3, max_steps=24, policy="hold")
    run = RunDir.create(tmp_path, config)
    line = usage_error(capsys, ["--resume", str(run.path), "--seed", "4", "--max-steps", "30"])
    assert "seed" in line and "max_steps" in line
    line = usage_error(capsys, ["--resume", str(run.path), "--episodes", "2"])
    assert "episodes" in line
    line = usage_error(capsys, ["--resume", str(run.path), "--policy", "probe"])
    assert "policy" in line


def test_resolve_config_defaults_and_reference_client_flags():
    parser = cli.build_parser(isaac_args=False)
    config, run_dir, servers = cli.resolve_config(parser, parser.parse_args(["--num-envs", "3"]))
    assert run_dir is None and servers is None
    assert config.episodes == 3 and config.scenes == [1] and config.max_steps == 450 and config.video
    assert config.policy == cli.default_policy(config.backend) and config.backend in ("mujoco", "isaac")
    assert cli.default_policy("mujoco") == "reference" and cli.default_policy("isaac") == "hold"
    config, _, _ = cli.resolve_config(parser, parser.parse_args(["--auth-env", "DZ_TOKEN", "--server", "ws://h:1/p"]))
    assert config.auth_env == "DZ_TOKEN"  # the variable's name, never its value
    args = parser.parse_args(["--host", "10.1.2.3", "--port", "9000", "--scene", "2", "--scene", "3", "--scene", "2"])
    config, _, servers = cli.resolve_config(parser, args)
    assert servers == ["ws://10.1.2.3:9000/v1/realtime/robot/openpi"]
    assert config.scenes == [2, 3] and config.policy == "external" and config.servers == servers


def test_resume_may_change_how_but_not_what(tmp_path):
    config = EvalConfig(scenes=[1], episodes=4, num_envs=2, seed=3, max_steps=24, policy="hold")
    run = RunDir.create(tmp_path, config)
    parser = cli.build_parser(isaac_args=False)
    args = parser.parse_args(["--resume", str(run.path), "--num-envs", "4", "--no-video", "--episodes", "6"])
    resumed, run_dir, servers = cli.resolve_config(parser, args)
    assert run_dir.path == run.path and servers is None
    assert (resumed.num_envs, resumed.video, resumed.episodes, resumed.seed, resumed.policy) == (4, False, 6, 3, "hold")


def test_resume_of_an_external_server_run(capsys, tmp_path):
    config = EvalConfig(scenes=[2], episodes=2, num_envs=1, servers=["ws://127.0.0.1:9/x"], policy="external")
    run = RunDir.create(tmp_path, config)
    parser = cli.build_parser(isaac_args=False)
    _, _, servers = cli.resolve_config(parser, parser.parse_args(["--resume", str(run.path)]))
    assert servers == ["ws://127.0.0.1:9/x"]
    args = ["--resume", str(run.path), "--server", "ws://127.0.0.1:10/x"]
    resumed, _, servers = cli.resolve_config(parser, parser.parse_args(args))
    assert servers == resumed.servers == ["ws://127.0.0.1:10/x"]
    assert "--policy" in usage_error(capsys, ["--resume", str(run.path), "--policy", "hold"])
