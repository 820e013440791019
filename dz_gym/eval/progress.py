"""Terminal progress of an evaluation: an episode bar and an env-step bar (tqdm), silent when not a TTY.

The episode bar shows the running success rate (at end, over the completed episodes) and the errored count;
the step bar shows env-steps/s and the last chunk latency. Both go to stderr, so stdout keeps only the final
table.
"""

from __future__ import annotations

import sys
import time

from tqdm import tqdm


class Progress:
    """Two tqdm bars; every method is a no-op when ``enabled`` is False."""

    def __init__(self, episodes_total: int, steps_total: int, enabled: bool | None = None):
        if enabled is None:
            enabled = sys.stderr.isatty()
        self.enabled = bool(enabled)
        self._successes = 0
        self._completed = 0
        self._errored = 0
        self._steps = 0
        self._t0 = time.perf_counter()
        self._last_latency_ms: float | None = None
        self._episodes = tqdm(
            total=episodes_total, desc="episodes", unit="ep", position=0, disable=not self.enabled, dynamic_ncols=True
        )
        self._env_steps = tqdm(
            total=steps_total, desc="env steps", unit="step", position=1, disable=not self.enabled, dynamic_ncols=True
        )

    def steps(self, n: int, last_latency_ms: float | None = None) -> None:
        """``n`` env steps were taken (one batch step of ``n`` active envs)."""
        if not self.enabled:
            return
        self._steps += n
        if last_latency_ms is not None:
            self._last_latency_ms = last_latency_ms
        elapsed = max(time.perf_counter() - self._t0, 1e-9)
        postfix = {"env-steps/s": f"{self._steps / elapsed:.1f}"}
        if self._last_latency_ms is not None:
            postfix["chunk ms"] = f"{self._last_latency_ms:.0f}"
        self._env_steps.set_postfix(postfix, refresh=False)
        self._env_steps.update(n)

    def episode(self, success_at_end: bool | None, errored: bool, unused_steps: int = 0) -> None:
        """One episode finished; ``unused_steps`` shrinks the step bar's total when it ended early."""
        if not self.enabled:
            return
        if errored:
            self._errored += 1
        else:
            self._completed += 1
            self._successes += int(bool(success_at_end))
        postfix = {"success": f"{self._successes}/{self._completed}"}
        if self._errored:
            postfix["errored"] = self._errored
        self._episodes.set_postfix(postfix, refresh=False)
        self._episodes.update(1)
        if unused_steps:
            self._env_steps.total = max(self._env_steps.n, self._env_steps.total - unused_steps)
            self._env_steps.refresh()

    def write(self, message: str) -> None:
        """A line above the bars (or plainly to stderr when the bars are off)."""
        if self.enabled:
            tqdm.write(message, file=sys.stderr)
        else:
            print(message, file=sys.stderr, flush=True)

    def close(self) -> None:
        self._env_steps.close()
        self._episodes.close()
