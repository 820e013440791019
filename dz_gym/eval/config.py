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
import re
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from dz_gym.cli_types import field_default
from dz_gym.envs import backends, droid
from dz_gym.eval.plan import is_url
from dz_gym.protocol.profiles import AUTO, SERVER_KINDS
from dz_gym.stats.comparison import ARMS
from dz_gym.transport import TransportConfig, validate_url

if TYPE_CHECKING:
    from dz_gym.eval.control import RunControl
    from dz_gym.eval.scene import EnvFactory
    from dz_gym.eval.shards.options import RayOptions

CONFIG_VERSION = 2  # 2: nested in sections; 1 (flat) still reads (migrate)
BACKENDS = backends.NAMES  # "auto" and every backend of dz_gym.envs.backends
EXTERNAL_POLICY = "external"  # the ``policy`` of a run against servers it did not start

_ARM_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_-]{0,15}")

LOG_CHOICES = ("wandb", "tensorboard")  # --log: the experiment trackers (dz_gym.eval.tracking)
LEGACY_MAX_EPISODES = 200  # --sequential's budget in runs saved before it defaulted to the design's cap
DEFAULT_ALPHA = 0.05  # --sequential: the test's type-I error
DEFAULT_MIN_DIFFERENCE = 0.2  # --sequential: the smallest difference in success rate the design is planned for
DEFAULT_POWER = 0.8  # --sequential: the design's power at that difference
DEFAULT_EPISODE_RETRIES = 2  # re-runs of an episode that ended by an infrastructure error
MAX_EPISODE_RETRIES = 10


def _result(default: Any = dataclasses.MISSING, **kwargs: Any) -> Any:
    """A field that changes what an episode does, and so its row: a resume refuses another value
    (:data:`RESULT_KEYS`, :func:`resume_conflicts`; the CLI marks its flag locked on ``--resume``)."""
    return dataclasses.field(default=default, metadata={"result": True}, **kwargs)


def _is_result(path: str) -> bool:
    section, name = path.split(".")
    return next(f for f in dataclasses.fields(ALL_SECTIONS[section]) if f.name == name).metadata.get("result", False)


def default_policy(backend: str) -> str:
    """The embedded server's default policy: the backend's (``reference`` on the embedded simulator, the only
    scenes it knows: their colours and camera calibration), else ``hold``."""
    from dz_gym.server.policies import BUILTIN_POLICIES

    policy = backends.traits(backend).embedded_policy
    return policy if policy in BUILTIN_POLICIES else "hold"


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _field_error(name: str, exc: Exception) -> ValueError:
    """``exc`` raised by the component that owns a rule, as a one-line error starting with ``name``."""
    text = str(exc).removeprefix("TransportConfig.")
    return ValueError(text if text.startswith(f"{name}:") else f"{name}: {text}")


@dataclasses.dataclass
class PlanSettings:
    """What is measured: the scenes, their episodes and seeds, the simulator (``config.plan``)."""

    scenes: list[int] = _result(default_factory=lambda: [1])
    episodes: int | None = None  # per scene; None: one per env
    num_envs: int = 8
    seed: int = _result(0)
    backend: str = _result("auto")
    max_steps: int = _result(droid.MAX_EPISODE_LENGTH)
    # [height, width] the embedded simulator renders its views at (None: its default, 180x320; a new run against
    # servers asking for other 16:9 views sets it from their handshake: dz_gym.envs.render_shape)
    render_shape: list[int] | None = _result(None)

    def __post_init__(self) -> None:
        if not isinstance(self.scenes, (list, tuple)) or not self.scenes:
            raise ValueError(f"scenes: expected a list of at least one scene id, got {self.scenes!r}")
        try:
            from dz_gym.envs.scenes import scene_key  # scenes 1-3 and named tasks' keys

            self.scenes = [scene_key(s) for s in self.scenes]
        except ValueError as exc:
            raise _field_error("scenes", exc) from None
        if len(set(self.scenes)) != len(self.scenes):
            raise ValueError(f"scenes: expected distinct scene ids, got {self.scenes}")
        for name in ("num_envs", "episodes", "max_steps"):  # episodes None: EvalConfig's default
            value = getattr(self, name)
            if (name != "episodes" or value is not None) and (not _is_int(value) or value < 1):
                raise ValueError(f"{name}: expected an integer >= 1, got {value!r}")
        if not _is_int(self.seed):
            raise ValueError(f"seed: expected an integer, got {self.seed!r}")
        self.backend = backends.resolve(self.backend)  # a one-line "backend: expected one of ..." if unknown
        if self.render_shape is not None:  # a size the renderer takes, for a backend that renders at a chosen size
            from dz_gym.envs.render_shape import check_render_shape

            self.render_shape = list(check_render_shape(self.render_shape, "render_shape"))
            traits = backends.traits(self.backend)
            if not traits.render_shape_kwarg:
                raise ValueError(f"render_shape: {traits.title} renders its own size (requests are resized to the "
                                 "server's); only the embedded simulator (--backend mujoco) takes it")  # fmt: skip


