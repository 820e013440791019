"""Server capacity checks of a run: resident sessions and the idle timeout (warnings, never errors).

vLLM-Omni keeps at most 64 sessions resident (fewer when its KV pool is small) and evicts the least recently
used one, whose context then restarts silently; it also closes a connection that sent nothing for 30 s. A
server runs one request at a time, so in a batched run an env waits about (envs on its server) x (time per
chunk) between its reply and its next request. The client-side round trip of a chunk already contains that
product (a request waits behind the other envs' requests), so :class:`IdleGapCheck` takes the typical round
trip of the first replies (after the first, which may include the server's warm-up) as the estimate, and warns
once when it may exceed the servers' idle timeout.

>>> session_warning(num_envs=80, servers=["ws://a/x"], max_sessions=64).split(",")[0]
'80 envs share the server ws://a/x'
>>> session_warning(num_envs=64, servers=["ws://a/x"], max_sessions=64) is None
True
>>> warnings = []
>>> check = IdleGapCheck(envs_per_server=16, idle_timeout_s=30.0, say=warnings.append)
>>> for ms in (240_000.0, 48_000.0, 48_000.0):   # warm-up, then rounds of 16 envs x 3 s
...     check.observe(ms)
>>> len(warnings), check.estimate_s
(1, 48.0)
"""

from __future__ import annotations

import math
import statistics
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

    ``observe`` takes chunk round trips as the client sees them. The first is skipped (a server's warm-up can
    take minutes); from ``min_samples`` more on, the estimate is their median. ``idle_timeout_s == 0`` turns
    the check off (the servers have no idle timeout).
    """

    def __init__(self, envs_per_server: int, idle_timeout_s: float, say: Callable[[str], None], min_samples: int = 2):
        self.envs_per_server = max(1, int(envs_per_server))
        self.idle_timeout_s = float(idle_timeout_s)
        self.say = say
        self.min_samples = max(1, int(min_samples))
        self.warned = False
        self.estimate_s: float | None = None
        self._seen = 0
        self._samples: list[float] = []

    def observe(self, latency_ms: float) -> None:
        """One chunk's round trip (ms), as the client saw it."""
        if self.warned or self.idle_timeout_s <= 0 or not math.isfinite(latency_ms) or latency_ms <= 0:
            return
        self._seen += 1
        if self._seen == 1:
            return  # may include the server's warm-up
        self._samples = (self._samples + [float(latency_ms)])[-16:]
        if len(self._samples) < self.min_samples:
            return
        self.estimate_s = statistics.median(self._samples) / 1000.0
        if self.estimate_s > self.idle_timeout_s:
            self.warned = True
            self.say(
                f"dz-gym-eval: warning: an env may wait ~{self.estimate_s:.3g} s between requests ({self.envs_per_server} "
                f"envs per server, chunk round trips of ~{self.estimate_s:.3g} s), longer than --server-idle-timeout="
                f"{self.idle_timeout_s:g} s: the server may close idle connections; such requests are sent again on "
                "a new connection, and as vLLM-Omni keys sessions per connection that env's policy context may "
                "restart (use more servers or fewer envs per server, or run vLLM-Omni with "
                "--robot-openpi-idle-timeout 0)"
            )
