"""Unit tests of dz_gym.transport.rules: pure functions, no sockets, no clocks."""

from __future__ import annotations

import itertools

import pytest
from websockets.datastructures import Headers
from websockets.exceptions import InvalidMessage, InvalidStatus
from websockets.http11 import Response

from dz_gym.transport.rules import (
    Delivery,
    InvalidTransition,
    SessionState,
    backoff_delay,
    backoff_schedule,
    classify_close,
    may_retry_server_error,
    open_failure_is_transient,
    request_was_unprocessed,
    transition,
)

S = SessionState


# ------------------------------------------------------------------------------------------------ states
ALLOWED = {
    (S.IDLE, S.CONNECTING), (S.IDLE, S.CLOSED),
    (S.CONNECTING, S.OPEN), (S.CONNECTING, S.BROKEN), (S.CONNECTING, S.CLOSED),
    (S.OPEN, S.CONNECTING), (S.OPEN, S.BROKEN), (S.OPEN, S.CLOSED),
    (S.BROKEN, S.CONNECTING), (S.BROKEN, S.BROKEN), (S.BROKEN, S.CLOSED),
    (S.CLOSED, S.CONNECTING), (S.CLOSED, S.CLOSED),
}  # fmt: skip


@pytest.mark.parametrize(("current", "new"), list(itertools.product(S, S)))
def test_every_transition_is_either_allowed_or_refused(current, new):
    if (current, new) in ALLOWED:
        assert transition(current, new) is new
    else:
        with pytest.raises(InvalidTransition, match=f"{current.value} -> {new.value}"):
            transition(current, new)


def test_only_a_handshake_opens_a_session():
    assert {current for current, new in ALLOWED if new is S.OPEN} == {S.CONNECTING}


# ------------------------------------------------------------------------------------------------ closes
def test_a_close_frame_we_sent_over_a_bad_frame_is_a_protocol_failure():
    verdict = classify_close((1009, "frame exceeds limit"), None, None)
    assert verdict.protocol and verdict.code == 1009 and verdict.side == "client"
    assert "too big: frame exceeds limit" in verdict.describe("ws://h:1", "infer")


@pytest.mark.parametrize(
    ("sent", "rcvd", "rcvd_then_sent", "code", "side"),
    [
        (None, (1000, "idle timeout"), None, 1000, "server"),  # server closed, we did not answer yet
        ((1000, ""), (1000, "idle timeout"), True, 1000, "server"),  # server first, we echoed
        ((1000, ""), (1000, ""), False, 1000, "client"),  # we closed first, the server echoed
        ((1000, "bye"), None, None, 1000, "client"),  # we closed, no echo
        ((1011, "keepalive ping timeout"), None, None, 1011, "client"),
        (None, None, None, 1006, "network"),  # the TCP connection broke
        (None, (1011, "Internal server error"), None, 1011, "server"),
    ],
)
def test_a_close_is_a_lost_connection_with_its_code_and_side(sent, rcvd, rcvd_then_sent, code, side):
    verdict = classify_close(sent, rcvd, rcvd_then_sent)
    assert not verdict.protocol and (verdict.code, verdict.side) == (code, side)
    assert f"code {code}, by {side}" in verdict.describe("ws://h:1", "infer")


# ------------------------------------------------------------------------------------------------ opening
def _status(code: int) -> InvalidStatus:
    return InvalidStatus(Response(code, "x", Headers()))


def _garbled(cause: BaseException) -> InvalidMessage:
    exc = InvalidMessage("did not receive a valid HTTP response")
    exc.__cause__ = cause
    return exc


@pytest.mark.parametrize(
    ("exc", "transient"),
    [
        (ConnectionRefusedError(111, "refused"), True),
        (ConnectionResetError(104, "reset"), True),
        (OSError(113, "no route to host"), True),
        (EOFError("connection closed during the upgrade"), True),
        (_garbled(EOFError()), True),
        (_garbled(ValueError("bad status line")), False),
        (_status(503), True),
        (_status(500), True),
        (_status(401), False),
        (_status(404), False),
        (ValueError("garbage"), False),
        (TimeoutError(), False),
    ],
)
def test_which_open_failures_are_retried(exc, transient):
    assert open_failure_is_transient(exc) is transient


def test_backoff_doubles_from_base_and_is_capped():
    assert backoff_schedule(6, base=0.25, cap=1.5) == [0.25, 0.5, 1.0, 1.5, 1.5, 1.5]
    assert backoff_schedule(0, base=1.0, cap=8.0) == []
    assert backoff_delay(0, base=2.0, cap=1.0) == 1.0  # the cap wins even on the first wait
    with pytest.raises(ValueError, match="attempt"):
        backoff_delay(-1, base=1.0, cap=1.0)


# ------------------------------------------------------------------------------------------------ re-sending
@pytest.mark.parametrize(
    ("delivery", "code", "by_server", "reply_seen", "unprocessed"),
    [
        (Delivery.CLOSED_BEFORE_SEND, None, False, False, True),  # never left this process
        (Delivery.CLOSED_BEFORE_SEND, 1006, False, False, True),
        (Delivery.SENT, 1000, True, False, True),  # vLLM-Omni's idle close: it stopped reading
        (Delivery.SENT, 1000, False, False, False),  # we closed it: the server may hold the request
        (Delivery.SENT, 1001, True, False, False),  # shutting down: a running request may finish
        (Delivery.SENT, 1011, True, False, False),  # an error while (maybe) processing
        (Delivery.SENT, 1006, False, False, False),  # abrupt drop: unknown
        (Delivery.SENT, 1000, True, True, False),  # a reply came: it was processed
    ],
)
def test_only_requests_the_server_cannot_have_processed_are_resent(delivery, code, by_server, reply_seen, unprocessed):
    verdict = request_was_unprocessed(delivery, close_code=code, closed_by_server=by_server, reply_seen=reply_seen)
    assert verdict is unprocessed


def test_server_error_retries_are_bounded_by_the_limit():
    assert [may_retry_server_error(k, 2) for k in range(4)] == [True, True, False, False]
    assert not may_retry_server_error(0, 0)  # the default: report the first error
