"""Reading a run directory for the report: rows, summary, run state, and compact per-episode trajectories.

Everything the page shows comes from the run directory's files (``config.json``, ``episodes.jsonl``,
``summary.json``, ``trajectories/*.npz``, ``videos/*.mp4``). The rows are read through the same ledger checks a
resume makes (:func:`checked_rows`): a run whose rows are not its plan's (a duplicate, another seed, another
step limit) is refused in one line, as ``--resume`` refuses it, instead of being counted. The summary's
numbers are shown as they are when it covers every row; while a run is in progress (rows newer than the last
summary, or no summary yet) the numbers are recomputed from the rows with
:func:`dz_gym.eval.results.summarize`, and the page says so.

Trajectories are shrunk for the page: at most :data:`TRAJ_POINTS` samples in time (evenly spaced steps), joints
and gripper quantized to 8 bits within the episode's own range, plus the exact list of steps that called the
server. That keeps one 450-step episode near 1.7 kB of JSON, so 500 episodes stay inline in one file; the page decodes
an episode only when it is opened.
"""

from __future__ import annotations

import base64
import json
import logging
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from dz_gym.eval import results, trajectory
from dz_gym.eval.rundir import CONFIG_FILE, ROWS_FILE, SUMMARY_FILE, RunDir

logger = logging.getLogger(__name__)

TRAJ_POINTS = 120
REPORT_FILE = "report.html"


@dataclass
class RunView:
    """One run directory as the report sees it."""

    path: Path
    config: dict[str, Any]
    rows: list[dict[str, Any]]
    summary: dict[str, Any]
    summary_is_recomputed: bool
    state: str  # complete | interrupted | aborted | in progress | incomplete
    state_detail: str = ""
    label: str = ""
    trajectories: dict[str, dict[str, Any]] = field(default_factory=dict)  # episode key -> compact trajectory

    @property
    def name(self) -> str:
        return self.path.name


def episode_key(row: dict[str, Any], label: str = "") -> str:
    """A key unique within one page: ``[label:]scene1_ep0003`` (arm/run label when comparing)."""
    stem = f"scene{int(row['scene'])}_ep{int(row['episode']):04d}"
    arm = row.get("arm")
    if arm:
        stem = f"{arm}:{stem}"
    return f"{label}:{stem}" if label else stem


def outcome(row: dict[str, Any]) -> str:
    """``errored``, ``success`` (success at the end) or ``failure``."""
    if row.get("error") is not None:
        return "errored"
    return "success" if row.get("success_at_end") else "failure"


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, json.JSONDecodeError) as exc:
        logger.warning("%s: unreadable (%s); the report recomputes what it can from the rows", path, exc)
        return None


def _read_config(path: Path) -> dict[str, Any] | None:
    """``config.json`` as a dict, None when there is none; unreadable, a one-line ``ValueError`` (the rows could
    not be checked against the run's plan)."""
    try:
        config = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"{path}: unreadable ({exc})") from None
    if not isinstance(config, dict):
        raise ValueError(f"{path}: expected a JSON object, got {type(config).__name__}")
    from dz_gym.eval.config import flat_layout

    return flat_layout(config)  # the layout summaries hold, whichever dz-gym wrote it


def _planned(config: dict[str, Any]) -> dict[int, int] | None:
    """Planned episodes per scene (every arm of an A/B or ``--arm`` run counts, as in the evaluator's summary)."""
    arms = len(config.get("arm_specs") or ()) or (
        2 if config.get("policy_b") is not None or config.get("servers_b") else 1
    )
    try:
        return {int(s): int(config["episodes"]) * arms for s in config["scenes"]}
    except (KeyError, TypeError, ValueError):
        return None


def run_state(summary: dict[str, Any] | None, rows: list[dict[str, Any]], recomputed: bool) -> tuple[str, str]:
    """The run's state and a one-line detail, from its last summary and its rows."""
    if summary is None:
        return "in progress", f"no summary.json yet; {len(rows)} finished episode(s) in {ROWS_FILE}"
    if recomputed:
        seen = int(summary.get("overall", {}).get("episodes", 0))
        return "in progress", f"{len(rows) - seen} episode(s) finished since the last summary.json"
    if summary.get("aborted"):
        return "aborted", str(summary["aborted"])
    if summary.get("interrupted"):
        return "interrupted", "stopped before every planned episode ran; resume with dz-gym-eval --resume"
    if summary.get("complete"):
        return "complete", "every planned episode has a row"
    return "incomplete", "not every planned episode has a row"


def checked_rows(run: RunDir, config: dict[str, Any] | None) -> list[dict[str, Any]]:
    """The rows of ``run`` through the ledger checks a resume makes (:func:`dz_gym.eval.segment.checked_rows`:
    a duplicate row, a row of another seed, scene, arm, step limit, backend or policy is a one-line
    ``ValueError`` ``.../episodes.jsonl:LINE: why``); a folder of rows without ``config.json`` has no plan to
    check them against: its rows as they are."""
    if config is None:
        return run.read_rows()
    from dz_gym.eval.config import EvalConfig
    from dz_gym.eval.segment import checked_rows as ledger_rows

    try:
        plan = EvalConfig.from_dict(config)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{run.path / CONFIG_FILE}: {str(exc).removeprefix('config.json: ')}") from None
    return ledger_rows(plan, run)


