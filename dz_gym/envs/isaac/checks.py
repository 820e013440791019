"""Pre-launch checks of the Isaac Lab backend: packages, scene assets, and an RTX-capable GPU.

Starting Isaac Sim takes minutes, so everything that can be known before it starts is checked first,
and each failure is a :class:`~dz_gym.errors.BackendUnavailable` that says what is missing and how to
get it. Nothing here imports Isaac Lab or sim-evals (``importlib.util.find_spec`` only locates them).
"""

from __future__ import annotations

import importlib.util
import os
import re
import sys
from pathlib import Path

from dz_gym.envs.isaac.compat import isaaclab_folder
from dz_gym.errors import BackendUnavailable

SETUP_HINT = "see docs/isaac.md"
ASSETS_HINT = (
    "download them from the sim-evals checkout's root with "
    "'hf download owhan/DROID-sim-environments --repo-type dataset --local-dir assets'"
)
ROBOT_USD = "franka_robotiq_2f_85_flattened.usd"
SKIP_GPU_CHECK_ENV = "DZ_GYM_ISAAC_SKIP_GPU_CHECK"

# Data-centre GPUs without RT cores. Isaac Sim's RTX cameras crash or degrade on them (IsaacLab#3421 on
# A100, #4271 on H100, #1519 DLSS on A100); the H200 and the Blackwell data-centre parts are in the same
# family. A heuristic on the CUDA device name, overridable (see check_rtx_gpu).
NO_RT_CORE_GPUS = (
    "A100",
    "A800",
    "A30",
    "H100",
    "H800",
    "H200",
    "H20",
    "GH200",
    "B100",
    "B200",
    "GB200",
    "V100",
    "P100",
)
_NO_RT_CORE_PATTERN = re.compile(r"(?<![A-Z0-9])(" + "|".join(NO_RT_CORE_GPUS) + r")(?![0-9])")


def renderer_in_process() -> dict[str, str | None]:
    """Who draws the views in this process (read from what is imported, nothing imported here): Isaac Sim's
    RTX renderer, the kit-less stack's Newton Warp cameras, or None before the simulator started."""
    if "isaacsim" in sys.modules:
        return {"renderer": "Isaac Sim RTX"}
    if "newton" in sys.modules:
        return {"renderer": "Newton Warp cameras (kit-less)"}
    return {"renderer": None}


def check_packages() -> None:
    """Isaac Lab (``isaaclab``, ``isaaclab_tasks``) and sim-evals (``sim_evals``) are installed.

    ``isaaclab_tasks`` is found where each install puts it: a top-level package (source installs, the 3.0
    wheel), or, in a 2.x wheel, the extension under ``isaaclab/source/isaaclab_tasks/``, which Kit makes
    importable only once it runs (so ``find_spec`` cannot see it before launch).
    """
    missing = [name for name in ("isaaclab", "sim_evals") if _find(name) is None]
    if "isaaclab" not in missing and not isaaclab_tasks_installed():
        missing.insert(1, "isaaclab_tasks")
    if not missing:
        return
    if "sim_evals" in missing and len(missing) == 1:
        raise BackendUnavailable(
            "sim-evals is not installed (module sim_evals): clone arhanjain/sim-evals at 423e87c or later "
            f"and 'pip install -e .' it in the Isaac Lab environment; {SETUP_HINT}"
        )
    raise BackendUnavailable(
        f"Isaac Lab is not installed (missing modules: {', '.join(missing)}): the isaac backend needs "
        f"Isaac Lab 2.2 (Isaac Sim 5.0) and sim-evals on an RTX GPU; {SETUP_HINT}"
    )


def isaaclab_tasks_installed() -> bool:
    """``isaaclab_tasks`` is importable now, or is the extension a 2.x wheel ships for Kit to load."""
    if _find("isaaclab_tasks") is not None:
        return True
    folder = isaaclab_folder()
    return folder is not None and (folder / "source" / "isaaclab_tasks" / "isaaclab_tasks" / "__init__.py").is_file()


KITLESS_STACK = ("isaaclab_newton", "newton", "warp", "mujoco_warp")


def isaac_can_start() -> bool:
    """Whether the isaac backend can start here, for ``--backend auto`` (nothing is imported): Isaac Lab
    is installed and so is Isaac Sim (``isaacsim``), which it starts (Kit renders the cameras), or Isaac
    Lab 3.0's kit-less stack (Newton, Warp, MuJoCo-Warp), on which dz-gym's own tasks run without Isaac Sim.
    An ``isaaclab`` wheel alone (a 2.x wheel imports ``isaacsim`` on import) cannot run an env."""
    if isaaclab_folder() is None:
        return False
    return _find("isaacsim") is not None or all(_find(name) is not None for name in KITLESS_STACK)


