"""``summary.json`` of a run directory: every row, every run segment's timing, and what ran it.

:func:`build_summary` recomputes the results from ``episodes.jsonl`` (:func:`dz_gym.eval.results.summarize`)
and adds what rows cannot carry (the run segments' timing, the config, the servers' metadata, versions). In an
A/B run it adds ``arms`` (per arm, per scene and overall), ``comparison`` (the JSON of ``dz-gym-compare``) and
``sequential`` (the test's decision and why the run stopped); in a run of ``K`` named arms (``--arm``) it adds
``arms`` and ``ranking`` (the leaderboard). :func:`pair_tracker` rebuilds an A/B run's
:class:`~dz_gym.eval.ab.PairTracker` from its rows (resume, and the summary).
"""

from __future__ import annotations

import dataclasses
import platform
from collections.abc import Mapping, Sequence
from importlib import metadata as importlib_metadata
from typing import Any

from dz_gym.eval.config import EvalConfig
from dz_gym.eval.results import summarize
from dz_gym.eval.rundir import RunDir

__all__ = ["build_summary", "metadata_dict", "package_versions", "pair_tracker", "versions"]

# After an adaptive stop the per-scene and per-arm rates and their Wilson intervals are descriptive.
ADAPTIVE_RATES = {
    "fields": ["<scene>", "overall", "arms"],
    "why": "the run stopped when its sequential test or race did: the success rates and their Wilson intervals "
    "do not account for the stop (its decision, the confidence sequence and the leaderboard's claims do)",
}


def package_versions(names: Sequence[str], version=importlib_metadata.version) -> dict[str, str | None]:
    """The installed version of each package of ``names`` (distribution names), None where it is not."""
    out: dict[str, str | None] = {}
    for name in names:
        try:
            out[name] = version(name)
        except importlib_metadata.PackageNotFoundError:
            out[name] = None
    return out


def versions() -> dict[str, str]:
    """Versions of Python, the platform and the packages that shape results (those installed)."""
    out = {"python": platform.python_version(), "platform": platform.platform()}
    names = ("dz-gym", "numpy", "gymnasium", "websockets", "msgpack", "mujoco", "torch", "isaaclab", "imageio")
    out.update({name: v for name, v in package_versions(names).items() if v is not None})
    return out


def metadata_dict(meta: Any) -> dict[str, Any]:
    """A server's metadata as a JSON object (a dataclass's fields, a mapping's items, else its repr).

    >>> metadata_dict({"a": 1}), metadata_dict(3)
    ({'a': 1}, {'value': '3'})
    """
    if dataclasses.is_dataclass(meta) and not isinstance(meta, type):
        return dataclasses.asdict(meta)
    return dict(meta) if isinstance(meta, Mapping) else {"value": repr(meta)}


def pair_tracker(config: EvalConfig, rows: Sequence[Mapping[str, Any]]):
    """The :class:`~dz_gym.eval.ab.PairTracker` of an A/B run, or the :class:`~dz_gym.eval.race.ArmRace` of a
    ``--select-best`` run, rebuilt from its rows (None otherwise)."""
    if config.stats.select_best:
        from dz_gym.eval.plan import pair_order
        from dz_gym.eval.race import ArmRace

        order = pair_order(config.plan.scenes, config.plan.episodes, interleave=True)
        return ArmRace(config.arms, order=order, alpha=config.stats.alpha, rows=rows)
    if not config.ab:
        return None
    from dz_gym.eval.ab import PairTracker
    from dz_gym.eval.plan import pair_order

    # The test's pair order is the plan's, the scenes interleaved (episode-major), so that it never decides
    # before every scene has contributed its share, even when the scenes run one after another.
    order = pair_order(config.plan.scenes, config.plan.episodes, interleave=True)
    stats = config.stats
    return PairTracker(sequential=stats.sequential, alpha=stats.alpha, max_pairs=config.sequential_max_pairs,
                       rows=rows, order=order, min_difference=stats.min_difference, power=stats.power)  # fmt: skip


def _planned(config: EvalConfig) -> dict[int, int]:
    return {s: config.plan.episodes * max(1, len(config.arms)) for s in config.plan.scenes}


def _ab_summary(
    config: EvalConfig, rows: Sequence[Mapping[str, Any]], dropped: Sequence[Mapping[str, Any]], finished: bool
) -> dict[str, Any]:
    """``arms``, ``comparison``, ``ranking`` and ``sequential`` of an A/B run's summary; ``dropped``: the episodes cut off
    by the sequential stop (no row); ``finished``: every planned episode has a row."""
    from dz_gym.eval.results import summarize_arms
    from dz_gym.stats.comparison import compare_rows, descriptive_comparison
    from dz_gym.stats.ranking import outcomes_by_seed, rank_arms

    labels = {}
    for arm, servers, policy in (
        ("a", config.policies.servers, config.policies.policy),
        ("b", config.policies.servers_b, config.policies.policy_b),
    ):
        labels[arm] = f"arm {arm.upper()} (" + (", ".join(servers) if servers else f"policy {policy}") + ")"
    planned = {s: config.plan.episodes for s in config.plan.scenes}
    out: dict[str, Any] = {"arms": summarize_arms(rows, config.arms, planned=planned)}
    out["arms"]["labels"] = labels  # what each arm ran (also comparison.arms)
    out["comparison"] = compare_rows(rows, labels=labels)
    by_arm = {arm: [r for r in rows if r.get("arm") == arm] for arm in config.arms}
    tracker = pair_tracker(config, rows)
    out["sequential"] = tracker.summary(
        rows, planned_pairs=config.plan.episodes * len(config.plan.scenes), finished=finished
    )
    if out["sequential"] is None:
        out["ranking"] = rank_arms(outcomes_by_seed(by_arm))  # per arm: Wilson interval, rank with an interval
    else:
        # The run stopped when the test did: its fixed-n verdicts lose their guarantee. The comparison keeps its
        # numbers, marked descriptive; the ranking's one claim is the sequential test's decision.
        out["comparison"] = descriptive_comparison(out["comparison"])
        better = out["sequential"].get("better") if out["sequential"].get("stop") else None
        claims = [(better, "b" if better == "a" else "a")] if better in ("a", "b") else []
        out["ranking"] = rank_arms(outcomes_by_seed(by_arm), config.stats.alpha, claims=claims,
                                   claims_method="the sequential test's decision (valid at its stop)")  # fmt: skip
        out["descriptive"] = ADAPTIVE_RATES
        out["sequential"]["dropped"] = [dict(d) for d in dropped]
        if tracker.stopped:
            out["complete"] = True  # the test decided: the episodes it did not need are not missing
    return out