@dataclasses.dataclass
class PolicySettings:
    """Which policies answer: the servers or the embedded server's policy, per arm, and what each request asks
    of them (``config.policies``)."""

    servers: list[str] = dataclasses.field(default_factory=list)
    policy: str | None = _result(None)
    server_kind: str = _result(AUTO)  # the servers' profile (dz_gym.protocol.profiles); auto: from the handshake
    servers_b: list[str] = dataclasses.field(default_factory=list)  # A/B: arm B's servers (arm A: servers)
    policy_b: str | None = _result(None)  # A/B on the embedded servers: arm B's policy (arm A: policy)
    arm_specs: list[str] = _result(default_factory=list)  # K >= 2 named arms: "NAME=POLICY_OR_URL" (--arm)
    policy_seed: bool = _result(False)  # send a per-episode ``seed`` (derived from the episode's seed) in each request
    num_inference_steps: int | None = _result(None)  # send ``sampling_params: {num_inference_steps}`` in each request

    def __post_init__(self) -> None:
        self._check_arms()
        if not isinstance(self.policy_seed, bool):
            raise ValueError(f"policy_seed: expected true or false, got {self.policy_seed!r}")
        steps = self.num_inference_steps
        if steps is not None and (not _is_int(steps) or steps < 1):
            raise ValueError(f"num_inference_steps: expected an integer >= 1, got {steps!r}")
        if self.server_kind not in SERVER_KINDS:
            raise ValueError(f"server_kind: expected one of {', '.join(SERVER_KINDS)}, got {self.server_kind!r}")
        for name in ("servers", "servers_b"):
            setattr(self, name, list(getattr(self, name)))
            for url in getattr(self, name):
                try:
                    validate_url(url)
                except ValueError as exc:
                    raise _field_error(name, exc) from None
        if self.servers:
            if self.policy not in (None, EXTERNAL_POLICY):
                raise ValueError("policy: only for the embedded server; an external server serves its own policy, "
                                 f"got {self.policy!r}")  # fmt: skip
            self.policy = EXTERNAL_POLICY
        if self.servers_b:
            if not self.servers:
                raise ValueError("servers_b: an A/B run against external servers needs arm A's servers too (--server)")
            if self.policy_b not in (None, EXTERNAL_POLICY):
                raise ValueError("policy_b: only for the embedded servers; an external server serves its own policy, "
                                 f"got {self.policy_b!r}")  # fmt: skip
            self.policy_b = EXTERNAL_POLICY
        elif self.policy_b is not None and self.servers:
            raise ValueError(
                "policy_b: only for the embedded servers; with --server give arm B's servers with --server-b"
            )

    def _check_arms(self) -> None:
        """``--arm NAME=POLICY_OR_URL``: at least two, distinct short names, not mixed with the A/B flags."""
        if not isinstance(self.arm_specs, (list, tuple)):
            raise ValueError(f"arm_specs: expected a list of NAME=POLICY_OR_URL, got {self.arm_specs!r}")
        self.arm_specs = list(self.arm_specs)
        if not self.arm_specs:
            return
        names = []
        for spec in self.arm_specs:
            name, eq, value = str(spec).partition("=")
            if not eq or not value or not _ARM_NAME.fullmatch(name):
                raise ValueError(f"arm_specs: expected NAME=POLICY_OR_URL with NAME of 1-16 letters, digits, _ or - "
                                 f"(starting with a letter), got {spec!r}")  # fmt: skip
            if value.startswith(("ws://", "wss://")):
                try:
                    validate_url(value)
                except ValueError as exc:
                    raise _field_error("arm_specs", exc) from None
            names.append(name)
        if len(set(names)) != len(names):
            raise ValueError(f"arm_specs: expected distinct arm names, got {names}")
        if len(names) < 2:
            raise ValueError(f"arm_specs: expected at least 2 arms (--arm NAME=POLICY_OR_URL, repeated), got {names}")
        if self.servers or self.servers_b or self.policy_b is not None:
            raise ValueError("arm_specs: --arm names every arm's policy or server; not with --server, --server-b or "
                             "--policy-b")  # fmt: skip


