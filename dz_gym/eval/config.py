"""What an evaluation run is (``EvalConfig``): the one source of its defaults and of its validation.

The settings sit in sections (:data:`SECTIONS`: ``plan``, ``policies``, ``schedule``, ``transport``, ``errors``,
``stats``, ``outputs``), small dataclasses whose field names are distinct, so a field has one dotted path
(``schedule.prefetch``) and one name (``prefetch``). Rules that span sections (an A/B run's even env count, the
sequential budget) are :class:`EvalConfig`'s. The command line (``dz-gym-eval``, its flags declared in
:mod:`dz_gym.eval.flag_table`, each naming its dotted field), its ``--help`` and ``docs/eval.md`` take every
default from the sections' fields (:meth:`EvalConfig.default`); the
transport's bounds (``request_timeout``, ``retry_server_errors``) default to
:class:`~dz_gym.transport.TransportConfig`'s, and the chunk-schedule rules (``prefetch``, ``max_stale_steps``,
``simulated_delay``) are checked by :class:`~dz_gym.chunks.ChunkSchedule` itself, so each rule lives in one
place. Every error is one line that starts with the field's name.

The config is saved as ``config.json`` in the run directory, nested by section (:data:`CONFIG_VERSION`); a
file of the flat layout that dz-gym wrote before the sections reads as well (:func:`migrate`), and
``summary.json`` keeps that flat layout (:func:`flat_layout`). ``--resume`` reloads it; a resumed run may
change how the work is done (``num_envs``, the servers' addresses, videos, timeouts, retries, progress) but
not what is measured. :data:`RESULT_KEYS` lists the settings that change the episodes' outcomes;
:func:`resume_conflicts` names every one that differs. ``episodes`` may grow on resume (the extra episodes get
the next seeds), never shrink, in a sequential run never change the test's budget of pairs, and in a fixed-n
comparison (A/B or arms without a race) not grow either: every setting that shapes the test (its design,
``max_episodes``, ``accept_lower_power``, the budget, a fixed comparison's n) is fixed when it starts.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from dz_gym.cli_types import field_default
from dz_gym.eval.plan import is_url
from dz_gym.eval.saved_config import CONFIG_VERSION, FLAT_KEYS, dotted_path, flat_layout, migrate
from dz_gym.eval.sections import (
    ALL_SECTIONS,
    DOTTED,
    EXTERNAL_POLICY,
    PATHS,
    RESULT_KEYS,
    SECTIONS,
    EnvFactory,
    ErrorSettings,
    ExecutionSettings,
    OutputSettings,
    PlanSettings,
    PolicySettings,
    ScheduleSettings,
    StatsSettings,
    TransportSettings,
    default_policy,
    field_error,
)
from dz_gym.stats.comparison import ARMS
from dz_gym.transport import TransportConfig

# What other modules read from here (the sections and the saved layout are their own modules' jobs).
__all__ = ["CONFIG_VERSION", "FLAT_KEYS", "PATHS", "RESULT_KEYS", "SECTIONS", "EnvFactory", "EvalConfig",
           "default_policy", "flat_layout", "migrate", "resume_conflicts"]  # fmt: skip


@dataclasses.dataclass(init=False)
class EvalConfig:
    """One evaluation run (see ``docs/eval.md``): its settings in sections (:data:`SECTIONS`), every field with
    its default there and only there; the flags of ``dz-gym-eval`` set the dotted fields (``--prefetch`` sets
    ``schedule.prefetch``, :mod:`dz_gym.eval.flag_table`).

    The sections: ``plan`` (what is measured: scenes, episodes, envs, seeds, backend, steps, render size),
    ``policies`` (which policies answer, per arm, and what each request asks of them), ``schedule`` (the chunk
    schedule), ``transport`` (the bounds on a request, the worker processes, the servers' capacity), ``errors``
    (infrastructure errors: the budget, the retries), ``stats`` (the test of a comparison) and ``outputs``
    (videos, report, profile, trackers). Each is passed as its dataclass or a mapping of its fields; a field may
    also be passed by its dotted path or its own name (unique over the sections; the flat names of version 1 too):
    ``EvalConfig(num_envs=4)`` and ``EvalConfig(**{"plan.num_envs": 4})`` are
    ``EvalConfig(plan={"num_envs": 4})``.

    ``policies.servers`` empty means the embedded reference server, ``policies.policy`` names its policy (default:
    reference on the embedded simulator, hold on Isaac Lab); with servers the policy is ``"external"``.
    ``plan.episodes`` defaults to one per env, ``plan.backend="auto"`` resolves to isaac when Isaac Lab is
    importable, else mujoco (the saved config holds the resolved values). Episode ``k`` of a scene has seed
    ``seed + k`` and runs on env slot ``k % num_envs``.

    >>> config = EvalConfig(num_envs=4, backend="mujoco")
    >>> config.plan.scenes, config.plan.episodes, config.policies.policy, config.transport.request_timeout
    ([1], 4, 'reference', 600.0)
    >>> EvalConfig(schedule={"prefetch": 8})
    Traceback (most recent call last):
    ValueError: prefetch: expected an integer in [0, 8), got 8
    """

    plan: PlanSettings
    policies: PolicySettings
    schedule: ScheduleSettings
    transport: TransportSettings
    errors: ErrorSettings
    stats: StatsSettings
    outputs: OutputSettings
    execution: ExecutionSettings = dataclasses.field(compare=False, repr=False)
    version: int = CONFIG_VERSION

    def __init__(self, version: int = CONFIG_VERSION, **values: Any) -> None:
        given: dict[str, dict[str, Any]] = {name: {} for name in ALL_SECTIONS}
        for key, value in sorted(values.items(), key=lambda item: item[0] not in ALL_SECTIONS):  # sections, then fields
            if key in ALL_SECTIONS:  # a mapping, or the section's dataclass (shallow: a control stays itself)
                fields = dataclasses.fields(value) if dataclasses.is_dataclass(value) else ()
                given[key].update(
                    value if isinstance(value, Mapping) else {f.name: getattr(value, f.name) for f in fields}
                )
            elif key in PATHS or key in FLAT_KEYS or key in DOTTED:
                section, name = dotted_path(key).split(".")
                given[section][name] = value
            else:
                raise TypeError(f"EvalConfig: unexpected field {key!r}")
        for name, cls in ALL_SECTIONS.items():
            try:
                setattr(self, name, cls(**given[name]))
            except TypeError as exc:
                raise TypeError(f"EvalConfig.{name}: {exc}") from None
        self.version = version
        self.__post_init__()

    @classmethod
    def default(cls, path: str) -> Any:
        """The default of field ``path`` (dotted, e.g. ``"schedule.prefetch"``, or its name): what ``--help`` and
        the docs show."""
        section, _, name = dotted_path(path).partition(".")
        return field_default(ALL_SECTIONS[section], name)

    def get(self, path: str) -> Any:
        """The value of field ``path`` (dotted, or its name).

        >>> EvalConfig(num_envs=2, backend="mujoco").get("plan.num_envs")
        2
        """
        section, _, name = dotted_path(path).partition(".")
        return getattr(getattr(self, section), name)

    def __post_init__(self) -> None:
        """The rules that span sections (each section checked its own fields as it was made)."""
        plan, policies, stats = self.plan, self.policies, self.stats
        arms = len(self.arms)
        if policies.arm_specs and plan.num_envs % arms:
            raise ValueError(f"num_envs: a run of {arms} arms needs a multiple of {arms} envs "
                             f"(slot {arms}j+i runs arm i), got {plan.num_envs}")  # fmt: skip
        if stats.sequential and policies.arm_specs:
            raise ValueError(
                "sequential: only for A/B runs (--server-b/--policy-b); with --arm the summary ranks the arms"
            )
        if stats.sequential and not self.ab:
            raise ValueError("sequential: only for A/B runs (give arm B with --server-b URL or --policy-b NAME)")
        if stats.select_best and not policies.arm_specs:
            raise ValueError("select_best: only for runs of named arms (give the arms with --arm NAME=POLICY_OR_URL)")
        if self.ab and (plan.num_envs < 2 or plan.num_envs % 2):
            raise ValueError("num_envs: an A/B run needs an even number of envs (slot 2j runs arm A, 2j+1 arm B), "
                             f"got {plan.num_envs}")  # fmt: skip
        if plan.episodes is None:
            plan.episodes = self._default_episodes()
        self._check_budget()
        if policies.policy is None:
            policies.policy = default_policy(plan.backend)
        self.transport_config()

    @property
    def ab(self) -> bool:
        """Whether this is an A/B run: every seed runs under arm A and arm B (``docs/eval.md``)."""
        return bool(self.policies.servers_b) or self.policies.policy_b is not None

    @property
    def arms(self) -> tuple[str, ...]:
        """``("a", "b")`` for an A/B run, the names of ``--arm`` in order, else ``()``."""
        if self.policies.arm_specs:
            return tuple(name for name, _ in self.arm_table())
        return ARMS if self.ab else ()

    @property
    def armed(self) -> bool:
        """Whether every seed runs under several arms, side by side in one batch (A/B or ``--arm``)."""
        return bool(self.arms)

    def retries_assumption(self) -> dict[str, Any] | None:
        """What ``--episode-retries`` assumes, for ``summary.json`` and the run's first lines (None without
        retries): a retry stands in for the errored attempt only if the episode is reproducible from its seed."""
        if not self.errors.episode_retries:
            return None
        if self.policies.policy_seed:
            how = ("--policy-seed sends each episode's policy seed (the same for every attempt of a scene and seed); "
                   "a server that ignores it draws fresh noise per attempt")  # fmt: skip
        else:
            how = ("no --policy-seed: a server whose policy samples draws fresh noise per attempt, so a retried "
                   "episode is a new draw and errors that depend on outcomes are not fully bounded")  # fmt: skip
        return {
            "episode_retries": self.errors.episode_retries,
            "policy_seed": self.policies.policy_seed,
            "assumes": "an errored episode re-run on its seed reproduces the attempt it replaces (deterministic "
            f"simulator and policy, or a policy seeded per episode); {how}",
        }

    def arm_table(self) -> list[tuple[str, str]]:
        """``(name, policy spec or server URL)`` per ``--arm``, in order.

        >>> EvalConfig(num_envs=2, backend="mujoco", arm_specs=["x=reference", "y=ws://127.0.0.1:1"]).arm_table()
        [('x', 'reference'), ('y', 'ws://127.0.0.1:1')]
        """
        return [tuple(spec.split("=", 1)) for spec in self.policies.arm_specs]  # type: ignore[misc]

    def arm_policies(self) -> dict[str | None, str]:
        """The policy each arm's rows name (key None: a run without arms): the embedded server's policy spec, or
        ``external`` for servers the run did not start (a URL is where the policy runs, and may change on resume).

        >>> EvalConfig(num_envs=2, backend="mujoco", arm_specs=["x=reference", "y=ws://127.0.0.1:1"]).arm_policies()
        {'x': 'reference', 'y': 'external'}
        >>> EvalConfig(num_envs=2, backend="mujoco", policy_b="reference:skill=0.3").arm_policies()
        {'a': 'reference', 'b': 'reference:skill=0.3'}
        """
        if self.policies.arm_specs:
            return {name: EXTERNAL_POLICY if is_url(value) else value for name, value in self.arm_table()}
        if self.ab:
            return {"a": str(self.policies.policy), "b": str(self.policies.policy_b)}
        return {None: str(self.policies.policy)}

    def sequential_design(self):
        """The sequential test's :class:`~dz_gym.stats.design.SequentialDesign` (:meth:`StatsSettings.design`)."""
        return self.stats.design()

    @property
    def sequential_max_pairs(self) -> int:
        """The most pairs the sequential test may use: ``max_episodes``, or the design's cap."""
        return self.stats.max_episodes if self.stats.max_episodes is not None else self.sequential_design().max_pairs

    @property
    def sequential_budget(self) -> int:
        """The pairs the run can give the sequential test: :attr:`sequential_max_pairs`, or the planned pairs
        (``episodes`` per scene times the scenes) when fewer."""
        return min(self.sequential_max_pairs, self.plan.episodes * len(self.plan.scenes))

    def _check_budget(self) -> None:
        """With ``sequential``, a budget below the design's cap would silently lose power: refused unless
        ``accept_lower_power`` (then the summary, the report and the table give the power it has)."""
        if not self.stats.sequential:
            return
        design, budget = self.sequential_design(), self.sequential_budget
        if budget >= design.max_pairs or self.stats.accept_lower_power:
            return
        cap = design.max_pairs
        if self.sequential_max_pairs < cap:
            name, what, fix = (
                "max_episodes",
                f"--max-episodes {self.stats.max_episodes}",
                f"--max-episodes {cap} or more",
            )
        else:
            name, what = "episodes", f"--episodes {self.plan.episodes} x {len(self.plan.scenes)} scene(s)"
            fix = f"--episodes {-(-cap // len(self.plan.scenes))} or more (or leave it out)"
        raise ValueError(
            f"{name}: {what} gives the sequential test {budget} pairs, below the design's cap of {cap} pairs "
            f"(--min-difference {self.stats.min_difference:g}, --power {self.stats.power:g}): its power there is "
            f"{design.power_at(budget):.3f}, not {self.stats.power:g}; expected {fix}, or --accept-lower-power to run "
            "at that power"
        )

    def _default_episodes(self) -> int:
        """Episodes per scene (per arm) when not given: one per env (pair of envs in an A/B run); with
        ``sequential``, enough for the test's cap spread over the scenes."""
        if self.stats.sequential:
            return -(-self.sequential_max_pairs // len(self.plan.scenes))
        return self.plan.num_envs // max(1, len(self.arms))

    @property
    def latency_honest_hz(self) -> float | None:
        """The control rate of a latency-honest run (the wrapper's ``latency_honest_hz``), else None."""
        return float(self.schedule.control_hz) if self.schedule.latency_honest else None

    def transport_process_count(self) -> int:
        """The worker processes each connection pool spreads its sessions over
        (:meth:`TransportConfig.process_count <dz_gym.transport.config.TransportConfig.process_count>` of one
        pool's sessions, the pools sharing this machine's cores: an A/B or ``--arm`` run has one pool per arm).
        On a Ray shard ``num_envs`` is the shard's, so each shard sizes its own.

        >>> EvalConfig(num_envs=8, backend="mujoco").transport_process_count()
        0
        >>> EvalConfig(num_envs=1024, backend="mujoco", transport_processes=3).transport_process_count()
        3
        """
        pools = max(1, len(self.arms))
        return self.transport_config().process_count(self.plan.num_envs // pools, pools=pools)

    def transport_config(self) -> TransportConfig:
        """The :class:`TransportConfig` of every connection of the run (its own rules validate the values)."""
        fields = {
            "request_timeout": self.transport.request_timeout,
            "retry_server_errors": self.transport.retry_server_errors,
            "auth_env": self.transport.auth_env,
            "processes": self.transport.processes,
        }
        try:
            return TransportConfig(**fields)
        except ValueError as exc:
            name = next((k for k in fields if k in str(exc)), "transport")
            raise field_error(name, exc) from None

    @property
    def error_budget(self) -> int:
        """Errored episodes tolerated before the run aborts (default: 10 % of the planned, at least 5)."""
        if self.errors.max_errors is not None:
            return self.errors.max_errors
        return max(5, (self.plan.episodes * len(self.plan.scenes) * max(1, len(self.arms))) // 10)

    def envs_per_server(self) -> int:
        """Envs sharing the busiest server (slot ``i`` uses server ``i % len(servers)``; one embedded server;
        in an A/B run each arm's half of the envs shares that arm's servers)."""
        if self.policies.arm_specs:
            return self.plan.num_envs // len(self.arms)  # one server per arm (its URL, or its embedded server)
        if self.ab:
            half = self.plan.num_envs // 2
            return max(-(-half // max(1, len(self.policies.servers))), -(-half // max(1, len(self.policies.servers_b))))
        return -(-self.plan.num_envs // max(1, len(self.policies.servers)))

    def to_dict(self) -> dict[str, Any]:
        """The nested layout ``config.json`` holds (:data:`CONFIG_VERSION`); :meth:`from_dict` reads it back."""
        return {name: dataclasses.asdict(getattr(self, name)) for name in SECTIONS} | {"version": self.version}

    def to_flat_dict(self) -> dict[str, Any]:
        """The flat layout of version 1 (:data:`FLAT_KEYS`), which ``summary.json``'s ``config`` and the
        experiment trackers keep; :meth:`from_dict` reads it too."""
        return flat_layout(self.to_dict())

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> EvalConfig:
        """Rebuild a config saved by :meth:`to_dict`, or by an earlier dz-gym (:func:`migrate`); unknown keys are
        an error (a newer format)."""
        return cls(**migrate(data))


def resume_conflicts(saved: EvalConfig, wanted: EvalConfig) -> list[str]:
    """One line per result-changing setting of ``wanted`` that differs from ``saved`` (fewer episodes; more for a fixed-n comparison)."""
    lines = []
    for path in RESULT_KEYS:
        if wanted.get(path) != saved.get(path):
            lines.append(f"{path.split('.')[-1]}: the run used {saved.get(path)!r}, got {wanted.get(path)!r}")
    if bool(wanted.ab) != bool(saved.ab):
        lines.append(f"A/B: the run {'was' if saved.ab else 'was not'} an A/B run (--server-b/--policy-b)")
    if wanted.plan.episodes < saved.plan.episodes:
        lines.append(
            f"episodes: the run planned {saved.plan.episodes} per scene; a resume may add episodes, not remove them"
        )
    elif saved.stats.sequential and wanted.stats.sequential and wanted.sequential_budget != saved.sequential_budget:
        # The test's budget shapes its final look: raising it after the run stopped undecided there (or after
        # looking at it) spends alpha again; it is fixed when the run starts.
        lines.append(
            f"episodes: --episodes {wanted.plan.episodes} gives the sequential test {wanted.sequential_budget} pairs, the "
            f"run planned {saved.sequential_budget}; a sequential run's budget is fixed when it starts"
        )
    elif (
        wanted.plan.episodes > saved.plan.episodes
        and (saved.ab or saved.armed)
        and not (saved.stats.sequential or saved.stats.select_best)
    ):
        # A fixed-n comparison's level holds for the n chosen before any outcome was seen: growing it after a
        # look is optional stopping. (A sequential test and a race are valid at any stop.)
        lines.append(
            f"episodes: a fixed-n comparison's pairs are fixed when it starts (the run planned {saved.plan.episodes} per "
            "scene; growing them after a look is optional stopping): start a new run, or use --sequential"
        )
    return lines
