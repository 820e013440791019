"""Rendering throughput: views/s of the embedded simulator's BatchRenderer vs one read-back per view.

P processes (P from ``--procs``) each hold G envs of scene 1 (their arms in random poses) and render all of
their 3G camera views per round, R rounds, started together. Two renderers, in turn, on the same views:

- *per view*: ``mujoco.Renderer`` (``update_scene`` + ``render``: one ``glReadPixels`` per view), the way the
  simulator rendered before;
- *batched*: :class:`dz_gym.envs.mujoco.render.BatchRenderer` (every view drawn, copied on the GPU into a page,
  one read-back per page).

It prints per P: views/s of all processes together, ms per view per process, and batched / per view.
With ``MUJOCO_GL=egl`` on a GPU this shows whether processes sharing the GPU render in parallel; on a
CPU (llvmpipe) it shows the cost of the copies around each read-back.

Usage::

    MUJOCO_GL=egl python benchmarks/bench_render.py --procs 1,4,16 --envs 16 --rounds 20
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import sys
import time

os.environ.setdefault("MUJOCO_GL", "egl")
os.environ.setdefault("PYOPENGL_PLATFORM", os.environ["MUJOCO_GL"] if os.environ["MUJOCO_GL"] != "glfw" else "")


def worker(mode: str, envs: int, rounds: int, shape: tuple[int, int], barrier, results, index: int) -> None:
    import mujoco
    import numpy as np

    from dz_gym.envs.mujoco import gl, scene
    from dz_gym.envs.mujoco.cameras import CAMERA_NAMES

    model = scene.build_model(1, shape)
    rng = np.random.default_rng(index)
    datas = []
    for _ in range(envs):
        data = mujoco.MjData(model)
        data.qpos[:7] += rng.normal(0.0, 0.3, 7)
        mujoco.mj_forward(model, data)
        datas.append(data)
    cameras = [model.camera(name).id for name in CAMERA_NAMES]
    out = np.zeros((envs * len(cameras), *shape, 3), dtype=np.uint8)
    views = [(data, cam, out[len(cameras) * d + c]) for d, data in enumerate(datas) for c, cam in enumerate(cameras)]
    if mode == "batched":
        renderer = gl.create_renderer(model, *shape, max_views=len(views))

        def render_all():
            renderer.render(views)
    else:
        renderer = mujoco.Renderer(model, height=shape[0], width=shape[1])
        renderer.scene.flags[mujoco.mjtRndFlag.mjRND_SHADOW] = False
        renderer.scene.flags[mujoco.mjtRndFlag.mjRND_REFLECTION] = False

        def render_all():
            for data, cam, target in views:
                renderer.update_scene(data, camera=cam)
                renderer.render(out=target)

    render_all()  # warm-up: uploads and shader compilation
    barrier.wait()
    start = time.perf_counter()
    for _ in range(rounds):
        render_all()
    results[index] = (start, time.perf_counter())
    renderer.close()


def run(mode: str, procs: int, envs: int, rounds: int, shape: tuple[int, int]) -> tuple[float, float]:
    """(views/s of all processes, mean ms per view within one process)."""
    context = mp.get_context("spawn")
    barrier = context.Barrier(procs)
    manager = context.Manager()
    results = manager.dict()
    workers = [
        context.Process(target=worker, args=(mode, envs, rounds, shape, barrier, results, k)) for k in range(procs)
    ]
    for w in workers:
        w.start()
    for w in workers:
        w.join(600)
    spans = [results[k] for k in range(procs)]
    manager.shutdown()
    views = procs * envs * 3 * rounds
    wall = max(end for _, end in spans) - min(start for start, _ in spans)
    per_view = sum(end - start for start, end in spans) / procs / (envs * 3 * rounds)
    return views / wall, 1e3 * per_view


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--procs", default="1,4,16", help="process counts, comma-separated")
    parser.add_argument("--envs", type=int, default=16, help="envs per process (3 views each)")
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--shape", default="180x320", help="image HxW")
    args = parser.parse_args()
    shape = tuple(int(v) for v in args.shape.split("x"))
    print(
        f"MUJOCO_GL={os.environ['MUJOCO_GL']}, {args.envs} envs x 3 views per process, {args.shape}, {args.rounds} rounds"
    )
    print(
        f"{'P':>3}  {'per view: views/s':>18}  {'ms/view':>8}  {'batched: views/s':>17}  {'ms/view':>8}  {'ratio':>6}"
    )
    for procs in [int(p) for p in args.procs.split(",") if p.strip()]:
        base_rate, base_ms = run("per_view", procs, args.envs, args.rounds, shape)
        rate, ms = run("batched", procs, args.envs, args.rounds, shape)
        print(
            f"{procs:>3}  {base_rate:>18.0f}  {base_ms:>8.3f}  {rate:>17.0f}  {ms:>8.3f}  {rate / base_rate:>5.2f}x",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
