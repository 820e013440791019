"""The sections of an evaluation run's settings (``config.plan``, ``config.policies`` ...): one small dataclass
each, every field with its default and its own checks there and only there (:mod:`dz_gym.eval.config`'s
:class:`~dz_gym.eval.config.EvalConfig` holds one of each and the rules that span them).

The field names are distinct across the sections, so a field has one dotted path (``schedule.prefetch``) and
one name (``prefetch``): :data:`PATHS`. A field marked a *result* (:data:`RESULT_KEYS`) changes what the
episodes measure, so a resumed run may not change it. ``execution`` says how this process runs the plan and is
neither saved nor compared.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from dz_gym.cli_types import field_default
from dz_gym.envs import backends, droid
from dz_gym.protocol.profiles import AUTO, SERVER_KINDS
from dz_gym.transport import TransportConfig, validate_url

if TYPE_CHECKING:
    from dz_gym.eval.control import RunControl
    from dz_gym.eval.shards.options import RayOptions

EnvFactory = Callable[..., Any]  # (scene, config, **env_kwargs) -> batched env
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


def field_error(name: str, exc: Exception) -> ValueError:
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
            raise field_error("scenes", exc) from None
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
                    raise field_error(name, exc) from None
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
                    raise field_error("arm_specs", exc) from None
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
            raise field_error("min_difference", exc) from None


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
    ``control``: the stop request and error budget (:class:`~dz_gym.eval.control.RunControl`; None: a fresh one).
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
ALL_SECTIONS: dict[str, type] = {**SECTIONS, "execution": ExecutionSettings}  # the saved ones and how it runs
# Every field's dotted path by its name (the names are distinct across the sections).
PATHS: dict[str, str] = {
    f.name: f"{name}.{f.name}" for name, cls in ALL_SECTIONS.items() for f in dataclasses.fields(cls)
}
DOTTED = frozenset(PATHS.values())
# Settings that change what an episode does, and so its row (the fields declared with ``_result``), dotted.
RESULT_KEYS = tuple(path for path in PATHS.values() if _is_result(path))
