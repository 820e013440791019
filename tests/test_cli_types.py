"""Flag declarations (dz_gym.cli_types.Flag) and the flags dz-gym-eval and dz-gym-bench share: one declaration,
the same dest and metavar, and defaults that come from the configs (the transport's bounds from TransportConfig)."""

from __future__ import annotations

import argparse

import pytest

from dz_gym import cli_types
from dz_gym.bench import cli as bench_cli
from dz_gym.bench.runner import BenchConfig
from dz_gym.eval import cli as eval_cli
from dz_gym.eval.config import PATHS, EvalConfig
from dz_gym.transport import TransportConfig

SHARED = (cli_types.SERVER, cli_types.AUTH_ENV, cli_types.REQUEST_TIMEOUT, cli_types.OPEN_LOOP_HORIZON, cli_types.SEED)


def _actions(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    return {a.option_strings[0]: a for a in parser._actions if a.option_strings}


def test_shared_flags_have_one_declaration_in_eval_and_bench():
    eval_actions = _actions(eval_cli.build_parser(isaac_args=False))
    bench_actions = _actions(bench_cli.build_parser())
    for flag in SHARED:
        a, b = eval_actions[flag.name], bench_actions[flag.name]
        assert a.dest == b.dest == flag.field and a.metavar == b.metavar == flag.metavar, flag.name
        assert a.type is b.type is flag.type and a.default is b.default is None, flag.name
        assert flag.field in set(PATHS) & set(BenchConfig.__dataclass_fields__)  # EvalConfig's by its name


def test_transport_bounds_default_to_transport_config_everywhere():
    transport = TransportConfig()
    bench = bench_cli.config_from_args(bench_cli.build_parser().parse_args(["--server", "ws://127.0.0.1:1"]))
    assert bench.request_timeout == EvalConfig.default("request_timeout") == transport.request_timeout
    assert bench.connect_retries == transport.connect_retries and bench.open_timeout == transport.open_timeout
    assert bench.transport_config() == TransportConfig(auth_env=None)
    help_text = " ".join(bench_cli.build_parser().format_help().split())
    assert f"--request-timeout S seconds to wait for one chunk (the transport's bound on one request) (default " \
           f"{transport.request_timeout:g})" in help_text  # fmt: skip


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["--request-timeout", "0"], "--request-timeout: expected a finite number > 0, got 0"),
        (["--auth-env", "MY-TOKEN"], "--auth-env: expected the NAME of an environment variable"),
        (["--open-loop-horizon", "0"], "--open-loop-horizon: expected an integer >= 1, got 0"),
        (["--seed", "-1"], "--seed: expected an integer >= 0, got -1"),
        (["--open-timeout", "-1"], "--open-timeout: expected a finite number > 0"),
        (["--max-outstanding", "4"], "--arrival/--max-outstanding: only apply with --request-rate"),
    ],
)
def test_bench_rules_live_in_its_config_and_errors_name_the_flag(capsys, argv, needle):
    with pytest.raises(SystemExit) as exc:
        bench_cli.main(["--server", "ws://127.0.0.1:1", *argv])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and err.count("\n") == 1 and needle in err, err


def test_flag_usage_defaults_and_messages():
    flag = cli_types.Flag("--num-envs", "envs", field="num_envs", type=cli_types.integer, metavar="N")
    parser = argparse.ArgumentParser()
    cli_types.add_flags(
        parser,
        [flag, cli_types.Flag("--video", "videos", field="video", action=argparse.BooleanOptionalAction)],
        EvalConfig,
    )
    helps = {a.dest: a.help for a in parser._actions}
    assert helps["num_envs"] == "envs (default 8)" and helps["video"] == "videos (default on)"
    assert parser.parse_args([]).num_envs is None and parser.parse_args(["--no-video"]).video is False
    assert flag.usage() == "--num-envs N" and cli_types.SEED.but(help="x").help == "x"
    assert cli_types.flag_message(ValueError("num_envs: expected an integer >= 1, got 0"), [flag]).startswith(
        "--num-envs:"
    )
    assert cli_types.show([1, 2]) == "1, 2" and cli_types.show(0.05) == "0.05" and cli_types.show(False) == "off"


@pytest.mark.parametrize(
    ("main", "argv", "needle"),
    [
        (eval_cli.main, ["--num-envs", "x"], "dz-gym-eval: error: argument --num-envs: expected an integer"),
        (bench_cli.main, ["--server", "ws://127.0.0.1:1", "--warmup", "-1"], "dz-gym-bench: error: argument --warmup"),
        ("compare", ["--alpha", "x"], "dz-gym-compare: error: argument --alpha: expected a finite number"),
        ("report", ["--nope"], "dz-gym-report: error: the following arguments are required: RUN_DIR"),
    ],
)
def test_every_command_says_a_usage_error_in_one_line(capsys, main, argv, needle):
    if main == "compare":
        from dz_gym.compare import main
    elif main == "report":
        from dz_gym.report.cli import main
    with pytest.raises(SystemExit) as exc:
        main(argv)
    err = capsys.readouterr().err
    assert exc.value.code == 2 and err.count("\n") == 1 and err.startswith(needle), err


def test_compare_alpha_is_checked_by_the_comparison_and_named_as_the_flag(tmp_path, capsys):
    from dz_gym.compare import main
    from dz_gym.eval.rundir import RunDir

    run = RunDir.create(tmp_path, EvalConfig(backend="mujoco", num_envs=2, episodes=1, policy="hold"))
    row = {"scene": 1, "episode": 0, "seed": 0, "env": 0, "session_id": "s", "steps": 450, "server_calls": 57,
           "error": None, "success_at_end": True, "success_any_step": True, "prompt": "p"}  # fmt: skip
    (run.path / "episodes.jsonl").write_text("".join(
        __import__("json").dumps(dict(row, arm=arm)) + "\n" for arm in "ab"))  # fmt: skip
    with pytest.raises(SystemExit) as exc:
        main([str(run.path), "--alpha", "2"])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and "--alpha: expected a number in (0, 1), got 2.0" in err and err.count("\n") == 1
