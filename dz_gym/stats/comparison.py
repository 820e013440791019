"""Paired comparison of two arms from episode rows: the JSON of ``dz-gym-compare`` (pure, no I/O).

Rows are the dicts of ``episodes.jsonl``. Two runs with the same ``--seed`` give, for every (scene, seed),
one outcome per arm: a *pair*. :func:`compare_rows` pairs the rows of arm A and arm B by (scene, seed) (or
splits one run's rows by their ``arm`` field, ``"a"`` / ``"b"``) and, per scene and overall, for the final
success (``success_at_end``), the success at any step (``success_any_step``) and each milestone present in the
rows (``milestones``: name -> first step or null), reports:

- ``pairs``: pairs without errors; ``errored_pairs``: pairs where either episode errored (still errored
  after the evaluator's retries): they are *bounded*, not dropped (below); ``missing``: pairs left out
  because a row lacks the metric (milestones of older runs);
- ``a``, ``b``: successes of each arm over the pairs used; ``both``, ``neither``, ``a_only``, ``b_only``;
- ``diff``: ``(b - a) / pairs`` over the pairs without errors (descriptive when some pairs errored);
  ``diff_range``: ``[low, high]``, the difference over every pair with the errored outcomes imputed against B
  and against A (every completion of the errored outcomes lies in it);
- ``ci95``: Newcombe's hybrid score interval for ``B - A``, bounded over the errored pairs: its ends are those of
  the tables imputed against B (lower) and against A (upper), so it contains the interval the complete outcomes
  would give, whatever the errors depend on
  (:func:`dz_gym.stats.proportions.bounded_difference_interval`); ``ci95_without_errored``: Newcombe's interval
  with the errored pairs dropped (information only: not valid when errors depend on outcomes);
- ``p_value``: twice the smaller of two exact one-sided McNemar p-values, "B better" on the pairs with the
  errored episodes imputed against B (B's as failures, A's as successes: ``worst_for_b``, as ``[A only,
  B only]``), "A better" on those imputed against A (``worst_for_a``): each claim is tested at ``alpha / 2``
  whatever the errored outcomes would have been (with no errors: the two-sided McNemar p-value); per scene
  also ``p_holm``, Holm-adjusted over the scenes of that metric; ``p_without_errored``: the two-sided McNemar
  p-value with the errored pairs dropped (information only: not valid when errors depend on outcomes);
- ``verdict``: ``"b_better"``, ``"a_better"`` or ``"no_difference_detected"`` at ``alpha`` (per scene on
  ``p_holm``).

Multiplicity: the per-scene verdicts of a metric are one family (Holm: the chance of any false per-scene verdict
is at most ``alpha``); the overall verdict is a second test at ``alpha``, so reading both, the chance of any
false verdict is at most ``2 alpha`` (``multiplicity`` in the JSON says so, and the printed table). Each metric
(final success, success at any step, each milestone) is its own family: the primary metric is
``success_at_end``; the others are secondary.

The pooled ``overall`` entry sums the scenes' tables: under "no difference" every discordant pair is B-only
with probability 1/2 whatever its scene, so the pooled McNemar test is valid across scenes.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from dz_gym.stats.exact import bounded_mcnemar_p, holm_adjust, mcnemar_exact_p
from dz_gym.stats.proportions import (
    PairedCounts,
    bounded_difference_interval,
    imputed_tables,
    paired_difference_interval,
)

__all__ = [
    "PRIMARY_METRIC",
    "SCHEMA",
    "compare_rows",
    "descriptive_comparison",
    "format_comparison",
    "pair_rows",
    "split_arms",
]

SCHEMA = "dz-gym-compare/1"
PRIMARY_METRIC = "success_at_end"
SUCCESS_METRICS = ("success_at_end", "success_any_step")
MILESTONE_PREFIX = "milestones."
MULTIPLICITY = ("per-scene verdicts: Holm over the scenes of each metric (any false per-scene verdict: at most "
                "alpha); the overall verdict is a separate test at alpha, so over both at most 2 alpha; each metric "
                "is its own family (success_at_end is the primary one)")  # fmt: skip
ARMS = ("a", "b")  # the arms of an A/B run, everywhere: slot 2j runs arm a, slot 2j + 1 arm b (eval/plan.py)


def split_arms(rows: Iterable[Mapping[str, Any]]) -> tuple[list[Mapping[str, Any]], list[Mapping[str, Any]]]:
    """Rows of one A/B run split by their ``arm`` field; one-line error when a row has none or another value."""
    arms: dict[str, list[Mapping[str, Any]]] = {"a": [], "b": []}
    for row in rows:
        arm = row.get("arm")
        if arm not in arms:
            where = f"scene {row.get('scene')!r} seed {row.get('seed')!r}"
            raise ValueError(f"episode row ({where}): 'arm' expected 'a' or 'b' in an A/B run, got {arm!r}")
        arms[arm].append(row)
    return arms["a"], arms["b"]


def _key(row: Mapping[str, Any], arm: str) -> tuple[int, int]:
    for name in ("scene", "seed"):
        value = row.get(name)
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"episode row of arm {arm.upper()}: {name!r} expected an int, got {value!r}")
    return row["scene"], row["seed"]


def pair_rows(
    rows_a: Iterable[Mapping[str, Any]], rows_b: Iterable[Mapping[str, Any]]
) -> tuple[list[tuple[Mapping[str, Any], Mapping[str, Any]]], dict[str, int]]:
    """Pairs ``(row_a, row_b)`` with the same (scene, seed), sorted by it, and the unpaired counts per arm.

    A (scene, seed) that appears twice in one arm is an error (its pair would be ambiguous).
    """
    by_arm: dict[str, dict[tuple[int, int], Mapping[str, Any]]] = {}
    for arm, rows in zip(ARMS, (rows_a, rows_b)):
        table: dict[tuple[int, int], Mapping[str, Any]] = {}
        for row in rows:
            key = _key(row, arm)
            if key in table:
                raise ValueError(
                    f"arm {arm.upper()}: scene {key[0]} seed {key[1]} appears twice (expected one row per seed)"
                )
            table[key] = row
        by_arm[arm] = table
    common = sorted(set(by_arm["a"]) & set(by_arm["b"]))
    unpaired = {arm: len(set(by_arm[arm]) - set(common)) for arm in ARMS}
    return [(by_arm["a"][k], by_arm["b"][k]) for k in common], unpaired


def _errored(row: Mapping[str, Any]) -> bool:
    return row.get("error") is not None


def _outcome(row: Mapping[str, Any], metric: str) -> bool | None:
    """The row's success for ``metric`` (``None`` when the row does not carry it)."""
    if metric.startswith(MILESTONE_PREFIX):
        milestones = row.get("milestones")
        name = metric[len(MILESTONE_PREFIX) :]
        if not isinstance(milestones, Mapping) or name not in milestones:
            return None
        return milestones[name] is not None
    value = row.get(metric)
    return None if value is None else bool(value)