def load_run(path: str | os.PathLike, *, label: str = "", trajectories: bool = True) -> RunView:
    """Read run directory ``path`` (its rows through :func:`checked_rows`); a one-line ``ValueError`` when it is
    not one or its rows are not its plan's."""
    run = RunDir(path)
    if not run.path.is_dir():
        raise ValueError(f"run_dir: {path} is not a directory")
    config = _read_config(run.path / CONFIG_FILE)
    if config is None and not (run.path / ROWS_FILE).exists():
        raise ValueError(f"run_dir: {path} is not a dz-gym-eval run directory (no {CONFIG_FILE} or {ROWS_FILE})")
    rows = sorted(checked_rows(run, config), key=lambda r: (str(r.get("arm") or ""), r["scene"], r["episode"]))
    config = config or {}
    saved = _read_json(run.path / SUMMARY_FILE)
    recomputed = saved is None or int(saved.get("overall", {}).get("episodes", -1)) != len(rows)
    if recomputed:
        prompts = {int(r["scene"]): str(r["prompt"]) for r in rows if r.get("prompt")}
        summary = results.summarize(rows, planned=_planned(config), prompts=prompts)
        summary["config"] = config
        if saved is not None:  # keep what rows cannot carry (command, versions, servers, timing)
            for key, value in saved.items():
                if key not in summary or summary[key] is None:
                    summary[key] = value
    else:
        summary = saved
    state, detail = run_state(saved, rows, recomputed and saved is not None)
    view = RunView(run.path, config, rows, summary, recomputed, state, detail, label=label)
    if trajectories:
        for row in rows:
            rel = row.get("trajectory")
            if rel:
                compact = compact_trajectory(run.path / rel)
                if compact is not None:
                    view.trajectories[episode_key(row, label)] = compact
    return view


def _quantize(values: np.ndarray) -> tuple[str, float, float]:
    """base64 of ``values`` mapped to 0..255 within their finite range, and that range."""
    finite = values[np.isfinite(values)]
    lo = float(finite.min()) if finite.size else 0.0
    hi = float(finite.max()) if finite.size else 1.0
    span = hi - lo if hi > lo else 1.0
    q = np.clip(np.round((np.nan_to_num(values, nan=lo) - lo) / span * 255.0), 0, 255).astype(np.uint8)
    return base64.b64encode(q.tobytes()).decode("ascii"), round(lo, 5), round(lo + span, 5)


def _runs(mask: np.ndarray) -> list[list[int]]:
    """``[[start, end), ...]`` 0-based runs of True in ``mask``."""
    if not mask.any():
        return []
    padded = np.concatenate([[False], mask, [False]]).astype(np.int8)
    edges = np.flatnonzero(np.diff(padded))
    return [[int(a), int(b)] for a, b in zip(edges[::2], edges[1::2])]


def compact_trajectory(path: Path, points: int = TRAJ_POINTS) -> dict[str, Any] | None:
    """The page's form of one trajectory ``.npz`` (see the module docstring); None when unreadable."""
    try:
        data = trajectory.read(path, ("joint_pos", "gripper_pos", "policy_called", "success"))
        joints = np.asarray(data["joint_pos"], dtype=np.float64)
        gripper = np.asarray(data["gripper_pos"], dtype=np.float64).reshape(len(joints), -1)[:, 0]
        called = np.asarray(data["policy_called"], dtype=bool)
        success = np.asarray(data["success"], dtype=bool) if "success" in data else np.zeros(len(joints), bool)
    except (OSError, KeyError, ValueError) as exc:
        logger.warning("%s: unreadable trajectory (%s)", path, exc)
        return None
    steps = len(joints)
    if steps == 0:
        return None
    m = min(points, steps)
    index = np.round(np.linspace(0, steps - 1, m)).astype(np.int64)
    j64, jlo, jhi = _quantize(joints[index].T.copy())
    g64, glo, ghi = _quantize(gripper[index])
    calls = np.flatnonzero(called).tolist()
    out: dict[str, Any] = {
        "T": int(steps),
        "m": int(m),
        "dof": int(joints.shape[1]),
        "j": j64,
        "jr": [jlo, jhi],
        "g": g64,
        "gr": [glo, ghi],
        "calls": calls,
        "ok": _runs(success),
    }
    return out


def finish_times(rows: list[dict[str, Any]]) -> list[float | None]:
    """Each row's end time in seconds since the epoch (``started_at`` + ``wall_s``), None when unknown."""
    import datetime as dt

    out: list[float | None] = []
    for row in rows:
        start = row.get("started_at")
        try:
            t0 = dt.datetime.fromisoformat(str(start).replace("Z", "+00:00")).timestamp()
        except ValueError:
            out.append(None)
            continue
        wall = row.get("wall_s")
        out.append(t0 + float(wall) if isinstance(wall, (int, float)) and math.isfinite(wall) else t0)
    return out


def start_times(rows: list[dict[str, Any]]) -> list[float | None]:
    """Each row's start time in seconds since the epoch, None when unknown."""
    import datetime as dt

    out: list[float | None] = []
    for row in rows:
        try:
            out.append(dt.datetime.fromisoformat(str(row.get("started_at")).replace("Z", "+00:00")).timestamp())
        except ValueError:
            out.append(None)
    return out
