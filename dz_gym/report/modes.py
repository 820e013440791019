"""The report's failure-mode section: episodes per mode (per scene and overall) and a grid of videos per mode.

The counts are the summary's ``failure_modes`` where it has them, else the rows' (:func:`dz_gym.eval.failure.
mode_counts`, so an old run without the field gets them too); the grid shows, for each mode that occurs, up to
:data:`VIDEOS_PER_MODE` of its episodes' videos (made only when asked for: nothing loads before), with the
rule that defines the mode as the title, so a page answers "why did it fail", not only "how often".
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from html import escape
from typing import Any

from dz_gym.eval.failure import MODES, NAMES, mode_counts, mode_of

__all__ = ["VIDEOS_PER_MODE", "modes_block"]

VIDEOS_PER_MODE = 12
RULES = dict(MODES)
VideoSource = Callable[[Mapping[str, Any]], tuple[str, str]]  # row -> (relative URL, why there is none)


def _counts_table(rows: Sequence[Mapping[str, Any]], summary: Mapping[str, Any], table_id: str) -> str:
    keys = [str(s) for s in summary.get("scenes", [])] + ["overall"]
    groups: dict[str, dict[str, int]] = {}
    for key in keys:
        saved = summary.get(key, {}).get("failure_modes") if isinstance(summary.get(key), Mapping) else None
        mine = rows if key == "overall" else [r for r in rows if str(r["scene"]) == key]
        groups[key] = dict(saved) if isinstance(saved, Mapping) else mode_counts(mine)
    names = [n for n in NAMES if any(g.get(n) for g in groups.values())]
    if not names:
        return f'<p class="muted" id="{escape(table_id)}-none">No finished episodes yet.</p>'
    head = "<tr><th>scene</th>" + "".join(f'<th title="{escape(RULES[n])}">{escape(n)}</th>' for n in names)
    body = []
    for key, counts in groups.items():
        total = sum(counts.values())
        cells = "".join(
            f'<td data-mode="{escape(n)}">{counts.get(n, 0)}'
            + (f' <span class="iv">{100 * counts.get(n, 0) / total:.0f}%</span>' if total else "")
            + "</td>"
            for n in names
        )
        body.append(f'<tr data-scene="{escape(key)}"><th>{escape(key)}</th>{cells}</tr>')
    return f'<table class="results" id="{escape(table_id)}"><thead>{head}</tr></thead><tbody>{"".join(body)}</tbody></table>'


def _grid(rows: Sequence[Mapping[str, Any]], video: VideoSource, grid_id: str) -> str:
    by_mode: dict[str, list[Mapping[str, Any]]] = {}
    for row in rows:
        by_mode.setdefault(mode_of(row), []).append(row)
    parts = []
    for name in NAMES:
        mine = by_mode.get(name) or []
        if not mine:
            continue
        videos = []
        for row in mine[:VIDEOS_PER_MODE]:
            arm = f"{row['arm']} · " if row.get("arm") else ""
            src, why = video(row)
            videos.append([f"{arm}scene {row['scene']}, episode {row['episode']} (seed {row['seed']})", src, why])
        more = len(mine) - VIDEOS_PER_MODE
        tail = f' <span class="muted">(the first {VIDEOS_PER_MODE}; {more} more)</span>' if more > 0 else ""
        parts.append(
            f'<details class="mode" data-mode="{escape(name)}"><summary><b>{escape(name)}</b> ({len(mine)}): '
            f'{escape(RULES[name])}</summary><button class="modeopen" type="button" '
            f'data-videos="{escape(json.dumps(videos))}">show videos</button>{tail}<div class="pairvids"></div></details>'
        )
    return f'<div class="modes" id="{escape(grid_id)}">{"".join(parts)}</div>'


def modes_block(
    rows: Sequence[Mapping[str, Any]], summary: Mapping[str, Any], video: VideoSource, suffix: str = ""
) -> str:
    """The section's HTML for one run: the counts table, then the videos of each mode (see the module docstring)."""
    return f"<h3>Failure modes</h3>{_counts_table(rows, summary, 'modes-table' + suffix)}" + _grid(
        rows, video, "modes-grid" + suffix
    )
