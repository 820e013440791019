"""Command-line handling of dz-gym-eval: bad flags end with one line and exit status 2; resume checks; one
source of defaults (EvalConfig) for the code, --help and docs/eval.md."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from dz_gym.eval import cli, flags
from dz_gym.eval.config import EvalConfig
from dz_gym.eval.rundir import RunDir


def usage_error(capsys, argv) -> str:
    """The whole of stderr: exactly one line (no argparse usage block), and exit status 2."""
    with pytest.raises(SystemExit) as exc:
        cli.main(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("dz-gym-eval: error: "), err
    return err.strip()


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
        (["--prefetch", "8"], "--prefetch: expected an integer in [0, 8)"),
        (["--auth-env", "MY-TOKEN=abc"], "--auth-env"),
        (["--retry-server-errors", "-1"], "--retry-server-errors"),
        (["--server-max-sessions", "0"], "--server-max-sessions"),
        (["--server-idle-timeout", "-5"], "--server-idle-timeout"),
        (["--max-stale-steps", "-2"], "--max-stale-steps"),
        (["--num-envs"], "--num-envs"),
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
    assert (
        config.plan.episodes == 3
        and config.plan.scenes == [1]
        and config.plan.max_steps == 450
        and config.outputs.video
    )
    assert config.policies.policy == cli.default_policy(config.plan.backend) and config.plan.backend in (
        "mujoco",
        "isaac",
    )
    assert cli.default_policy("mujoco") == "reference" and cli.default_policy("isaac") == "hold"
    config, _, _ = cli.resolve_config(parser, parser.parse_args(["--auth-env", "DZ_TOKEN", "--server", "ws://h:1/p"]))
    assert config.transport.auth_env == "DZ_TOKEN"  # the variable's name, never its value
    args = parser.parse_args(["--host", "10.1.2.3", "--port", "9000", "--scene", "2", "--scene", "3", "--scene", "2"])
    config, _, servers = cli.resolve_config(parser, args)
    assert servers == ["ws://10.1.2.3:9000/v1/realtime/robot/openpi"]
    assert config.plan.scenes == [2, 3] and config.policies.policy == "external" and config.policies.servers == servers


def test_resume_may_change_how_but_not_what(tmp_path):
    config = EvalConfig(scenes=[1], episodes=4, num_envs=2, seed=3, max_steps=24, policy="hold")
    run = RunDir.create(tmp_path, config)
    parser = cli.build_parser(isaac_args=False)
    args = parser.parse_args(["--resume", str(run.path), "--num-envs", "4", "--no-video", "--episodes", "6"])
    resumed, run_dir, servers = cli.resolve_config(parser, args)
    assert run_dir.path == run.path and servers is None
    assert (
        resumed.plan.num_envs,
        resumed.outputs.video,
        resumed.plan.episodes,
        resumed.plan.seed,
        resumed.policies.policy,
    ) == (4, False, 6, 3, "hold")


def test_resume_of_an_external_server_run(capsys, tmp_path):
    config = EvalConfig(scenes=[2], episodes=2, num_envs=1, servers=["ws://127.0.0.1:9/x"], policy="external")
    run = RunDir.create(tmp_path, config)
    parser = cli.build_parser(isaac_args=False)
    _, _, servers = cli.resolve_config(parser, parser.parse_args(["--resume", str(run.path)]))
    assert servers == ["ws://127.0.0.1:9/x"]
    args = ["--resume", str(run.path), "--server", "ws://127.0.0.1:10/x"]
    resumed, _, servers = cli.resolve_config(parser, parser.parse_args(args))
    assert servers == resumed.policies.servers == ["ws://127.0.0.1:10/x"]
    assert "--policy" in usage_error(capsys, ["--resume", str(run.path), "--policy", "hold"])


def test_defaults_come_from_eval_config_in_code_help_and_docs():
    """EvalConfig holds every default; the transport's bounds come from TransportConfig; --help and the flag
    table of docs/eval.md show the same values."""
    from dz_gym.transport import TransportConfig

    parser = cli.build_parser(isaac_args=False)
    config, _, _ = cli.resolve_config(parser, parser.parse_args([]))
    default = EvalConfig(backend=config.plan.backend)
    assert config == default and config.plan.episodes == config.plan.num_envs
    assert EvalConfig.default("request_timeout") == TransportConfig().request_timeout
    assert EvalConfig.default("retry_server_errors") == TransportConfig().retry_server_errors == 0
    assert EvalConfig.default("backend") == "auto"
    help_text = " ".join(parser.format_help().split())
    docs = (Path(__file__).resolve().parents[1] / "docs" / "eval.md").read_text()
    table = dict(re.findall(r"^\| `(--[a-z-]+)(?:\\\||[^|])*\| ([^|]*) \|", docs, flags=re.M))
    for field in (
        "num_envs",
        "seed",
        "max_steps",
        "server_kind",
        "prefetch",
        "request_timeout",
        "retry_server_errors",
        "server_max_sessions",
        "server_idle_timeout",
        "backend",
        "scenes",
    ):
        value = EvalConfig.default(field)
        shown = (
            ", ".join(map(str, value))
            if isinstance(value, list)
            else f"{value:g}"
            if isinstance(value, float)
            else str(value)
        )
        flag = flags.flag_of(field)
        assert f"(default {shown}" in help_text.split(flag + " ", 1)[1], (flag, shown)
        assert table[flag].strip().split(" ")[0] == shown, (flag, table[flag], shown)


def test_flags_reach_the_transport_config():
    parser = cli.build_parser(isaac_args=False)
    argv = [
        "--retry-server-errors",
        "2",
        "--request-timeout",
        "30",
        "--server-max-sessions",
        "4",
        "--server-idle-timeout",
        "0",
    ]
    config, _, _ = cli.resolve_config(parser, parser.parse_args(argv))
    transport = config.transport_config()
    assert (transport.retry_server_errors, transport.request_timeout) == (2, 30.0)
    assert (config.transport.server_max_sessions, config.transport.server_idle_timeout) == (4, 0.0)


def test_preflight_failures_leave_no_run_directory(capsys, tmp_path):
    """An unreachable server: one error line, exit status 1, no run directory (nothing written at all)."""
    root = tmp_path / "runs"
    assert cli.main(["--server", "ws://127.0.0.1:1/v1/realtime/robot/openpi", "--output-root", str(root)]) == 1
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if "error" in line.lower()]
    assert len(errors) == 1 and errors[0].startswith("dz-gym-eval: error: --server"), err
    assert "ws://127.0.0.1:1/" in errors[0]
    assert not root.exists()


def test_preflight_backend_not_importable(capsys, tmp_path):
    from dz_gym.envs import backends

    if backends.traits("isaac").available():  # an isaaclab wheel alone (no Isaac Sim) is not
        pytest.skip("Isaac Lab can start here")
    root = tmp_path / "runs"
    assert cli.main(["--backend", "isaac", "--output-root", str(root)]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("dz-gym-eval: error: --backend isaac: Isaac Lab is not importable")
    assert not root.exists()


@pytest.fixture
def sigint_disposition():
    """Sets SIGINT's disposition for one test (``set(handler)``) and restores whatever it was (the suite may
    have been started with SIGINT ignored, or with Python's default handler)."""
    import signal

    before = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    try:
        yield lambda handler: signal.signal(signal.SIGINT, handler)
    finally:
        signal.signal(signal.SIGINT, before[0])
    assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == before


