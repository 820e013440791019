"""Experiment logging: a run's episodes, summary and decision to Weights & Biases or TensorBoard (``--log``).

What is logged is the same for both: per finished episode (as it ends, step = the episodes logged so far)
its success, steps, calls, median latency, wall time, whether it errored and its failure mode (TensorBoard:
running counts per mode under ``failure_modes/``); at the end the summary: per scene and overall the success
rates with their Wilson intervals, per failure mode its count, throughput (env-steps/s), server utilization
and latency percentiles, and the decision of an A/B, sequential or K-arm run as text. W&B also gets a table of
every row with its video and the summary in ``run.summary``. Rows that this process did not see end (a
process per scene, an earlier segment of a resumed run) are logged from ``episodes.jsonl`` at the end, so
every logged run holds every row.

Both are optional extras (``pip install 'dz-gym[wandb]'`` / ``'dz-gym[tensorboard]'``); :func:`log_problem`
says in one line what a ``--log`` choice lacks, before the run starts: its package, or W&B's credentials
(:func:`wandb_problem`: read where W&B reads them, its environment variables and netrc file, never from a
flag) or its ``WANDB_DIR``. W&B's offline mode (``WANDB_MODE=offline``) needs no network and no key.
TensorBoard's event files go to ``RUN_DIR/tensorboard/``, W&B's files under ``RUN_DIR/wandb/`` (under
``$WANDB_DIR/wandb/`` where that is set). A tracker that fails to start anyway (W&B's server unreachable)
is one warning line and the run goes on without it.
"""

from __future__ import annotations

import logging
import math
import netrc
import os
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from dz_gym import extras
from dz_gym.errors import first_line
from dz_gym.eval.failure import NAMES as MODES
from dz_gym.eval.failure import mode_of

logger = logging.getLogger(__name__)

__all__ = ["BACKENDS", "ExperimentLog", "episode_scalars", "log_problem", "missing", "open_logs", "summary_scalars",
           "wandb_problem"]  # fmt: skip

BACKENDS = {"wandb": "wandb", "tensorboard": "tensorboard"}  # --log choice -> the module it needs
TB_DIR = "tensorboard"
WANDB_HOST = "https://api.wandb.ai"  # W&B's default server (WANDB_BASE_URL overrides it)
WANDB_KEYLESS_MODES = ("offline", "dryrun", "disabled")  # WANDB_MODE values that need no credentials


def missing(choices: Iterable[str]) -> str | None:
    """One line naming the first ``--log`` choice whose package is not installed, or None."""
    for choice in choices:
        if choice not in BACKENDS:
            return f"--log: expected one of {', '.join(BACKENDS)}, got {choice!r}"
        problem = extras.missing([BACKENDS[choice]])
        if problem is not None:
            return f"--log {choice}: {problem}"
    return None


def log_problem(choices: Iterable[str], environ: Mapping[str, str] | None = None) -> str | None:
    """One line naming why a ``--log`` choice cannot log here (checked before the run: no network, nothing
    written), or None: its package is missing (:func:`missing`), or for W&B its credentials or folder."""
    choices = list(choices)
    problem = missing(choices)
    if problem is None and "wandb" in choices:
        problem = wandb_problem(os.environ if environ is None else environ)
    return problem


def wandb_problem(environ: Mapping[str, str]) -> str | None:
    """Why ``wandb.init`` would fail for want of credentials or of its folder (one line), or None.

    The sources are W&B's own, read as it reads them, with no network: ``WANDB_MODE`` offline (or dryrun,
    disabled) needs no key; otherwise ``WANDB_API_KEY``, ``WANDB_IDENTITY_TOKEN_FILE``, or a netrc entry
    (``NETRC``, else ``~/.netrc`` or ``~/_netrc``) for the host of ``WANDB_BASE_URL`` (default
    ``https://api.wandb.ai``), which ``wandb login`` writes. ``WANDB_DIR``, where set, must be writable.
    """
    from dz_gym.eval.preflight import check_writable

    if environ.get("WANDB_DIR"):
        problem = check_writable(environ["WANDB_DIR"], "WANDB_DIR")
        if problem is not None:
            return f"--log wandb: {problem}"
    if environ.get("WANDB_MODE", "").strip().lower() in WANDB_KEYLESS_MODES:
        return None
    if environ.get("WANDB_API_KEY") or environ.get("WANDB_IDENTITY_TOKEN_FILE") or _netrc_key(environ):
        return None
    host = urlsplit(environ.get("WANDB_BASE_URL") or WANDB_HOST).netloc
    return (f"--log wandb: no W&B credentials for {host}: set WANDB_API_KEY (or run `wandb login`, which "
            "stores the key in ~/.netrc), or WANDB_MODE=offline to log to files without an account")  # fmt: skip


