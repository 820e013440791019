"""dz-gym-serve's flags: one declaration each (dz_gym.server.flags), a grouped --help with the config's
defaults, one-line errors naming the flag (the config's rules), and docs/server.md's table."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from dz_gym.server import cli, flags
from dz_gym.server.app import ServerConfig

DOCS = Path(__file__).resolve().parent.parent / "docs" / "server.md"


def test_help_is_grouped_and_shows_the_defaults():
    text = " ".join(flags.build_parser().format_help().split())
    for title, _ in flags.GROUPS:
        assert f" {title}: " in text
    assert "--workers K independent inference workers (emulated GPUs) (default 1)" in text
    assert "--port PORT port; 0 picks a free one (read it from the ready line) (default 8000)" in text
    assert "(default vllm-omni)" in text and "(default 64)" in text and "(default hold)" in text


def test_every_field_flag_sets_a_config_field_and_the_flags_build_the_config():
    names = {f.name for f in dataclasses.fields(ServerConfig)}
    assert all(f.field in names for f in flags.FLAGS if f.field)
    parser = flags.build_parser()
    argv = ["--flavor", "openpi", "--workers", "3", "--latency-ms", "5", "--max-payload-mib", "2", "--no-robot-policy"]
    config = flags.config_of(parser, parser.parse_args(argv))
    assert config == ServerConfig(flavor="openpi", port=8000, workers=3, latency_ms=5.0,
                                  max_payload_bytes=2 * 1024 * 1024, robot_policy_available=False)  # fmt: skip
    assert flags.config_of(parser, parser.parse_args([])) == ServerConfig(port=8000)


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["--workers", "0"], "--workers: expected an integer >= 1, got 0"),
        (["--latency-ms", "-1"], "--latency-ms: expected a number of milliseconds >= 0, got -1.0"),
        (["--fail-every", "-2"], "--fail-every: expected an integer >= 0 (0: never), got -2"),
        (["--idle-timeout", "-1"], "--idle-timeout: expected >= 0 (0 disables), got -1.0"),
        (["--port", "70000"], "--port: expected 0..65535, got 70000"),
        (["--flavor", "dreamzero", "--max-sessions", "2"], "--max-sessions: only the vllm-omni flavor caps sessions"),
        (["--workers", "x"], "--workers: expected an integer, got 'x'"),
    ],
)
def test_bad_flags_are_one_line_naming_the_flag(capsys, argv, needle):
    with pytest.raises(SystemExit) as exc:
        cli.main(argv)
    err = capsys.readouterr().err
    assert exc.value.code == 2 and err.count("\n") == 1 and needle in err, err


def test_the_docs_flags_table_is_the_declaration():
    assert flags.markdown_table() in DOCS.read_text()