def _raced_seeds(config: EvalConfig, rows: Sequence[Mapping[str, Any]], race) -> list[dict[str, bool | None]]:
    """Per seed the race folded, in plan order, the outcome of every arm still in the race at that seed: the
    data of the race's own e-processes (an arm's rows after its elimination are left out)."""
    from dz_gym.eval.plan import pair_order

    table = {(int(r["scene"]), int(r["episode"]), r.get("arm")): r for r in rows}
    out_after = race.seeds  # per eliminated arm: the seeds folded when it went out
    seeds = []
    for index, (scene, episode) in enumerate(pair_order(config.plan.scenes, config.plan.episodes, interleave=True)):
        if index >= race.next_group:
            break
        seed = {}
        for arm in config.arms:
            row = table.get((scene, episode, arm))
            if row is not None and index < out_after.get(arm, index + 1):
                seed[arm] = None if row.get("error") is not None else bool(row.get("success_at_end"))
        seeds.append(seed)
    return seeds


def _arms_summary(config: EvalConfig, rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """``arms`` and ``ranking`` of a run of named arms (``--arm``): per arm its groups, what it ran, and the
    leaderboard (:func:`~dz_gym.stats.ranking.rank_arms` on the seeds every arm completed)."""
    from dz_gym.eval.results import summarize_arms
    from dz_gym.stats.ranking import anytime_claims, outcomes_by_seed, rank_arms

    planned = {s: config.plan.episodes for s in config.plan.scenes}
    out: dict[str, Any] = {"arms": summarize_arms(rows, config.arms, planned=planned)}
    out["arms"]["labels"] = {name: f"arm {name} ({value})" for name, value in config.arm_table()}
    by_arm = {arm: [r for r in rows if r.get("arm") == arm] for arm in config.arms}
    if not config.stats.select_best:
        out["ranking"] = rank_arms(outcomes_by_seed(by_arm))
    else:
        race = pair_tracker(config, rows)
        # The race stopped arms adaptively: the leaderboard's claims come from its e-processes, replayed in
        # plan order on the seeds it folded (anytime-valid); rates and Wilson intervals are descriptive.
        claims = anytime_claims(_raced_seeds(config, rows, race), config.stats.alpha)
        out["ranking"] = rank_arms(outcomes_by_seed(by_arm), config.stats.alpha, claims=claims)
        out["selection"] = race.summary()
        out["descriptive"] = ADAPTIVE_RATES
        if race.stopped:
            out["complete"] = True  # the race ended: the episodes it did not need are not missing
    return out


def build_summary(
    config: EvalConfig,
    run_dir: RunDir,
    *,
    segments: list[dict[str, Any]],
    extra: Mapping[str, Any],
    finished: bool | None = None,
) -> dict[str, Any]:
    """``summary.json`` of the whole run directory: every row, every run segment's timing.

    The rates come from the counts the summary reports: ``env_steps_per_s = env_steps_taken / wall_s``
    (``env_steps_taken`` also counts the steps of episodes an interruption dropped, which have no row).
    ``extra``: the fields rows cannot carry (``dropped``: an A/B run's episodes cut off by the sequential stop);
    ``finished``: every planned episode has a row (default: counted from the rows).
    """
    rows = run_dir.read_rows()
    wall = sum(seg["wall_s"] for seg in segments)
    stepped = sum(seg["env_steps"] for seg in segments)
    busy: dict[str, float] = {}
    for seg in segments:
        for url, seconds in seg.get("busy_s", {}).items():
            busy[url] = busy.get(url, 0.0) + seconds
    from dz_gym.envs.scenes import scene_prompt

    prompts = {s: scene_prompt(s) for s in config.plan.scenes}
    fields = dict(extra)
    dropped = fields.pop("dropped", [])
    fields["segments"] = segments
    fields["config"] = config.to_flat_dict()  # the flat layout summaries have always had
    fields["retries"] = config.retries_assumption()  # what --episode-retries assumes (None: no retries)
    summary = summarize(
        rows,
        planned=_planned(config),
        prompts=prompts,
        wall_s=wall or None,
        stepped=stepped,
        busy_s=busy,
        extra=fields,
    )
    if config.ab:
        if finished is None:
            done = {(int(r["scene"]), int(r["episode"]), r.get("arm")) for r in rows}
            wanted = {
                (s, k, arm) for s in config.plan.scenes for k in range(config.plan.episodes) for arm in config.arms
            }
            finished = wanted <= done
        summary.update(_ab_summary(config, rows, dropped, finished))
    elif config.armed:
        summary.update(_arms_summary(config, rows))
    return summary