def sim_evals_package_dir() -> Path:
    """The installed ``sim_evals`` package folder (``.../src/sim_evals``)."""
    return sim_evals_root() / "src" / "sim_evals"


def sim_evals_root() -> Path:
    """The sim-evals checkout that holds ``assets/`` (``src/sim_evals`` -> the repository root)."""
    spec = _find("sim_evals")
    if spec is None:
        raise BackendUnavailable(f"sim-evals is not installed (module sim_evals); {SETUP_HINT}")
    if spec.submodule_search_locations:
        package_dir = Path(list(spec.submodule_search_locations)[0])
    elif spec.origin:
        package_dir = Path(spec.origin).parent
    else:
        raise BackendUnavailable(f"sim-evals: cannot locate the installed package; {SETUP_HINT}")
    if not (package_dir / "environments").is_dir():
        raise BackendUnavailable(
            f"sim-evals at {package_dir} has no sim_evals.environments package: it is older than 423e87c "
            f"(2026-02-01); update it; {SETUP_HINT}"
        )
    # sim-evals reads Path(environments/droid_environment.py).parent / "../../../assets", i.e. the
    # repository root of a src-layout checkout installed in editable mode.
    return package_dir.parent.parent


def check_assets(scene: int, assets_dir: str | os.PathLike | None = None, files: tuple[str, ...] | None = None) -> Path:
    """The scene files (``files`` under the scenes folder, default ``scene{k}.usd``) and the robot USD that
    sim-evals will load exist; returns the scenes folder.

    sim-evals reads them from different places: the scenes from ``SIM_EVALS_ASSET_ROOT`` when set (711ff04
    and later), else from the checkout's ``assets/``; the robot from the checkout's ``assets/`` (older
    versions: next to the scenes). ``assets_dir`` overrides where the scenes are looked for.
    """
    checkout = sim_evals_root() / "assets"
    if assets_dir is not None:
        scene_folders = [Path(assets_dir)]
    else:
        scene_folders = [Path(os.environ["SIM_EVALS_ASSET_ROOT"])] if os.environ.get("SIM_EVALS_ASSET_ROOT") else []
        scene_folders.append(checkout)
    scene_files = tuple(files or (f"scene{int(scene)}.usd",))
    found = next((f for f in scene_folders if all((f / name).exists() for name in scene_files)), None)
    robot = next((f for f in (checkout, *scene_folders) if (f / ROBOT_USD).exists()), None)
    if found is not None and robot is not None:
        return found
    folder = found or scene_folders[0]
    absent = [name for name in scene_files if not (folder / name).exists()]
    where = [f"{', '.join(absent)} in {folder}"] if absent else []
    if robot is None:
        where.append(f"{ROBOT_USD} in {checkout}")
    raise BackendUnavailable(f"sim-evals assets missing: {'; '.join(where)}; {ASSETS_HINT}")


def gpu_lacks_rt_cores(name: str) -> bool:
    """True when the CUDA device name is a known GPU without RT cores (A100, H100, H200 ...)."""
    return _NO_RT_CORE_PATTERN.search(str(name).upper()) is not None


def check_rtx_gpu(device: str, torch_module=None) -> str:
    """The GPU that will render has RT cores (Isaac Sim's cameras need RTX); returns its name.

    A heuristic on ``torch.cuda.get_device_name``: the known RT-core-less data-centre GPUs are refused.
    Set ``DZ_GYM_ISAAC_SKIP_GPU_CHECK=1`` (or pass ``check_gpu=False`` to the env) to try anyway.
    """
    if os.environ.get(SKIP_GPU_CHECK_ENV, "").strip() not in ("", "0"):
        return "(not checked)"
    if torch_module is None:
        try:
            import torch as torch_module
        except ImportError as exc:
            raise BackendUnavailable(f"torch is not installed: Isaac Lab brings it; {SETUP_HINT}") from exc
    if not torch_module.cuda.is_available():
        raise BackendUnavailable(
            f"no CUDA GPU visible: Isaac Sim's cameras need an NVIDIA RTX GPU; {SETUP_HINT} (or use --backend mujoco)"
        )
    index = 0
    match = re.fullmatch(r"cuda:(\d+)", str(device))
    if match:
        index = int(match.group(1))
    name = torch_module.cuda.get_device_name(index)
    if gpu_lacks_rt_cores(name):
        raise BackendUnavailable(
            f"GPU {index} ({name}) has no RT cores: Isaac Sim's RTX cameras crash or render wrongly on it "
            f"(IsaacLab#3421, #4271); use an RTX GPU (L40S, RTX 6000, RTX 4090 ...), or the mujoco backend; "
            f"set {SKIP_GPU_CHECK_ENV}=1 to try anyway"
        )
    return name


def _find(name: str):
    try:
        return importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return None
