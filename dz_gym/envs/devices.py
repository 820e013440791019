"""Which GPU a process simulates and renders on, from the GPU ids a scheduler gave it (pure; no GPU library).

A Ray actor given GPUs learns their ids from ``ray.get_gpu_ids()`` (the ids of the node, e.g. ``[2]``) and runs
with ``CUDA_VISIBLE_DEVICES`` set by Ray to those ids, so that CUDA numbers them from 0 (``cuda:0`` is
physical GPU 2). :func:`pin_gpu` turns the ids into what each library needs to use the first of them:

- **CUDA (torch, Isaac Lab, Newton)**: the device ``cuda:k``, where ``k`` is the position of that GPU in
  ``CUDA_VISIBLE_DEVICES`` (0 under Ray), or the id itself when the variable is unset (Ray was told not to
  set it). Isaac Lab 3.0's Kit launcher passes the same index to PhysX (``/physics/cudaDevice``, a CUDA index)
  and to the renderer (``/renderer/multiGpu/activeCudaGpus``), so the whole simulator stays on that GPU; the
  camera tensors live there and the batched preprocessing runs on the tensors' device.
- **MuJoCo's EGL rendering**: ``MUJOCO_EGL_DEVICE_ID``, read by ``mujoco.egl`` when it opens its display (the
  first GL context of a process; the env's worker processes inherit it). MuJoCo 3.x indexes *all* EGL devices
  in the driver's order and ignores ``CUDA_VISIBLE_DEVICES``: without the variable every process renders on
  EGL device 0. MuJoCo 4.0 maps EGL devices to CUDA ids where the driver says which is which (NVIDIA's
  ``EGL_NV_device_cuda``), orders them as ``CUDA_VISIBLE_DEVICES`` does and accepts either an index among the
  visible GPUs or a CUDA id in the list; without that mapping it indexes all devices, as 3.x does. With one
  visible GPU, the id Ray gave selects it: mapped 4.0 finds it in ``CUDA_VISIBLE_DEVICES`` (exact); 3.x and
  unmapped 4.0 take it as the EGL index, the same GPU where the driver lists its EGL devices in CUDA's order
  (not checked on a multi-GPU host). A process that renders with MuJoCo therefore uses one GPU
  (:data:`MAX_RENDER_GPUS`).

Ids that are not integers (GPU UUIDs in ``CUDA_VISIBLE_DEVICES``) give no EGL index: then MuJoCo keeps its
own choice, which MuJoCo 4.0 still bases on ``CUDA_VISIBLE_DEVICES`` where it can.

>>> pin = pin_gpu(["2"], cuda_visible="2")
>>> pin.gpu, pin.cuda_device, pin.environ
('2', 'cuda:0', {'MUJOCO_EGL_DEVICE_ID': '2'})
>>> pin_gpu([], cuda_visible=None) == NO_GPU
True
>>> place_device("cuda:3", pin), place_device("cpu", pin), place_device(None, pin)
('cuda:0', 'cpu', 'cuda:0')
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Mapping, Sequence

EGL_DEVICE_ENV = "MUJOCO_EGL_DEVICE_ID"
MAX_RENDER_GPUS = 1.0  # MuJoCo renders a process's views on one EGL device


@dataclasses.dataclass(frozen=True)
class GpuPin:
    """Where a process runs: ``gpu`` (the scheduler's id of its GPU, for rows; None without one), the torch
    device of that GPU in this process (``cuda_device``) and the environment variables that put rendering
    there (``environ``)."""

    gpu: str | None = None
    cuda_device: str | None = None
    environ: Mapping[str, str] = dataclasses.field(default_factory=dict)


NO_GPU = GpuPin()


def pin_gpu(gpu_ids: Sequence[int | str], cuda_visible: str | None) -> GpuPin:
    """The :class:`GpuPin` of the first of ``gpu_ids`` for a process whose ``CUDA_VISIBLE_DEVICES`` is
    ``cuda_visible`` (None: unset); :data:`NO_GPU` when ``gpu_ids`` is empty."""
    ids = [str(g).strip() for g in gpu_ids if str(g).strip()]
    if not ids:
        return NO_GPU
    first = ids[0]
    visible = None if cuda_visible is None else [v.strip() for v in cuda_visible.split(",") if v.strip()]
    if visible is not None and first in visible:
        index: int | None = visible.index(first)
    elif visible is None and first.isdigit():
        index = int(first)
    else:
        index = None  # CUDA does not see it under this name: let the libraries choose
    environ = {EGL_DEVICE_ENV: first} if first.isdigit() else {}
    return GpuPin(gpu=",".join(ids), cuda_device=None if index is None else f"cuda:{index}", environ=environ)


def place_device(device: str | None, pin: GpuPin) -> str | None:
    """The torch device a simulator should use when asked for ``device`` in a process pinned to ``pin``: a CUDA
    device (``cuda``, ``cuda:N``, or none named) becomes the pinned GPU's; ``cpu`` (or no pinned GPU) stays."""
    if pin.cuda_device is None:
        return device
    if device is None or str(device) == "cuda" or str(device).startswith("cuda:"):
        return pin.cuda_device
    return device


def place_options(options, name: str, pin: GpuPin):
    """``options`` (a namespace of launcher flags, e.g. Isaac Lab's, or a dict of env keywords) with its
    device entry ``name`` moved by :func:`place_device`; the same object when there is nothing to move (a copy
    otherwise: the caller's stays as given)."""
    if not name or options is None or pin.cuda_device is None:
        return options
    if isinstance(options, dict):
        return {**options, name: place_device(options[name], pin)} if name in options else options
    if not hasattr(options, name):
        return options
    moved = copy.copy(options)
    setattr(moved, name, place_device(getattr(options, name), pin))
    return moved