def _milestone_names(rows: Iterable[Mapping[str, Any]]) -> list[str]:
    names: list[str] = []
    for row in rows:
        milestones = row.get("milestones")
        if isinstance(milestones, Mapping):
            names.extend(str(name) for name in milestones if str(name) not in names)
    return names


def _verdict(direction: str | None, p_value: float, alpha: float) -> str:
    if p_value <= alpha and direction is not None:
        return "b_better" if direction == "b" else "a_better"
    return "no_difference_detected"


def _interval(interval: tuple[float, float] | None) -> list[float] | None:
    return None if interval is None else [interval[0], interval[1]]


def _entry(pairs: Sequence[tuple[bool | None, bool | None]], missing: int, alpha: float) -> dict[str, Any]:
    """One table entry; ``pairs``: ``(a, b)`` outcomes, ``None`` where that episode errored."""
    clean = [(a, b) for a, b in pairs if a is not None and b is not None]
    counts = PairedCounts.from_pairs(clean)
    worst_b, worst_a = imputed_tables(pairs)
    p_value, direction = bounded_mcnemar_p((worst_b.a_only, worst_b.b_only), (worst_a.a_only, worst_a.b_only))
    return {
        "pairs": counts.n,
        "errored_pairs": len(pairs) - len(clean),
        "missing": missing,
        "a": counts.a,
        "b": counts.b,
        "both": counts.both,
        "neither": counts.neither,
        "a_only": counts.a_only,
        "b_only": counts.b_only,
        "diff": counts.diff,
        "diff_range": None if not pairs else [worst_b.diff, worst_a.diff],
        "ci95": _interval(bounded_difference_interval(worst_b, worst_a)),
        "ci95_without_errored": _interval(paired_difference_interval(counts)),
        "worst_for_b": [worst_b.a_only, worst_b.b_only],
        "worst_for_a": [worst_a.a_only, worst_a.b_only],
        "p_without_errored": mcnemar_exact_p(counts.a_only, counts.b_only),
        "p_value": p_value,
        "direction": direction,
        "verdict": _verdict(direction, p_value, alpha),
    }


