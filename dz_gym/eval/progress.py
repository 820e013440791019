"""Progress of an evaluation on stderr: tqdm bars on a terminal, else one progress line every ~30 s.

The episode bar shows the running success rate (at end, over the completed episodes) and the errored count;
the step bar shows env-steps/s and the last chunk latency. When stderr is not a terminal (a batch job, a log
file) the bars would print nothing useful, so a background thread writes one line every ``heartbeat_s``
seconds instead (:meth:`Progress.status_line`). Everything goes to stderr, so stdout keeps only the final
table.

Every chunk latency the runner reports also goes to ``on_latency`` (the evaluator's idle-gap check).
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable

from tqdm import tqdm

HEARTBEAT_S = 30.0


class Progress:
    """Counters of a run, shown as bars (``mode="bars"``), periodic lines (``"lines"``) or not at all.

    ``enabled``: True for bars, False for nothing, None for bars on a terminal and lines elsewhere.

    >>> p = Progress(episodes_total=4, steps_total=64, enabled=False)
    >>> p.steps(16, last_latency_ms=40.0); p.episode(success_at_end=True, errored=False)
    >>> p.status_line(elapsed_s=2.0)
    'progress: 1/4 episodes (success 1/1), 16 env steps, 8.0 env-steps/s, last chunk 40 ms'
    """

    def __init__(
        self,
        episodes_total: int,
        steps_total: int,
        enabled: bool | None = None,
        *,
        heartbeat_s: float = HEARTBEAT_S,
        on_latency: Callable[[float], None] | None = None,
        stream=None,
    ):
        self._stream = stream if stream is not None else sys.stderr
        if enabled is None:
            tty = bool(getattr(self._stream, "isatty", lambda: False)())
            self.mode = "bars" if tty else "lines"
        else:
            self.mode = "bars" if enabled else "off"
        self.enabled = self.mode == "bars"
        self.episodes_total = int(episodes_total)
        self.on_latency = on_latency
        self._successes = 0
        self._completed = 0
        self._errored = 0
        self._steps = 0
        self._t0 = time.perf_counter()
        self._last_latency_ms: float | None = None
        self._episodes = tqdm(
            total=episodes_total,
            desc="episodes",
            unit="ep",
            position=0,
            disable=not self.enabled,
            dynamic_ncols=True,
            file=self._stream,
        )
        self._env_steps = tqdm(
            total=steps_total,
            desc="env steps",
            unit="step",
            position=1,
            disable=not self.enabled,
            dynamic_ncols=True,
            file=self._stream,
        )
        self._closed = threading.Event()
        self._thread: threading.Thread | None = None
        if self.mode == "lines" and heartbeat_s > 0:
            self._thread = threading.Thread(target=self._beat, args=(heartbeat_s,), name="dz-gym-progress", daemon=True)
            self._thread.start()

    def steps(self, n: int, last_latency_ms: float | None = None) -> None:
        """``n`` env steps were taken (one batch step of ``n`` active envs)."""
        self._steps += n
        if last_latency_ms is not None:
            self._last_latency_ms = last_latency_ms
            if self.on_latency is not None:
                self.on_latency(last_latency_ms)
        if not self.enabled:
            return
        postfix = {"env-steps/s": f"{self._steps / self._elapsed():.1f}"}
        if self._last_latency_ms is not None:
            postfix["chunk ms"] = f"{self._last_latency_ms:.0f}"
        self._env_steps.set_postfix(postfix, refresh=False)
        self._env_steps.update(n)

    def episode(self, success_at_end: bool | None, errored: bool, unused_steps: int = 0) -> None:
        """One episode finished; ``unused_steps`` shrinks the step bar's total when it ended early."""
        if errored:
            self._errored += 1
        else:
            self._completed += 1
            self._successes += int(bool(success_at_end))
        if not self.enabled:
            return
        postfix = {"success": f"{self._successes}/{self._completed}"}
        if self._errored:
            postfix["errored"] = self._errored
        self._episodes.set_postfix(postfix, refresh=False)
        self._episodes.update(1)
        if unused_steps:
            self._env_steps.total = max(self._env_steps.n, self._env_steps.total - unused_steps)
            self._env_steps.refresh()

    def status_line(self, elapsed_s: float | None = None) -> str:
        """One line with the counters so far (what the periodic progress lines print)."""
        elapsed = self._elapsed() if elapsed_s is None else max(elapsed_s, 1e-9)
        done = self._completed + self._errored
        parts = [f"progress: {done}/{self.episodes_total} episodes (success {self._successes}/{self._completed}"]
        if self._errored:
            parts[0] += f", {self._errored} errored"
        parts[0] += ")"
        parts.append(f"{self._steps} env steps")
        parts.append(f"{self._steps / elapsed:.1f} env-steps/s")
        if self._last_latency_ms is not None:
            parts.append(f"last chunk {self._last_latency_ms:.0f} ms")
        return ", ".join(parts)

    def write(self, message: str) -> None:
        """A line above the bars (or plainly to stderr when the bars are off)."""
        if self.enabled:
            tqdm.write(message, file=self._stream)
        else:
            print(message, file=self._stream, flush=True)

    def close(self) -> None:
        self._closed.set()
        if self._thread is not None:
            self._thread.join(5.0)
        self._env_steps.close()
        self._episodes.close()

    def _elapsed(self) -> float:
        return max(time.perf_counter() - self._t0, 1e-9)

    def _beat(self, interval_s: float) -> None:
        while not self._closed.wait(interval_s):
            self.write(self.status_line())