def test_stop_signals_first_stops_second_only_where_safe(sigint_disposition):
    """First signal: stop at the next step (no exception). A repeated one raises KeyboardInterrupt only inside
    an interruptible block and never inside a shielded one (writing results); SIGTERM is worded as such. The
    handlers in place before are restored at the end, whatever they were."""
    import signal
    import threading

    from dz_gym.eval.signals import StopOnSignal, interruptible, shielded

    def previous_handler(signum, frame):  # what a caller had installed before: it must come back
        raise AssertionError("the previous handler must not run inside the block")

    sigint_disposition(previous_handler)
    expected = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    said: list[str] = []
    stop = threading.Event()
    with StopOnSignal(stop, said.append) as handler:
        signal.raise_signal(signal.SIGTERM)
        assert stop.is_set() and "SIGTERM" in said[-1] and "Ctrl-C" not in said[-1]
        signal.raise_signal(signal.SIGINT)  # outside an interruptible block: noted, no exception
        assert len(said) == 2 and handler.signals == 2
        with shielded(), interruptible():
            signal.raise_signal(signal.SIGINT)  # writing results: never interrupted
        with pytest.raises(KeyboardInterrupt), interruptible():
            signal.raise_signal(signal.SIGINT)
    assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == expected
    sigint_disposition(signal.default_int_handler)
    said.clear()
    with StopOnSignal(threading.Event(), said.append):
        signal.raise_signal(signal.SIGINT)
        assert "Ctrl-C again to stop now" in said[0]
        with pytest.raises(KeyboardInterrupt), interruptible():
            signal.raise_signal(signal.SIGINT)
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_an_ignored_sigint_stays_ignored(sigint_disposition):
    """Started with SIGINT ignored (a background job of a script, nohup under some shells), the evaluator does
    not start reacting to Ctrl-C; SIGTERM still stops it, and SIGINT is ignored again afterwards."""
    import signal
    import threading

    from dz_gym.eval.signals import StopOnSignal, interruptible

    sigint_disposition(signal.SIG_IGN)
    said: list[str] = []
    stop = threading.Event()
    with StopOnSignal(stop, said.append) as handler, interruptible():
        signal.raise_signal(signal.SIGINT)
        signal.raise_signal(signal.SIGINT)
        assert not stop.is_set() and handler.signals == 0 and said == []
        signal.raise_signal(signal.SIGTERM)
        assert stop.is_set() and handler.signals == 1 and "SIGTERM" in said[0]
    assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN


