"""The report page: one self-contained HTML file built from one or two :class:`~dz_gym.report.load.RunView`.

The page has no external resources: CSS and the small vanilla script (``assets/report.css``, ``assets/report.js``)
are inlined; plots are inline SVG; per-episode trajectories are inline JSON decoded only when an episode is
opened; videos are referenced by relative ``file`` paths and a ``<video>`` element is created only when an
episode (or a discordant pair) is opened, so a run of 500 episodes opens as fast as one of 24.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Mapping, Sequence
from html import escape
from importlib import resources
from pathlib import Path
from typing import Any
from urllib.parse import quote

from dz_gym.eval import results
from dz_gym.eval.failure import mode_of
from dz_gym.eval.row import INFO_FIELDS
from dz_gym.eval.video import video_problem
from dz_gym.report import plots
from dz_gym.report.leaderboard import leaderboard_block, named_arms
from dz_gym.report.load import RunView, episode_key, outcome
from dz_gym.report.modes import modes_block
from dz_gym.report.paired import compare, discordant_list, split_arms
from dz_gym.report.sequential import sequential_block
from dz_gym.stats.comparison import ARMS

INFO_KEYS = INFO_FIELDS  # shown under each episode


def _asset(name: str) -> str:
    return resources.files("dz_gym.report").joinpath("assets", name).read_text(encoding="utf-8")


def pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f}%"


def rate_text(entry: Mapping[str, Any] | None) -> str:
    """``k/n  r%  [lo, hi]`` as the page shows a success rate (one decimal, Wilson 95%)."""
    if not entry or not entry.get("n"):
        return "-"
    lo, hi = entry["ci95"]
    return f"{entry['k']}/{entry['n']} {pct(entry['rate'])} [{100 * lo:.1f}, {100 * hi:.1f}]"


def _rate_cell(entry: Mapping[str, Any] | None, field: str) -> str:
    if not entry or not entry.get("n"):
        return f'<td class="rate" data-field="{field}">-</td>'
    lo, hi = entry["ci95"]
    bar = (
        f'<span class="ci" title="Wilson 95% interval"><span class="cibar" style="left:{100 * lo:.1f}%;'
        f'width:{100 * (hi - lo):.1f}%"></span><span class="cipt" style="left:{100 * entry["rate"]:.1f}%"></span></span>'
    )
    return (
        f'<td class="rate" data-field="{field}"><span class="kn">{entry["k"]}/{entry["n"]}</span> '
        f'<span class="pc">{pct(entry["rate"])}</span> <span class="iv">[{100 * lo:.1f}, {100 * hi:.1f}]</span>{bar}</td>'
    )


def _ms(stats: Mapping[str, Any] | None, key: str) -> str:
    return "-" if not stats or stats.get(key) is None else f"{stats[key]:.0f}"


def results_table(summary: Mapping[str, Any], table_id: str) -> str:
    """Per scene and overall: episodes, errored, success at end / at any step, calls, latency percentiles."""
    head = (
        "<tr><th>scene</th><th>task</th><th>episodes</th><th>errored</th><th>success at end (k/n, %, 95% CI)</th>"
        "<th>success at any step</th><th>server calls</th><th>latency p50 / p90 / p99 (ms)</th></tr>"
    )
    body = []
    for key in [str(s) for s in summary.get("scenes", [])] + ["overall"]:
        entry = summary.get(key)
        if not isinstance(entry, Mapping):
            continue
        planned = entry.get("planned")
        episodes = f"{entry['episodes']}" + (f" / {planned}" if planned is not None else "")
        lat = entry.get("latency_ms")
        body.append(
            f'<tr data-scene="{escape(key)}"><th>{escape(key)}</th><td class="prompt">{escape(str(entry.get("prompt", "")))}</td>'
            f'<td data-field="episodes">{episodes}</td><td data-field="errored">{entry["errored"]}</td>'
            + _rate_cell(entry.get("success_at_end"), "success_at_end")
            + _rate_cell(entry.get("success_any_step"), "success_any_step")
            + f'<td data-field="server_calls">{entry.get("server_calls", "-")}</td>'
            f'<td data-field="latency">{_ms(lat, "p50")} / {_ms(lat, "p90")} / {_ms(lat, "p99")}</td></tr>'
        )
    return f'<table class="results" id="{table_id}"><thead>{head}</thead><tbody>{"".join(body)}</tbody></table>'


def funnel_table(summary: Mapping[str, Any], table_id: str = "funnel") -> str:
    """Milestones reached per scene and overall, as the summary has them (``milestones``: name -> rate)."""
    keys = [str(s) for s in summary.get("scenes", [])] + ["overall"]
    groups = {k: summary[k].get("milestones") for k in keys if isinstance(summary.get(k), Mapping)}
    names: list[str] = []
    for funnel in groups.values():
        for name in funnel or {}:
            if name not in names:
                names.append(name)
    if not names:
        return (
            '<p class="muted" data-empty="funnel">No milestones in these rows (the simulator did not report them).</p>'
        )
    head = "<tr><th>scene</th>" + "".join(f"<th>{escape(m.replace('_', ' '))}</th>" for m in names) + "</tr>"
    body = []
    for key, funnel in groups.items():
        cells = []
        for name in names:
            entry = (funnel or {}).get(name)
            if not entry or not entry.get("n"):
                cells.append(f'<td data-milestone="{escape(name)}">-</td>')
                continue
            lo, hi = entry["ci95"]
            cells.append(
                f'<td data-milestone="{escape(name)}"><span class="kn">{entry["k"]}/{entry["n"]}</span> {pct(entry["rate"])} '
                f'<span class="iv">[{100 * lo:.1f}, {100 * hi:.1f}]</span><span class="fbar" style="width:{100 * entry["rate"]:.0f}%"></span></td>'
            )
        body.append(f'<tr data-scene="{escape(key)}"><th>{escape(key)}</th>{"".join(cells)}</tr>')
    return f'<table class="funnel" id="{table_id}"><thead>{head}</thead><tbody>{"".join(body)}</tbody></table>'


def errored_list(rows: Sequence[Mapping[str, Any]], prefix: str = "") -> str:
    bad = [r for r in rows if r.get("error") is not None]
    if not bad:
        return '<p class="muted" data-empty="errors">No errored episodes.</p>'
    items = []
    for r in bad:
        where = f"step {r.get('error_step')}" if r.get("error_step") is not None else ""
        items.append(
            f'<li data-key="{escape(episode_key(r, prefix))}"><b>scene {r["scene"]}, episode {r["episode"]} (seed {r["seed"]})</b> '
            f"<code>{escape(str(r.get('error_event') or 'error'))}</code> {escape(where)}: {escape(str(r['error']))}</li>"
        )
    return f'<ul class="errors">{"".join(items)}</ul>'


def _details(title: str, data: Any) -> str:
    if not data:
        return ""
    text = json.dumps(data, indent=1, sort_keys=True, default=str)
    return f"<details><summary>{escape(title)}</summary><pre>{escape(text)}</pre></details>"


def _state_detail(text: str, limit: int = 240) -> str:
    """The state's one-line reason; a long one (an abort's traceback) folds into a details element."""
    if len(text) <= limit:
        return f'<p class="muted">{escape(text)}</p>'
    return f'<details class="muted"><summary>{escape(text[:limit])}…</summary><pre>{escape(text)}</pre></details>'


def _speed(s: Mapping[str, Any], recomputed: bool) -> str:
    rate = s.get("env_steps_per_s")
    if not rate:
        return "-"
    if recomputed:  # the rows cannot carry the stepping loop's wall time
        return f"{rate:.1f} (as of the last summary.json)"
    return f"{rate:.1f} ({s.get('env_steps', 0)} steps in {plots.format_duration(s.get('wall_s'))})"


def provenance_line(provenance: Mapping[str, Any] | None) -> str:
    """The run's provenance in one line of plain text (``summary.json``'s ``provenance``), "-" without one.

    >>> provenance_line({"gpu": {"name": "NVIDIA H100", "driver": "580.1"}, "renderer": {"backend": "egl"},
    ...                  "dz_gym": {"version": "0.1.0", "commit": "0123456789abcdef", "dirty": True},
    ...                  "server_profile": "sglang"})
    'GPU NVIDIA H100 (driver 580.1); renderer egl; dz-gym 0.1.0 at 0123456789 (local changes); server sglang'
    """
    if not provenance:
        return "-"
    gpu = provenance.get("gpu")
    parts = [f"GPU {gpu.get('name')} (driver {gpu.get('driver')})" if isinstance(gpu, Mapping) else "no GPU"]
    drawn = provenance.get("renderer") or {}
    parts.append(f"renderer {drawn.get('backend') or drawn.get('renderer') or '-'}")
    source = provenance.get("dz_gym") or {}
    where = f" at {source['commit'][:10]}" if source.get("commit") else ""
    parts.append(f"dz-gym {source.get('version') or '-'}{where}" + (" (local changes)" if source.get("dirty") else ""))
    parts.append(f"server {provenance.get('server_profile') or '-'}")
    return "; ".join(parts)


def header_block(view: RunView, suffix: str = "") -> str:
    s = view.summary
    segments = s.get("segments") or []
    started = segments[0].get("started_at") if segments else (view.rows[0].get("started_at") if view.rows else None)
    server = s.get("server") or {}
    policy = server.get("policy") or view.config.get("policy") or "-"
    servers = s.get("servers") or view.config.get("servers") or []
    where = "embedded reference server" if server.get("embedded") else ", ".join(servers) or "-"
    versions = s.get("versions") or {}
    short_versions = ", ".join(f"{k} {v}" for k, v in versions.items() if k != "platform")
    label = f" ({escape(view.label.upper())})" if view.label else ""
    facts = [
        ("command", f"<code>{escape(str(s.get('command') or '-'))}</code>"),
        ("started", escape(str(started or "-"))),
        ("backend", escape(str(s.get("backend") or view.config.get("backend") or "-"))),
        ("policy server", f"{escape(where)} (policy {escape(str(policy))})"),
        ("episodes", f"{len(view.rows)} finished of {s.get('overall', {}).get('planned', '-')} planned"),
        ("env-steps/s", _speed(s, view.summary_is_recomputed)),
        ("versions", escape(short_versions) or "-"),
        ("provenance", escape(provenance_line(s.get("provenance")))),
    ]
    retries = s.get("retries")
    if isinstance(retries, Mapping) and retries.get("assumes"):
        facts.append(
            ("episode retries", f"{retries.get('episode_retries')}: assumes {escape(str(retries['assumes']))}")
        )
    dl = "".join(f"<dt>{k}</dt><dd>{v}</dd>" for k, v in facts)
    adaptive = s.get("descriptive")
    if isinstance(adaptive, Mapping):
        adaptive_note = (f'<p class="muted descriptive" id="rates-descriptive{suffix}"><b>Descriptive only:</b> the '
                           f"success rates and their intervals ({escape(str(adaptive.get('why', '')))}).</p>")  # fmt: skip
    else:
        adaptive_note = ""
    recomputed = (
        '<p class="warn" id="recomputed">Numbers recomputed from episodes.jsonl: the run is still going or stopped before '
        "it wrote summary.json.</p>"
        if view.summary_is_recomputed
        else ""
    )
    return (
        f'<div class="runhead" id="run{suffix}"><h2>Run{label}: <span class="runname">{escape(view.name)}</span> '
        f'<span class="state state-{view.state.replace(" ", "-")}" id="run-state{suffix}">{escape(view.state)}</span></h2>'
        + _state_detail(view.state_detail)
        + f'{recomputed}{adaptive_note}<dl class="facts">{dl}</dl>'
        + _details("server metadata", s.get("server_metadata"))
        + _details("configuration", s.get("config") or view.config)
        + _details("versions", versions)
        + _details("provenance", s.get("provenance"))
        + "</div>"
    )


def plots_block(view: RunView, suffix: str = "") -> str:
    s = view.summary
    figs = [
        plots.success_curve(view.rows, plot_id=f"plot-success{suffix}"),
        plots.latency_histogram(view.rows, s.get("latency_ms"), plot_id=f"plot-latency{suffix}"),
        plots.steps_rate(view.rows, s.get("env_steps_per_s"), plot_id=f"plot-steps{suffix}"),
        plots.server_load(view.rows, s.get("server_utilization"), plot_id=f"plot-server{suffix}"),
    ]
    per_server = s.get("server_utilization_per_server") or {}
    util = "".join(f"<li><code>{escape(u)}</code>: {pct(v)}</li>" for u, v in per_server.items())
    note = f'<ul class="util">{util}</ul>' if util else ""
    return '<div class="plots">' + "".join(f"<figure>{f}</figure>" for f in figs) + f"</div>{note}"


class _Videos:
    """Relative video URLs from the page's folder, and why a video is absent: a video that a resume would
    withdraw (missing, or not a complete mp4: :func:`~dz_gym.eval.video.video_problem`) is not linked."""

    def __init__(self, out_dir: Path):
        self.out_dir = out_dir
        self._problems: dict[Path, str | None] = {}  # each file checked once per page

    def src(self, view: RunView, row: Mapping[str, Any]) -> tuple[str, str]:
        rel = row.get("video")
        if not rel:
            if view.config.get("video") is False:
                return "", "no video: the run was made with --no-video"
            return "", "no video recorded for this episode"
        path = view.path / rel
        if path not in self._problems:
            self._problems[path] = video_problem(view.path, rel)
        problem = self._problems[path]
        if problem is not None:
            return "", f"video not playable: {rel}: {problem}"
        return quote(os.path.relpath(path, self.out_dir).replace(os.sep, "/")), ""


def episode_grid(views: Sequence[RunView], videos: _Videos) -> str:
    """Filters, the grid's header, and its rows as inline JSON (the script builds the rows, the first screen
    before the first paint: a 500-row table parsed as HTML is laid out again and again while it streams in)."""
    multi = len(views) > 1 or any(r.get("arm") for v in views for r in v.rows)
    columns = (["run"] if multi else []) + [
        "scene",
        "episode",
        "seed",
        "env",
        "outcome",
        "mode",
        "any step",
        "steps",
        "calls",
        "p50 ms",
        "ended by",
        "",
    ]
    head = "<tr>" + "".join(f"<th>{escape(c)}</th>" for c in columns) + "</tr>"
    entries = []
    for view in views:
        for r in view.rows:
            run = (view.label or str(r.get("arm") or "")).upper()
            state = outcome(r)
            src, why = videos.src(view, r)
            any_step = "-" if r.get("success_any_step") is None else ("yes" if r["success_any_step"] else "no")
            info = {k: r.get(k) for k in INFO_KEYS if r.get(k) is not None}
            cells = ([run] if multi else []) + [
                r["scene"],
                r["episode"],
                r["seed"],
                r["env"],
                state,
                mode_of(r),
                any_step,
                r["steps"],
                r["server_calls"],
                _ms(r.get("latency_ms"), "p50"),
                str(r.get("ended_by") or "-"),
            ]
            entries.append(
                {
                    "k": episode_key(r, view.label),
                    "o": state,
                    "s": str(r["scene"]),
                    "r": run,
                    "v": src,
                    "nv": why,
                    "i": info,
                    "c": cells,
                }
            )
    scenes = sorted({int(r["scene"]) for v in views for r in v.rows})
    runs = sorted({(v.label or str(r.get("arm") or "")).upper() for v in views for r in v.rows} - {""})
    scene_opts = "".join(f'<option value="{s}">scene {s}</option>' for s in scenes)
    run_filter = (
        '<label>run <select id="f-run"><option value="">all</option>'
        + "".join(f'<option value="{escape(x)}">{escape(x)}</option>' for x in runs)
        + "</select></label>"
        if runs
        else ""
    )
    filters = (
        '<div class="filters"><label>outcome <select id="f-outcome"><option value="">all</option>'
        '<option value="success">success</option><option value="failure">failure</option><option value="errored">errored</option>'
        f'</select></label><label>scene <select id="f-scene"><option value="">all</option>{scene_opts}</select></label>{run_filter}'
        '<span id="shown-count" class="muted"></span></div>'
    )
    return (
        filters
        + f'<table class="grid" id="episodes" data-outcome-col="{columns.index("outcome")}"><thead>{head}</thead><tbody></tbody></table>'
        + f'<script type="application/json" id="dz-episodes">{_json_script(entries)}</script>'
    )


def _json_script(data: Any) -> str:
    """JSON safe inside a ``<script>`` element."""
    return json.dumps(data, separators=(",", ":"), default=str).replace("<", "\\u003c")


def comparison_block(
    rows_a: Sequence[Mapping[str, Any]],
    rows_b: Sequence[Mapping[str, Any]],
    view_a: RunView,
    view_b: RunView,
    videos: _Videos,
    names: tuple[str, str],
    descriptive: bool = False,
    not_comparable: Sequence[str] = (),
) -> str:
    """Paired 2x2 tables, difference with interval and p-value per scene, discordant pairs' videos.

    ``descriptive``: the run stopped by a sequential test: the fixed-n verdict column is left out and the table
    is marked descriptive only (the sequential block above has the decision). ``not_comparable``: why the two
    runs are not comparable (:func:`dz_gym.compare.comparability`; the page was asked for anyway): no verdict
    either, and those reasons above the table."""
    descriptive = descriptive or bool(not_comparable)
    cmp = compare(rows_a, rows_b, labels={"a": names[0], "b": names[1]})
    head = (
        "<tr><th>scene</th><th>pairs</th><th>both</th><th>A only</th><th>B only</th><th>neither</th>"
        "<th>A</th><th>B</th><th>B - A (95% CI)</th><th>p (exact McNemar)</th><th>p Holm</th>"
        + ("" if descriptive else "<th>verdict</th>")
        + "</tr>"
    )
    body = []
    table = cmp["scenes"]
    for scope in [k for k in table if k != "overall"] + ["overall"]:
        entry = table[scope]
        n = entry["pairs"]
        if entry["ci95"] is None:
            diff = "-"
        else:
            low, high = entry.get("diff_range") or [entry["diff"], entry["diff"]]
            # with errored pairs: B - A's range over their possible outcomes, not the estimate without them
            estimate = (
                f"{100 * low:+.1f}..{100 * high:+.1f}" if entry["errored_pairs"] else f"{100 * entry['diff']:+.1f}"
            )
            diff = f"{estimate} pts [{100 * entry['ci95'][0]:+.1f}, {100 * entry['ci95'][1]:+.1f}]"
        p = "-" if not n else f"{entry['p_value']:.3g}"
        holm = "" if scope == "overall" or not n else f"{entry['p_holm']:.3g}"
        verdict = {"a_better": "A better", "b_better": "B better"}.get(entry.get("verdict"), "no difference detected")
        body.append(
            f'<tr data-scope="{escape(scope)}"><th>{escape(scope)}</th><td>{n}</td><td>{entry["both"]}</td><td>{entry["a_only"]}</td>'
            f"<td>{entry['b_only']}</td><td>{entry['neither']}</td><td>{entry['a']}/{n}</td><td>{entry['b']}/{n}</td>"
            f'<td class="diff">{diff}</td><td class="p">{p}</td><td class="p">{holm}</td>'
            + ("" if descriptive else f"<td>{escape(verdict)}</td>")
            + "</tr>"
        )
    overall = table["overall"]
    unpaired = cmp.get("unpaired") or {}
    note = (
        f'<p class="muted">A = {escape(names[0])}, B = {escape(names[1])}. Pairs: same scene and seed; '
        f"{overall.get('errored_pairs', 0)} pair(s) with an errored episode, bounded, not dropped (B - A shows its "
        "range over their possible outcomes; the interval and p hold whatever they were); "
        f"{unpaired.get('a', 0)} episode(s) only in A, {unpaired.get('b', 0)} only in B. Outcome: success at the end "
        f"(alpha {cmp.get('alpha', 0.05)}). Multiplicity: {escape(str(cmp.get('multiplicity', '')))}. "
        "The same numbers as dz-gym-compare.</p>"
    )
    pairs = cmp["discordant"]
    discordant = discordant_list(
        pairs, lambda r: videos.src(view_a, r), lambda r: videos.src(view_b, r), ("A", "B"), "discordant"
    )
    if not_comparable:
        note = (
            '<p class="warn descriptive" id="paired-not-comparable"><b>Not comparable</b> (built anyway with '
            f"--force): {escape('; '.join(not_comparable))}. These numbers are descriptive only and no verdict is "
            "drawn from them.</p>" + note
        )
    elif descriptive:
        note = (
            '<p class="muted descriptive" id="paired-descriptive"><b>Descriptive only:</b> the run stopped by a '
            "sequential test; these fixed-n p-values and intervals do not account for the stop, and no verdict is "
            "drawn from them (read the sequential decision).</p>" + note
        )
    return (
        f'<table class="paired" id="paired" data-descriptive="{str(descriptive).lower()}"><thead>{head}</thead>'
        f"<tbody>{''.join(body)}</tbody></table>{note}"
        f"<h3>Discordant pairs ({len(pairs)})</h3>{discordant}"
    )


def _sequential_run(views: Sequence[RunView]) -> bool:
    """Whether the page is one A/B run with a sequential test (its fixed-n verdicts are then descriptive)."""
    return len(views) == 1 and bool(views[0].config.get("sequential") or views[0].summary.get("sequential"))


def _arm_summaries(view: RunView) -> list[tuple[str, Mapping[str, Any]]]:
    """Per arm of an A/B run or a run of named arms: the summary's ``arms`` entries (recomputed from the rows
    when the summary is)."""
    names = named_arms(view) or (list(ARMS) if split_arms(view.rows) is not None else [])
    if not names:
        return []
    saved = view.summary.get("arms")
    if (
        not view.summary_is_recomputed
        and isinstance(saved, Mapping)
        and all(isinstance(saved.get(a), Mapping) for a in names)
    ):
        return [(a, saved[a]) for a in names]
    planned = {int(sc): int(view.config.get("episodes", 0)) for sc in view.summary.get("scenes", [])}
    return [(arm, results.summarize([r for r in view.rows if r.get("arm") == arm], planned=planned)) for arm in names]


def _has_milestones(summary: Mapping[str, Any]) -> bool:
    return any(
        isinstance(summary.get(k), Mapping) and summary[k].get("milestones")
        for k in [*map(str, summary.get("scenes", [])), "overall"]
    )


def build_page(views: Sequence[RunView], out_dir: str | os.PathLike, not_comparable: Sequence[str] = ()) -> str:
    """The whole HTML document for one run (or two, compared) written into ``out_dir``; ``not_comparable``: why
    two runs are not comparable, when the page was asked for anyway (no verdicts, the reasons shown)."""
    out = Path(out_dir)
    videos = _Videos(out)
    title = " vs ".join(v.name for v in views)
    parts = [
        f'<header><h1>dz-gym report</h1><p class="muted">{escape(title)} · written {time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())}</p>'
    ]
    nav = ['<a href="#results">results</a>', '<a href="#plots">plots</a>', '<a href="#grid">episodes</a>']
    pair = None
    if len(views) == 2:
        pair = (views[0].rows, views[1].rows, views[0], views[1], (views[0].name, views[1].name))
    elif len(views) == 1 and split_arms(views[0].rows) is not None:
        a, b = split_arms(views[0].rows)
        labels = (views[0].summary.get("arms") or {}).get("labels") or {}
        pair = (a, b, views[0], views[0], (labels.get("a", "arm A"), labels.get("b", "arm B")))
    arms = named_arms(views[0]) if len(views) == 1 else None
    if arms:  # named arms (--arm), even two called a and b: the leaderboard, not the A/B page
        pair = None
    if pair is not None:
        nav.insert(1, '<a href="#compare">A/B comparison</a>')
    if arms:
        nav.insert(1, '<a href="#leaderboard-section">leaderboard</a>')
    if len(views) == 1 and isinstance(views[0].summary.get("sequential"), Mapping):
        nav.insert(1, '<a href="#sequential">sequential decision</a>')
    parts.append("<nav>" + " · ".join(nav) + "</nav></header><main>")
    multi = len(views) > 1
    sections = []
    for view in views:
        suffix = f"-{view.label}" if multi else ""
        s = view.summary
        block = [header_block(view, suffix)]
        block.append(f"<h3>Success per scene</h3>{results_table(s, 'results-table' + suffix)}")
        for arm, per_arm in _arm_summaries(view):
            label = (s.get("arms") or {}).get("labels", {}).get(arm, "")
            title = f"Arm {escape(arm.upper() if arm in ('a', 'b') else arm)}" + (
                f": {escape(str(label))}" if label else ""
            )
            block.append(f"<h3>{title}</h3>{results_table(per_arm, f'results-table{suffix}-arm-{arm}')}")
            block.append(funnel_table(per_arm, f"funnel{suffix}-arm-{arm}") if _has_milestones(per_arm) else "")
        block.append(f"<h3>Milestones</h3>{funnel_table(s, 'funnel' + suffix)}")
        block.append(modes_block(view.rows, s, lambda r, v=view: videos.src(v, r), suffix))
        block.append(f"<h3>Errored episodes</h3>{errored_list(view.rows, view.label)}")
        note = s.get("note")
        if note:
            block.append(f'<p class="muted">Note: {escape(note)}.</p>')
        sections.append("".join(block))
    parts.append('<section id="results">' + "".join(sections) + "</section>")
    if len(views) == 1:
        parts.append(sequential_block(views[0].summary))
    if arms:
        parts.append(leaderboard_block(views[0], arms, lambda r: videos.src(views[0], r)))
    if pair is not None:
        parts.append(
            '<section id="compare"><h2>A/B comparison (paired by scene and seed)</h2>'
            + comparison_block(*pair[:4], videos, pair[4], _sequential_run(views), not_comparable)
            + "</section>"
        )
    plot_html = "".join(
        (f"<h3>{escape(v.label.upper())}: {escape(v.name)}</h3>" if multi else "")
        + plots_block(v, f"-{v.label}" if multi else "")
        for v in views
    )
    parts.append(f'<section id="plots"><h2>Plots</h2>{plot_html}</section>')
    no_video = all(v.config.get("video") is False for v in views)
    video_note = (
        '<p class="warn" id="no-videos">This run has no videos (it was made with --no-video).</p>' if no_video else ""
    )
    parts.append(f'<section id="grid"><h2>Episodes</h2>{video_note}{episode_grid(views, videos)}</section></main>')
    trajectories: dict[str, Any] = {}
    for view in views:
        trajectories.update(view.trajectories)
    data = _json_script(trajectories)
    return (
        '<!doctype html><html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>dz-gym report: {escape(title)}</title><style>{_asset('report.css')}</style></head><body>"
        + "".join(parts)
        + f'<script type="application/json" id="dz-traj">{data}</script><script>{_asset("report.js")}</script></body></html>'
    )