def _netrc_key(environ: Mapping[str, str]) -> bool:
    """Whether W&B's netrc file has a password for the host of ``WANDB_BASE_URL``."""
    if environ.get("NETRC"):
        path = Path(environ["NETRC"]).expanduser()
    else:
        home = Path(environ.get("HOME") or Path.home())
        path = next((p for p in (home / ".netrc", home / "_netrc") if p.exists()), home / ".netrc")
    host = urlsplit(environ.get("WANDB_BASE_URL") or WANDB_HOST).netloc
    try:
        entry = netrc.netrc(str(path)).authenticators(host)
    except (OSError, netrc.NetrcParseError):
        return False
    return bool(entry and entry[2])


def _key(row: Mapping[str, Any]) -> tuple:
    return (int(row["scene"]), int(row["episode"]), str(row.get("arm") or ""))


def episode_scalars(row: Mapping[str, Any]) -> dict[str, float]:
    """The numbers logged for one episode row (pure; success fields left out for an errored episode).

    >>> episode_scalars({"scene": 1, "error": None, "success_at_end": True, "success_any_step": True, "steps": 9,
    ...                  "server_calls": 2, "latency_ms": {"p50": 4.0}, "wall_s": 0.5})["episode/success_at_end"]
    1.0
    """
    out = {"episode/steps": float(row.get("steps", 0)), "episode/server_calls": float(row.get("server_calls", 0)),
           "episode/wall_s": float(row.get("wall_s") or 0.0), "episode/errored": float(row.get("error") is not None),
           "episode/scene": float(row["scene"])}  # fmt: skip
    if row.get("error") is None:
        out["episode/success_at_end"] = float(bool(row.get("success_at_end")))
        out["episode/success_any_step"] = float(bool(row.get("success_any_step")))
    latency = row.get("latency_ms")
    if isinstance(latency, Mapping) and latency.get("p50") is not None:
        out["episode/latency_p50_ms"] = float(latency["p50"])
    return out


def _groups(summary: Mapping[str, Any]) -> list[tuple[str, Mapping[str, Any]]]:
    """(prefix, group) of every scene and overall, per arm in a run with arms."""
    keys = [str(s) for s in summary.get("scenes", [])] + ["overall"]
    out = [(f"summary/{k}", summary[k]) for k in keys if isinstance(summary.get(k), Mapping)]
    arms = summary.get("arms")
    if isinstance(arms, Mapping):
        for arm, entry in arms.items():
            if arm != "labels" and isinstance(entry, Mapping):
                out += [(f"summary/arm_{arm}/{k}", entry[k]) for k in keys if isinstance(entry.get(k), Mapping)]
    return out


def summary_scalars(summary: Mapping[str, Any]) -> dict[str, float]:
    """The numbers logged for a summary (pure): rates and intervals, failure modes, throughput, latency."""
    out: dict[str, float] = {}
    for prefix, group in _groups(summary):
        for metric in ("success_at_end", "success_any_step"):
            entry = group.get(metric)
            if isinstance(entry, Mapping) and entry.get("rate") is not None:
                out[f"{prefix}/{metric}"] = float(entry["rate"])
                out[f"{prefix}/{metric}_ci95_lo"], out[f"{prefix}/{metric}_ci95_hi"] = map(float, entry["ci95"])
        for name in ("episodes", "completed", "errored"):
            if isinstance(group.get(name), int):
                out[f"{prefix}/{name}"] = float(group[name])
        for mode, n in (group.get("failure_modes") or {}).items():
            out[f"{prefix}/failure_modes/{mode}"] = float(n)
    for name in ("env_steps_per_s", "server_utilization", "wall_s", "env_steps_taken"):
        value = summary.get(name)
        if isinstance(value, (int, float)) and math.isfinite(value):
            out[f"summary/{name}"] = float(value)
    for name, value in (summary.get("latency_ms") or {}).items():
        if isinstance(value, (int, float)):
            out[f"summary/latency_ms/{name}"] = float(value)
    return out


