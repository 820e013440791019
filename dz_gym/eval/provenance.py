"""What produced a run's numbers, for ``summary.json`` and the report: machine, simulator, dz-gym, servers, seeds.

:func:`provenance` gathers, for the run segment that writes the summary:

- ``gpu``: ``{"name", "driver"}`` of the first GPU (from torch when this process has imported it, else from
  ``nvidia-smi`` when it is on ``PATH``, bounded by a timeout), or ``"none"``;
- ``renderer``: who drew the views (the embedded simulator: MuJoCo's OpenGL backend and EGL device; Isaac
  Lab: Isaac Sim's RTX renderer or, kit-less, Newton's Warp cameras);
- ``simulator``: the versions of ``mujoco``, ``isaaclab``, ``isaacsim``, ``warp-lang``, ``newton`` and
  ``mujoco-warp`` (None where not installed);
- ``dz_gym``: its version and, when it runs from a git checkout, the commit and whether the tree had local
  changes (None otherwise: nothing fails without git);
- ``server_handshakes``: per server URL the first frame it sent, as sent, made JSON-safe
  (:func:`json_safe`);
- ``server_profile``: which kind of server the run spoke to (one name; see :func:`server_profile`);
- ``seeds``: the base seed, the episodes' seed range, and the per-episode policy seed rule when
  ``--policy-seed`` sends one.

Every probe is bounded and never raises: provenance must not cost a run its summary.
"""

from __future__ import annotations

import base64
import importlib.metadata
import math
import shutil
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

__all__ = ["dz_gym_source", "gpu", "json_safe", "provenance", "renderer", "server_profile", "simulator_versions"]

SIMULATOR_PACKAGES = ("mujoco", "isaaclab", "isaacsim", "warp-lang", "newton", "mujoco-warp")
PROBE_TIMEOUT_S = 5.0


def _run(argv: list[str], cwd: str | None = None) -> str | None:
    """``argv``'s stdout stripped, or None (missing, failed, or slower than :data:`PROBE_TIMEOUT_S`)."""
    try:
        done = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=PROBE_TIMEOUT_S, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def gpu(run=_run) -> dict[str, str | None] | str:
    """The first GPU's ``{"name", "driver"}``, or ``"none"`` (see the module docstring)."""
    torch = sys.modules.get("torch")  # never imported here: a CPU run must not pay for torch
    name = driver = None
    try:
        if torch is not None and torch.cuda.is_available():
            name = str(torch.cuda.get_device_name(0))
    except Exception:  # noqa: BLE001 - a broken CUDA set-up is reported as what nvidia-smi says
        name = None
    if shutil.which("nvidia-smi"):
        out = run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"])
        if out:
            first = [part.strip() for part in out.splitlines()[0].split(",")]
            name = name or first[0]
            driver = first[1] if len(first) > 1 else None
    if name is None and driver is None:
        return "none"
    return {"name": name, "driver": driver}


def renderer(backend: str) -> dict[str, Any]:
    """Who drew the views of ``backend`` in this process (the backend's own probe:
    :meth:`~dz_gym.envs.backends.BackendTraits.renderer`); ``{"simulator": backend}`` when it cannot say."""
    from dz_gym.envs.backends import traits

    try:
        return traits(backend).renderer()
    except Exception:  # noqa: BLE001 - provenance never costs a run its summary
        return {"simulator": backend}


def simulator_versions(version=importlib.metadata.version) -> dict[str, str | None]:
    """The installed version of each of :data:`SIMULATOR_PACKAGES`, None where it is not installed."""
    from dz_gym.eval.summary import package_versions

    return package_versions(SIMULATOR_PACKAGES, version)


def dz_gym_source(run=_run) -> dict[str, Any]:
    """dz-gym's ``version`` and, from a git checkout, its ``commit`` and ``dirty`` (None without git)."""
    try:
        version = importlib.metadata.version("dz-gym")
    except importlib.metadata.PackageNotFoundError:
        version = None
    package = str(Path(__file__).resolve().parents[1])
    commit = run(["git", "-C", package, "rev-parse", "HEAD"]) if shutil.which("git") else None
    dirty = None
    if commit:
        status = run(["git", "-C", package, "status", "--porcelain", "--untracked-files=no"])
        dirty = None if status is None else bool(status)
    return {"version": version, "commit": commit or None, "dirty": dirty}


def json_safe(value: Any, depth: int = 0) -> Any:
    """``value`` in plain JSON types: mappings with string keys, lists, numbers (non-finite ones as their
    name), strings; bytes as UTF-8 text when they are, else ``{"base64": ...}``; numpy arrays as lists;
    anything else as its ``repr``. Nesting deeper than 32 is cut off (a repr).

    >>> json_safe({b"k": (1, float("nan")), "b": b"\\xff", "s": {2}})
    {'k': [1, 'nan'], 'b': {'base64': '/w=='}, 's': '{2}'}
    """
    if depth > 32:
        return repr(value)
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    if isinstance(value, (bytes, bytearray, memoryview)):
        raw = bytes(value)
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            return {"base64": base64.b64encode(raw).decode("ascii")}
    if isinstance(value, Mapping):
        return {str(k.decode("utf-8", "replace") if isinstance(k, bytes) else k): json_safe(v, depth + 1)
                for k, v in value.items()}  # fmt: skip
    if isinstance(value, (list, tuple)):
        return [json_safe(v, depth + 1) for v in value]
    if hasattr(value, "tolist") and type(value).__module__ == "numpy":
        return json_safe(value.tolist(), depth + 1)
    return repr(value)


def server_profile(server_metadata: Mapping[str, Any], server_info: Mapping[str, Any]) -> str | None:
    """One name for the kind of server the run spoke to: the ``profile`` its servers' metadata entries name
    (one name when they agree, else the names joined by ``", "``), else the embedded server's ``flavor``, else
    None (external servers whose kind was not recorded)."""
    names = sorted({str(m["profile"]) for m in server_metadata.values() if isinstance(m, Mapping) and m.get("profile")})
    if names:
        return ", ".join(names)
    flavor = server_info.get("flavor")
    return str(flavor) if flavor else None


def _seeds(config: Any) -> dict[str, Any]:
    from dz_gym.eval.clients import policy_seed

    first, last = int(config.plan.seed), int(config.plan.seed) + int(config.plan.episodes) - 1
    out: dict[str, Any] = {"seed": int(config.plan.seed), "episode_seeds": [first, last], "policy_seed": None}
    if config.policies.policy_seed:
        out["policy_seed"] = {"rule": "SplitMix64 of the episode seed, in [0, 2**31) (dz_gym.eval.clients.policy_seed)",
                              "first": policy_seed(first), "last": policy_seed(last)}  # fmt: skip
    return out


def provenance(config: Any, server_metadata: Mapping[str, Any], server_info: Mapping[str, Any]) -> dict[str, Any]:
    """The ``provenance`` entry of ``summary.json`` (see the module docstring). ``server_metadata``: per URL the
    summary's metadata dict (its ``raw`` holds the first frame as sent); ``server_info``: the summary's
    ``server`` entry."""
    handshakes = {}
    for url, meta in server_metadata.items():
        raw = meta.get("raw", meta) if isinstance(meta, Mapping) else meta
        handshakes[str(url)] = json_safe(raw)
    return {
        "gpu": gpu(),
        "renderer": renderer(str(config.plan.backend)),
        "simulator": simulator_versions(),
        "dz_gym": dz_gym_source(),
        "server_handshakes": handshakes,
        "server_profile": server_profile(server_metadata, server_info),
        "seeds": _seeds(config),
    }
