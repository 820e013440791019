"""The robot policy contract a server announces in its handshake, and the checks against it (no I/O).

Newer vLLM-Omni versions validate every reply against optional keys of the model's ``policy_server_config``,
the map they send as the handshake (``entrypoints/openpi/action_contract.py``): ``action_horizon`` (every
chunk has exactly that many rows), ``max_action_horizon`` (at most that many), ``action_dim`` (the width of
a row) and ``action_keys`` (the reply is a map of named chunks with exactly these keys). dz-gym also reads
``default_action_horizon`` (the rows a chunk has unless asked otherwise) and ``max_sessions`` (a cap on
resident sessions beyond which new sessions are refused; the reference server's ``--max-sessions``).
A server without these keys announces nothing, and nothing is checked: that is every older server.

:func:`policy_contract` reads them (a malformed value is a one-line :class:`~dz_gym.errors.ProtocolError`);
:func:`check_contract` compares them with what the client will do, before its first request;
:func:`check_reply` checks one reply's chunk as the evaluator executes it (``dz-gym-bench`` counts a reply
that fails it as an error);
:func:`expected_horizon` is the chunk length a reply must have (None: any); :func:`contract_horizon` the
longest open-loop horizon the server guarantees. :func:`is_admission_refusal` recognises a refused session;
:func:`releases_sessions` says whether a ``reset`` at the end of an episode frees its session there.

>>> contract = policy_contract({"action_horizon": 24, "action_dim": 8})
>>> contract.action_horizon, contract.announced, contract_horizon(contract)
(24, True, 24)
>>> check_contract(contract, open_loop_horizon=32, action_dim=8, url="ws://gpu:8000")
Traceback (most recent call last):
...
dz_gym.errors.HandshakeError: server ws://gpu:8000: announces action_horizon=24, but the open-loop horizon is 32 (it must be <= 24)
>>> policy_contract({"image_resolution": [180, 320]}).announced
False
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import numpy as np

from dz_gym.errors import HandshakeError, ProtocolError

__all__ = [
    "ADMISSION_ERROR_CODES",
    "CONTRACT_KEYS",
    "PolicyContract",
    "check_chunk",
    "check_contract",
    "check_reply",
    "contract_horizon",
    "expected_horizon",
    "is_admission_refusal",
    "policy_contract",
    "releases_sessions",
    "resolve_horizon",
]

CONTRACT_KEYS = ("action_horizon", "max_action_horizon", "default_action_horizon", "action_dim", "action_keys")

# Error-reply codes and message words that mean "no room for a new session" (the exception name of
# vLLM-Omni's proposal, the reference server's code). Matched case-insensitively in the code or the message.
ADMISSION_ERROR_CODES = ("session_admission", "sessionadmissionerror", "session_capacity")


@dataclasses.dataclass(frozen=True)
class PolicyContract:
    """The contract keys of one handshake (None: not announced); ``announced`` when any of them is set."""

    action_horizon: int | None = None
    max_action_horizon: int | None = None
    default_action_horizon: int | None = None
    action_dim: int | None = None
    action_keys: tuple[str, ...] | None = None
    max_sessions: int | None = None

    @property
    def announced(self) -> bool:
        return any(getattr(self, key) is not None for key in CONTRACT_KEYS)


def _positive_int(raw: Mapping[str, Any], key: str) -> int | None:
    value = raw.get(key)
    if value is None:
        return None
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ProtocolError(f"metadata {key}: expected an integer >= 1 or null, got {value!r}")
    return int(value)


def policy_contract(raw: Mapping[str, Any]) -> PolicyContract:
    """The contract announced in a decoded handshake map ``raw`` (see the module docstring)."""
    keys = raw.get("action_keys")
    if keys is not None:
        if not isinstance(keys, (list, tuple)) or not keys or not all(isinstance(k, str) and k for k in keys):
            raise ProtocolError(f"metadata action_keys: expected a non-empty list of strings or null, got {keys!r}")
        keys = tuple(keys)
    contract = PolicyContract(
        action_horizon=_positive_int(raw, "action_horizon"),
        max_action_horizon=_positive_int(raw, "max_action_horizon"),
        default_action_horizon=_positive_int(raw, "default_action_horizon"),
        action_dim=_positive_int(raw, "action_dim"),
        action_keys=keys,
        max_sessions=_positive_int(raw, "max_sessions"),
    )
    cap = contract.max_action_horizon
    for key in ("action_horizon", "default_action_horizon"):
        value = getattr(contract, key)
        if cap is not None and value is not None and value > cap:
            raise ProtocolError(f"metadata {key}: {value} exceeds max_action_horizon={cap}")
    return contract


def expected_horizon(contract: PolicyContract) -> int | None:
    """The number of rows every reply must have: the announced fixed ``action_horizon``, else None (any)."""
    return contract.action_horizon


def contract_horizon(contract: PolicyContract) -> int | None:
    """The chunk length the server announces it will send (fixed, else default, else its maximum)."""
    for value in (contract.action_horizon, contract.default_action_horizon, contract.max_action_horizon):
        if value is not None:
            return value
    return None


def check_contract(contract: PolicyContract, *, open_loop_horizon: int, action_dim: int, url: str) -> None:
    """Raise a one-line :class:`~dz_gym.errors.HandshakeError` when the announced contract cannot serve a
    client that executes ``open_loop_horizon`` rows of each chunk on an env taking ``action_dim`` values."""
    where = f"server {url}: announces"
    if contract.action_dim is not None and contract.action_dim != action_dim:
        raise HandshakeError(
            f"{where} action_dim={contract.action_dim}, but the env's action space takes {action_dim} values per step"
        )
    if contract.action_keys is not None and tuple(contract.action_keys) != ("actions",):
        raise HandshakeError(
            f"{where} action_keys={list(contract.action_keys)}, but the env takes one chunk of {action_dim}-wide "
            "joint-position rows (a bare array or the key 'actions')"
        )
    for key in ("action_horizon", "default_action_horizon", "max_action_horizon"):
        value = getattr(contract, key)
        if value is not None and open_loop_horizon > value:
            raise HandshakeError(
                f"{where} {key}={value}, but the open-loop horizon is {open_loop_horizon} (it must be <= {value})"
            )


def resolve_horizon(
    contracts: Mapping[str, PolicyContract], requested: int | None, default: int, action_dim: int
) -> int:
    """The open-loop horizon for servers announcing ``contracts`` (per URL): ``requested`` where set, else
    ``default`` capped by the chunk lengths they announce; :func:`check_contract` against each of them.

    >>> resolve_horizon({"ws://a": policy_contract({"action_horizon": 4})}, None, 8, 8)
    4
    """
    horizon = requested
    if horizon is None:
        announced = [h for h in map(contract_horizon, contracts.values()) if h is not None]
        horizon = min([default, *announced])
    for url, contract in contracts.items():
        check_contract(contract, open_loop_horizon=horizon, action_dim=action_dim, url=url)
    return horizon


def check_chunk(actions: np.ndarray, *, action_dim: int | None, horizon: int | None) -> None:
    """Raise a one-line :class:`~dz_gym.errors.ProtocolError` unless the decoded chunk ``actions`` is 2-D
    with at least one row, ``action_dim`` wide and ``horizon`` rows long (each where given). The one check of
    a reply's shape: the parser applies it to what it decodes, the chunk schedule to what it executes.

    >>> check_chunk(np.zeros((16, 8), np.float32), action_dim=8, horizon=24)
    Traceback (most recent call last):
    ...
    dz_gym.errors.ProtocolError: reply actions: expected horizon 24, got shape (16, 8)
    """
    shape = tuple(getattr(actions, "shape", ()))
    if len(shape) != 2:
        raise ProtocolError(f"reply actions: expected shape (H, {action_dim or 'D'}), got {shape}")
    if action_dim is not None and shape[1] != action_dim:
        raise ProtocolError(f"reply actions: expected last dim {action_dim}, got shape {shape}")
    if shape[0] == 0:
        raise ProtocolError(f"reply actions: expected at least one row, got shape {shape}")
    if horizon is not None and shape[0] != horizon:
        raise ProtocolError(f"reply actions: expected horizon {horizon}, got shape {shape}")


def check_reply(actions: np.ndarray, contract: PolicyContract, *, open_loop_horizon: int, action_dim: int) -> None:
    """Raise a one-line :class:`~dz_gym.errors.ProtocolError` unless the decoded chunk ``actions`` is one a
    client executing ``open_loop_horizon`` rows on an env of ``action_dim`` values per step can use, from a
    server announcing ``contract``: :func:`check_chunk` (2-D, ``action_dim`` wide, the announced
    ``action_horizon`` long where there is one) and at least ``open_loop_horizon`` rows. (The reply parser
    has already refused a non-numeric dtype and non-finite values.)

    >>> check_reply(np.zeros((24, 3)), PolicyContract(), open_loop_horizon=8, action_dim=8)
    Traceback (most recent call last):
    ...
    dz_gym.errors.ProtocolError: reply actions: expected last dim 8, got shape (24, 3)
    >>> check_reply(np.zeros((4, 8)), PolicyContract(), open_loop_horizon=8, action_dim=8)
    Traceback (most recent call last):
    ...
    dz_gym.errors.ProtocolError: reply actions: expected at least 8 rows (the open-loop horizon), got shape (4, 8)
    """
    check_chunk(actions, action_dim=action_dim, horizon=expected_horizon(contract))
    if actions.shape[0] < open_loop_horizon:
        raise ProtocolError(
            f"reply actions: expected at least {open_loop_horizon} rows (the open-loop horizon), got shape "
            f"{tuple(actions.shape)}"
        )


def is_admission_refusal(code: Any, message: Any) -> bool:
    """Whether an error reply's ``code``/``message`` say the server refused a new session (no capacity).

    >>> is_admission_refusal(None, "SessionAdmissionError: 4 resident sessions")
    True
    >>> is_admission_refusal(None, "Internal inference error")
    False
    """
    text = f"{code or ''} {message or ''}".lower().replace(" ", "_")
    return any(word in text for word in ADMISSION_ERROR_CODES)


def releases_sessions(contract: PolicyContract) -> bool:
    """Whether a client should free an ended episode's session with a ``reset`` on its own connection.

    True for a server that caps resident sessions (``max_sessions``: an unreleased session holds a place
    until its connection closes) or announces the action contract (vLLM-Omni versions that do also drop a
    session's state on ``reset``, on a session switch and on disconnect). Not for the others: DreamZero's own
    server resets its one global session and writes a video, openpi's passes ``endpoint`` on to the model.
    """
    return contract.max_sessions is not None or contract.announced
