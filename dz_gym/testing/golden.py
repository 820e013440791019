"""What a user sees of a run directory, minus what differs between two runs of the same plan (reads only).

A change to how the evaluator works (its transport, its configuration objects, how a scene is stepped) must not
change what it writes. :func:`normalized_run` reduces a finished run directory to what two runs of the same plan
share: the file names, ``config.json`` (its values, in the flat layout), the rows of ``episodes.jsonl``,
``summary.json``, the trajectories (digests of their arrays), the videos (digests) and ``report.html`` (its page as
lines, its embedded episode and trajectory data as JSON). What varies from run to run, or from one installation to
another, is dropped (:data:`VOLATILE`) or masked (the embedded server's port, the output folder, the run's start
time); the comment beside each says why it varies. Everything else must be identical, so a test can compare a fresh
run with a committed golden file, written by the generator::

    python -m dz_gym.testing.golden RUN_DIR > tests/data/embedded_defaults_golden.json

(``RUN_DIR`` from ``dz-gym-eval --num-envs 8 --scene 1 --output-root ROOT``, the README's quick start, with
``ROOT`` an absolute path). :func:`first_differences` names the first keys at which two normalized runs differ.

The trajectories' and videos' digests hold on one machine: the simulator's floating point, the renderer (EGL)
and the video encoder (imageio's ffmpeg) are the machine's, so another machine writes the golden file anew at
the commit it compares against.
"""

from __future__ import annotations

import hashlib
import json
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from dz_gym.eval.config import flat_layout

__all__ = ["VOLATILE", "first_differences", "normalized_run"]

# Dotted key paths ("*" stands for any one key or list index) dropped from each file, with why they vary.
VOLATILE: dict[str, dict[str, str]] = {
    "rows": {
        "session_id": "a fresh random id per episode",
        "started_at": "the wall-clock time the episode started",
        "wall_s": "wall-clock duration of the episode",
        "latency_ms": "statistics of the chunks' round-trip times",
        "latencies_ms": "the chunks' round-trip times",
    },
    "summary": {
        "wall_s": "wall-clock duration of the stepping loop",
        "env_steps_per_s": "env steps over wall_s",
        "server_busy_s": "wall-clock seconds the server spent on requests",
        "server_utilization": "server_busy_s over wall_s",
        "server_utilization_per_server": "server_busy_s over wall_s, per server",
        "latency_ms": "statistics of the chunks' round-trip times",
        "*.latency_ms": "the same per scene and overall",
        "segments.*.started_at": "the wall-clock time the run segment started",
        "segments.*.wall_s": "wall-clock duration of the run segment",
        "segments.*.busy_s": "wall-clock seconds the server spent in the segment",
        "versions": "the installed Python, platform and packages: one installation's, not the run's",
        "provenance.simulator": "the installed simulator packages (isaaclab where Isaac Lab is installed)",
        "provenance.dz_gym.commit": "the checkout that ran it: differs by construction before and after a change",
        "provenance.dz_gym.dirty": "whether that checkout had uncommitted changes",
    },
    "trajectory": {
        "chunk_latency_ms": "the chunks' round-trip times, per step",
    },
    "report_episode": {  # the report's per-episode data (rows' fields under "i", the grid's cells under "c")
        "i.session_id": "a fresh random id per episode",
        "i.started_at": "the wall-clock time the episode started",
        "i.wall_s": "wall-clock duration of the episode",
        "c.9": "the grid's p50 ms cell: the chunks' round-trip times",
    },
}

# Pieces of the report's page that show volatile values (the dropped keys above, as the page words them).
PAGE_MASKS = (
    # When the page was written.
    (r"written \d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC", "written {time} UTC"),
    # The run segments' started_at.
    (r"(<dt>started</dt><dd>)[^<]*", r"\1{time}"),
    # env_steps_per_s and wall_s.
    (r"(<dt>env-steps/s</dt><dd>)[^<]*", r"\1{rate}"),
    # The installed versions, as a line and as JSON.
    (r"(<dt>versions</dt><dd>)[^<]*", r"\1{versions}"),
    (r"(<summary>versions</summary><pre>)[^<]*", r"\1{versions}"),
    # The provenance's commit, as a line and in its JSON; the checkout's dirty flag; installed simulators.
    (r"( at )[0-9a-f]{10}(?: \(local changes\))?(; )", r"\1{commit}\2"),
    (r"(&quot;commit&quot;: &quot;)[0-9a-f]+", r"\1{commit}"),
    (r"(&quot;dirty&quot;: )(true|false)", r"\1{dirty}"),
    (r"(\n &quot;simulator&quot;: )\{[^}]*\}", r"\1{simulator}"),
    # Latency percentiles per scene.
    (r'(<td data-field="latency">)[^<]*', r"\1{ms}"),
    # Plots of latencies, of env steps per wall-clock second and of the server's load over wall-clock time.
    (r'(<svg class="plot" id="plot-(?:latency|steps|server)")[^>]*>.*?</svg>', r"\1>{masked}</svg>"),
    # The servers' busy fraction.
    (r'(<ul class="util">).*?(</ul>)', r"\1{masked}\2"),
)
_DATA_SCRIPT = re.compile(r'<script type="application/json" id="([\w-]+)">(.*?)</script>', re.S)
_CODE = re.compile(r"(<style>|<script>)(.*?)(</style>|</script>)", re.S)
_PORT = re.compile(r"(ws://127\.0\.0\.1:)\d+")  # the embedded server listens on a free port
_RUN_TIME = re.compile(r"^\d{8}-\d{6}")  # the run folder's name starts with its start time


