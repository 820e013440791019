"""Headless OpenGL for the embedded simulator: backend choice and the one clear error when none works.

MuJoCo picks its OpenGL backend from ``MUJOCO_GL`` when ``mujoco`` is first imported, so
:func:`configure` must run before that import (``dz_gym.envs.mujoco`` calls it first thing). The default
is ``egl``, which works without a GPU through Mesa's llvmpipe; ``osmesa`` is the fallback (the env retries
its worker processes with it when EGL fails and the user did not choose a backend). Both need Debian
packages: ``libegl1 libegl-mesa0 libgl1-mesa-dri`` for EGL, ``libosmesa6`` for OSMesa.
"""

from __future__ import annotations

import os
import sys

from dz_gym.errors import DzGymError

DEFAULT_BACKEND = "egl"
FALLBACK_BACKEND = "osmesa"
DEBIAN_PACKAGES = "libegl1 libegl-mesa0 libgl1-mesa-dri (EGL) or libosmesa6 (OSMesa)"

_user_choice: str | None = os.environ.get("MUJOCO_GL")


class RenderingUnavailable(DzGymError, RuntimeError):
    """No headless OpenGL backend could create a rendering context (``detail``: the underlying failure)."""

    def __init__(self, message: str, detail: str = ""):
        super().__init__(message)
        self.detail = detail or message


def configure() -> str:
    """Set ``MUJOCO_GL`` to the default backend unless the user chose one; returns the backend in force."""
    os.environ.setdefault("MUJOCO_GL", DEFAULT_BACKEND)
    return os.environ["MUJOCO_GL"]


def user_chose_backend() -> bool:
    """Whether ``MUJOCO_GL`` was set before dz-gym configured it (then dz-gym never overrides it)."""
    return _user_choice is not None


def backend_in_process() -> str:
    """The backend that this process's ``mujoco`` uses (fixed at its import)."""
    module = sys.modules.get("mujoco.rendering.classic.gl_context")
    return getattr(module, "_MUJOCO_GL", None) or os.environ.get("MUJOCO_GL", "")


def unavailable(detail: str, tried: list[str] | tuple[str, ...] = ()) -> RenderingUnavailable:
    """The error raised when rendering cannot start, naming the packages to install."""
    tried_text = ", ".join(tried) if tried else backend_in_process() or "(unset)"
    return RenderingUnavailable(
        f"rendering: no OpenGL context (MUJOCO_GL tried: {tried_text}; {detail}); install the Debian packages "
        f"{DEBIAN_PACKAGES}, and set MUJOCO_GL=egl or MUJOCO_GL=osmesa before mujoco is imported",
        detail,
    )


def create_renderer(model, height: int, width: int, max_views: int = 1):
    """A :class:`~dz_gym.envs.mujoco.render.BatchRenderer` for up to ``max_views`` views a page, or
    :class:`RenderingUnavailable`."""
    from dz_gym.envs.mujoco.render import BatchRenderer

    try:
        return BatchRenderer(model, height, width, max_views=max_views)
    except Exception as exc:
        message = str(exc).strip().splitlines()[-1] if str(exc).strip() else type(exc).__name__
        raise unavailable(f"{type(exc).__name__}: {message}") from exc
