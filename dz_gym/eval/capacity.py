"""Server capacity checks of a run: resident sessions and the idle timeout (warnings, never errors).

vLLM-Omni keeps at most 64 sessions resident (fewer when its KV pool is small) and evicts the least recently
used one, whose context then restarts silently; it also closes a connection that sent nothing for 30 s. A
server runs one request at a time, so in a batched run an env waits about (envs on its server) x (time per
chunk) between its reply and its next request; the longest chunk round trip the client sees (its request
queued behind the others) is that gap. :class:`IdleGapCheck` watches the first replies and warns once when
the gap may exceed the server's idle timeout.

>>> session_warning(num_envs=80, servers=["ws://a/x"], max_sessions=64).split(",")[0]
'80 envs share the server ws://a/x'
>>> session_warning(num_envs=64, servers=["ws://a/x"], max_sessions=64) is None
True
>>> warnings = []
>>> check = IdleGapCheck(envs_per_server=16, idle_timeout_s=30.0, say=warnings.append)
>>> check.observe(3000.0)   # 3 s for the first chunk: 16 x 3 s = 48 s between an env's requests
>>> len(warnings), check.estimate_s
(1, 48.0)
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence


def envs_per_server(num_envs: int, num_servers: int) -> int:
    """Envs on the busiest server: slot ``i`` talks to server ``i % num_servers``."""
    return math.ceil(int(num_envs) / max(1, int(num_servers)))


def session_warning(num_envs: int, servers: Sequence[str], max_sessions: int) -> str | None:
    """A one-line warning when more envs than ``max_sessions`` share one server, else None."""
    per = envs_per_server(num_envs, len(servers))
    if per <= max_sessions:
        return None
    busiest = servers[0] if servers else "(embedded)"
    return (
        f"{per} envs share the server {busiest}, more than --server-max-sessions={max_sessions}: vLLM-Omni keeps "
        "at most that many sessions resident and evicts the least recently used, whose context restarts "
        "silently; use more servers or fewer envs"
    )


class IdleGapCheck:
    """Warn once when an env's wait between two requests may exceed the servers' idle timeout.

    The estimate is ``envs_per_server`` x the shortest chunk latency seen so far (a chunk's own time, when the
    server is not queueing), and at least the longest latency seen (a request that waited behind the
    others). ``idle_timeout_s == 0`` turns the check off (the servers have no idle timeout).
    """

    def __init__(self, envs_per_server: int, idle_timeout_s: float, say: Callable[[str], None]):
        self.envs_per_server = max(1, int(envs_per_server))
        self.idle_timeout_s = float(idle_timeout_s)
        self.say = say
        self.warned = False
        self.estimate_s: float | None = None
        self._min_ms = math.inf
        self._max_ms = 0.0

    def observe(self, latency_ms: float) -> None:
        """One chunk's round trip (ms), as the client saw it."""
        if self.warned or self.idle_timeout_s <= 0 or not math.isfinite(latency_ms) or latency_ms <= 0:
            return
        self._min_ms = min(self._min_ms, latency_ms)
        self._max_ms = max(self._max_ms, latency_ms)
        self.estimate_s = max(self.envs_per_server * self._min_ms, self._max_ms) / 1000.0
        if self.estimate_s > self.idle_timeout_s:
            self.warned = True
            self.say(
                f"dz-gym-eval: warning: an env may wait ~{self.estimate_s:.0f} s between requests "
                f"({self.envs_per_server} envs per server, chunks of ~{self._min_ms / 1000:.1f} s), longer than "
                f"--server-idle-timeout={self.idle_timeout_s:g} s: the server may close idle connections; such "
                "requests are sent again on a new connection, and as vLLM-Omni keys sessions per connection that "
                "env's policy context may restart (use more servers or fewer envs per server, or run vLLM-Omni "
                "with --robot-openpi-idle-timeout 0)"
            )