@dataclasses.dataclass
class ScheduleSettings:
    """When requests are sent and their chunks applied: the chunk schedule (:mod:`dz_gym.chunks`, which checks
    these rules itself; ``config.schedule``)."""

    open_loop_horizon: int | None = _result(None)  # None: the actions the server's profile executes per chunk
    prefetch: int = _result(0)  # latency hiding (dz_gym.chunks): request when this many actions are left
    simulated_delay: int | None = _result(None)  # a fixed delay in steps instead of wall-clock latency
    # each chunk's delay in steps from its own measured round trip at control_hz (dz_gym.chunks.honest_delay)
    latency_honest: bool = _result(False)
    control_hz: float = _result(float(droid.CONTROL_HZ))  # the robot's control rate of a latency-honest run
    max_stale_steps: int | None = _result(None)  # rows past a chunk's window while its successor is late

    def __post_init__(self) -> None:
        # Types here; the ranges are the schedule's own rules (ChunkSchedule, below).
        for name in ("open_loop_horizon", "prefetch", "simulated_delay", "max_stale_steps"):
            value = getattr(self, name)
            if not _is_int(value) and not (value is None and name != "prefetch"):
                raise ValueError(f"{name}: expected an integer, got {value!r}")
        if not isinstance(self.latency_honest, bool):
            raise ValueError(f"latency_honest: expected true or false, got {self.latency_honest!r}")
        if self.latency_honest and self.simulated_delay is not None:
            raise ValueError("latency_honest: each chunk's delay is measured; pass --latency-honest or "
                             "--simulated-delay, not both")  # fmt: skip
        hz = self.control_hz
        if isinstance(hz, bool) or not isinstance(hz, (int, float)) or not 0 < hz < float("inf"):
            raise ValueError(f"control_hz: expected a control rate > 0 (Hz), got {hz!r}")
        from dz_gym.chunks import ChunkSchedule

        horizon = droid.DEFAULT_OPEN_LOOP_HORIZON if self.open_loop_horizon is None else self.open_loop_horizon
        ChunkSchedule(1, horizon, lambda: "", prefetch=self.prefetch, max_stale_steps=self.max_stale_steps,
                      simulated_delay=self.simulated_delay,
                      control_period_s=1.0 / self.control_hz if self.latency_honest else None)  # fmt: skip


@dataclasses.dataclass
class TransportSettings:
    """How requests travel, and what the servers can hold (``config.transport``); the bounds default to
    :class:`~dz_gym.transport.TransportConfig`'s, whose rules check them."""

    request_timeout: float = field_default(TransportConfig, "request_timeout")
    retry_server_errors: int = field_default(TransportConfig, "retry_server_errors")
    auth_env: str | None = None  # NAME of the environment variable holding the servers' API token
    # worker processes per pool (0: all in this process; None: TransportConfig's default, auto_processes)
    processes: int | None = field_default(TransportConfig, "processes")
    server_max_sessions: int = 64  # vLLM-Omni's resident session capacity (MAX_DREAMZERO_SESSIONS)
    server_idle_timeout: float = 30.0  # vLLM-Omni closes a connection idle this long; 0: the servers have none

    def __post_init__(self) -> None:
        # request_timeout, retry_server_errors and auth_env: TransportConfig's rules (EvalConfig.transport_config)
        if not _is_int(self.server_max_sessions) or self.server_max_sessions < 1:
            raise ValueError(f"server_max_sessions: expected an integer >= 1, got {self.server_max_sessions!r}")
        idle = self.server_idle_timeout
        if isinstance(idle, bool) or not isinstance(idle, (int, float)) or not idle >= 0:
            raise ValueError(f"server_idle_timeout: expected seconds >= 0 (0: the servers have none), got {idle!r}")
        if self.processes is not None and (not _is_int(self.processes) or self.processes < 0):
            raise ValueError(f"transport_processes: expected an integer >= 0 (0: every session in this process) or "
                             f"None (chosen from the envs and the cores), got {self.processes!r}")  # fmt: skip