def normalized_run(run_dir: str | Path) -> dict[str, Any]:
    """The finished run directory ``run_dir`` as a JSON-able dict without its :data:`VOLATILE` keys (see the
    module docstring)."""
    path = Path(run_dir).resolve()
    masks = [(str(path.parent), "{output-root}"), (path.name, _RUN_TIME.sub("{time}", path.name))]

    def mask(text: str) -> str:
        for old, new in masks:
            text = text.replace(old, new)
        return _PORT.sub(r"\1{port}", text)

    rows = [json.loads(line) for line in (path / "episodes.jsonl").read_text().splitlines() if line.strip()]
    rows.sort(key=lambda r: (r["scene"], r["episode"], r.get("arm") or ""))
    page, data = _report(mask((path / "report.html").read_text()))
    return _masked(
        {
            "run": mask(path.name),
            "files": sorted(str(p.relative_to(path)) for p in path.rglob("*") if p.is_file()),
            # config.json's layout is not what a run shares, its values are: compared in the flat layout of
            # version 1 (the nested sections of later versions moved key by key, dz_gym.eval.config.flat_layout)
            "config": flat_layout(json.loads((path / "config.json").read_text())),
            "rows": [_drop(r, VOLATILE["rows"]) for r in rows],
            "summary": _drop(json.loads((path / "summary.json").read_text()), VOLATILE["summary"]),
            "trajectories": {p.name: _arrays(p) for p in sorted((path / "trajectories").glob("*.npz"))},
            "videos": {p.name: _digest(p.read_bytes()) for p in sorted((path / "videos").glob("*.mp4"))},
            "report": {
                "page": page,
                "episodes": [_drop(e, VOLATILE["report_episode"]) for e in data["dz-episodes"]],
                "trajectories": data["dz-traj"],
            },
        },
        mask,
    )


def _report(text: str) -> tuple[list[str], dict[str, Any]]:
    """The page (one line per tag, CSS and script as digests, volatile values masked) and its JSON data."""
    data = {name: json.loads(body) for name, body in _DATA_SCRIPT.findall(text)}
    text = _DATA_SCRIPT.sub(lambda m: f'<script type="application/json" id="{m[1]}"></script>', text)
    text = _CODE.sub(lambda m: f"{m[1]}{_digest(m[2].encode())}{m[3]}", text)
    for pattern, replacement in PAGE_MASKS:
        text = re.sub(pattern, replacement, text, flags=re.S)
    return text.replace("><", ">\n<").splitlines(), data


def _arrays(npz: Path) -> dict[str, str]:
    """Per array of a trajectory file: its dtype, shape and a digest of its bytes (volatile arrays dropped)."""
    import numpy as np

    with np.load(npz) as arrays:
        return {
            name: f"{arrays[name].dtype} {list(arrays[name].shape)} {_digest(arrays[name].tobytes())}"
            for name in arrays.files
            if name not in VOLATILE["trajectory"]
        }


def _digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def _drop(value: Any, paths: dict[str, str]) -> Any:
    """``value`` without the keys at ``paths`` (dotted; ``*`` matches any key or index)."""
    out = json.loads(json.dumps(value))
    for dotted in paths:
        *parents, last = dotted.split(".")
        for container in _walk(out, parents):
            if isinstance(container, dict):
                container.pop(last, None)
            elif isinstance(container, list) and last.isdigit() and int(last) < len(container):
                container[int(last)] = "{masked}"
    return out


def _walk(value: Any, keys: list[str]) -> Iterator[Any]:
    if not keys:
        yield value
        return
    head, rest = keys[0], keys[1:]
    if isinstance(value, dict):
        children = list(value.values()) if head == "*" else [value[head]] if head in value else []
    elif isinstance(value, list):
        children = value if head == "*" else [value[int(head)]] if head.isdigit() and int(head) < len(value) else []
    else:
        children = []
    for child in children:
        yield from _walk(child, rest)


def _masked(value: Any, mask) -> Any:
    """``value`` with ``mask`` applied to every string and key."""
    if isinstance(value, dict):
        return {mask(k): _masked(v, mask) for k, v in value.items()}
    if isinstance(value, list):
        return [_masked(v, mask) for v in value]
    return mask(value) if isinstance(value, str) else value


def first_differences(got: Any, want: Any, limit: int = 10, where: str = "") -> list[str]:
    """The first ``limit`` key paths at which ``got`` and ``want`` differ, each with both values."""
    out: list[str] = []
    if isinstance(got, dict) and isinstance(want, dict):
        for key in [*want, *(k for k in got if k not in want)]:
            if key not in got or key not in want:
                out.append(f"{where}.{key}: {'missing' if key not in got else 'unexpected'}")
            else:
                out.extend(first_differences(got[key], want[key], limit - len(out), f"{where}.{key}"))
            if len(out) >= limit:
                break
    elif isinstance(got, list) and isinstance(want, list) and len(got) == len(want):
        for index, (g, w) in enumerate(zip(got, want)):
            out.extend(first_differences(g, w, limit - len(out), f"{where}[{index}]"))
            if len(out) >= limit:
                break
    elif got != want:
        out.append(f"{where or '.'}: got {json.dumps(got)[:200]}, want {json.dumps(want)[:200]}")
    return out[:limit]


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python -m dz_gym.testing.golden RUN_DIR > golden.json")
    print(json.dumps(normalized_run(sys.argv[1]), indent=1, sort_keys=True))
