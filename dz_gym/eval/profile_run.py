"""``--profile`` of one scene's run: the profiler, the span it covers, ``profile.json`` and the printed table.

:class:`ProfileRun` holds the scene's :class:`~dz_gym.profiling.StageProfiler` (the
:class:`~dz_gym.profiled_wrapper.ProfiledPolicyWrapper` fills it); :meth:`ProfileRun.span` covers the
runner's loop and measures its wall time, the client process's CPU time (all threads; an embedded server runs
in a process of its own and is not counted) and the transport's own CPU time (the loop thread's, or with
``--transport-processes`` the worker processes') and the garbage collector's pauses
(:class:`~dz_gym.eval.collector.CollectorPauses`), then writes the report
into ``profile.json`` of the run directory (one entry per scene, ``{"scenes": {"1": {...}}}``) and prints
the table.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Iterator
from typing import Any

from dz_gym.eval.collector import CollectorPauses
from dz_gym.profiling import StageProfiler, format_table

__all__ = ["PROFILE_FILE", "ProfileRun"]

PROFILE_FILE = "profile.json"


def _transport_cpu(client: Any):
    """A reader of the CPU seconds of ``client``'s transport (SessionPool's loop thread, ProcessSessionPool's
    worker processes: their ``transport_cpu_s``), or None where the client or the platform has none."""
    read = getattr(client, "transport_cpu_s", None)
    if not callable(read) or read() is None:
        return None
    return read


class ProfileRun:
    """One scene's profile (see the module docstring)."""

    def __init__(self, scene: Any, run_dir: Any):
        self.scene = scene
        self.run_dir = run_dir
        self.profiler = StageProfiler()
        self.report: dict[str, Any] | None = None

    @contextlib.contextmanager
    def span(self, wrapper: Any) -> Iterator[None]:
        loop_cpu = _transport_cpu(wrapper.client)
        wall0, cpu0 = time.perf_counter(), time.process_time()
        loop0 = loop_cpu() if loop_cpu is not None else None
        pauses = CollectorPauses()
        try:
            with pauses:
                yield
        finally:
            wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
            loop_now = loop_cpu() if loop_cpu is not None else None
            loop = loop_now - loop0 if loop_now is not None and loop0 is not None else None
            if loop is not None and loop < 0:  # a worker restarted: its predecessor's time is gone
                loop = None
            report = self.profiler.report(wall, cpu_s=cpu, loop_cpu_s=loop)
            report["env_hooks"] = list(getattr(wrapper, "env_hooks", []))
            report["num_envs"] = int(wrapper.num_envs)
            report["collector"] = pauses.report()
            self.report = report
            self._write(report)
            print(format_table(report, f"profile of scene {self.scene} (N={wrapper.num_envs})"), flush=True)

    def _write(self, report: dict[str, Any]) -> None:
        """Add this scene's report to ``profile.json`` (under the run's summary lock: the scene processes of a
        run, side by side, each add theirs)."""
        from dz_gym.eval.shared import summary_lock

        path = self.run_dir.path / PROFILE_FILE
        with summary_lock(self.run_dir):
            try:
                data = json.loads(path.read_text()) if path.exists() else {}
            except (OSError, ValueError):
                data = {}
            data.setdefault("scenes", {})[str(self.scene)] = report
            tmp = path.with_suffix(".json.tmp")
            tmp.write_text(json.dumps(data, indent=1) + "\n")
            tmp.replace(path)
