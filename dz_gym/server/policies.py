"""Policies the reference server can serve, and how to plug in your own.

A policy is any object with

- ``metadata: dict`` (optional): the handshake fields; DreamZero's ``PolicyServerConfig`` when absent;
- ``infer(request: dict, *, session_id: str, new_session: bool) -> np.ndarray | dict``: one action chunk,
  normally a ``(24, 8)`` float32 array (7 absolute joint targets + gripper; ``(32, 8)`` behind the FLUX
  flavors). ``request`` is the decoded
  observation (``endpoint`` already removed for the vllm-omni and dreamzero flavors); ``new_session`` is true
  when the server would reset the model's memory for this session (first request of a session id on a
  vLLM-Omni connection, a session switch on DreamZero's single global session);
- ``reset(session_id: str | None)`` (optional): called on a ``reset`` request.

With ``--workers K > 1`` these methods are called from K threads at once.

An openpi policy (openpi-client's ``BasePolicy``: ``infer(obs) -> {"actions": ...}`` and ``reset()``, with
neither session keyword) is served through :class:`OpenPIPolicy`, which :func:`as_server_policy` puts around
any policy whose ``infer`` takes no ``session_id``/``new_session`` keywords: the reference server serves it as
it is, with its one state shared by every session, reset (``reset()``) at each new session.

``--policy`` takes a built-in name (see :data:`BUILTIN_POLICIES`; adding one is one line there) or
``package.module:factory``; ``--policy-arg key=value`` arguments are passed to the factory as keyword
arguments, values parsed as JSON when they parse (numbers, ``true``, lists) and kept as strings otherwise.
A built-in name may carry its arguments inline, ``NAME:key=value[,key=value...]`` (``reference:skill=0.3``),
so that one string names the policy everywhere a policy name is stored or passed on (``dz-gym-eval
--policy``, ``config.json``).
"""

from __future__ import annotations

import importlib
import inspect
import json
import threading
from collections.abc import Iterable, Mapping
from typing import Any, Protocol, runtime_checkable

import numpy as np

from dz_gym.envs.droid import ACTION_DIM, ACTION_HORIZON, ARM_DOF
from dz_gym.protocol import DREAMZERO_METADATA
from dz_gym.protocol.observation import request_profile

__all__ = [
    "BUILTIN_POLICIES",
    "HoldPolicy",
    "OpenPIPolicy",
    "Policy",
    "ProbePolicy",
    "as_server_policy",
    "load_policy",
    "parse_policy_args",
    "parse_policy_spec",
    "policy_metadata",
]

# Built-in policies by name -> "module:factory" (imported only when chosen).
BUILTIN_POLICIES: dict[str, str] = {
    "hold": "dz_gym.server.policies:HoldPolicy",
    "probe": "dz_gym.server.policies:ProbePolicy",
    "reference": "dz_gym.policies.reference:make_reference_policy",
}


@runtime_checkable
class Policy(Protocol):
    """What the server calls; ``metadata`` and ``reset`` are optional (see the module docstring)."""

    def infer(self, request: dict, *, session_id: str, new_session: bool) -> np.ndarray | dict: ...


def policy_metadata(policy: Any) -> dict:
    """The handshake fields of ``policy``: its ``metadata`` dict, else DreamZero's defaults."""
    metadata = getattr(policy, "metadata", None)
    if metadata is None:
        return dict(DREAMZERO_METADATA)
    if not isinstance(metadata, Mapping):
        raise TypeError(f"policy metadata: expected a dict, got {type(metadata).__name__}")
    return dict(metadata)


class OpenPIPolicy:
    """An openpi-style policy (``infer(obs)``, ``reset()``) as the server calls a policy (see the module
    docstring): each new session first resets it, then every request goes to ``infer(request)``."""

    def __init__(self, policy: Any):
        self.policy = policy
        self.metadata = getattr(policy, "metadata", None)

    def infer(self, request: dict, *, session_id: str, new_session: bool) -> Any:
        if new_session:
            self._reset()
        return self.policy.infer(request)

    def reset(self, session_id: str | None) -> None:
        self._reset()

    def _reset(self) -> None:
        reset = getattr(self.policy, "reset", None)
        if callable(reset):
            reset()


def as_server_policy(policy: Any) -> Any:
    """``policy`` when its ``infer`` takes the server's session keywords (or ``**kwargs``), an
    :class:`OpenPIPolicy` around it when it takes the observation alone; a one-line ``TypeError`` without
    an ``infer`` method."""
    infer = getattr(policy, "infer", None)
    if not callable(infer):
        raise TypeError(f"policy: expected an object with an infer method, got {type(policy).__name__}")
    try:
        parameters = inspect.signature(infer).parameters.values()
    except (TypeError, ValueError):  # no signature to read (a builtin): call it as the server does
        return policy
    names = {p.name for p in parameters if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD)}
    if any(p.kind == p.VAR_KEYWORD for p in parameters) or {"session_id", "new_session"} <= names:
        return policy
    return OpenPIPolicy(policy)


def _joints(request: Mapping[str, Any]) -> np.ndarray:
    """The request's joint positions, whichever server's keys it carries (two keys or one state)."""
    profile = request_profile(request)
    key = profile.state_key or profile.joint_key
    if key not in request:
        raise KeyError(f"request has no {key!r}")
    values = np.asarray(request[key], dtype=np.float32).reshape(-1)
    size = ARM_DOF + 1 if key == profile.state_key else ARM_DOF
    if values.size != size:
        raise ValueError(f"{key}: expected {size} values, got shape {np.shape(request[key])}")
    return values[:ARM_DOF]


