"""The reference policy server: a websockets (asyncio) server that behaves like the real ones.

Three flavors, each following its real counterpart (see ``docs/server.md`` and the protocol docs):

``vllm-omni`` (vLLM-Omni 0.30)
    Binary metadata. ``endpoint`` is popped, default ``"infer"``; ``"reset"`` answers binary
    ``{"status": "reset successful"}`` and forgets every session seen on the connection. The first request of
    a session id on a connection runs with ``new_session=True`` (a per-connection seen-set). Errors are binary
    ``{"type": "error", "message": ...}`` and the connection stays open (an inference error also forgets that
    session). Text and empty binary frames are ignored, never answered. Optional idle timeout (normal close).
    ``GET /health``. With ``max_sessions`` (``--max-sessions K``) at most K session ids are resident at once;
    the first request of one more gets the binary error ``{"type": "error", "message":
    "SessionAdmissionError: ...", "code": "session_admission"}`` (connection open, nothing computed), as
    vLLM-Omni's proposed admission cap; a session is freed by a reset on its connection, a switch of its
    connection to another session id, an inference error, or the connection's close
    (:mod:`dz_gym.server.admission`). The handshake then announces ``max_sessions``.
``dreamzero`` (DreamZero's own server)
    ``endpoint`` is required; reset answers the text ``"reset successful"``. One global session for the whole
    server: a request whose ``session_id`` differs from the last one runs with ``new_session=True``. Any
    exception sends the traceback as a text frame and closes with 1011.
``openpi`` (openpi's ``WebsocketPolicyServer``)
    No routing: the whole request goes to the policy. The reply is a dict with ``actions`` and
    ``server_timing`` (``infer_ms``, ``prev_total_ms``). Errors as dreamzero. ``GET /healthz``.
``flux3-bfl`` (BFL's ``flux-action serve-robolab``)
    Handshake ``{"serving_setup": {...}}``. No sessions and no routing: ``session_id`` and ``endpoint`` are
    ignored, and a frame without images (a reset) raises. Slash keys, 360x640 views or a 540x640
    composite (:mod:`dz_gym.server.flux`); the reply is ``{"action": (32, 8), "server_timing"}``. The seed is
    a global query counter. Errors as dreamzero (text traceback, then close 1011). No health route.
``sglang`` (SGLang's ``/openpi/policy``)
    Only on ``/openpi/policy`` (other paths: HTTP 404). Handshake ``action.metadata``. Dot keys
    ``observation.images.*`` (360x640 views or a 540x640 composite), an 8-value ``state``, ``prompt`` or
    ``task``; no sessions or reset. The reply is ``{"request_id", "actions": (32, 8), "parameters",
    "timings", "cache", "server_timing"}``; the seed is the request's ``seed``, else 0. Errors: binary
    ``{"error": traceback}``, then close 1011.

The FLUX flavors hand the policy the normalised request (the composite, the state, the prompt) and pass its
session id through as the policy's memory key (the real servers have none; the reference policy plans with
memory), never as a new session.

Every flavor serves the websocket on any path and runs inference through one FIFO
:class:`~dz_gym.server.engine.InferenceEngine` shared by all connections.
"""

from __future__ import annotations

import asyncio
import http
import json
import logging
import time
import traceback
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import numpy as np
from websockets.asyncio.server import Server, ServerConnection, serve
from websockets.exceptions import ConnectionClosed
from websockets.frames import CloseCode
from websockets.http11 import Request, Response

from dz_gym.errors import ProtocolError
from dz_gym.protocol import (
    RESET_SUCCESSFUL,
    encode_error,
    encode_metadata,
    encode_reply,
    encode_reset_reply,
    packb,
    parse_request,
    unpackb,
)
from dz_gym.server.admission import ADMISSION_CODE, ResidentSessions, refusal_message
from dz_gym.server.engine import EngineStats, InferenceEngine, JobResult
from dz_gym.server.flux import SGLANG, bfl_handshake, bfl_observation, flux_reply, sglang_handshake, sglang_observation
from dz_gym.server.policies import as_server_policy, policy_metadata

__all__ = ["FLAVORS", "PolicyServer", "ServerConfig"]

logger = logging.getLogger("dz_gym.server")