@dataclasses.dataclass
class ErrorSettings:
    """What a run does about episodes that end by an infrastructure error (``config.errors``)."""

    max_errors: int | None = None  # None: 10 % of the planned episodes, at least 5
    # an episode that ended by an infrastructure error runs again from its reset on the same seed, this many times
    episode_retries: int = _result(DEFAULT_EPISODE_RETRIES)

    def __post_init__(self) -> None:
        if not _is_int(self.episode_retries) or not 0 <= self.episode_retries <= MAX_EPISODE_RETRIES:
            raise ValueError(f"episode_retries: expected an integer in [0, {MAX_EPISODE_RETRIES}], "
                             f"got {self.episode_retries!r}")  # fmt: skip
        if self.max_errors is not None and (not _is_int(self.max_errors) or self.max_errors < 0):
            raise ValueError(f"max_errors: expected an integer >= 0, got {self.max_errors!r}")


@dataclasses.dataclass
class StatsSettings:
    """The test a comparison of arms runs as its episodes come in (``config.stats``)."""

    sequential: bool = _result(False)  # A/B: stop as soon as the sequential test stops (dz_gym.stats.sequential)
    alpha: float = _result(DEFAULT_ALPHA)  # the sequential test's type-I error
    min_difference: float = _result(DEFAULT_MIN_DIFFERENCE)  # sequential: the difference the design looks for
    power: float = _result(DEFAULT_POWER)  # sequential: the design's power at min_difference
    max_episodes: int | None = _result(None)  # sequential: the most pairs (episodes per arm); None: the design's cap
    accept_lower_power: bool = _result(False)  # sequential: run a budget below the design's cap, at the power it has
    select_best: bool = _result(False)  # --arm: eliminate clearly worse arms as seeds come in (dz_gym.eval.race)

    def __post_init__(self) -> None:
        """Each setting in its range, and the sequential test's only with ``sequential`` (whether the run can
        run one, A/B or named arms, is EvalConfig's rule)."""
        for name in ("sequential", "select_best", "accept_lower_power"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name}: expected true or false, got {getattr(self, name)!r}")  # noqa: TRY004
        alpha = self.alpha
        if not isinstance(alpha, (int, float)) or isinstance(alpha, bool) or not 0.0 < alpha < 1.0:
            raise ValueError(f"alpha: expected a number in (0, 1), got {alpha!r}")
        if alpha != DEFAULT_ALPHA and not (self.sequential or self.select_best):
            raise ValueError("alpha: only with --sequential or --select-best (dz-gym-compare --alpha sets the "
                             "verdicts' level)")  # fmt: skip
        for name, default, low in (("min_difference", DEFAULT_MIN_DIFFERENCE, 0.0), ("power", DEFAULT_POWER, alpha)):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or isinstance(value, bool) or not low < value < 1.0:
                raise ValueError(f"{name}: expected a number in ({low:g}, 1), got {value!r}")
            if value != default and not self.sequential:
                raise ValueError(f"{name}: only with --sequential (it plans the sequential test)")
        if self.max_episodes is not None:
            if not self.sequential:
                raise ValueError("max_episodes: only with --sequential (--episodes sets the episodes of a fixed run)")
            if not _is_int(self.max_episodes) or self.max_episodes < 1:
                raise ValueError(f"max_episodes: expected an integer >= 1, got {self.max_episodes!r}")
        if self.accept_lower_power and not self.sequential:
            raise ValueError("accept_lower_power: only with --sequential (it accepts a budget below the design's cap)")

    def design(self):
        """The sequential test's :class:`~dz_gym.stats.design.SequentialDesign` (``min_difference``, ``power``,
        ``alpha``)."""
        from dz_gym.stats.design import SequentialDesign

        try:
            return SequentialDesign.plan(self.min_difference, alpha=self.alpha, power=self.power)
        except ValueError as exc:
            raise _field_error("min_difference", exc) from None


