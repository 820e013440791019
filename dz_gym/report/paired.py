"""Paired comparison of two sets of episode rows for the report (pure).

Two runs with the same seeds and scenes (or the two arms of one A/B run, rows with ``arm`` ``"a"``/``"b"``)
give paired outcomes per (scene, seed). Per scene and overall the report shows the 2x2 table, the difference
of success rates B - A with Newcombe's interval for paired proportions (method 10, built from Wilson
intervals), and the exact McNemar p-value (two-sided binomial test of the discordant pairs at 1/2).

When :mod:`dz_gym.compare` is installed its ``compare_rows`` is used for the numbers, so the page and the
comparison JSON agree; :func:`paired_comparison` is the fallback with the same keys (``pairs``, ``a``, ``b``,
``a_only``, ``b_only``, ``diff``, ``ci95``, ``p_value``) plus ``both``, ``neither`` and the discordant pairs.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from dz_gym.eval.results import wilson_interval


def mcnemar_exact(a_only: int, b_only: int) -> float:
    """Two-sided exact McNemar p-value: binomial test of ``b_only`` of ``a_only + b_only`` at 1/2."""
    d = a_only + b_only
    if d == 0:
        return 1.0
    low = min(a_only, b_only)
    tail = sum(math.comb(d, i) for i in range(low + 1)) / 2.0**d
    return min(1.0, 2.0 * tail)


def newcombe_paired(both: int, a_only: int, b_only: int, neither: int) -> tuple[float, float] | None:
    """95% interval of p_B - p_A for paired binary outcomes (Newcombe 1998, method 10)."""
    n = both + a_only + b_only + neither
    if n == 0:
        return None
    p_a, p_b = (both + a_only) / n, (both + b_only) / n
    l_a, u_a = wilson_interval(both + a_only, n)
    l_b, u_b = wilson_interval(both + b_only, n)
    diff = p_b - p_a
    denom = (both + a_only) * (b_only + neither) * (both + b_only) * (a_only + neither)
    phi = 0.0 if denom == 0 else (both * neither - a_only * b_only) / math.sqrt(denom)
    dl = math.sqrt(max(0.0, (p_b - l_b) ** 2 - 2 * phi * (p_b - l_b) * (u_a - p_a) + (u_a - p_a) ** 2))
    du = math.sqrt(max(0.0, (u_b - p_b) ** 2 - 2 * phi * (u_b - p_b) * (p_a - l_a) + (p_a - l_a) ** 2))
    return max(-1.0, diff - dl), min(1.0, diff + du)


def _index(rows: Sequence[Mapping[str, Any]]) -> dict[tuple[int, int], Mapping[str, Any]]:
    return {(int(r["scene"]), int(r["seed"])): r for r in rows}


def _entry(pairs: list[tuple[Mapping[str, Any], Mapping[str, Any]]], key: str) -> dict[str, Any]:
    both = a_only = b_only = neither = 0
    discordant = []
    for ra, rb in pairs:
        sa, sb = bool(ra.get(key)), bool(rb.get(key))
        if sa and sb:
            both += 1
        elif sa:
            a_only += 1
            discordant.append(("a_only", ra, rb))
        elif sb:
            b_only += 1
            discordant.append(("b_only", ra, rb))
        else:
            neither += 1
    n = len(pairs)
    return {
        "pairs": n,
        "a": both + a_only,
        "b": both + b_only,
        "both": both,
        "a_only": a_only,
        "b_only": b_only,
        "neither": neither,
        "diff": ((b_only - a_only) / n) if n else None,
        "ci95": (list(newcombe_paired(both, a_only, b_only, neither)) if n else None),
        "p_value": mcnemar_exact(a_only, b_only) if n else None,
        "discordant": [
            {"which": which, "scene": int(ra["scene"]), "seed": int(ra["seed"]), "episode_a": int(ra["episode"]), "episode_b": int(rb["episode"])}
            for which, ra, rb in discordant
        ],
    }


def paired_comparison(rows_a: Sequence[Mapping[str, Any]], rows_b: Sequence[Mapping[str, Any]], key: str = "success_at_end") -> dict[str, Any]:
    """``{"scenes": {scene: entry}, "overall": entry, "unpaired": {...}}`` for outcome ``key``.

    Pairs are episodes with the same (scene, seed) in both sets where neither errored; the others are counted
    in ``unpaired`` (only in A, only in B, errored in either).
    """
    ia, ib = _index(rows_a), _index(rows_b)
    common = sorted(set(ia) & set(ib))
    pairs = [(ia[k], ib[k]) for k in common if ia[k].get("error") is None and ib[k].get("error") is None]
    errored = len(common) - len(pairs)
    scenes = sorted({k[0] for k in common})
    return {
        "key": key,
        "scenes": {str(s): _entry([p for p in pairs if int(p[0]["scene"]) == s], key) for s in scenes},
        "overall": _entry(pairs, key),
        "unpaired": {"only_a": len(set(ia) - set(ib)), "only_b": len(set(ib) - set(ia)), "errored": errored},
    }


def split_arms(rows: Sequence[Mapping[str, Any]]) -> tuple[list[Mapping[str, Any]], list[Mapping[str, Any]]] | None:
    """The A and B rows of an A/B run (rows carry ``arm``), or None for a plain run."""
    arms = {r.get("arm") for r in rows}
    if not arms & {"a", "b"}:
        return None
    return [r for r in rows if r.get("arm") == "a"], [r for r in rows if r.get("arm") == "b"]


def compare(rows_a: Sequence[Mapping[str, Any]], rows_b: Sequence[Mapping[str, Any]], key: str = "success_at_end") -> dict[str, Any]:
    """:func:`paired_comparison`, with the numbers of :mod:`dz_gym.compare` when that module is present."""
    out = paired_comparison(rows_a, rows_b, key)
    try:
        from dz_gym import compare as external  # type: ignore[attr-defined]

        official = external.compare_rows(list(rows_a), list(rows_b))  # type: ignore[attr-defined]
    except (ImportError, AttributeError, TypeError, ValueError, KeyError):
        return out
    for scope, entry in [("overall", out["overall"]), *((s, e) for s, e in out["scenes"].items())]:
        theirs = official.get("overall") if scope == "overall" else (official.get("scenes") or {}).get(scope)
        if isinstance(theirs, Mapping):
            for field in ("pairs", "a", "b", "a_only", "b_only", "diff", "ci95", "p_value"):
                if field in theirs:
                    entry[field] = theirs[field]
    out["source"] = "dz_gym.compare"
    return out
