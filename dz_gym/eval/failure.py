"""Failure modes: why an episode did not succeed, one name per finished episode (pure).

The milestone funnel says *how often* each stage of the task was reached; a failure mode says, per episode,
*where* it went wrong. Every backend reports the generic milestones ``reached``, ``lifted``, ``above_target``
and ``placed`` (:data:`dz_gym.envs.episodes.MILESTONES`; a task that judges itself, such as sim-evals' MILA
tasks, maps its own milestones onto them in order), so one rule serves all of them. It reads only fields of
the episode row (:class:`~dz_gym.eval.row.EpisodeRow`): ``error``, ``success_at_end``, ``success_any_step``,
``milestones``, ``ended_by``, ``final_object_pos``, ``final_container_pos`` and ``scene``; old rows without a
``failure_mode`` get theirs from the same rule (:func:`mode_of`).

The first rule of :data:`MODES` that holds names the episode:

>>> row = {"scene": 1, "error": None, "success_at_end": False, "success_any_step": False, "ended_by": "time_limit",
...        "milestones": {"reached": 40, "lifted": 80, "above_target": None, "placed": None}}
>>> failure_mode(row)
'dropped'
>>> failure_mode({**row, "error": "server error: boom"})
'server_error'
>>> failure_mode({**row, "milestones": {"reached": 40, "lifted": None, "above_target": None, "placed": None}})
'grasp_failed'
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

__all__ = ["MODES", "NAMES", "failure_mode", "format_transitions", "markdown_table", "mode_counts", "mode_of",
           "mode_transitions"]  # fmt: skip

# (name, rule): in order; the first that holds is the episode's mode.
MODES: tuple[tuple[str, str], ...] = (
    ("server_error", "the episode errored (`error` is set; `error_event` says which cause: a server error, a lost "
                     "connection, a timeout, a protocol error, a refused session or a lost shard)"),
    ("success", "the placement check holds on the final state (`success_at_end`)"),
    ("undone", "the check held at some step but not at the end (`success_any_step` without `success_at_end`): "
               "placed, then knocked or pulled out"),
    ("never_reached", "the tool centre point never came within reach of the object (`reached` null)"),
    ("grasp_failed", "reached the object but never lifted it (`lifted` null)"),
    ("dropped", "lifted the object but never carried it over the container (`above_target` null)"),
    ("timeout_near", "was over the container and the time ran out (`ended_by` `time_limit`) with the object "
                     "still within the scene's `xy_radius` of the container's centre at the last step; for a task "
                     "that judges itself (scene ids 101+) or without final positions: the time ran out after "
                     "`above_target`"),
    ("misplaced", "was over the container but the object ended elsewhere (outside the `xy_radius` at the last "
                  "step), or the env ended the episode before the time limit"),
    ("failed", "not a success and the env reports no milestones, so nothing says where"),
)  # fmt: skip
NAMES = tuple(name for name, _ in MODES)


def _xy_radius(scene: Any) -> float | None:
    """The success check's horizontal radius of a DROID scene (1-3), None for a task that judges itself."""
    from dz_gym.envs.droid import SCENES

    spec = SCENES.get(scene) if isinstance(scene, int) else None
    return None if spec is None else float(spec.success.xy_radius)


def _near_at_end(row: Mapping[str, Any]) -> bool:
    """Whether the object ended over the container (see ``timeout_near``)."""
    radius = _xy_radius(row.get("scene"))
    obj, container = row.get("final_object_pos"), row.get("final_container_pos")
    if radius is None or not obj or not container or len(obj) < 2 or len(container) < 2:
        return True  # nothing to judge it by: the time ran out after above_target
    distance = math.hypot(float(obj[0]) - float(container[0]), float(obj[1]) - float(container[1]))
    return distance <= radius


