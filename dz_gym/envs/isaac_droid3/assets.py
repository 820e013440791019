"""USD assets of the Isaac Lab 3.0 DROID task, converted from the embedded simulator's MJCF and cached.

Isaac Lab builds its Newton model from a USD stage (``ModelBuilder.add_usd`` on the cloned env prims), so
the robot, the table and each scene's object and container become USD files here, converted by
``mujoco-usd-converter`` (the MJCF importer Isaac Lab 3.0 lists in its ``importers`` extra) from exactly the
MJCF the MuJoCo backend compiles (:mod:`dz_gym.envs.mujoco.scene`, :mod:`dz_gym.envs.mujoco.robot`):

- ``robot.usd``: the Franka + Robotiq 2F-85 with its MuJoCo tendon ``split`` and the gripper's tendon
  actuator ``fingers_actuator`` (driven through Isaac Lab's fixed-tendon action); the arm's seven MJCF
  position actuators are dropped, since Isaac Lab's implicit actuators drive the arm joints with the same
  gains (kp 400, kd 80); cameras (the task config places them) and sites (markers) are not converted;
- ``table.usd``: the table top, legs and floor as static colliders;
- ``scene{k}_object.usd`` / ``scene{k}_container.usd``: one free rigid body each, posed at reset.

Conversion runs once per cache key (the MJCF text and the converter's version) and takes about a second;
the files land under ``$DZ_GYM_ISAAC3_ASSETS`` or ``~/.cache/dz_gym/isaac3/<key>/``. Nothing is downloaded.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

ASSETS_ENV = "DZ_GYM_ISAAC3_ASSETS"
GRIPPER_TENDON = "split"
GRIPPER_ACTUATOR = "fingers_actuator"
_ARM_ACTUATORS = tuple(f"joint{i}" for i in range(1, 8))


@dataclass(frozen=True)
class SceneAssets:
    """The USD files of one scene (absolute paths)."""

    robot: Path
    table: Path
    object: Path
    container: Path


def _robot_mjcf() -> str:
    import mujoco

    from dz_gym.envs.mujoco import robot

    spec = robot.load_robot_spec()
    spec.meshdir = str(robot.ASSET_DIR)
    for actuator in list(spec.actuators):
        if actuator.name in _ARM_ACTUATORS:
            spec.delete(actuator)
    for camera in list(spec.cameras):
        spec.delete(camera)
    # Sites are markers (the ``tcp`` sphere is transparent in MuJoCo); the converter makes them visible
    # shapes, and the Warp renderer would draw the tcp as a red dot in the wrist view.
    for site in list(spec.sites):
        spec.delete(site)
    spec.modelname = "droid_robot"
    _ = mujoco  # the spec API is mujoco's
    return spec.to_xml()


def _table_mjcf() -> str:
    import mujoco

    from dz_gym.envs.mujoco import scene

    spec = mujoco.MjSpec()
    spec.modelname = "droid_table"
    scene._add_table_and_floor(spec)
    # Isaac Lab's Newton import hides a static collider whose scope also holds visual-only geoms (the legs):
    # give the top and the floor visual twins so that the cameras see them.
    for geom in list(spec.worldbody.geoms):
        if geom.contype or geom.conaffinity:
            twin = spec.worldbody.add_geom(
                name=f"{geom.name}_visual", type=geom.type, size=geom.size, pos=geom.pos, quat=geom.quat, rgba=geom.rgba
            )
            twin.contype, twin.conaffinity = 0, 0
    return spec.to_xml()


def _body_mjcf(scene_id: int, keep: str) -> str:
    """One of the scene's two free bodies (``object`` or ``container``) alone, at the origin."""
    import mujoco

    from dz_gym.envs.mujoco import scene

    spec = mujoco.MjSpec()
    spec.modelname = f"scene{scene_id}_{keep}"
    scene._BUILDERS[scene_id](spec)
    for body in list(spec.worldbody.bodies):
        if body.name != keep:
            spec.delete(body)
        else:
            body.pos = (0.0, 0.0, 0.0)
    return spec.to_xml()


def _sources(scene_id: int) -> dict[str, str]:
    return {
        "robot": _robot_mjcf(),
        "table": _table_mjcf(),
        f"scene{scene_id}_object": _body_mjcf(scene_id, "object"),
        f"scene{scene_id}_container": _body_mjcf(scene_id, "container"),
    }


def cache_root() -> Path:
    """Where converted assets are kept (``$DZ_GYM_ISAAC3_ASSETS`` or ``~/.cache/dz_gym/isaac3``)."""
    override = os.environ.get(ASSETS_ENV, "").strip()
    return Path(override) if override else Path.home() / ".cache" / "dz_gym" / "isaac3"


def scene_assets(scene_id: int, root: Path | None = None) -> SceneAssets:
    """The USD files of ``scene_id`` (1-3), converting what is not cached yet."""
    from dz_gym.envs import droid

    scene_id = droid.scene_spec(scene_id).scene_id
    sources = _sources(scene_id)
    out = {name: _converted(name, text, root or cache_root()) for name, text in sources.items()}
    return SceneAssets(out["robot"], out["table"], out[f"scene{scene_id}_object"], out[f"scene{scene_id}_container"])


def _converted(name: str, mjcf: str, root: Path) -> Path:
    try:
        import mujoco_usd_converter
    except ImportError as exc:
        from dz_gym.errors import BackendUnavailable

        raise BackendUnavailable(
            "mujoco-usd-converter is not installed: the Isaac Lab 3.0 DROID task converts its MJCF to USD with it; "
            "run scripts/setup_isaac3.sh (see docs/isaac.md)"
        ) from exc
    key = hashlib.sha256((mjcf + mujoco_usd_converter.__version__).encode()).hexdigest()[:16]
    folder = root / key / name
    target = folder / f"{name}.usd"
    if target.is_file():
        return target
    folder.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=folder) as tmp:
        xml = Path(tmp) / f"{name}.xml"
        xml.write_text(mjcf)
        converter = mujoco_usd_converter.Converter(layer_structure=False, scene=False)
        converted = Path(converter.convert(str(xml), str(Path(tmp) / "out")).path)
        _post_process(converted, target)
    return target


def _post_process(source: Path, target: Path) -> None:
    """Gravity compensation under the attribute name Newton reads; written atomically to ``target``."""
    from pxr import Sdf, Usd

    stage = Usd.Stage.Open(str(source))
    for prim in stage.Traverse():
        value = prim.GetAttribute("mjc:body:gravcomp")
        if value and value.HasAuthoredValue() and not prim.GetAttribute("mjc:gravcomp").HasAuthoredValue():
            prim.CreateAttribute("mjc:gravcomp", Sdf.ValueTypeNames.Float, custom=True).Set(float(value.Get()))
    partial = target.with_suffix(".partial.usdc")
    stage.GetRootLayer().Export(str(partial))
    os.replace(partial, target)
