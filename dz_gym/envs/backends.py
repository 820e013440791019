"""The simulator backends and their traits: what a run, a shard and the CLI need to know about each one.

Everything that differs between the embedded MuJoCo simulator and Isaac Lab outside the env itself is a
field of :class:`BackendTraits` here, so the evaluator asks the registry (``traits(config.backend)``) instead
of branching on the backend's name. A new backend is one more entry in :data:`REGISTRY` (and its package
under ``dz_gym/envs/``). Nothing here imports a simulator: the factory and the app launcher are named as
``module:function`` and imported on use.

>>> traits("mujoco").embedded_policy, traits("isaac").embedded_policy
('reference', 'hold')
>>> traits("isaac").shard_gpus, traits("mujoco").shard_gpus
(1.0, None)
>>> traits("vulkan")
Traceback (most recent call last):
ValueError: backend: expected one of auto, isaac, mujoco, got 'vulkan'
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
from collections.abc import Mapping
from typing import Any

from dz_gym.envs.devices import MAX_RENDER_GPUS

AUTO = "auto"


@dataclasses.dataclass(frozen=True)
class BackendTraits:
    """One backend's facts (see the module docstring); ``name`` is what ``--backend`` takes.

    - ``title``: the name messages use; ``package``, ``missing``: the module that must be importable, and the one-line hint when it is not;
    - ``factory``: ``module:function`` that builds the batched env (``scene``, ``num_envs``, keyword arguments);
    - ``config_kwargs``: env keyword arguments taken from run settings (keyword -> ``EvalConfig`` field);
    - ``embedded_policy``: the embedded server's default policy (``reference`` only knows the embedded
      scenes' colours and camera calibration; elsewhere ``hold``);
    - ``one_scene_per_process``: the simulator cannot build a second scene in a process (Isaac Sim runs
      once per process), so each scene gets a fresh process (or Ray actor) by default;
    - ``app_launcher``: ``module:function`` that starts the simulator app in a process before any other
      simulator import, given the launcher flags (``app_args``); empty when there is no app;
    - ``shard_gpus``: GPUs one Ray shard asks for by default; > 0 also means one shard per ``shard_gpus``
      GPUs by default; None: a share of its node's GPUs where every node has some (the shards of a node
      spread evenly over its GPUs, one shard per GPU at least), else none;
    - ``max_shard_gpus``: the most GPUs one shard can use (MuJoCo renders on one), None: no limit;
    - ``device_option``: the launcher flag and env keyword naming the simulator's torch device
      (``--device cuda:k``), which a shard given a GPU points at it; empty when the backend has none;
    - ``shard_cpus``: CPUs one Ray shard asks for; None: one per env slot, at most its share of a node;
    - ``worker_processes``: a shard steps its envs in worker processes, one per CPU it was given;
    - ``render_shape_kwarg``: the env keyword that sets the size its views render at (``--render-shape``);
      empty when the backend renders its own size, which requests are resized from;
    - ``renderer_probe``: ``module:function`` -> dict saying who draws the views in this process (a run's
      provenance); nothing is imported that the run has not imported.
    """

    name: str
    title: str  # for messages ("Isaac Lab")
    package: str
    missing: str
    factory: str
    config_kwargs: Mapping[str, str] = dataclasses.field(default_factory=dict)
    embedded_policy: str = "hold"
    one_scene_per_process: bool = False
    app_launcher: str = ""
    shard_gpus: float | None = 0.0
    max_shard_gpus: float | None = None
    device_option: str = ""
    shard_cpus: float | None = None
    worker_processes: bool = False
    named_tasks: bool = False  # runs sim-evals' named tasks beyond the DROID scenes (MILA, keys 101+)
    can_start: str = ""  # ``module:function`` -> bool, stricter than ``package`` importable (nothing imported)
    render_shape_kwarg: str = ""
    renderer_probe: str = ""

    @property
    def starts_app(self) -> bool:
        """Whether a process must start the simulator app (with the launcher flags) before building envs."""
        return bool(self.app_launcher)

    def make_env(self, scene: int | str, num_envs: int, **kwargs: Any):
        """The batched env of ``scene`` with ``num_envs`` envs (imports the backend now)."""
        return _load(self.factory)(scene=scene, num_envs=num_envs, **kwargs)

    def renderer(self) -> dict[str, Any]:
        """Who draws this backend's views in this process (``renderer_probe``), with the backend's name."""
        found = dict(_load(self.renderer_probe)()) if self.renderer_probe else {}
        return {"simulator": self.name, **found}

    def start_app(self, app_args: Any = None) -> None:
        """Start the simulator app in this process (a no-op for backends without one)."""
        if self.app_launcher:
            _load(self.app_launcher)(app_args)

    def shard_count(self, num_envs: int, *, nodes: int, gpus: float, shard_gpus: float | None = None) -> int:
        """Default Ray shards, at most one per env slot: one per ``shard_gpus`` GPUs (default: the backend's)
        when that is > 0; for a backend that shares GPUs (``shard_gpus`` None), one per GPU and at least one
        per node; else one per node."""
        each = self.shard_gpus if shard_gpus is None else shard_gpus
        if each is not None and each > 0:
            want = int(gpus // each + 1e-9)
            if want < 1:
                text = "one GPU" if each == 1 else f"{each:g} GPUs"
                raise ValueError(
                    f"shards: the {self.name} backend needs {text} per shard and the Ray cluster reports {gpus:g} GPUs"
                )
        elif each is None:
            want = max(int(nodes), int(gpus))
        else:
            want = int(nodes)
        return max(1, min(want, int(num_envs)))

    def check_shard_gpus(self, shard_gpus: float) -> None:
        """ValueError naming ``shard_gpus`` when one shard of this backend cannot use that many GPUs."""
        if self.max_shard_gpus is not None and shard_gpus > self.max_shard_gpus:
            raise ValueError(
                f"shard_gpus: {self.title} uses at most {self.max_shard_gpus:g} GPU per shard, got {shard_gpus:g}"
            )

    def available(self) -> bool:
        """Whether the backend's package can be imported here, and ``can_start`` says yes (nothing is imported)."""
        try:
            found = importlib.util.find_spec(self.package) is not None
        except (ImportError, ValueError):
            return False
        return found and (not self.can_start or bool(_load(self.can_start)()))


def _load(target: str):
    module, _, function = target.partition(":")
    return getattr(importlib.import_module(module), function)


REGISTRY: dict[str, BackendTraits] = {
    t.name: t
    for t in (
        BackendTraits(
            name="isaac",
            title="Isaac Lab",
            package="isaaclab",
            missing="Isaac Lab is not importable here with Isaac Sim or its kit-less stack (see docs/isaac.md), or use --backend mujoco",
            factory="dz_gym.envs.isaac:make_env",
            config_kwargs={"seed": "seed", "max_episode_length": "max_steps"},
            embedded_policy="hold",
            one_scene_per_process=True,
            app_launcher="dz_gym.envs.isaac.launch:launch_app",
            can_start="dz_gym.envs.isaac.checks:isaac_can_start",  # an isaaclab wheel alone cannot start
            shard_gpus=1.0,
            device_option="device",
            shard_cpus=1.0,
            named_tasks=True,
            renderer_probe="dz_gym.envs.isaac.checks:renderer_in_process",
        ),
        BackendTraits(
            name="mujoco",
            title="the embedded MuJoCo simulator",
            package="mujoco",
            missing="the mujoco package is not installed (pip install mujoco)",
            factory="dz_gym.envs.mujoco:make_env",
            config_kwargs={"seed": "seed", "max_episode_length": "max_steps"},
            embedded_policy="reference",
            shard_gpus=None,
            max_shard_gpus=MAX_RENDER_GPUS,
            worker_processes=True,
            render_shape_kwarg="image_shape",
            renderer_probe="dz_gym.envs.mujoco.gl:rendering_device",
        ),
    )
}
# ``--backend auto`` prefers the first available of these; the last is the fallback.
AUTO_ORDER = ("isaac", "mujoco")
NAMES = (AUTO, *sorted(REGISTRY))


def traits(name: str) -> BackendTraits:
    """The traits of backend ``name`` (not ``auto``: resolve it first); a one-line error naming the field."""
    try:
        return REGISTRY[name]
    except (KeyError, TypeError):
        raise ValueError(f"backend: expected one of {', '.join(NAMES)}, got {name!r}") from None


def resolve(name: str) -> str:
    """``name``, or for ``auto`` the first backend of :data:`AUTO_ORDER` whose package is importable."""
    if name != AUTO:
        return traits(name).name
    return next((n for n in AUTO_ORDER[:-1] if REGISTRY[n].available()), AUTO_ORDER[-1])


def auto_reason(resolved: str) -> str:
    """Why ``auto`` chose ``resolved`` (one clause, for the CLI's first line)."""
    if resolved == AUTO_ORDER[0]:
        return f"{REGISTRY[resolved].title} is importable"
    skipped = ", ".join(REGISTRY[n].title for n in AUTO_ORDER[: AUTO_ORDER.index(resolved)])
    return f"{skipped} is not importable"


def per_backend(describe) -> str:
    """``describe(traits)`` for every backend, for a flag's shown default: ``"hold for isaac, reference for mujoco"``."""
    return ", ".join(f"{describe(t)} for {name}" for name, t in sorted(REGISTRY.items()))