def failure_mode(row: Mapping[str, Any]) -> str:
    """The mode of one finished (or errored) episode row, by the rules of :data:`MODES`."""
    if row.get("error") is not None:
        return "server_error"
    if row.get("success_at_end"):
        return "success"
    if row.get("success_any_step"):
        return "undone"
    milestones = row.get("milestones")
    if not isinstance(milestones, Mapping) or not milestones:
        return "failed"
    for name, mode in (("reached", "never_reached"), ("lifted", "grasp_failed"), ("above_target", "dropped")):
        if milestones.get(name) is None:
            return mode
    if row.get("ended_by") == "time_limit" and _near_at_end(row):
        return "timeout_near"
    return "misplaced"


def mode_of(row: Mapping[str, Any]) -> str:
    """The row's ``failure_mode``, or the rule's for an old row that has none."""
    mode = row.get("failure_mode")
    return str(mode) if mode is not None else failure_mode(row)


def mode_counts(rows: Iterable[Mapping[str, Any]]) -> dict[str, int]:
    """Episodes per mode, in the order of :data:`MODES`, modes that occur only.

    >>> mode_counts([{"error": "x"}, {"error": None, "success_at_end": True}, {"error": "y"}])
    {'server_error': 2, 'success': 1}
    """
    counts = dict.fromkeys(NAMES, 0)
    for row in rows:
        counts[mode_of(row)] += 1
    return {name: n for name, n in counts.items() if n}


def mode_transitions(rows_a: Iterable[Mapping[str, Any]], rows_b: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """What B changes against A on the same seeds: per pair of modes ``"A -> B"`` the number of seeds, and the
    modes B fixes (A's failures that are B's successes) and breaks (A's successes that fail under B).

    Episodes pair by (scene, seed); seeds that only one side ran are left out (``unpaired``).

    >>> a = [{"scene": 1, "seed": 0, "failure_mode": "dropped"}, {"scene": 1, "seed": 1, "failure_mode": "success"}]
    >>> b = [{"scene": 1, "seed": 0, "failure_mode": "success"}, {"scene": 1, "seed": 1, "failure_mode": "undone"}]
    >>> t = mode_transitions(a, b)
    >>> t["fixed"], t["broken"], t["pairs"]
    ({'dropped': 1}, {'undone': 1}, 2)
    """
    by_a = {(int(r["scene"]), int(r["seed"])): mode_of(r) for r in rows_a}
    by_b = {(int(r["scene"]), int(r["seed"])): mode_of(r) for r in rows_b}
    common = sorted(set(by_a) & set(by_b))
    changes: dict[str, int] = {}
    fixed: dict[str, int] = {}
    broken: dict[str, int] = {}
    for key in common:
        a, b = by_a[key], by_b[key]
        changes[f"{a} -> {b}"] = changes.get(f"{a} -> {b}", 0) + 1
        if a != "success" and b == "success":
            fixed[a] = fixed.get(a, 0) + 1
        elif a == "success" and b != "success":
            broken[b] = broken.get(b, 0) + 1
    order = {name: i for i, name in enumerate(NAMES)}

    def _sorted(d: dict[str, int]) -> dict[str, int]:
        return dict(sorted(d.items(), key=lambda kv: (-kv[1], order.get(kv[0].split(" ")[0], 99), kv[0])))

    return {"pairs": len(common), "unpaired": len(set(by_a) ^ set(by_b)), "changes": _sorted(changes),
            "fixed": _sorted(fixed), "broken": _sorted(broken)}  # fmt: skip


def format_transitions(transitions: Mapping[str, Any], labels: tuple[str, str] = ("A", "B")) -> list[str]:
    """Terminal lines of :func:`mode_transitions`: what B fixes and breaks."""
    a, b = labels
    lines = []
    for key, verb in (("fixed", "fixes"), ("broken", "breaks")):
        items = transitions.get(key) or {}
        text = ", ".join(f"{mode} {n}" for mode, n in items.items()) or "none"
        lines.append(f"failure modes {b} {verb} against {a} (same seeds): {text}")
    return lines


def markdown_table() -> str:
    """The failure-mode table of ``docs/eval.md`` (a test keeps them equal)."""
    lines = ["| mode | when (the first rule that holds) |", "|---|---|"]
    lines.extend(f"| `{name}` | {rule} |" for name, rule in MODES)
    return "\n".join(lines)
