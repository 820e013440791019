"""Bounds and options of the transport (:class:`TransportConfig`) and URL validation; no I/O.

Every default of the transport is defined here once; the evaluator, the wrapper and the CLIs read them from
:class:`TransportConfig` instead of repeating them.

>>> cfg = TransportConfig(request_timeout=60, retry_server_errors=2)
>>> cfg.request_timeout, cfg.retry_server_errors, cfg.resend_unprocessed
(60, 2, 2)
>>> validate_url("ws://127.0.0.1:8000/v1/realtime/robot/openpi")
'ws://127.0.0.1:8000/v1/realtime/robot/openpi'
>>> auto_processes(1024, cores=16), auto_processes(256, cores=16), auto_processes(1024, cores=2)
(8, 4, 0)
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
import ssl
from typing import Any
from urllib.parse import urlsplit

from dz_gym.spawning import usable_cores
from dz_gym.transport.rules import admission_retry_delay, backoff_delay, backoff_schedule

__all__ = ["TransportConfig", "auto_processes", "check_pool_args", "validate_url"]

_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_SCHEME = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")


def _positive(name: str, value: Any, *, allow_none: bool = False) -> None:
    if value is None and allow_none:
        return
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value > 0
    if not ok:
        expected = "a finite number > 0" + (" or None" if allow_none else "")
        raise ValueError(f"TransportConfig.{name}: expected {expected}, got {value!r}")


def _int_at_least(name: str, value: Any, low: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < low:
        raise ValueError(f"TransportConfig.{name}: expected an int >= {low}, got {value!r}")


@dataclasses.dataclass(frozen=True)
class TransportConfig:
    """Bounds and options of every connection of a session or pool (all times in seconds).

    The defaults fit DreamZero servers that block for seconds per request and take minutes to warm up:
    keepalive pings every 60 s that may go unanswered for 600 s (a busy server may not answer pings),
    and a generous but finite wait for each reply.

    Attributes:
        open_timeout: bound on opening the websocket, and separately on the server's metadata frame.
        connect_retries: extra attempts after a refused/unreachable connection (``OSError``), a connection
            dropped during the upgrade, or an HTTP 5xx answer to the upgrade; the wait between attempts
            doubles from ``retry_backoff`` up to ``retry_backoff_max``.
        ping_interval, ping_timeout: websocket keepalive; ``None`` disables it.
        request_timeout: bound on one attempt of a request (send plus reply). Past it the connection is
            dropped and :class:`~dz_gym.errors.RequestTimeout` raised.
        resend_unprocessed: how many times one request that the server cannot have processed (the
            connection was found closed when sending, or the server closed it cleanly before any reply, as
            vLLM-Omni does after its idle timeout) is re-sent on a fresh connection. ``0`` turns it off.
        retry_server_errors: how many times a request that got a server error reply is sent again (after a
            reconnect when the error closed the connection). ``0``, the default, reports the first error.
        max_frame_bytes: largest reply frame accepted; a bigger one is a :class:`~dz_gym.errors.ProtocolError`.
        close_timeout: bound on the closing handshake.
        auth_env: NAME of an environment variable holding an API token, sent as
            ``Authorization: <auth_scheme> <token>``. The token itself never appears in configs, argv or logs.
        auth_scheme: the scheme word in front of the token (``Api-Key`` as openpi-client, or ``Bearer``).
        compression: ``None`` (the servers' own setting) or ``"deflate"``.
        connect_concurrency: how many sessions of a pool open at once.
        admission_backoff, admission_backoff_max, admission_wait: a session the server refuses for lack of
            room (:class:`~dz_gym.errors.SessionRefused`) asks again after a wait that doubles from
            ``admission_backoff`` up to ``admission_backoff_max``; after ``admission_wait`` seconds of
            refusals in a row it gives up and the failure is reported.
        ssl_context: TLS settings for ``wss://``; ``None`` uses Python's default (system CAs, hostname check).
        processes: worker processes the sessions are spread over
            (:class:`~dz_gym.transport.workers.pool.ProcessSessionPool`, built by
            :func:`~dz_gym.transport.open_pool`): many sessions of large requests (hundreds of 0.5 MB requests
            a round) then no longer share this process's interpreter lock. ``0``: every session in this
            process (:class:`~dz_gym.transport.SessionPool`). ``None``, the default: :func:`auto_processes`
            of the pool's sessions (:meth:`process_count`), for the wrapper, ``open_pool`` and the evaluator
            alike. Not with ``ssl_context`` (a TLS context cannot be handed to another process; ``None`` then
            means 0).
    """

    open_timeout: float = 10.0
    connect_retries: int = 3
    retry_backoff: float = 0.5
    retry_backoff_max: float = 8.0
    ping_interval: float | None = 60.0
    ping_timeout: float | None = 600.0
    request_timeout: float = 600.0
    resend_unprocessed: int = 2
    retry_server_errors: int = 0
    max_frame_bytes: int = 64 * 1024 * 1024
    close_timeout: float = 10.0
    auth_env: str | None = None
    auth_scheme: str = "Api-Key"
    compression: str | None = None
    connect_concurrency: int = 16
    admission_backoff: float = 0.5
    admission_backoff_max: float = 8.0
    admission_wait: float = 900.0
    ssl_context: ssl.SSLContext | None = dataclasses.field(default=None, repr=False, compare=False)
    processes: int | None = None

    def __post_init__(self) -> None:
        for name in (
            "open_timeout",
            "retry_backoff",
            "retry_backoff_max",
            "request_timeout",
            "close_timeout",
            "admission_backoff",
            "admission_backoff_max",
            "admission_wait",
        ):
            _positive(name, getattr(self, name))
        _positive("ping_interval", self.ping_interval, allow_none=True)
        _positive("ping_timeout", self.ping_timeout, allow_none=True)
        for name, low in (
            ("connect_retries", 0),
            ("resend_unprocessed", 0),
            ("retry_server_errors", 0),
            ("max_frame_bytes", 1),
            ("connect_concurrency", 1),
        ):
            _int_at_least(name, getattr(self, name), low)
        if self.processes is not None:
            _int_at_least("processes", self.processes, 0)
        if self.auth_env is not None and (not isinstance(self.auth_env, str) or not _ENV_NAME.match(self.auth_env)):
            raise ValueError(
                f"TransportConfig.auth_env: expected the NAME of an environment variable (letters, digits, _), "
                f"got {self.auth_env!r}"
            )
        if not isinstance(self.auth_scheme, str) or not _SCHEME.match(self.auth_scheme):
            raise ValueError(
                "TransportConfig.auth_scheme: expected one word such as 'Api-Key' or 'Bearer', "
                f"got {self.auth_scheme!r}"
            )
        if self.compression not in (None, "deflate"):
            raise ValueError(f"TransportConfig.compression: expected None or 'deflate', got {self.compression!r}")
        if self.ssl_context is not None and not isinstance(self.ssl_context, ssl.SSLContext):
            raise ValueError(
                "TransportConfig.ssl_context: expected an ssl.SSLContext or None, "
                f"got {type(self.ssl_context).__name__}"
            )
        if self.processes and self.ssl_context is not None:
            raise ValueError(
                "TransportConfig.processes: expected 0 with an ssl_context (a TLS context cannot be handed to "
                f"worker processes), got {self.processes}"
            )

    def process_count(self, num_sessions: int, *, pools: int = 1) -> int:
        """The worker processes a pool of ``num_sessions`` sessions is spread over: ``processes``, or where
        that is None :func:`auto_processes` of them on this process's cores, shared by ``pools`` pools (an
        A/B run's arms each have one); 0 with an ``ssl_context``.

        >>> TransportConfig(processes=3).process_count(1024), TransportConfig().process_count(8)
        (3, 0)
        """
        if self.processes is not None:
            return self.processes
        if self.ssl_context is not None:
            return 0
        return auto_processes(num_sessions, cores=usable_cores() // max(1, int(pools)))

    def backoff(self, attempt: int) -> float:
        """The wait before connect retry ``attempt + 1`` (0-based)."""
        return backoff_delay(attempt, base=self.retry_backoff, cap=self.retry_backoff_max)

    def admission_delay(self, refusals: int, waited_s: float) -> float | None:
        """The wait before a refused session asks again (None: give up); see ``admission_wait``."""
        return admission_retry_delay(
            refusals,
            waited_s,
            base=self.admission_backoff,
            cap=self.admission_backoff_max,
            bound=self.admission_wait,
        )

    def connect_bound(self) -> float:
        """Upper bound of one connect, retries and backoff included."""
        attempts = self.connect_retries + 1
        waits = backoff_schedule(self.connect_retries, base=self.retry_backoff, cap=self.retry_backoff_max)
        return attempts * (2 * self.open_timeout + self.close_timeout) + sum(waits)

    def request_bound(self) -> float:
        """Upper bound of one submitted request: every attempt it may make (re-sends after a clean close,
        retries after server errors), each with its reconnect, plus the closing of a dropped connection."""
        attempts = 1 + self.resend_unprocessed + self.retry_server_errors
        reconnects = self.resend_unprocessed + self.retry_server_errors
        return attempts * self.request_timeout + reconnects * self.connect_bound() + self.close_timeout + 5.0

    def auth_header(self) -> dict[str, str]:
        """The ``Authorization`` header read from ``auth_env`` now (empty without ``auth_env``)."""
        if self.auth_env is None:
            return {}
        token = os.environ.get(self.auth_env, "")
        if not token.strip():
            raise ValueError(f"TransportConfig.auth_env: environment variable {self.auth_env} is not set or is empty")
        if any(c in token for c in "\r\n\0"):
            raise ValueError(
                f"TransportConfig.auth_env: environment variable {self.auth_env} holds a line break or NUL"
            )
        return {"Authorization": f"{self.auth_scheme} {token.strip()}"}


# The sizing rule of auto_processes: one worker process per this many sessions, at most one per usable core
# and AUTO_PROCESSES_MAX, none on fewer than AUTO_PROCESSES_MIN_CORES cores (there the workers would take the
# simulator's), and none below two (one worker only moves the interpreter lock's contention elsewhere).
SESSIONS_PER_PROCESS = 64
AUTO_PROCESSES_MAX = 8
AUTO_PROCESSES_MIN_CORES = 4


def auto_processes(num_sessions: int, *, cores: int | None = None) -> int:
    """The worker processes a pool of ``num_sessions`` sessions is spread over when nobody chose
    (``TransportConfig.processes`` None, the default; the evaluator's ``--transport-processes`` left out): 0
    (every session in this process) below 128 sessions or 4 cores, else one per 64 sessions, at most one per
    core and 8. Below that many sessions one process's interpreter lock keeps up with the requests; above it,
    the measured rate grew with the workers up to 8 beside a simulator's process (benchmarks/README.md)."""
    cores = usable_cores() if cores is None else int(cores)
    if cores < AUTO_PROCESSES_MIN_CORES:
        return 0
    count = min(int(num_sessions) // SESSIONS_PER_PROCESS, cores, AUTO_PROCESSES_MAX)
    return count if count >= 2 else 0


def validate_url(url: Any) -> str:
    """Return ``url`` if it is a ``ws://``/``wss://`` URL with a host; one-line ``ValueError`` otherwise.

    >>> validate_url("http://127.0.0.1:8000")
    Traceback (most recent call last):
    ...
    ValueError: url: expected a ws:// or wss:// URL with a host, got 'http://127.0.0.1:8000'
    """
    if not isinstance(url, str):
        raise ValueError(f"url: expected a ws:// or wss:// URL string, got {type(url).__name__}")
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - raises ValueError on a bad port
    except ValueError as exc:
        raise ValueError(f"url: expected a ws:// or wss:// URL, got {url!r} ({exc})") from None
    if parts.scheme not in ("ws", "wss") or not parts.hostname:
        raise ValueError(f"url: expected a ws:// or wss:// URL with a host, got {url!r}")
    if parts.username is not None or parts.password is not None:
        raise ValueError("url: credentials in the URL are not allowed; put the token in an env var named by auth_env")
    return url


def check_pool_args(urls: Any, num_sessions: Any, config: Any) -> tuple[list[str], TransportConfig]:
    """A pool's ``urls`` as a list of checked URLs (one string is one URL) and its config (``None``: the
    defaults); ``ValueError`` naming the argument for anything else, and for ``num_sessions`` below 1."""
    if isinstance(urls, str):
        urls = [urls]
    urls = list(urls)
    if not urls:
        raise ValueError("urls: expected at least one ws:// or wss:// URL, got an empty list")
    for url in urls:
        validate_url(url)
    if not isinstance(num_sessions, int) or isinstance(num_sessions, bool) or num_sessions < 1:
        raise ValueError(f"num_sessions: expected an int >= 1, got {num_sessions!r}")
    config = config if config is not None else TransportConfig()
    if not isinstance(config, TransportConfig):
        raise ValueError(f"config: expected a TransportConfig, got {type(config).__name__}")
    return urls, config
