"""Rebuild the vendored robot assets of the embedded simulator from tabletask's bundled "droid" MJCF.

The Franka + Robotiq 2F-85 model in ``dz_gym/envs/mujoco/assets/droid/`` comes from tabletask 0.2.3
(MIT; geometry from MuJoCo Menagerie, Apache-2.0 and BSD-2 licences shipped next to it). Its visual meshes
hold ~300k triangles, which makes software (llvmpipe) rendering ~4x slower than needed, so this script
writes decimated visual meshes and a model.xml that points at them:

- visual meshes with more than ``--min-faces`` faces are loaded with processing on, their vertices merged
  (texture and normal seams too; without this the output is scattered specks), then simplified with
  ``fast_simplification`` at ``--reduction`` (0.9 by default); smaller meshes are copied as they are;
- meshes used only for collision are copied unchanged;
- meshes used both for visuals and collision (the gripper's STL parts) get a decimated visual copy
  (``<name>_visual.obj``) and, for collision, their convex hull (``<name>_hull.obj``): MuJoCo collides
  with the convex hull of a mesh anyway, so collision geometry stays the same while the files shrink.

Dev-only tools: ``pip install tabletask==0.2.3 trimesh fast-simplification``. Usage:
    python scripts/decimate_robot_meshes.py [--out dz_gym/envs/mujoco/assets/droid]
"""

from __future__ import annotations

import argparse
import shutil
import xml.etree.ElementTree as ET
from pathlib import Path

import numpy as np

DEFAULT_OUT = Path(__file__).resolve().parent.parent / "dz_gym" / "envs" / "mujoco" / "assets" / "droid"
VISUAL_CLASSES = {"visual", "gripper_visual"}


def source_dir() -> Path:
    """Folder of tabletask's bundled droid model (model.xml, meshes/, licences, NOTICE)."""
    import tabletask

    return Path(tabletask.__file__).resolve().parent / "mujoco" / "robots" / "assets" / "droid"


def mesh_name(element: ET.Element) -> str:
    """The name MuJoCo gives a <mesh>: its name attribute, else the file's stem."""
    return element.get("name") or Path(element.get("file", "")).stem


def mesh_uses(root: ET.Element) -> dict[str, set[str]]:
    """For each mesh name, the set of uses among {"visual", "collision"} of the geoms that reference it."""
    uses: dict[str, set[str]] = {}
    for geom in root.iter("geom"):
        name = geom.get("mesh")
        if name is None:
            continue
        kind = "visual" if geom.get("class") in VISUAL_CLASSES else "collision"
        uses.setdefault(name, set()).add(kind)
    return uses


def load_merged(path: Path):
    """Load a mesh as one trimesh with merged vertices (including texture and normal seams)."""
    import trimesh

    mesh = trimesh.load(path, process=True, force="mesh")
    mesh.merge_vertices(merge_tex=True, merge_norm=True)
    mesh.remove_unreferenced_vertices()
    return mesh


def write_obj(path: Path, vertices: np.ndarray, faces: np.ndarray) -> None:
    """A compact OBJ (positions and triangles only; MuJoCo computes smooth normals from shared vertices)."""
    lines = [f"v {x:.6g} {y:.6g} {z:.6g}" for x, y, z in np.asarray(vertices, dtype=np.float64)]
    lines += [f"f {a + 1} {b + 1} {c + 1}" for a, b, c in np.asarray(faces, dtype=np.int64)]
    path.write_text("\n".join(lines) + "\n")


def decimate(path: Path, reduction: float, min_faces: int) -> tuple[np.ndarray, np.ndarray]:
    """Merged, and if larger than ``min_faces`` simplified, vertices and faces of the mesh at ``path``."""
    import fast_simplification

    mesh = load_merged(path)
    vertices, faces = np.asarray(mesh.vertices), np.asarray(mesh.faces)
    if len(faces) > min_faces:
        vertices, faces = fast_simplification.simplify(vertices, faces, target_reduction=reduction)
    return vertices, faces


def convex_hull(path: Path) -> tuple[np.ndarray, np.ndarray]:
    """Vertices and faces of the convex hull of the mesh at ``path``."""
    hull = load_merged(path).convex_hull
    return np.asarray(hull.vertices), np.asarray(hull.faces)


def build(out: Path, reduction: float, min_faces: int) -> None:
    """Write model.xml, meshes/, licences and NOTICE under ``out``."""
    src = source_dir()
    tree = ET.parse(src / "model.xml")
    root = tree.getroot()
    uses = mesh_uses(root)
    if out.exists():
        shutil.rmtree(out)
    (out / "meshes").mkdir(parents=True)
    for name in ("LICENSE.franka", "LICENSE.robotiq", "NOTICE.md"):
        shutil.copy2(src / name, out / name)

    asset = root.find("asset")
    total_before = total_after = 0
    renamed_visual: dict[str, str] = {}
    renamed_collision: dict[str, str] = {}
    for element in list(asset.iter("mesh")):
        name = mesh_name(element)
        file = Path(element.get("file"))
        kinds = uses.get(name, set())
        if kinds == {"collision"}:
            shutil.copy2(src / file, out / "meshes" / file.name)
            continue
        vertices, faces = decimate(src / file, reduction, min_faces)
        total_before += len(load_merged(src / file).faces)
        total_after += len(faces)
        if kinds == {"visual"}:
            target = Path("meshes") / f"{file.stem}.obj"
            write_obj(out / target, vertices, faces)
            element.set("file", target.as_posix())
            element.set("name", name)
            continue
        # Used by visual and collision geoms: a decimated visual copy plus the convex hull for collision.
        visual_name, hull_name = f"{name}_visual", f"{name}_hull"
        write_obj(out / "meshes" / f"{visual_name}.obj", vertices, faces)
        hull_vertices, hull_faces = convex_hull(src / file)
        write_obj(out / "meshes" / f"{hull_name}.obj", hull_vertices, hull_faces)
        element.set("name", hull_name)
        element.set("file", f"meshes/{hull_name}.obj")
        visual = ET.SubElement(asset, "mesh", {"name": visual_name, "file": f"meshes/{visual_name}.obj"})
        for key in ("class", "scale"):
            if element.get(key) is not None:
                visual.set(key, element.get(key))
        renamed_visual[name] = visual_name
        renamed_collision[name] = hull_name

    for geom in root.iter("geom"):
        name = geom.get("mesh")
        if name in renamed_visual:
            visual = geom.get("class") in VISUAL_CLASSES
            geom.set("mesh", renamed_visual[name] if visual else renamed_collision[name])

    root.insert(
        0,
        ET.Comment(
            " Generated by scripts/decimate_robot_meshes.py from tabletask 0.2.3's droid model: visual meshes "
            f"decimated (target_reduction {reduction} above {min_faces} faces), collision geometry unchanged "
            "(collision-only meshes copied; shared gripper meshes collide through their convex hull) "
        ),
    )
    ET.indent(tree, space="  ")
    tree.write(out / "model.xml", encoding="unicode")
    size = sum(p.stat().st_size for p in out.rglob("*") if p.is_file())
    print(f"visual triangles {total_before} -> {total_after}; {size / 1e6:.1f} MB written to {out}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--reduction", type=float, default=0.9)
    parser.add_argument("--min-faces", type=int, default=1500)
    args = parser.parse_args()
    build(args.out, args.reduction, args.min_faces)


if __name__ == "__main__":
    main()