def _metric_table(pairs: Sequence[tuple[Mapping[str, Any], Mapping[str, Any]]], metric: str, scenes: Sequence[int],
                  alpha: float) -> dict[str, Any]:  # fmt: skip
    per_scene: dict[int, list[tuple[bool | None, bool | None]]] = {s: [] for s in scenes}
    missing = dict.fromkeys(scenes, 0)
    for row_a, row_b in pairs:
        scene = row_a["scene"]
        a = None if _errored(row_a) else _outcome(row_a, metric)
        b = None if _errored(row_b) else _outcome(row_b, metric)
        if (a is None and not _errored(row_a)) or (b is None and not _errored(row_b)):
            missing[scene] += 1
            continue
        per_scene[scene].append((a, b))
    table: dict[str, Any] = {}
    for scene in scenes:
        table[str(scene)] = _entry(per_scene[scene], missing[scene], alpha)
    usable = [table[str(s)]["pairs"] + table[str(s)]["errored_pairs"] for s in scenes]
    adjusted = holm_adjust([table[str(s)]["p_value"] if n else None for s, n in zip(scenes, usable)])
    for scene, p_holm in zip(scenes, adjusted):
        entry = table[str(scene)]
        entry.pop("verdict")  # re-added after p_holm, on which it now rests
        entry["p_holm"] = 1.0 if p_holm is None else p_holm
        entry["verdict"] = _verdict(entry["direction"], entry["p_holm"], alpha)
    everything = [pair for scene in scenes for pair in per_scene[scene]]
    table["overall"] = _entry(everything, sum(missing.values()), alpha)
    return table