def chunk_length(horizon: int | None, request: Mapping[str, Any]) -> int:
    """``horizon`` where given, else the chunk length of the server the request was made for (24 for
    DreamZero's keys, 32 for the FLUX servers')."""
    if horizon is not None:
        return horizon
    shape = request_profile(request).chunk_shape
    return ACTION_HORIZON if shape is None else shape[0]


def _horizon(horizon: int | None) -> int | None:
    if horizon is not None and int(horizon) < 1:
        raise ValueError(f"horizon: expected >= 1, got {horizon}")
    return None if horizon is None else int(horizon)


class HoldPolicy:
    """Hold the received joint positions with the gripper open: a chunk of identical rows (``horizon``
    rows; None: as many as the request's server sends, :func:`chunk_length`)."""

    def __init__(self, horizon: int | None = None, gripper: float = 0.0, metadata: dict | None = None):
        self.horizon = _horizon(horizon)
        self.gripper = float(gripper)
        self.metadata = dict(DREAMZERO_METADATA if metadata is None else metadata)

    def infer(self, request: dict, *, session_id: str, new_session: bool) -> np.ndarray:
        row = np.empty(ACTION_DIM, dtype=np.float32)
        row[:ARM_DOF] = _joints(request)
        row[ARM_DOF] = self.gripper
        return np.tile(row, (chunk_length(self.horizon, request), 1))


class ProbePolicy:
    """Actions that report what the server did, for tests of session and ordering semantics.

    Column 0: number of inferences in this session since it (re)started (1 on a new session);
    column 1: 1.0 if the server flagged the request ``new_session``; column 2: the global inference number in
    execution order (1-based); column 3: the number of resets seen; the other columns are 0.
    """

    def __init__(self, horizon: int | None = None, metadata: dict | None = None):
        self.horizon = _horizon(horizon)
        self.metadata = dict(DREAMZERO_METADATA if metadata is None else metadata)
        self._lock = threading.Lock()
        self._calls: dict[str, int] = {}
        self._global = 0
        self.resets: list[str | None] = []
        self.log: list[tuple[str, bool]] = []

    def infer(self, request: dict, *, session_id: str, new_session: bool) -> np.ndarray:
        with self._lock:
            self._global += 1
            calls = 1 if new_session else self._calls.get(session_id, 0) + 1
            self._calls[session_id] = calls
            self.log.append((session_id, new_session))
            out = np.zeros((chunk_length(self.horizon, request), ACTION_DIM), dtype=np.float32)
            out[:, 0] = calls
            out[:, 1] = float(new_session)
            out[:, 2] = self._global
            out[:, 3] = len(self.resets)
        return out

    def reset(self, session_id: str | None) -> None:
        with self._lock:
            self.resets.append(session_id)


def parse_policy_args(items: Iterable[str]) -> dict[str, Any]:
    """``["k=v", ...]`` -> kwargs; values are JSON when they parse, strings otherwise."""
    kwargs: dict[str, Any] = {}
    for item in items:
        key, sep, text = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"--policy-arg: expected key=value, got {item!r}")
        try:
            value: Any = json.loads(text)
        except ValueError:
            value = text
        kwargs[key.strip()] = value
    return kwargs


def parse_policy_spec(spec: str) -> tuple[str, dict[str, Any]]:
    """``"NAME:k=v,k2=v2"`` of a built-in NAME -> ``(NAME, {k: v, k2: v2})``; any other spec unchanged, ``{}``.

    ``module:factory`` specs are told apart by their part before the colon, which is not a built-in name.
    """
    name, sep, rest = spec.partition(":")
    if not sep or name not in BUILTIN_POLICIES:
        return spec, {}
    items = [item for item in rest.split(",") if item.strip()]
    if not items:
        raise ValueError(f"--policy: expected {name}:key=value[,key=value...], got {spec!r}")
    return name, parse_policy_args(items)


def load_policy(spec: str, kwargs: Mapping[str, Any] | None = None) -> Any:
    """Build the policy named ``spec`` (a built-in name, ``NAME:k=v,...`` or ``module:factory``) with ``kwargs``.

    Inline arguments of ``spec`` and ``kwargs`` are merged; a key given both ways is an error.
    """
    spec, inline = parse_policy_spec(spec)
    both = sorted(set(inline) & set(kwargs or {}))
    if both:
        raise ValueError(f"--policy-arg: {', '.join(both)} also given in --policy {spec}:...; give each once")
    kwargs = {**inline, **dict(kwargs or {})}
    target = BUILTIN_POLICIES.get(spec, spec)
    module_name, sep, attr = target.partition(":")
    if not sep or not module_name or not attr:
        known = ", ".join(sorted(BUILTIN_POLICIES))
        raise ValueError(f"--policy: expected one of {known} or module:factory, got {spec!r}")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ValueError(f"--policy: cannot import {module_name!r} ({exc})") from None
    factory = getattr(module, attr, None)
    if factory is None or not callable(factory):
        raise ValueError(f"--policy: {module_name!r} has no callable {attr!r}")
    try:
        policy = factory(**dict(kwargs or {}))
    except TypeError as exc:
        raise ValueError(f"--policy-arg: {spec} rejected the arguments ({exc})") from None
    if not callable(getattr(policy, "infer", None)):
        raise ValueError(f"--policy: {spec} built a {type(policy).__name__} without an infer method")
    return policy
