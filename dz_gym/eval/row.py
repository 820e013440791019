"""The episode row: one line of ``episodes.jsonl``, its fields and what each one is, declared once (pure).

:class:`EpisodeRow` is the schema. Each field says, in its metadata, its JSON type, its meaning and its kind:

- ``identity``: what the episode is (scene, episode, arm, seed, prompt...) and the configuration it ran
  under (step limit, backend, policy), fixed by the run plan;
- ``placement``: where it ran (env slot, server, shard), fixed by the plan too but different between runs
  with other ``num_envs``, servers or shard counts;
- ``result``: what it measured; for a deterministic policy equal between any two runs of the same plan;
- ``volatile``: what differs between two runs of the same plan (session ids, timing, the Ray node and GPU);
- ``file``: paths of the episode's trajectory and video in the run directory.

:data:`VOLATILE`, :data:`PLACEMENT`, :data:`RESULTS` and :data:`FILES` are the names of each kind; the tests,
the report and ``docs/eval.md`` (its row table is :func:`markdown_table`, checked by a test) read them here.

:meth:`EpisodeRow.of` is the one constructor of a row, for a finished, an errored and a lost episode alike (a
lost one is an errored row whose cause is :data:`~dz_gym.records.SHARD_LOST`): it takes the plan entry, the
episode's context and what its steps measured, and enforces the rules (an errored episode's success fields are
null and its ``error_step`` is its step count).

>>> from dz_gym.eval.plan import PlanEntry
>>> entry = PlanEntry(order=0, scene=1, episode=3, arm=None, seed=3, slot=1, server="ws://a")
>>> row = EpisodeRow.of(entry, prompt="put the cube in the bowl", task=None, max_steps=16, backend="mujoco",
...                     error="shard 0 lost", error_event="shard_lost")
>>> d = row.to_dict()
>>> d["ended_by"], d["success_at_end"], d["error_step"], d["env"], "arm" in d, "shard" in d
('error', None, 0, 1, False, False)
>>> EpisodeRow.from_dict(d) == row
True
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from typing import Any

from dz_gym.eval.failure import NAMES as FAILURE_MODES
from dz_gym.eval.failure import failure_mode
from dz_gym.records import INTEGRITY_EVENTS

__all__ = [
    "FILES",
    "KINDS",
    "PLACEMENT",
    "RESULTS",
    "VOLATILE",
    "EpisodeRow",
    "check_row",
    "comparable",
    "markdown_table",
]

KINDS = ("identity", "placement", "result", "volatile", "file")
ENDED_BY = ("time_limit", "terminated", "error")


def _f(kind: str, type_: str, meaning: str, default: Any = None, factory: Any = None) -> Any:
    meta = {"kind": kind, "type": type_, "meaning": meaning}
    if factory is not None:
        return dataclasses.field(default_factory=factory, metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


@dataclasses.dataclass(frozen=True)
class EpisodeRow:
    """One episode of a run (see the module docstring); the field order is the row's key order."""

    arm: str | None = _f("identity", "str", 'runs with arms only: `"a"` or `"b"` in an A/B run, the `--arm` NAME '
                         "in a run of named arms (a row of each arm per scene and seed)")  # fmt: skip
    scene: int = _f("identity", "int", "the scene id")
    task: str | None = _f("identity", "str / null", "the scene's task name: `DROID-CubeInBowl`, `DROID-CanInMug`, "
                          "`DROID-BananaInBin` for scenes 1-3, the sim-evals task (`place_spoon_in_sink`, ...) for "
                          "scene ids 101-103")  # fmt: skip
    episode: int = _f("identity", "int", "episode k of the scene")
    seed: int = _f("identity", "int", "the episode's seed: `--seed` + k")
    env: int = _f("placement", "int", "slot that ran it (`episode % num_envs`; in an A/B run "
                  "`2 (episode % (num_envs / 2))` for arm A, one more for arm B; with K named arms "
                  "`K (episode % (num_envs / K)) + i` for arm i)")  # fmt: skip
    prompt: str = _f("identity", "str", "what the server got as the instruction", "")
    server: str = _f("placement", "str", "the server URL the episode's requests went to", "")
    backend: str | None = _f("identity", "str", "the simulator backend that ran it (`mujoco`, `isaac`, ...); absent "
                             "in rows of older runs")  # fmt: skip
    policy: str | None = _f("identity", "str", "the policy of its arm (of the run without arms): the embedded "
                            "server's policy spec (`reference`, `reference:skill=0.3`, `module:factory`) or `external` "
                            "for servers the run did not start (their URL is placement); absent in rows of older "
                            "runs")  # fmt: skip
    session_id: str = _f("volatile", "str", "the episode's session id (empty when it never started)", "")
    steps: int = _f("result", "int", "steps taken", 0)
    max_steps: int = _f("identity", "int", "the episode's step limit", 0)
    ended_by: str = _f("result", "str", "`time_limit`, `terminated` or `error`", "error")
    success_at_end: bool | None = _f("result", "bool / null", "placement check on the final state (null for an "
                                     "errored episode)")  # fmt: skip
    success_any_step: bool | None = _f("result", "bool / null", "check true at any step (null for an errored "
                                       "episode)")  # fmt: skip
    first_success_step: int | None = _f("result", "int / null", "1-based step at which the check first held")
    milestones: dict[str, int | None] | None = _f(
        "result", "object / null", "name -> first episode step (1-based) at which the milestone was reached, or "
        "null if never: every name the env reports in `info[\"milestones\"]`, i.e. `reached`, `lifted`, "
        "`above_target`, `placed` and, for MILA tasks, the task's own names (`reached_spoon`, ...); thresholds in "
        "[embedded_sim.md](embedded_sim.md) and [isaac.md](isaac.md). null when the env reports none"
    )  # fmt: skip
    failure_mode: str | None = _f("result", "str / null", "why it ended as it did, one name per episode: `success`, "
                                  "`undone`, `never_reached`, `grasp_failed`, `dropped`, `timeout_near`, `misplaced`, "
                                  "`failed` or `server_error` (the rules: [Failure modes](#failure-modes)); null only "
                                  "in rows written before it existed")  # fmt: skip
    server_calls: int = _f("result", "int", "requests sent", 0)
    server_errors: int = _f("result", "int", "failed requests", 0)
    latency_ms: dict[str, float] | None = _f("volatile", "object / null", "`mean`, `p50`, `p90`, `p99`, `max`, "
                                             "`count` of this episode's chunk latencies")  # fmt: skip
    latencies_ms: list[float] = _f("volatile", "list", "every chunk latency (ms), so summaries can be recomputed "
                                   "exactly", factory=list)  # fmt: skip
    error: str | None = _f("result", "str / null", "one-line reason; null when none")
    error_event: str | None = _f("result", "str / null", "the cause, one name per cause for every env and server "
                                 "flavor: `server_error`, `connection_lost`, `timeout`, `protocol_error`, "
                                 "`session_refused` (the server refused the episode's session for longer than "
                                 "`admission_wait`; a shorter refusal is waited out and the episode re-run from its "
                                 "reset with its seed, with no row of its own) or `shard_lost` (the process running "
                                 "it was lost, `--ray`)")  # fmt: skip
    error_step: int | None = _f("result", "int / null", "the step at which the error happened")
    env_seed: int | None = _f("result", "int / null", "the seed the env reports it used (equal to `seed`)")
    final_object_pos: list[float] | None = _f("result", "list / null", "env-local object position at the last step")
    final_container_pos: list[float] | None = _f("result", "list / null", "env-local container position at the "
                                                 "last step")  # fmt: skip
    started_at: str | None = _f("volatile", "str / null", "start time (UTC, ISO 8601)")
    wall_s: float = _f("volatile", "float", "wall time of the episode (s)", 0.0)
    trajectory: str | None = _f("file", "str / null", "the trajectory's path relative to the run directory")
    video: str | None = _f("file", "str / null", "the video's path relative to the run directory")
    chunk_delays: list[int] = _f("result", "list of int", "per chunk, the steps between its request's observation "
                                 "and its first executed row (0 when waiting synchronously)", factory=list)  # fmt: skip
    request_delays: list[int] = _f("result", "list of int", "`--latency-honest` only: every request's delay in "
                                   "steps, ceil(round trip x `--control-hz`) or replayed from an earlier attempt "
                                   "of the episode, in request order (also one whose chunk the episode's end left "
                                   "unused); empty otherwise", factory=list)  # fmt: skip
    wait_steps: int = _f("result", "int", "steps the env waited (blocked on a late reply, or held its pose under "
                         "`--simulated-delay`)", 0)  # fmt: skip
    stale_steps: int = _f("result", "int", "steps it executed past a chunk's window while the next one was late", 0)
    reconnects: int = _f("result", "int", "connections reopened during the episode (a request the server cannot "
                         "have processed, e.g. on a connection it closed while idle, is sent again on a new one)", 0)  # fmt: skip
    retries: int = _f("result", "int", "requests sent again after a server error (`--retry-server-errors`)", 0)
    attempts: int = _f("volatile", "int", "times the episode was started from its reset: 1 plus the attempts that "
                       "ended by an infrastructure error and were run again on the same seed and slot "
                       "(`--episode-retries`; volatile: a run without errors has 1)", 1)  # fmt: skip
    retried_events: list[str] = _f("volatile", "list of str", "the `error_event` of each attempt run again, in "
                                   "order", factory=list)  # fmt: skip
    shard: int | None = _f("placement", "int", "sharded runs (`--ray`) only: the shard that ran the episode")
    node: str | None = _f("volatile", "str / null", "sharded runs (`--ray`) only: the Ray node id of its shard "
                          "(null for a lost shard's episode when it was never known)")  # fmt: skip
    gpu: str | None = _f("volatile", "str / null", "sharded runs (`--ray`) only: the GPU id Ray gave the shard "
                         "(null without a GPU; see [ray.md](ray.md))")  # fmt: skip

    @classmethod
    def of(cls, entry: Any, *, prompt: str, task: str | None, max_steps: int, backend: str | None,
           **measured: Any) -> EpisodeRow:  # fmt: skip
        """The row of plan entry ``entry`` (a :class:`~dz_gym.eval.plan.PlanEntry`; its ``policy`` is the row's):
        finished, errored or lost, run on ``backend``.

        ``measured``: what its steps measured (any result, volatile, file or placement field; the rest keep
        their "nothing ran" defaults). With ``error`` set the success fields are null, ``ended_by`` is
        ``error`` and ``error_step`` defaults to ``steps``; without it ``success_at_end`` and
        ``success_any_step`` must be given."""
        unknown = set(measured) - set(_NAMES)
        if unknown:
            raise TypeError(f"episode row: unknown field(s) {sorted(unknown)}")
        values = {"scene": entry.scene, "episode": entry.episode, "seed": entry.seed, "env": entry.slot,
                  "server": entry.server, "arm": entry.arm, "prompt": prompt, "task": task,
                  "max_steps": int(max_steps), "backend": backend, "policy": entry.policy}  # fmt: skip
        values.update(measured)
        if values.get("error") is not None:
            values.update(ended_by="error", success_at_end=None, success_any_step=None, first_success_step=None)
            values.setdefault("error_step", int(values.get("steps", 0)))
        values.setdefault("failure_mode", failure_mode(values))
        row = cls(**values)
        check_row(row.to_dict())
        return row

    def to_dict(self) -> dict[str, Any]:
        """The JSON object of ``episodes.jsonl`` (``arm``, ``shard``, ``node``, ``backend``, ``policy`` only
        where they apply or are known)."""
        out = {name: getattr(self, name) for name in _NAMES}
        for name in ("arm", "backend", "policy"):  # no arm; a row built from an older run's row
            if out[name] is None:
                del out[name]
        if out["shard"] is None:  # not sharded; a sharded row names its node and GPU, null when not known
            del out["shard"], out["node"], out["gpu"]
        return out

    @classmethod
    def from_dict(cls, row: Mapping[str, Any]) -> EpisodeRow:
        """A written row as an :class:`EpisodeRow` (checked; unknown keys are an error)."""
        check_row(row)
        unknown = set(row) - set(_NAMES)
        if unknown:
            raise ValueError(f"episode row: unknown key(s) {sorted(unknown)}")
        return cls(**dict(row))

    def with_placement(self, **placement: Any) -> EpisodeRow:
        """The same row run elsewhere (a shard's global slot, its shard and node)."""
        bad = [k for k in placement if _FIELDS[k].metadata["kind"] not in ("placement", "volatile")]
        if bad:
            raise TypeError(f"episode row: {bad} are not placement fields")
        return dataclasses.replace(self, **placement)


