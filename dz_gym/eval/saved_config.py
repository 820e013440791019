"""How an evaluation run's settings are saved: ``config.json`` nested by section (:data:`CONFIG_VERSION`), and
the flat layout of version 1 that dz-gym wrote before the sections, which still reads (:func:`migrate`) and which
``summary.json``'s ``config`` keeps (:func:`flat_layout`). Pure: dicts in, dicts out.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from dz_gym.eval.sections import LEGACY_MAX_EPISODES, PATHS, SECTIONS

CONFIG_VERSION = 2  # 2: nested in sections; 1 (flat) still reads (migrate)
# The flat layout of version 1 (config.json before the sections; summary.json's "config" keeps it), in its order:
# each flat key and the dotted path it moved to.
FLAT_KEYS: dict[str, str] = {key: PATHS.get(key, "transport.processes") for key in (
    "scenes episodes num_envs seed backend servers policy open_loop_horizon server_kind prefetch simulated_delay "
    "latency_honest control_hz max_stale_steps max_steps render_shape max_errors request_timeout retry_server_errors "
    "episode_retries server_max_sessions server_idle_timeout auth_env transport_processes servers_b policy_b "
    "arm_specs select_best sequential alpha min_difference power max_episodes accept_lower_power policy_seed "
    "num_inference_steps video report profile log log_project"
).split()}  # fmt: skip


def dotted_path(key: str) -> str:
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