FLAVORS = ("vllm-omni", "dreamzero", "openpi", "flux3-bfl", "sglang")
FLUX_FLAVORS = ("flux3-bfl", "sglang")
MAX_TRACKED_SESSIONS = 1024  # vLLM-Omni's per-connection seen-set bound
_MIB = 1024 * 1024


@dataclass(frozen=True)
class ServerConfig:
    """How the server behaves; the CLI flags map one to one onto these fields."""

    flavor: str = "vllm-omni"
    host: str = "127.0.0.1"
    port: int = 0
    workers: int = 1
    latency_ms: float = 0.0
    jitter_ms: float = 0.0
    fail_every: int = 0
    idle_timeout_s: float = 0.0  # vllm-omni only; 0 disables (the real server's default is 30 s)
    max_payload_bytes: int = 64 * _MIB
    robot_policy_available: bool = True  # vllm-omni only: False refuses every connection at handshake
    seed: int | None = None
    max_sessions: int | None = None  # vllm-omni only: resident-session cap; None admits every session

    def __post_init__(self) -> None:
        if self.flavor not in FLAVORS:
            raise ValueError(f"flavor: expected one of {', '.join(FLAVORS)}, got {self.flavor!r}")
        if not 0 <= self.port <= 65535:
            raise ValueError(f"port: expected 0..65535, got {self.port}")
        if isinstance(self.workers, bool) or not isinstance(self.workers, int) or self.workers < 1:
            raise ValueError(f"workers: expected an integer >= 1, got {self.workers!r}")
        for name in ("latency_ms", "jitter_ms"):
            if not getattr(self, name) >= 0:
                raise ValueError(f"{name}: expected a number of milliseconds >= 0, got {getattr(self, name)!r}")
        if self.fail_every < 0:
            raise ValueError(f"fail_every: expected an integer >= 0 (0: never), got {self.fail_every!r}")
        if self.idle_timeout_s < 0:
            raise ValueError(f"idle_timeout_s: expected >= 0 (0 disables), got {self.idle_timeout_s}")
        if self.max_payload_bytes < 1024:
            raise ValueError(f"max_payload_bytes: expected >= 1024, got {self.max_payload_bytes}")
        if self.max_sessions is not None:
            if isinstance(self.max_sessions, bool) or not isinstance(self.max_sessions, int) or self.max_sessions < 1:
                raise ValueError(f"max_sessions: expected an integer >= 1, got {self.max_sessions!r}")
            if self.flavor != "vllm-omni":
                raise ValueError(f"max_sessions: only the vllm-omni flavor caps sessions, got flavor {self.flavor!r}")

    @property
    def max_frame_bytes(self) -> int:
        """The websocket frame bound: vllm-omni answers payloads up to twice its limit with an error reply."""
        return 2 * self.max_payload_bytes if self.flavor == "vllm-omni" else self.max_payload_bytes


def flavor_handshake(flavor: str, policy: Any) -> dict:
    """The first frame of ``flavor``: the FLUX servers' own, else the policy's metadata."""
    if flavor == "flux3-bfl":
        return bfl_handshake()
    if flavor == "sglang":
        return sglang_handshake()
    return policy_metadata(policy)


def _session_of(request: dict) -> str | None:
    value = request.get("session_id")
    if value is None or value == "":
        return None
    return str(value)


def _check_result(result: Any) -> Any:
    if isinstance(result, (np.ndarray, dict)):
        return result
    raise TypeError(f"policy infer: expected an ndarray or a dict, got {type(result).__name__}")