@dataclasses.dataclass
class OutputSettings:
    """What the run writes besides its rows and summary (``config.outputs``)."""

    video: bool = True
    report: bool = True  # write report.html into the run directory at the end (dz_gym.report)
    profile: bool = False  # time every stage of the hot path, write profile.json (dz_gym.profiling)
    log: list[str] = dataclasses.field(default_factory=list)  # experiment logging: "wandb", "tensorboard"
    log_project: str = "dz-gym"  # the W&B project of --log wandb

    def __post_init__(self) -> None:
        self.log = list(self.log)
        for choice in self.log:
            if choice not in LOG_CHOICES:
                raise ValueError(f"log: expected a list of {', '.join(LOG_CHOICES)}, got {choice!r}")
        if not isinstance(self.log_project, str) or not self.log_project:
            raise ValueError(f"log_project: expected a non-empty W&B project name, got {self.log_project!r}")


@dataclasses.dataclass
class ExecutionSettings:
    """How this process runs the plan (``config.execution``): none of it changes a row, none of it is saved in
    ``config.json`` (a resume takes it from its own flags or call), and configs that differ only here are equal.

    ``process_per_scene``: each scene in a ``dz-gym-eval`` child process (None: the backend's
    ``one_scene_per_process``); ``scene_processes``: at most this many at once (None: all); ``ray``: shards on
    Ray (:class:`~dz_gym.eval.shards.options.RayOptions`); ``serve_args``: extra ``dz-gym-serve`` arguments of the
    embedded servers; ``progress``: bars (None: on a TTY, else a line every 30 s); ``command``: what the summary
    records (None: this process's command line); ``argv``: the flags the scene processes repeat (None: made from
    ``serve_args`` and ``progress``); ``only_scenes``: this process runs these scenes only (a scene's child);
    ``env_factory``: builds each scene's env in this process, as ``env_factory(scene, config, **env_kwargs)``
    (:func:`~dz_gym.eval.scene.default_env_factory` when None; it cannot cross into another process);
    ``control``: the stop request and error budget (:class:`~dz_gym.eval.runner.RunControl`; None: a fresh one).
    """

    process_per_scene: bool | None = None
    scene_processes: int | None = None
    ray: RayOptions | None = None
    serve_args: list[str] = dataclasses.field(default_factory=list)
    progress: bool | None = False
    command: str | None = None
    argv: list[str] | None = None
    only_scenes: list[int] | None = None
    env_factory: EnvFactory | None = None
    env_kwargs: dict[str, Any] = dataclasses.field(default_factory=dict)
    control: RunControl | None = None

    def __post_init__(self) -> None:
        """What cannot cross into another process stays in this one."""
        if self.scene_processes is not None and (not _is_int(self.scene_processes) or self.scene_processes < 1):
            raise ValueError(f"scene_processes: expected an integer >= 1, got {self.scene_processes}")
        if self.process_per_scene and self.env_factory is not None:
            raise ValueError("process_per_scene: an env_factory cannot cross into a scene's process")
        if self.ray is not None and (self.env_factory is not None or self.only_scenes is not None):
            raise ValueError("ray: a sharded run builds its envs in its shards (no env_factory, only_scenes)")
        self.serve_args = list(self.serve_args)
        self.env_kwargs = dict(self.env_kwargs or {})


# The saved sections of EvalConfig, in order: attribute name -> its dataclass.
SECTIONS: dict[str, type] = {
    "plan": PlanSettings,
    "policies": PolicySettings,
    "schedule": ScheduleSettings,
    "transport": TransportSettings,
    "errors": ErrorSettings,
    "stats": StatsSettings,
    "outputs": OutputSettings,
}
# Every field's dotted path by its name (the names are distinct across the sections).
ALL_SECTIONS: dict[str, type] = {**SECTIONS, "execution": ExecutionSettings}  # the saved ones and how it runs
PATHS: dict[str, str] = {
    f.name: f"{name}.{f.name}" for name, cls in ALL_SECTIONS.items() for f in dataclasses.fields(cls)
}
DOTTED = frozenset(PATHS.values())
# The flat layout of version 1 (config.json before the sections; summary.json's "config" keeps it), in its order:
# each flat key and the dotted path it moved to.
FLAT_KEYS: dict[str, str] = {key: PATHS.get(key, "transport.processes") for key in (
    "scenes episodes num_envs seed backend servers policy open_loop_horizon server_kind prefetch simulated_delay "
    "latency_honest control_hz max_stale_steps max_steps render_shape max_errors request_timeout retry_server_errors "
    "episode_retries server_max_sessions server_idle_timeout auth_env transport_processes servers_b policy_b "
    "arm_specs select_best sequential alpha min_difference power max_episodes accept_lower_power policy_seed "
    "num_inference_steps video report profile log log_project"
).split()}  # fmt: skip


