"""The pipe messages of the transport's worker processes (pure): one table of every kind, both sides build and
read through it, a message it does not declare is refused with a clear error, docs/transport.md's table is its
own, and errors cross the pipe as their fields."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from dz_gym.errors import ConnectionLost, ProtocolError, ServerError
from dz_gym.transport.workers import messages
from dz_gym.transport.workers.messages import (
    ARENA,
    MESSAGES,
    OUT,
    RESET,
    SEND,
    TO_PARENT,
    TO_WORKER,
    VIEWS,
    MessageError,
    error_fields,
    markdown_table,
    pack_message,
    read_message,
    rebuild_error,
    unpack_message,
)

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs" / "transport.md"
SIDES = [ROOT / "dz_gym" / "transport" / "workers" / name for name in ("handle.py", "process.py", "pool.py")]


def test_every_kind_is_declared_once_per_direction_with_its_fields():
    names = {(kind.name, kind.direction) for kind in MESSAGES}
    assert len(names) == len(MESSAGES), "a kind declared twice"
    assert {kind.direction for kind in MESSAGES} == {TO_WORKER, TO_PARENT}
    for kind in MESSAGES:
        assert kind.fields and all(kind.fields) and kind.doc, kind.name
        assert getattr(messages, kind.name.upper()) is kind, f"{kind.name}: its constant has another name"


def test_a_message_round_trips_through_the_pipe_encoding():
    requests = [[7, 3, [[ARENA, 0, 128, 4096]]], [8, 3, [b"head", [VIEWS, 1, 64, 512], b"tail"]], [9, 4, [b"frame"]]]
    message = SEND(requests)
    assert message == ["send", requests]
    kind, fields = read_message(unpack_message(pack_message(message)), TO_WORKER)
    assert kind is SEND and fields == [requests]
    out = OUT(1, 2, b"frame", [0.5, 0.75, 10, 0, 0], None, 0.001, True)
    kind, fields = read_message(unpack_message(pack_message(out)), TO_PARENT)
    assert kind is OUT and fields[2] == b"frame" and fields[-1] is True


def test_an_undeclared_kind_or_a_wrong_field_count_is_refused():
    with pytest.raises(MessageError, match="reset message: expected 3 fields"):
        RESET(1, 2)
    with pytest.raises(MessageError, match=r"parent -> worker.*got 'sendx'"):
        read_message(["sendx", []], TO_WORKER)
    with pytest.raises(MessageError, match=r"worker -> parent.*got 'send'"):
        read_message(SEND([]), TO_PARENT)  # declared, but for the other direction
    with pytest.raises(MessageError, match="out message: expected 7 fields"):
        read_message(["out", 1, 2], TO_PARENT)
    with pytest.raises(MessageError, match="got 5"):
        read_message(5, TO_PARENT)


def test_no_kind_is_spelled_outside_the_table():
    """Both sides name the kinds by their constants: no string in their code is a kind's name (docstrings
    and the profiler's stage names aside)."""
    kinds = {kind.name for kind in MESSAGES}
    stages = {"send"}  # AsyncSession times its sends into the profiler's "send" stage
    for path in SIDES:
        tree = ast.parse(path.read_text())
        docstrings = {
            id(node.body[0].value)
            for node in ast.walk(tree)
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
            and node.body
            and isinstance(node.body[0], ast.Expr)
            and isinstance(node.body[0].value, ast.Constant)
        }
        spelled = {
            node.value
            for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings
        }
        assert not (spelled & kinds) - stages, f"{path.name} spells a kind: {sorted((spelled & kinds) - stages)}"


def test_the_docs_table_is_generated_from_the_declaration():
    table = markdown_table()
    assert table in DOCS.read_text(), "docs/transport.md: paste dz_gym.transport.workers.messages.markdown_table()"
    lines = table.splitlines()
    assert lines[0] == "| kind | direction | fields | what it does |" and len(lines) == 2 + len(MESSAGES)


def test_error_fields_rebuild_every_dz_gym_error():
    for error in (
        ServerError("Traceback\nboom", fatal=True, code="x"),
        ConnectionLost("gone", code=1011, reason="bye"),
        ProtocolError("bad frame"),
    ):
        again = rebuild_error(error_fields(error))
        assert type(again) is type(error) and str(again) == str(error) and vars(again) == vars(error)