_FIELDS = {f.name: f for f in dataclasses.fields(EpisodeRow)}
_NAMES = tuple(_FIELDS)


def _kind(kind: str) -> frozenset[str]:
    return frozenset(f.name for f in _FIELDS.values() if f.metadata["kind"] == kind)


IDENTITY = _kind("identity")
PLACEMENT = _kind("placement")
RESULTS = _kind("result")
VOLATILE = _kind("volatile")
FILES = _kind("file")
REQUIRED = ("scene", "episode", "seed", "env", "session_id", "steps", "server_calls", "success_at_end",
            "success_any_step", "error")  # fmt: skip
# What the report lists under an episode beside its outcome and its plots.
INFO_FIELDS = ("arm", "task", "prompt", "session_id", "server", "first_success_step", "wait_steps", "stale_steps",
               "error", "error_event", "error_step", "attempts", "failure_mode", "milestones", "reconnects", "retries", "shard", "node", "gpu",
               "wall_s", "started_at")  # fmt: skip


def check_row(row: Mapping[str, Any]) -> None:
    """One-line ``ValueError`` when ``row`` lacks a required key or has a wrong-typed core field."""
    for key in REQUIRED:
        if key not in row:
            raise ValueError(f"episode row: missing key {key!r} (expected {', '.join(REQUIRED)})")
    for key in ("scene", "episode", "seed", "env", "steps", "server_calls"):
        if not isinstance(row[key], int) or isinstance(row[key], bool):
            raise ValueError(f"episode row: {key!r} expected an int, got {row[key]!r}")
    errored = row["error"] is not None
    for key in ("success_at_end", "success_any_step"):
        value = row[key]
        if errored and value is not None:
            raise ValueError(f"episode row: {key!r} expected null for an errored episode, got {value!r}")
        if not errored and not isinstance(value, bool):
            raise ValueError(f"episode row: {key!r} expected true/false, got {value!r}")
    event = row.get("error_event")
    if event is not None and event not in INTEGRITY_EVENTS:
        raise ValueError(f"episode row: 'error_event' expected one of {', '.join(INTEGRITY_EVENTS)}, got {event!r}")
    mode = row.get("failure_mode")
    if mode is not None and mode not in FAILURE_MODES:
        raise ValueError(f"episode row: 'failure_mode' expected one of {', '.join(FAILURE_MODES)}, got {mode!r}")
    if "ended_by" in row and row["ended_by"] not in ENDED_BY:
        raise ValueError(f"episode row: 'ended_by' expected one of {', '.join(ENDED_BY)}, got {row['ended_by']!r}")


def comparable(rows: Iterable[Mapping[str, Any]], *, ignore: Iterable[str] = ()) -> list[dict[str, Any]]:
    """The rows without their :data:`VOLATILE` fields (and ``ignore``), sorted by (scene, episode, arm): what
    two runs of the same plan must agree on for a deterministic policy.

    >>> comparable([{"scene": 1, "episode": 1, "wall_s": 0.3}, {"scene": 1, "episode": 0, "wall_s": 0.1}])
    [{'scene': 1, 'episode': 0}, {'scene': 1, 'episode': 1}]
    """
    drop = VOLATILE | frozenset(ignore)
    out = [{k: v for k, v in r.items() if k not in drop} for r in rows]
    return sorted(out, key=lambda r: (r["scene"], r["episode"], r.get("arm") or ""))


def markdown_table() -> str:
    """The row table of ``docs/eval.md``: one line per field (key, JSON type, kind, meaning)."""
    lines = ["| key | type | kind | meaning |", "|---|---|---|---|"]
    for name in _NAMES:
        meta = _FIELDS[name].metadata
        lines.append(f"| `{name}` | {meta['type']} | {meta['kind']} | {meta['meaning']} |")
    return "\n".join(lines)
