"""What an evaluation run is (``EvalConfig``), and which of its settings change results.

The config is saved as ``config.json`` in the run directory. ``--resume`` reloads it; a resumed run may
change how the work is done (``num_envs``, the servers' addresses, videos, timeouts, progress) but not what is
measured. :data:`RESULT_KEYS` lists the settings that change the episodes' outcomes; :func:`resume_conflicts`
names every one that differs. ``episodes`` may grow on resume (the extra episodes get the next seeds), never
shrink.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from dz_gym.envs import droid

CONFIG_VERSION = 1

# Settings that change what an episode does, and so its row: refuse to resume with other values.
RESULT_KEYS = (
    "backend", "scenes", "seed", "max_steps", "open_loop_horizon", "policy",
    "prefetch", "simulated_delay", "max_stale_steps",
)


@dataclasses.dataclass
class EvalConfig:
    """One evaluation run (see ``docs/eval.md``).

    ``servers`` empty means the embedded reference server (``policy`` names its policy); otherwise
    ``policy`` is ``"external"``. Episode ``k`` of a scene has seed ``seed + k`` and runs on env slot
    ``k % num_envs``.
    """

    scenes: list[int]
    episodes: int
    num_envs: int
    seed: int = 0
    backend: str = "mujoco"
    servers: list[str] = dataclasses.field(default_factory=list)
    policy: str = "external"
    open_loop_horizon: int = droid.DEFAULT_OPEN_LOOP_HORIZON
    prefetch: int = 0  # latency hiding (dz_gym.chunks): request when this many actions are left
    simulated_delay: int | None = None  # a fixed delay in steps instead of wall-clock latency
    max_stale_steps: int | None = None  # rows past a chunk's window while its successor is late
    max_steps: int = droid.MAX_EPISODE_LENGTH
    max_errors: int | None = None
    request_timeout: float = 600.0
    auth_env: str | None = None  # NAME of the environment variable holding the servers' API token
    video: bool = True
    version: int = CONFIG_VERSION

    def __post_init__(self) -> None:
        if not self.scenes:
            raise ValueError("scenes: expected at least one scene id")
        for scene in self.scenes:
            droid.scene_spec(scene)
        if len(set(self.scenes)) != len(self.scenes):
            raise ValueError(f"scenes: expected distinct scene ids, got {self.scenes}")
        for name in ("episodes", "num_envs", "open_loop_horizon", "max_steps"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name}: expected an integer >= 1, got {value!r}")
        if not 0 <= self.prefetch < self.open_loop_horizon:
            raise ValueError(f"prefetch: expected an integer in [0, {self.open_loop_horizon}), got {self.prefetch!r}")
        for name in ("simulated_delay", "max_stale_steps"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 0):
                raise ValueError(f"{name}: expected an integer >= 0, got {value!r}")
        if self.max_errors is not None and self.max_errors < 0:
            raise ValueError(f"max_errors: expected an integer >= 0, got {self.max_errors!r}")
        if self.auth_env is not None:
            from dz_gym.transport import TransportConfig

            TransportConfig(auth_env=self.auth_env)  # validates the name
        if not self.request_timeout > 0:
            raise ValueError(f"request_timeout: expected seconds > 0, got {self.request_timeout!r}")

    @property
    def error_budget(self) -> int:
        """Errored episodes tolerated before the run aborts (default: 10 % of the planned, at least 5)."""
        if self.max_errors is not None:
            return self.max_errors
        return max(5, (self.episodes * len(self.scenes)) // 10)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> EvalConfig:
        """Rebuild a config saved by :meth:`to_dict`; unknown keys are an error (a newer format)."""
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - names)
        if unknown:
            raise ValueError(f"config.json: unknown keys {unknown} (written by a newer dz-gym?)")
        if data.get("version", CONFIG_VERSION) != CONFIG_VERSION:
            raise ValueError(f"config.json: version {data.get('version')!r} is not supported (expected {CONFIG_VERSION})")
        return cls(**dict(data))


def resume_conflicts(saved: EvalConfig, wanted: Mapping[str, Any]) -> list[str]:
    """One line per result-changing setting in ``wanted`` that differs from ``saved``."""
    lines = []
    for key in RESULT_KEYS:
        if key in wanted and wanted[key] != getattr(saved, key):
            lines.append(f"{key}: the run used {getattr(saved, key)!r}, got {wanted[key]!r}")
    if "episodes" in wanted and wanted["episodes"] < saved.episodes:
        lines.append(f"episodes: the run planned {saved.episodes} per scene; a resume may add episodes, not remove them")
    return lines