def compare_rows(
    rows_a: Iterable[Mapping[str, Any]],
    rows_b: Iterable[Mapping[str, Any]] | None = None,
    *,
    alpha: float = 0.05,
    labels: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """The comparison JSON of arm B against arm A (see the module docstring).

    ``rows_b`` ``None``: ``rows_a`` are the rows of one A/B run, split by their ``arm`` field. ``labels``:
    ``{"a": ..., "b": ...}`` names shown for the arms (run directories, policies).

    Layout: ``{"schema", "alpha", "arms", "metric", "scenes", "metrics", "unpaired"}`` where ``scenes`` is the
    primary metric's table (``success_at_end``): scene id (as a string) and ``"overall"`` -> entry, and
    ``metrics`` maps every metric name (``success_at_end``, ``success_any_step``, ``milestones.<name>``) to
    such a table.
    """
    if not 0.0 < float(alpha) < 1.0:
        raise ValueError(f"alpha: expected a number in (0, 1), got {alpha!r}")
    if rows_b is None:
        rows_a, rows_b = split_arms(rows_a)
    rows_a, rows_b = list(rows_a), list(rows_b)
    pairs, unpaired = pair_rows(rows_a, rows_b)
    scenes = sorted({row_a["scene"] for row_a, _ in pairs})
    milestones = [n for n in _milestone_names(r for pair in pairs for r in pair)]
    metrics = [*SUCCESS_METRICS, *(MILESTONE_PREFIX + name for name in milestones)]
    tables = {metric: _metric_table(pairs, metric, scenes, float(alpha)) for metric in metrics}
    return {
        "schema": SCHEMA,
        "alpha": float(alpha),
        "arms": {arm: (labels or {}).get(arm, arm.upper()) for arm in ARMS},
        "metric": PRIMARY_METRIC,
        "scenes": tables[PRIMARY_METRIC],
        "metrics": tables,
        "unpaired": unpaired,
        "multiplicity": MULTIPLICITY,
        "note": "diff = B - A over pairs with the same scene and seed and no errored episode (descriptive when "
        "pairs errored); diff_range: B - A over every pair with the errored outcomes imputed against B and against "
        "A; ci95: Newcombe hybrid score interval bounded over the errored outcomes (lower end imputed against B, "
        "upper end against A); p_value: exact one-sided McNemar per direction with the errored episodes imputed "
        "against the claim (worst_for_b, worst_for_a), doubled; p_holm: Holm-adjusted over scenes; "
        "ci95_without_errored, p_without_errored: with the errored pairs dropped (information only)",
    }


def _pct(k: int, n: int) -> str:
    return f"{k}/{n}" if not n else f"{k}/{n} {100 * k / n:.0f}%"


def _fmt_p(p: float) -> str:
    return "<0.001" if p < 0.001 else f"{p:.3f}"


def _lines(table: Mapping[str, Any], scene_keys: Sequence[str]) -> list[tuple[str, ...]]:
    out = []
    for key in scene_keys:
        e = table[key]
        if e.get("errored_pairs") and e.get("diff_range"):  # the range over the errored outcomes, not one number
            estimate = f"{e['diff_range'][0]:+.2f}..{e['diff_range'][1]:+.2f}"
        else:
            estimate = "-" if e["diff"] is None else f"{e['diff']:+.2f}"
        ci = "-" if e["ci95"] is None else f"{estimate} [{e['ci95'][0]:+.2f}, {e['ci95'][1]:+.2f}]"
        verdict = {"b_better": "B better", "a_better": "A better"}.get(e.get("verdict"), "-")
        out.append((key, str(e["pairs"]), str(e["errored_pairs"]), _pct(e["a"], e["pairs"]), _pct(e["b"], e["pairs"]),
                    str(e["a_only"]), str(e["b_only"]), ci, _fmt_p(e["p_value"]),
                    _fmt_p(e["p_holm"]) if "p_holm" in e else "", verdict))  # fmt: skip
    return out


DESCRIPTIVE_WHY = ("the run stopped by a sequential test, whose decision (summary.json's sequential) is the one "
                   "to read; the fixed-n p-values and intervals below do not account for the stop")  # fmt: skip


def descriptive_comparison(result: Mapping[str, Any]) -> dict[str, Any]:
    """``result`` (:func:`compare_rows`) after a sequential run: every ``verdict`` dropped (a fixed-n claim that
    the stop invalidates) and ``descriptive`` naming the fields that are descriptive only, and why."""
    metrics = {name: {scope: {k: v for k, v in entry.items() if k != "verdict"} for scope, entry in table.items()}
               for name, table in result["metrics"].items()}  # fmt: skip
    out = {**result, "metrics": metrics, "scenes": metrics[result["metric"]]}
    out["descriptive"] = {
        "fields": ["diff", "diff_range", "ci95", "p_value", "p_holm"],
        "dropped": ["verdict"],
        "why": DESCRIPTIVE_WHY,
    }
    return out


def format_comparison(result: Mapping[str, Any], *, descriptive: bool = False) -> str:
    """The printed tables: one block per metric, one line per scene and the pooled ``overall`` line.

    ``descriptive``: the runs stopped by a sequential test, whose decision is the one to read: the fixed-n
    p-values are shown as descriptive only and the verdict column is left out."""
    header = ("scene", "pairs", "errored", "A", "B", "A only", "B only", "B - A [95% CI]", "p", "p Holm", "verdict")
    blocks = [f"A = {result['arms']['a']}", f"B = {result['arms']['b']}"]
    if descriptive:
        header = header[:-1]
        blocks.append("fixed-n p-values and intervals below are DESCRIPTIVE ONLY: the run stopped by a sequential "
                      "test, whose decision is the one to read")  # fmt: skip
    for metric, table in result["metrics"].items():
        keys = [k for k in table if k != "overall"] + ["overall"]
        lines = [line[: len(header)] for line in _lines(table, keys)]
        widths = [max(len(header[i]), *(len(line[i]) for line in lines)) for i in range(len(header))]
        blocks.append("")
        blocks.append(f"{metric} (paired by scene and seed, alpha {result['alpha']:g})")
        blocks.append("  ".join(h.ljust(w) for h, w in zip(header, widths)).rstrip())
        blocks.append("  ".join("-" * w for w in widths).rstrip())
        blocks.extend("  ".join(c.ljust(w) for c, w in zip(line, widths)).rstrip() for line in lines)
    if any(e.get("errored_pairs") for table in result["metrics"].values() for e in table.values()):
        blocks.append("")
        blocks.append("errored pairs are bounded, not dropped: B - A shows its range over their possible outcomes, "
                      "and the 95% CI and p hold whatever those outcomes were")  # fmt: skip
    if result.get("multiplicity") and not descriptive:
        blocks.append(f"multiplicity: {result['multiplicity']}")
    unpaired = result.get("unpaired") or {}
    if any(unpaired.values()):
        blocks.append("")
        blocks.append(f"unpaired episodes left out: A {unpaired.get('a', 0)}, B {unpaired.get('b', 0)}")
    return "\n".join(blocks)