def test_docs_flags_table_is_generated_from_the_declarations():
    """docs/eval.md's flags table is markdown_table() (regenerate it from dz_gym.eval.flag_table when a flag
    changes), and the parser has exactly the declared flags."""
    from dz_gym.eval import flag_table

    docs = (Path(__file__).resolve().parents[1] / "docs" / "eval.md").read_text()
    assert flag_table.markdown_table() in docs, "docs/eval.md: paste dz_gym.eval.flag_table.markdown_table()"
    parser = cli.build_parser(isaac_args=False)
    declared = {flag.name for flag in flag_table.ALL}
    parsed = {a.option_strings[0] for a in parser._actions if a.option_strings and a.help != "==SUPPRESS=="}
    assert parsed - {"-h"} == declared


def test_every_config_field_has_one_flag_and_every_flag_a_field():
    """The declarations checked against the dataclasses: each EvalConfig / RayOptions field a user sets has
    exactly one flag (servers also via --host/--port/--path), and a flag's field exists."""
    import dataclasses

    from dz_gym.eval import flag_table
    from dz_gym.eval.shards.options import RayOptions

    fields = [flag.field for flag in flag_table.ALL if flag.field]
    assert len(fields) == len(set(fields))
    assert all(flag_table.config_class(flag) is not None for flag in flag_table.ALL if flag.field)
    from dz_gym.eval.config import PATHS

    # every saved section's every field, dotted; of how this process runs it, those a flag sets directly (the
    # rest: --ray's RayOptions, --progress, the command line itself, or Python objects)
    python_only = {"ray", "progress", "command", "argv", "only_scenes", "env_factory", "env_kwargs", "control"}
    eval_fields = {path for name, path in PATHS.items() if name not in python_only}
    assert eval_fields <= set(fields), eval_fields - set(fields)
    assert all(flag.key == flag.field.split(".")[-1] or flag.dest for flag in flag_table.eval_flags())
    ray_fields = {f.name for f in dataclasses.fields(RayOptions)} - {
        "resources",
        "local_cpus",
        "local_gpus",
        "worker_setup",
    }
    assert ray_fields - {"poll_s", "stop_grace_s"} <= set(fields)


def test_help_groups_by_decision_and_marks_the_flags_locked_on_resume():
    from dz_gym.eval.config import RESULT_KEYS

    parser = cli.build_parser(isaac_args=False)
    titles = [g.title for g in parser._action_groups][2:]
    assert titles == ["what to run", "which policy and server", "how requests are timed", "outputs and faults",
                      "scale-out", "A/B and K arms: every seed under several policies"]  # fmt: skip
    assert {key.split(".")[-1] for key in RESULT_KEYS} == {"backend", "scenes", "seed", "max_steps", "open_loop_horizon", "policy", "prefetch",
                                "simulated_delay", "max_stale_steps", "policy_b", "sequential", "alpha",
                                "min_difference", "power", "max_episodes", "policy_seed", "num_inference_steps", "arm_specs",
                                "select_best", "episode_retries", "server_kind", "latency_honest", "control_hz",
                                "render_shape", "accept_lower_power"}  # fmt: skip
    helps = {a.option_strings[0]: a.help for a in parser._actions if a.option_strings}
    for key in RESULT_KEYS:
        assert helps[flags.flag_of(key)].endswith("[locked on --resume]"), key
    for free in ("--num-envs", "--request-timeout", "--video", "--server", "--episodes", "--shards"):
        assert "[locked" not in helps[free], free
    assert "[locked on --resume]" in " ".join(parser.format_help().split())