def decision_text(summary: Mapping[str, Any]) -> str:
    """The run's decision in one line: a sequential A/B's, a K-arm race's or leaderboard's, else its state."""
    sequential = summary.get("sequential")
    if isinstance(sequential, Mapping) and sequential.get("reason"):
        return f"sequential A/B: {sequential.get('reason')} (stopped by {sequential.get('stopped_by')}): {sequential.get('why', '')}"
    selection = summary.get("selection")
    if isinstance(selection, Mapping):
        return f"select-best: best {selection.get('best')}; {selection.get('why', '')}"
    ranking = summary.get("ranking")
    if isinstance(ranking, Mapping) and isinstance(ranking.get("arms"), Sequence):
        order = [str(a.get("arm")) for a in ranking["arms"] if isinstance(a, Mapping)]
        return "ranking: " + ", ".join(order)
    state = "aborted" if summary.get("aborted") else "interrupted" if summary.get("interrupted") else "complete"
    return f"run {state}"


class _TensorBoard:
    """Event files of scalars and text, written with tensorboard's own writer (no TensorFlow, no torch)."""

    def __init__(self, run_dir: Path, name: str):
        from tensorboard.summary.writer.event_file_writer import EventFileWriter

        self._writer = EventFileWriter(str(run_dir / TB_DIR), flush_secs=5)
        self.text("run", name, 0)

    def _add(self, values: list, step: int) -> None:
        from tensorboard.compat.proto import event_pb2, summary_pb2

        event = event_pb2.Event(wall_time=time.time(), step=int(step), summary=summary_pb2.Summary(value=values))
        self._writer.add_event(event)

    def scalars(self, values: Mapping[str, float], step: int) -> None:
        from tensorboard.compat.proto import summary_pb2

        self._add([summary_pb2.Summary.Value(tag=k, simple_value=float(v)) for k, v in values.items()], step)

    def text(self, tag: str, text: str, step: int) -> None:
        from tensorboard.compat.proto import summary_pb2, tensor_pb2, tensor_shape_pb2, types_pb2

        meta = summary_pb2.SummaryMetadata(plugin_data=summary_pb2.SummaryMetadata.PluginData(plugin_name="text"))
        tensor = tensor_pb2.TensorProto(dtype=types_pb2.DT_STRING, string_val=[text.encode()],
                                        tensor_shape=tensor_shape_pb2.TensorShapeProto())  # fmt: skip
        self._add([summary_pb2.Summary.Value(tag=tag, metadata=meta, tensor=tensor)], step)

    def episode(self, row: Mapping[str, Any], counts: Mapping[str, int], step: int) -> None:
        self.scalars({**episode_scalars(row), **{f"failure_modes/{m}": float(n) for m, n in counts.items()}}, step)

    def finish(self, run_dir: Path, rows: Sequence[Mapping[str, Any]], summary: Mapping[str, Any], step: int):
        self.scalars(summary_scalars(summary), step)
        self.text("decision", decision_text(summary), step)
        self._writer.close()