def _path(key: str) -> str:
    """The dotted path of a field given by its path, its name or its flat name of version 1."""
    return PATHS.get(key) or FLAT_KEYS.get(key) or key


def migrate(data: Mapping[str, Any]) -> dict[str, Any]:
    """A saved config in today's nested layout (:data:`CONFIG_VERSION`): a flat one of version 1 (or older,
    without a version) is moved key by key (:data:`FLAT_KEYS`); a sequential run saved before budgets were checked
    against the design keeps the budget it ran with. Pure: ``data`` is not changed. Unknown keys and newer
    versions are one-line errors.

    >>> migrate({"scenes": [2], "transport_processes": 0, "version": 1})
    {'plan': {'scenes': [2]}, 'transport': {'processes': 0}, 'version': 2}
    """
    version = data.get("version", 1)
    if version not in (1, CONFIG_VERSION):
        raise ValueError(f"config.json: version {version!r} is not supported (expected {CONFIG_VERSION})")
    if version == CONFIG_VERSION:
        unknown = sorted(set(data) - set(SECTIONS) - {"version"})
        unknown += sorted(
            f"{s}.{k}"
            for s in SECTIONS
            for k in set(data.get(s) or {}) - {f.name for f in dataclasses.fields(SECTIONS[s])}
        )
        nested = {s: dict(data[s]) for s in SECTIONS if s in data}
    else:
        unknown = sorted(set(data) - set(FLAT_KEYS) - {"version"})
        nested = {}
        for key, value in data.items():
            if key in FLAT_KEYS:
                section, name = FLAT_KEYS[key].split(".")
                nested.setdefault(section, {})[name] = value
    if unknown:
        raise ValueError(f"config.json: unknown keys {unknown} (written by a newer dz-gym?)")
    stats = nested.get("stats", {})
    if stats.get("sequential") and "accept_lower_power" not in stats:
        # Saved before budgets were checked against the design: the run keeps the budget it ran with.
        stats.update(accept_lower_power=True, max_episodes=stats.get("max_episodes") or LEGACY_MAX_EPISODES)
    return {**nested, "version": CONFIG_VERSION}


def flat_layout(data: Mapping[str, Any]) -> dict[str, Any]:
    """A saved config (either layout) in the flat layout of version 1 (:data:`FLAT_KEYS`): what ``summary.json``'s
    ``config`` holds and the report reads. Pure; keys it does not know are left out.

    >>> flat_layout({"plan": {"scenes": [2]}, "transport": {"processes": 0}, "version": 2})
    {'scenes': [2], 'transport_processes': 0, 'version': 1}
    """
    if data.get("version", 1) == 1:
        return dict(data)
    out = {}
    for key, path in FLAT_KEYS.items():
        section, name = path.split(".")
        if isinstance(data.get(section), Mapping) and name in data[section]:
            out[key] = data[section][name]
    return {**out, "version": 1}


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
                section, name = _path(key).split(".")
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
        section, _, name = _path(path).partition(".")
        return field_default(ALL_SECTIONS[section], name)

    def get(self, path: str) -> Any:
        """The value of field ``path`` (dotted, or its name).

        >>> EvalConfig(num_envs=2, backend="mujoco").get("plan.num_envs")
        2
        """
        section, _, name = _path(path).partition(".")
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
            raise _field_error(name, exc) from None

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


# Settings that change what an episode does, and so its row (the fields declared with ``_result``), dotted.
RESULT_KEYS = tuple(path for path in PATHS.values() if _is_result(path))


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
