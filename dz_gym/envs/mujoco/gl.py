"""Headless OpenGL for the embedded simulator: backend choice, context creation, and one clear error.

MuJoCo picks its OpenGL backend from ``MUJOCO_GL`` when ``mujoco`` is first imported, so
:func:`configure` must run before that import (``dz_gym.envs.mujoco`` calls it first thing). The default
is ``egl``, which works without a GPU through Mesa's llvmpipe; ``osmesa`` is the fallback (the env retries
its worker processes with it when EGL fails and the user did not choose a backend). Both need Debian
packages: ``libegl1 libegl-mesa0 libgl1-mesa-dri`` for EGL, ``libosmesa6`` for OSMesa.

A program may import ``mujoco`` before dz-gym (``pytest.importorskip("mujoco")`` does), and then MuJoCo
has already bound the backend ``MUJOCO_GL`` named at that time (``glfw`` when it was unset), whatever the
variable says now. :func:`loaded_backend` reads the backend MuJoCo really loaded, from the class behind
``mujoco.GLContext``. :func:`open_context` makes a context current before any MuJoCo rendering call, and
never calls MuJoCo's ``mjr_makeContext`` without one: in MuJoCo 3.x/4.0, once ``mjr_makeContext`` has
failed in a process, the next call aborts the whole process (libc++abi "recursive initialization", exit
134). For the same reason a failure is remembered: every later :func:`create_renderer` in the process
raises the same one-line :class:`RenderingUnavailable` again instead of retrying.
"""

from __future__ import annotations

import importlib
import os
import sys

from dz_gym.errors import RenderingUnavailable

DEFAULT_BACKEND = "egl"
FALLBACK_BACKEND = "osmesa"
HEADLESS_BACKENDS = (DEFAULT_BACKEND, FALLBACK_BACKEND)
DEBIAN_PACKAGES = "libegl1 libegl-mesa0 libgl1-mesa-dri (EGL) or libosmesa6 (OSMesa)"
FIX = "set MUJOCO_GL=egl or MUJOCO_GL=osmesa before mujoco is imported"
# The module of each backend's GLContext class in MuJoCo's Python package, and PyOpenGL's platform class.
_BACKEND_MODULES = {"mujoco.egl": "egl", "mujoco.osmesa": "osmesa", "mujoco.glfw": "glfw", "mujoco.cgl": "cgl"}
_PYOPENGL_PLATFORMS = {"egl": "EGLPlatform", "osmesa": "OSMesaPlatform"}

_user_choice: str | None = os.environ.get("MUJOCO_GL")
_failure: RenderingUnavailable | None = None  # the first failure in this process (see the module docstring)


def configure() -> str:
    """Set ``MUJOCO_GL`` to the default backend unless the user chose one; returns the backend in force."""
    os.environ.setdefault("MUJOCO_GL", DEFAULT_BACKEND)
    return os.environ["MUJOCO_GL"]


def user_chose_backend() -> bool:
    """Whether ``MUJOCO_GL`` was set before dz-gym configured it (then dz-gym never overrides it)."""
    return _user_choice is not None


def loaded_backend() -> str | None:
    """The backend this process's ``mujoco`` loaded at its import: ``egl``, ``osmesa``, ``glfw``, ``cgl``,
    ``disabled`` (``MUJOCO_GL=disable``), ``missing`` (the backend's own import failed), or None when
    ``mujoco`` is not imported yet."""
    module = sys.modules.get("mujoco")
    if module is None:
        return None
    context_class = getattr(module, "GLContext", None)
    if context_class is None:
        return "disabled"
    return _BACKEND_MODULES.get(getattr(context_class, "__module__", ""), "missing")


def backend_in_process() -> str:
    """The backend that this process's ``mujoco`` uses (fixed at its import), else what ``MUJOCO_GL`` says."""
    return loaded_backend() or os.environ.get("MUJOCO_GL", "")


def rendering_device() -> dict[str, str | None]:
    """What this process renders with: the GL backend (:func:`backend_in_process`) and the EGL device that
    ``MUJOCO_EGL_DEVICE_ID`` asks MuJoCo's EGL backend for (None: MuJoCo's own choice; only the ``egl`` backend
    reads it), for a run to record where its views were drawn."""
    return {"backend": backend_in_process() or None, "egl_device_id": os.environ.get("MUJOCO_EGL_DEVICE_ID")}


def _one_line(text: str) -> str:
    lines = [line.strip() for line in str(text).strip().splitlines() if line.strip()]
    return lines[-1] if lines else ""


def _describe(exc: BaseException) -> str:
    message = _one_line(str(exc))
    return f"{type(exc).__name__}: {message}" if message else type(exc).__name__


def unavailable(detail: str, tried: list[str] | tuple[str, ...] = ()) -> RenderingUnavailable:
    """The error raised when rendering cannot start, naming the packages to install."""
    tried_text = ", ".join(tried) if tried else backend_in_process() or "(unset)"
    return RenderingUnavailable(
        f"rendering: no OpenGL context (MUJOCO_GL tried: {tried_text}; {_one_line(detail)}); install the Debian "
        f"packages {DEBIAN_PACKAGES}, and {FIX}",
        detail,
    )