class _Wandb:
    """One W&B run per run segment, in ``RUN_DIR/wandb`` or ``$WANDB_DIR/wandb`` where that is set
    (``WANDB_MODE=offline`` works with no network)."""

    def __init__(self, run_dir: Path, name: str, project: str, config: Mapping[str, Any]):
        import wandb

        self.wandb = wandb
        folder = os.environ.get("WANDB_DIR") or str(run_dir)  # W&B's own setting first
        self.run = wandb.init(project=project, name=name, dir=folder, config=dict(config), reinit=True)

    def episode(self, row: Mapping[str, Any], counts: Mapping[str, int], step: int) -> None:
        self.run.log({**episode_scalars(row), "episode/failure_mode": mode_of(row)}, step=step)

    def finish(self, run_dir: Path, rows: Sequence[Mapping[str, Any]], summary: Mapping[str, Any], step: int):
        columns = ["scene", "episode", "arm", "seed", "failure_mode", "success_at_end", "steps", "error", "video"]
        table = self.wandb.Table(columns=columns)
        for row in rows:
            video = row.get("video")
            path = run_dir / video if video else None
            media = self.wandb.Video(str(path), format="mp4") if path is not None and path.is_file() else None
            table.add_data(*(row.get(c) for c in columns[:-2]), row.get("error"), media)
        scalars = summary_scalars(summary)
        self.run.log({"episodes": table, **scalars, "decision": decision_text(summary)}, step=step)
        self.run.summary.update({**scalars, "decision": decision_text(summary)})
        self.run.finish()


class ExperimentLog:
    """The ``--log`` sinks of one run segment: :meth:`attach` hooks the rows as they end, :meth:`finish` logs the
    rows not seen yet and the summary, then closes. A sink's failure is a warning: the run's results are in the
    run directory whatever happens here."""

    def __init__(self, sinks: Sequence[Any]):
        self.sinks = list(sinks)
        self._seen: set[tuple] = set()
        self._counts = dict.fromkeys(MODES, 0)
        self._lock = threading.Lock()

    def attach(self, control: Any) -> None:
        """Log every row ``control`` (a :class:`~dz_gym.eval.runner.RunControl`) records, then call its old hook."""
        previous: Callable[[dict], None] | None = control.on_row

        def on_row(row: dict) -> None:
            self.row(row)
            if previous is not None:
                previous(row)

        control.on_row = on_row

    def row(self, row: Mapping[str, Any]) -> None:
        with self._lock:
            if _key(row) in self._seen:
                return
            self._seen.add(_key(row))
            self._counts[mode_of(row)] += 1
            counts = {m: n for m, n in self._counts.items() if n}
            step = len(self._seen)
            for sink in list(self.sinks):
                self._guard(sink, "episode", row, counts, step)

    def finish(self, run_dir: Path, rows: Sequence[Mapping[str, Any]], summary: Mapping[str, Any] | None) -> None:
        for row in sorted(rows, key=lambda r: (_key(r), r.get("started_at") or "")):
            self.row(row)
        for sink in list(self.sinks):
            self._guard(sink, "finish", Path(run_dir), list(rows), summary or {}, len(self._seen) + 1)
        self.sinks = []

    def _guard(self, sink: Any, method: str, *args: Any) -> None:
        try:
            getattr(sink, method)(*args)
        except Exception as exc:  # noqa: BLE001 - logging must never lose a run
            logger.warning("--log %s: %s failed (%s); logging to it stops here", type(sink).__name__.strip("_").lower(),
                           method, first_line(exc))  # fmt: skip
            if sink in self.sinks:
                self.sinks.remove(sink)


def open_logs(choices: Sequence[str], run_dir: Path, config: Mapping[str, Any], project: str) -> ExperimentLog:
    """The sinks of ``choices`` (``wandb``, ``tensorboard``) for run directory ``run_dir``, named after it."""
    sinks: list[Any] = []
    for choice in dict.fromkeys(choices):
        if choice not in BACKENDS:
            raise ValueError(f"--log: expected one of {', '.join(BACKENDS)}, got {choice!r}")
        try:
            if choice == "tensorboard":
                sinks.append(_TensorBoard(Path(run_dir), Path(run_dir).name))
            else:
                sinks.append(_Wandb(Path(run_dir), Path(run_dir).name, project, config))
        except Exception as exc:  # noqa: BLE001 - logging must never lose a run
            logger.warning("--log %s: cannot start (%s); the run goes on without it", choice, first_line(exc))
    return ExperimentLog(sinks)