class PolicyServer:
    """One reference server: ``await start()``, then ``url``; ``await stop()`` closes everything."""

    def __init__(self, policy: Any, config: ServerConfig | None = None, *, policy_name: str | None = None):
        self.policy = as_server_policy(policy)  # an openpi BasePolicy is served through OpenPIPolicy
        self.config = config or ServerConfig()
        self.policy_name = policy_name or type(policy).__name__
        self.metadata = flavor_handshake(self.config.flavor, policy)
        if self.config.max_sessions is not None:
            self.metadata["max_sessions"] = self.config.max_sessions
        self.sessions = ResidentSessions(self.config.max_sessions)
        self._metadata_frame = encode_metadata(self.metadata)
        self.engine = InferenceEngine(
            workers=self.config.workers,
            latency_s=self.config.latency_ms / 1000.0,
            jitter_s=self.config.jitter_ms / 1000.0,
            fail_every=self.config.fail_every,
            seed=self.config.seed,
        )
        self._server: Server | None = None
        self._connections = 0
        self._stopping = False
        # dreamzero: one global session for the whole server (None until the first request or after a reset).
        self._dz_session: str | None = None
        self._dz_started = False
        self._queries = 0  # flux3-bfl: the global query counter its seeds come from
        self.seeds: list[int] = []  # flux flavors: each inference's seed, in the order they ran (the last 1024)
        self.port: int | None = None

    # ------------------------------------------------------------------------------------------ lifecycle
    @property
    def url(self) -> str:
        if self.port is None:
            raise RuntimeError("server not started")
        host = self.config.host
        return f"ws://{'[' + host + ']' if ':' in host else host}:{self.port}"

    @property
    def connections(self) -> int:
        """Connections accepted so far."""
        return self._connections

    def stats(self) -> EngineStats:
        return self.engine.stats()

    def ready_line(self) -> str:
        cap = "" if self.config.max_sessions is None else f", max_sessions={self.config.max_sessions}"
        return (
            f"dz-gym-serve ready on {self.url} (flavor={self.config.flavor}, policy={self.policy_name}, "
            f"workers={self.config.workers}{cap})"
        )

    def sessions_line(self) -> str:
        """Sessions admitted (in all, and at most at once) and refused so far."""
        s = self.sessions
        return f"sessions admitted={s.admitted} peak_resident={s.peak} refused={s.refusals}"

    async def start(self) -> None:
        self.engine.start()
        pings = {"ping_interval": None} if self.config.flavor == "dreamzero" else {}
        self._server = await serve(
            self._handle,
            self.config.host,
            self.config.port,
            compression=None,
            max_size=self.config.max_frame_bytes,
            process_request=self._process_request,
            **pings,
        )
        self.port = self._server.sockets[0].getsockname()[1]

    async def stop(self, timeout: float = 10.0) -> None:
        """Stop accepting, close connections (1001), fail queued work, wait for handlers (bounded)."""
        if self._stopping:
            return
        self._stopping = True
        if self._server is not None:
            self._server.close()  # closes open connections too (1001)
        await asyncio.get_running_loop().run_in_executor(None, self.engine.stop, timeout)
        if self._server is not None:
            try:
                await asyncio.wait_for(self._server.wait_closed(), timeout)
            except asyncio.TimeoutError:
                logger.warning("handlers still running after %.1f s at shutdown", timeout)

    async def serve_until(self, stop: asyncio.Event) -> None:
        await stop.wait()
        await self.stop()

    # ------------------------------------------------------------------------------------------ HTTP
    def _process_request(self, connection: ServerConnection, request: Request) -> Response | None:
        path = urlsplit(request.path).path
        if self.config.flavor == "sglang":  # FastAPI routes: the websocket only on its route
            return None if path == SGLANG.url_path else connection.respond(http.HTTPStatus.NOT_FOUND, "Not Found\n")
        if self.config.flavor == "flux3-bfl":
            return None  # a plain websockets server: every path is the websocket, no health route
        if self.config.flavor == "vllm-omni":
            if path == "/health":
                ok = not self._stopping
                status = http.HTTPStatus.OK if ok else http.HTTPStatus.SERVICE_UNAVAILABLE
                body = {"status": "healthy"} if ok else {"status": "unhealthy"}
                response = connection.respond(status, json.dumps(body))
                del response.headers["Content-Type"]
                response.headers["Content-Type"] = "application/json"
                return response
            if path == "/healthz":
                return connection.respond(http.HTTPStatus.NOT_FOUND, '{"detail":"Not Found"}')
            return None
        if path == "/healthz":
            return connection.respond(http.HTTPStatus.OK, "OK\n")
        return None

    # ------------------------------------------------------------------------------------------ websocket
    async def _handle(self, ws: ServerConnection) -> None:
        self._connections += 1
        conn_id = self._connections
        logger.info("connection %d opened from %s", conn_id, ws.remote_address)
        try:
            if self.config.flavor == "vllm-omni" and not self.config.robot_policy_available:
                error = {"type": "error", "error": "Robot policy not available", "code": "unsupported"}
                await ws.send(json.dumps(error))
                await ws.close()
                return
            await ws.send(self._metadata_frame)
            if self.config.flavor == "vllm-omni":
                await self._serve_vllm(ws, conn_id)
            elif self.config.flavor == "dreamzero":
                await self._serve_dreamzero(ws, conn_id)
            elif self.config.flavor in FLUX_FLAVORS:
                await self._serve_flux(ws, conn_id)
            else:
                await self._serve_openpi(ws, conn_id)
        except ConnectionClosed:
            pass
        finally:
            logger.info("connection %d closed", conn_id)

    async def _infer(self, conn_id: int, request: dict, session_id: str, new_session: bool) -> JobResult:
        def job() -> Any:
            return _check_result(self.policy.infer(request, session_id=session_id, new_session=new_session))

        try:
            result = await self.engine.run(job)
        except Exception as exc:
            logger.info("infer conn=%d session=%s new=%s failed: %s", conn_id, session_id, new_session, exc)
            raise
        logger.info(
            "infer conn=%d session=%s new=%s wait_ms=%.1f latency_ms=%.1f",
            conn_id,
            session_id,
            new_session,
            result.wait_s * 1000,
            result.service_s * 1000,
        )
        return result

    async def _reset_policy(self, conn_id: int, session_id: str | None) -> None:
        reset = getattr(self.policy, "reset", None)
        if callable(reset):
            await self.engine.run(lambda: reset(session_id), inference=False)
        logger.info("reset conn=%d session=%s", conn_id, session_id)

    async def _serve_vllm(self, ws: ServerConnection, conn_id: int) -> None:
        try:
            await self._vllm_loop(ws, conn_id)
        finally:
            self.sessions.release_connection(conn_id)

    async def _vllm_loop(self, ws: ServerConnection, conn_id: int) -> None:
        seen: OrderedDict[str, None] = OrderedDict()
        current: str | None = None
        idle = self.config.idle_timeout_s
        while True:
            try:
                message = await (asyncio.wait_for(ws.recv(), idle) if idle > 0 else ws.recv())
            except asyncio.TimeoutError:
                logger.info("connection %d idle for %.1f s: closing", conn_id, idle)
                await ws.close()
                return
            if isinstance(message, str) or not message:
                continue  # vLLM-Omni ignores text and empty binary frames without a reply
            if len(message) > self.config.max_payload_bytes:
                await ws.send(encode_error("Invalid request payload"))
                continue
            try:
                request = parse_request(message)
            except ProtocolError as exc:
                logger.info("connection %d: invalid payload (%s)", conn_id, exc)
                await ws.send(encode_error("Invalid request payload"))
                continue
            endpoint = request.pop("endpoint", "infer")
            if endpoint == "reset":
                try:
                    await self._reset_policy(conn_id, _session_of(request))
                except Exception:
                    logger.exception("connection %d: reset failed", conn_id)
                    await ws.send(encode_error("Internal inference error"))
                    continue
                seen.clear()
                current = None
                self.sessions.release_connection(conn_id)
                await ws.send(encode_reset_reply())
                continue
            session_id = _session_of(request) or current or "default"
            if current is not None and current != session_id:
                self.sessions.release(current)  # a switch frees the connection's previous session
            if not self.sessions.admit(session_id, conn_id):
                cap = self.config.max_sessions or 0
                logger.info("connection %d: session %s refused (%d resident)", conn_id, session_id, len(self.sessions))
                error = {"type": "error", "message": refusal_message(len(self.sessions), cap), "code": ADMISSION_CODE}
                await ws.send(packb(error))
                continue
            current = session_id
            new_session = session_id not in seen
            if new_session:
                seen[session_id] = None
                while len(seen) > MAX_TRACKED_SESSIONS:
                    seen.popitem(last=False)
            try:
                result = await self._infer(conn_id, request, session_id, new_session)
                frame = encode_reply(result.value)
            except Exception:
                seen.pop(session_id, None)  # the session's state is released: its next request starts over
                self.sessions.release(session_id)
                await ws.send(encode_error("Internal inference error"))
                continue
            await ws.send(frame)

    async def _fatal(self, ws: ServerConnection, conn_id: int) -> None:
        """openpi, DreamZero and BFL: the traceback as a text frame, then close 1011; SGLang: the traceback
        as a binary ``{"error"}`` map, then close 1011."""
        text = traceback.format_exc()
        logger.info("connection %d: error, closing with 1011: %s", conn_id, text.strip().splitlines()[-1])
        if self.config.flavor == "sglang":
            await ws.send(packb({"error": text}))
            await ws.close(CloseCode.INTERNAL_ERROR, "Internal server error")
            return
        await ws.send(text)
        await ws.close(CloseCode.INTERNAL_ERROR, "Internal server error. Traceback included in previous frame.")

    def _decode_strict(self, message: bytes | str) -> dict:
        """A request as openpi's and DreamZero's servers read it: a text frame or a non-map raises (and the
        caller answers with the traceback and closes)."""
        if isinstance(message, str):
            raise TypeError("a bytes-like object is required, not 'str'")
        request = unpackb(message, max_bytes=self.config.max_payload_bytes)
        if not isinstance(request, dict):
            raise TypeError(f"request must be a map, got {type(request).__name__}")
        return request

    async def _serve_dreamzero(self, ws: ServerConnection, conn_id: int) -> None:
        while True:
            message = await ws.recv()
            try:
                request = self._decode_strict(message)
                endpoint = request.pop("endpoint")  # KeyError without it, as DreamZero's server
                if endpoint == "reset":
                    await self._reset_policy(conn_id, self._dz_session)
                    self._dz_session = None
                    self._dz_started = False
                    await ws.send(RESET_SUCCESSFUL)
                    continue
                if endpoint != "infer":
                    raise ValueError(f"unknown endpoint {endpoint!r}")
                session_id = _session_of(request)
                new_session = not self._dz_started or session_id != self._dz_session
                self._dz_session = session_id
                self._dz_started = True
                result = await self._infer(conn_id, request, session_id or "default", new_session)
                await ws.send(encode_reply(result.value))
            except ConnectionClosed:
                raise
            except Exception:
                await self._fatal(ws, conn_id)
                return

    def _flux_seed(self, request: dict) -> int:
        """BFL: 0 + the global query counter (requests cannot set it); SGLang: the request's ``seed``, else 0."""
        if self.config.flavor == "flux3-bfl":
            seed, self._queries = self._queries, self._queries + 1
        else:
            seed = int(request.get("seed", 0))
        self.seeds = [*self.seeds[-1023:], seed]
        return seed

    async def _serve_timed(self, ws: ServerConnection, conn_id: int, answer) -> None:
        """The openpi-style loop (openpi, flux3-bfl, sglang): decode each request, ``await answer(request)``
        for ``(reply map, infer_ms)``, add ``server_timing`` and send it; any error is fatal (:meth:`_fatal`)."""
        previous_total: float | None = None
        while True:
            message = await ws.recv()
            started = time.monotonic()
            try:
                reply, infer_ms = await answer(self._decode_strict(message))
                timing = {"infer_ms": infer_ms}
                if previous_total is not None:
                    timing["prev_total_ms"] = previous_total * 1000.0
                reply["server_timing"] = timing
                await ws.send(encode_reply(reply))
                previous_total = time.monotonic() - started
            except ConnectionClosed:
                raise
            except Exception:
                await self._fatal(ws, conn_id)
                return

    async def _serve_flux(self, ws: ServerConnection, conn_id: int) -> None:
        """flux3-bfl and sglang (see the module docstring): validate, infer, reply."""
        observation = bfl_observation if self.config.flavor == "flux3-bfl" else sglang_observation

        async def answer(request: dict) -> tuple[dict, float]:
            normalised = observation(request)
            seed = self._flux_seed(request)
            memory_key = _session_of(request) or f"connection-{conn_id}"
            result = await self._infer(conn_id, normalised, memory_key, False)
            value = result.value
            actions = value if isinstance(value, np.ndarray) else value.get("actions", value.get("action"))
            infer_ms = result.service_s * 1000.0
            request_id = str(request.get("request_id") or f"act_{conn_id}_{seed}")
            return flux_reply(self.config.flavor, actions, request_id=request_id, infer_ms=infer_ms), infer_ms

        await self._serve_timed(ws, conn_id, answer)

    async def _serve_openpi(self, ws: ServerConnection, conn_id: int) -> None:
        current: str | None = None

        async def answer(request: dict) -> tuple[dict, float]:
            nonlocal current
            session_id = _session_of(request) or "default"
            new_session = session_id != current
            current = session_id
            result = await self._infer(conn_id, request, session_id, new_session)
            value = result.value
            reply = {"actions": value} if isinstance(value, np.ndarray) else dict(value)
            return reply, result.service_s * 1000.0

        await self._serve_timed(ws, conn_id, answer)
