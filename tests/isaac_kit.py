"""A thin fake of Isaac Sim's own modules (``isaacsim``, ``carb``, ``omni.*``) for tests that import the real
Isaac Lab wheels (isaaclab 2.2.0 on Python 3.11, 3.0.0 on Python 3.12) without Kit.

Everything of Isaac Lab these tests touch is the real wheel's code. Only what cannot run without Kit is
faked here, and as little of it as possible:

- ``isaacsim.SimulationApp(config, experience=...)``: records its config and experience file, and does what
  Kit's extension manager does for Isaac Lab's experience files when a wheel install starts
  (``[settings.app.exts] folders`` names ``${app}/../source``): each Isaac Lab extension under the wheel's
  ``isaaclab/source/<ext>/`` becomes importable (its folder is put on ``sys.path``, as Kit's Python
  extensions are). ``close()``, ``update()``, ``is_running()`` are recorded.
- every other name under ``isaacsim``, ``carb`` and ``omni`` is a :class:`Anything`: any attribute, call,
  ``int()``, iteration or subclassing works and returns another one; calls are recorded in
  :attr:`Kit.calls`. Isaac Lab calls these to configure Kit (settings, timeline subscriptions, the
  extension manager) and nothing a test checks depends on their values.

Install it only inside a test's process (a fixture), never in users' processes: :func:`install` puts an
import finder for those three top-level names only, :func:`uninstall` removes it.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
import tempfile
import types
from pathlib import Path
from typing import Any

KIT_PACKAGES = ("isaacsim", "carb", "omni")
# Isaac Sim's own USD schemas (not in OpenUSD, so not in usd-core's ``pxr``, which the tests use for real)
KIT_PXR_MODULES = ("pxr.PhysxSchema", "pxr.Semantics", "pxr.PhysicsSchemaTools", "pxr.OmniAudioSchema")
_ISAACLAB_EXTENSIONS = ("isaaclab", "isaaclab_assets", "isaaclab_tasks", "isaaclab_mimic", "isaaclab_rl")


class Anything:
    """Stands for any Kit object: attributes, calls and results are more of the same, and calls are logged."""

    def __init__(self, kit: Kit, path: str):
        object.__setattr__(self, "_kit", kit)
        object.__setattr__(self, "_path", path)

    def __getattr__(self, name: str) -> Anything:
        if name.startswith("__"):
            raise AttributeError(name)
        child = Anything(self._kit, f"{self._path}.{name}")
        object.__setattr__(self, name, child)
        return child

    def __call__(self, *args: Any, **kwargs: Any) -> Anything:
        self._kit.calls.append((self._path, args, kwargs))
        return Anything(self._kit, f"{self._path}()")

    def __mro_entries__(self, bases):  # ``class X(omni.ext.IExt)``
        return (type(self._path.rsplit(".", 1)[-1], (), {}),)

    def __int__(self) -> int:
        return 0

    def __float__(self) -> float:
        return 0.0

    def __index__(self) -> int:
        return 0

    def __bool__(self) -> bool:
        return True

    def __iter__(self):
        return iter(())

    def __enter__(self) -> Anything:
        return self

    def __exit__(self, *exc) -> bool:
        return False

    def __repr__(self) -> str:
        return f"<kit fake {self._path}>"


class SimulationApp:
    """``isaacsim.SimulationApp``: records its start; makes the Isaac Lab extensions of a wheel importable."""

    def __init__(self, launch_config: dict | None = None, experience: str = ""):
        kit = _KIT
        self.config = dict(launch_config or {})
        self.experience = str(experience)
        self.closed = False
        kit.apps.append(self)
        kit.calls.append(("isaacsim.SimulationApp", (self.config,), {"experience": self.experience}))
        _load_isaaclab_extensions(self.experience)

    def update(self) -> None:
        _KIT.calls.append(("SimulationApp.update", (), {}))

    def close(self, *args: Any, **kwargs: Any) -> None:
        self.closed = True
        _KIT.calls.append(("SimulationApp.close", args, kwargs))

    def is_running(self) -> bool:
        return not self.closed

    def __getattr__(self, name: str) -> Anything:
        if name.startswith("__"):
            raise AttributeError(name)
        return getattr(Anything(_KIT, "SimulationApp"), name)


def _load_isaaclab_extensions(experience: str) -> None:
    """Kit's extension search path of Isaac Lab's experience files includes ``${app}/../source``: in a wheel
    install each extension folder there holds its Python package, which Kit puts on ``sys.path``."""
    if not experience:
        return
    source = Path(experience).resolve().parent.parent / "source"
    for name in _ISAACLAB_EXTENSIONS:
        folder = source / name
        if (folder / name).is_dir() and str(folder) not in sys.path:
            sys.path.append(str(folder))
            _KIT.added_paths.append(str(folder))


class Kit:
    """What the fake recorded: every call to a Kit object, the apps started, the folders put on sys.path."""

    def __init__(self, isaac_sim_version: str = "5.0.0"):
        self.isaac_sim_version = isaac_sim_version
        self.calls: list[tuple[str, tuple, dict]] = []
        self.apps: list[SimulationApp] = []
        self.added_paths: list[str] = []
        self.saved_env: dict[str, str | None] = {}

    def called(self, prefix: str) -> list[tuple[str, tuple, dict]]:
        return [call for call in self.calls if call[0].startswith(prefix)]


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname, path=None, target=None):
        top = fullname.split(".")[0]
        if top in _ISAACLAB_EXTENSIONS and fullname.count(".") == 1 and _KIT.added_paths:
            # Once Kit runs, ``isaaclab.<sub>`` of a wheel install is the extension's (under the wheel's
            # ``source/isaaclab/``): the wheel's own ``isaaclab`` package has only ``__init__`` and ``app``.
            folders = [str(Path(folder) / top) for folder in _KIT.added_paths if Path(folder).name == top]
            return importlib.machinery.PathFinder.find_spec(fullname, folders) if folders else None
        if top not in KIT_PACKAGES and fullname not in KIT_PXR_MODULES:
            return None
        return importlib.machinery.ModuleSpec(fullname, self, origin="kit fake", is_package=True)

    def create_module(self, spec):
        module = types.ModuleType(spec.name)
        module.__path__ = []
        proxy = Anything(_KIT, spec.name)
        module.__getattr__ = lambda name: getattr(proxy, name)  # PEP 562
        if spec.name == "isaacsim":
            # An Isaac Sim folder with its VERSION file; the real ``import isaacsim`` bootstraps the kernel, which
            # sets EXP_PATH (Kit's experience folder).
            root = Path(tempfile.mkdtemp(prefix="isaac-sim-"))
            (root / "apps").mkdir()
            (root / "VERSION").write_text(f"{_KIT.isaac_sim_version}\n")
            module.__file__ = str(root / "python" / "isaacsim" / "__init__.py")
            module.SimulationApp = SimulationApp
            _set_env("EXP_PATH", str(root / "apps"))
        return module

    def exec_module(self, module):
        pass


_KIT = Kit()


def install(isaac_sim_version: str = "5.0.0") -> Kit:
    """Serve the fake Kit modules in this process (a fresh record); returns the record. ``isaac_sim_version``
    is what its VERSION file says (Isaac Lab 2.2.0 pins Isaac Sim 5.0.0, 3.0.0 pins 6.0)."""
    global _KIT
    uninstall()
    _KIT = Kit(isaac_sim_version)
    sys.meta_path.insert(0, _Finder())
    return _KIT


def uninstall() -> None:
    """Remove the finder, the fake modules and the extension folders the fake put on ``sys.path``."""
    sys.meta_path[:] = [finder for finder in sys.meta_path if not isinstance(finder, _Finder)]
    for name in list(sys.modules):
        if name.split(".")[0] in KIT_PACKAGES:
            del sys.modules[name]
    for folder in _KIT.added_paths:
        while folder in sys.path:
            sys.path.remove(folder)
    _KIT.added_paths.clear()
    for name, value in _KIT.saved_env.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value
    _KIT.saved_env.clear()


def _set_env(name: str, value: str) -> None:
    _KIT.saved_env.setdefault(name, os.environ.get(name))
    os.environ[name] = value


def forget_isaaclab() -> None:
    """Drop every imported Isaac Lab module (each test starts from a process that has imported none)."""
    for name in list(sys.modules):
        if name.split(".")[0] in _ISAACLAB_EXTENSIONS or name in ("app_launcher",):
            del sys.modules[name]
    importlib.invalidate_caches()


def wheel_root() -> Path | None:
    """The installed isaaclab wheel's package folder (``site-packages/isaaclab``), located without importing."""
    spec = importlib.util.find_spec("isaaclab")
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(list(spec.submodule_search_locations)[0])