def _has_display() -> bool:
    return sys.platform == "darwin" or bool(os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY"))


def _plan() -> tuple[list[str], list[str]]:
    """The backends to try in this process, in order, and why others are left out (one phrase each)."""
    loaded = loaded_backend()
    if loaded is None:  # only callers that imported mujoco get here; be safe anyway
        loaded = "missing"
    if loaded in HEADLESS_BACKENDS:
        return [loaded], []
    setting = os.environ.get("MUJOCO_GL", "") if _user_choice is None else _user_choice
    if loaded == "disabled":
        return [], [f"mujoco was imported with MUJOCO_GL={setting or 'disable'}, which turns rendering off"]
    skipped: list[str] = []
    plan: list[str] = []
    if loaded in ("glfw", "cgl"):
        if _has_display():
            plan.append(loaded)
        else:
            skipped.append(
                f"mujoco was imported with MUJOCO_GL={_user_choice or '(unset)'} and so renders through "
                f"{loaded}, which needs a display, but DISPLAY is not set"
            )
    else:
        skipped.append(f"mujoco could not load its OpenGL backend (MUJOCO_GL={setting or '(unset)'}{_import_error()})")
    if _user_choice is None or _user_choice.strip().lower() not in ("glfw", "glx", "cgl", "egl", "osmesa"):
        plan += [b for b in HEADLESS_BACKENDS if b not in plan]  # the user chose nothing: dz-gym may pick
    return plan, skipped


def _import_error() -> str:
    """``: <why>`` for the backend import MuJoCo's ``gl_context`` module caught, or nothing."""
    context_class = getattr(sys.modules.get("mujoco"), "GLContext", None)
    error = getattr(sys.modules.get(getattr(context_class, "__module__", "")), "_import_error", None)
    return f": {_describe(error)}" if error is not None else ""


def _context_class(backend: str):
    """MuJoCo's GLContext class for ``backend`` (the loaded one, or a headless one imported beside it)."""
    import mujoco

    if backend == loaded_backend():
        return mujoco.GLContext
    platform = sys.modules.get("OpenGL.platform")
    bound = type(getattr(platform, "PLATFORM", None)).__name__ if platform is not None else None
    if bound not in (None, "NoneType", _PYOPENGL_PLATFORMS[backend]):
        raise RuntimeError(f"PyOpenGL is already bound to {bound} in this process")
    chosen = os.environ.get("PYOPENGL_PLATFORM", "")
    if chosen and chosen.lower() != backend:
        raise RuntimeError(f"PYOPENGL_PLATFORM={chosen} is set")
    return importlib.import_module(f"mujoco.{backend}").GLContext


def _make_current(backend: str, width: int, height: int):
    """A context of ``backend``, current on this thread, or an exception (nothing of MuJoCo's C renderer
    has run yet, so a failure here is safe)."""
    context = _context_class(backend)(width, height)
    try:
        context.make_current()
        if backend == "glfw":  # GLFW returns no window rather than raising; MuJoCo would go on without one
            import glfw

            if not glfw.get_current_context():
                raise RuntimeError(f"GLFW could not open a window on DISPLAY={os.environ.get('DISPLAY', '')}")
    except BaseException:
        context.free()
        raise
    return context


def open_context(height: int, width: int) -> tuple[str, object]:
    """``(backend, context)``: a GL context made current on this thread, which MuJoCo can render with; or
    :class:`RenderingUnavailable` with one line naming the cause and the fix."""
    plan, reasons = _plan()
    for backend in plan:
        try:
            return backend, _make_current(backend, width, height)
        except Exception as exc:  # noqa: BLE001 - each backend's failure goes into the one error
            reasons.append(f"{backend}: {_describe(exc)}")
    if not plan and loaded_backend() == "missing":  # the backend the user chose cannot load: packages
        raise unavailable("; ".join(reasons), tried=[os.environ.get("MUJOCO_GL", "")])
    if not plan:
        raise RenderingUnavailable(f"rendering: {'; '.join(reasons)}; {FIX}", "; ".join(reasons))
    raise unavailable("; ".join(reasons), tried=plan)


def create_renderer(model, height: int, width: int, max_views: int = 1):
    """A :class:`~dz_gym.envs.mujoco.render.BatchRenderer` for up to ``max_views`` views a page, or
    :class:`RenderingUnavailable` (the same one on every call after the first failure in this process)."""
    global _failure
    from dz_gym.envs.mujoco.render import BatchRenderer, check_size

    check_size(model, height, width)  # a wrong size is the caller's error, not the machine's
    if _failure is not None:
        raise RenderingUnavailable(str(_failure), _failure.detail)
    try:
        backend, context = open_context(height, width)
    except RenderingUnavailable as exc:
        _failure = exc
        raise
    try:
        return BatchRenderer(model, height, width, context, max_views=max_views)
    except Exception as exc:
        _failure = unavailable(_describe(exc), tried=[backend])
        raise _failure from exc
