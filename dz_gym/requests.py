"""Observation adapter: batched DROID observations -> a policy server's infer requests (pure, no I/O).

Takes ``obs["policy"]`` of a batched env (numpy arrays or torch tensors on any device), picks the envs that
need a chunk, resizes their three views to the server's ``image_resolution`` in one batched call per camera
(on the tensors' device, before any host copy), and builds exactly the reference client's request per env:
external_cam -> exterior_image_0_left, external_cam_2 -> exterior_image_1_left, wrist_cam -> wrist_image_left,
joint and gripper positions as float64, zero cartesian position, prompt, session id, endpoint "infer".
Other servers' requests follow their profile (:mod:`dz_gym.protocol.profiles`): its keys, its 360x640 views
or one composite, its state vector.

:func:`compose_views` and :func:`composite_of` (:mod:`dz_gym.protocol.composite`, here for the adapter's
callers) build FLUX 3 Action's 540x640 composite from three 360x640 views (numpy or torch, on the tensors'
device): the wrist view on top, the two exteriors below at half size, left then right.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from dz_gym.envs import droid
from dz_gym.preprocess import is_torch_tensor, resize_with_pad, to_numpy
from dz_gym.protocol.composite import compose_views, composite_of
from dz_gym.protocol.profiles import PROFILES, ServerProfile
from dz_gym.protocol.request_batch import RequestBatch

__all__ = ["assemble_requests", "build_requests", "compose_views", "composite_of", "contiguous_runs", "hold_actions", "profile_image_keys", "is_torch_tensor", "proprio", "resized_views", "views_bytes",
           "resolve_prompts", "to_numpy", "validate_policy_obs", "checked_actions", "env_actions"]  # fmt: skip


def validate_policy_obs(policy: Mapping[str, Any], num_envs: int) -> None:
    """Check ``obs["policy"]`` against the DROID contract; one-line ``ValueError`` naming the field."""
    if not isinstance(policy, Mapping):
        raise ValueError(f"obs['policy']: expected a mapping of observation terms, got {type(policy).__name__}")
    for key in droid.CAMERA_KEYS:
        if key not in policy:
            raise ValueError(f"obs['policy']['{key}']: missing (expected (N,H,W,3) uint8 images)")
        shape = tuple(policy[key].shape)
        if len(shape) != 4 or shape[0] != num_envs or shape[3] != 3:
            raise ValueError(f"obs['policy']['{key}']: expected shape ({num_envs}, H, W, 3), got {shape}")
        dtype = str(policy[key].dtype)
        if "uint8" not in dtype:
            raise ValueError(f"obs['policy']['{key}']: expected dtype uint8, got {dtype}")
    for key, width in ((droid.OBS_JOINT_KEY, droid.ARM_DOF), (droid.OBS_GRIPPER_KEY, 1)):
        if key not in policy:
            raise ValueError(f"obs['policy']['{key}']: missing (expected ({num_envs}, {width}))")
        shape = tuple(policy[key].shape)
        if shape != (num_envs, width):
            raise ValueError(f"obs['policy']['{key}']: expected shape ({num_envs}, {width}), got {shape}")


def proprio(policy: Mapping[str, Any]) -> tuple[np.ndarray, np.ndarray]:
    """Joint ``(N,7)`` and gripper ``(N,1)`` positions as host float64 arrays."""
    joints = to_numpy(policy[droid.OBS_JOINT_KEY]).astype(np.float64)
    gripper = to_numpy(policy[droid.OBS_GRIPPER_KEY]).astype(np.float64)
    return joints, gripper


def contiguous_runs(env_ids: Sequence[int]) -> list[tuple[int, int]]:
    """Sorted ``env_ids`` as half-open ``(start, stop)`` runs of consecutive ids."""
    runs: list[tuple[int, int]] = []
    for env_id in sorted(int(i) for i in env_ids):
        if runs and runs[-1][1] == env_id:
            runs[-1] = (runs[-1][0], env_id + 1)
        else:
            runs.append((env_id, env_id + 1))
    return runs


HostMemory = Callable[[int], "np.ndarray | None"]
"""Where GPU views may be copied to: ``nbytes`` -> a writable uint8 array of that size, or None (no room);
e.g. :meth:`dz_gym.transport.workers.views.HostViews.alloc`, memory the transport's workers read directly."""


def resized_views(
    policy: Mapping[str, Any],
    env_ids: Sequence[int],
    image_resolution: tuple[int, int] | None,
    *,
    host_memory: HostMemory | None = None,
) -> dict[str, np.ndarray]:
    """The three views of ``env_ids`` (in sorted order), resized with pad to ``image_resolution``.

    Full-resolution images are never gathered: each run of consecutive env ids is resized through a slice
    (a view of the batch, on its device). GPU tensors stay there until every camera's part is ready, then go
    to the host in one transfer (:func:`_to_host`): a single synchronisation, into ``host_memory`` where it
    has room, else into page-locked memory of this process. Host views go into ``host_memory`` too where
    it has room (one copy of the batch, which a transport in another process would otherwise make of each
    request); without it they are the arrays themselves.
    """
    runs = contiguous_runs(env_ids)
    parts: dict[str, list[Any]] = {}
    for camera in droid.CAMERA_KEYS:
        batch = policy[camera]
        blocks = []
        for start, stop in runs:
            block = batch[start:stop]
            if image_resolution is not None:
                block = resize_with_pad(block, int(image_resolution[0]), int(image_resolution[1]))
            blocks.append(block)
        parts[camera] = blocks
    if any(getattr(block, "is_cuda", False) for blocks in parts.values() for block in blocks):
        return _to_host(parts, host_memory)
    if host_memory is not None and (gathered := _gather(parts, host_memory)) is not None:
        return gathered
    return {camera: to_numpy(blocks[0]) if len(blocks) == 1 else np.concatenate([to_numpy(b) for b in blocks])
            for camera, blocks in parts.items()}  # fmt: skip


def views_bytes(policy: Mapping[str, Any], image_resolution: tuple[int, int] | None) -> int:
    """Bytes of every env's three views as :func:`resized_views` returns them (a full request round's), from
    the batch's shapes alone (nothing is read or copied)."""
    total = 0
    for camera in droid.CAMERA_KEYS:
        batch = policy[camera]
        num, height, width, channels = (int(d) for d in batch.shape[-4:])
        if image_resolution is not None:
            height, width = int(image_resolution[0]), int(image_resolution[1])
        itemsize = batch.element_size() if is_torch_tensor(batch) else batch.dtype.itemsize
        total += num * height * width * channels * itemsize
    return total


def space_views_bytes(observation_space: Any, image_resolution: tuple[int, int] | None) -> int:
    """:func:`views_bytes` of a batched observation space (its ``policy`` group's camera boxes), 0 where the
    space has no such views (an env whose space does not say them)."""
    try:
        return views_bytes(observation_space[droid.POLICY_GROUP], image_resolution)
    except (KeyError, TypeError, AttributeError, ValueError, IndexError):
        return 0


def _layout(parts: Mapping[str, Sequence[Any]]) -> tuple[dict[str, tuple[int, ...]], dict[str, int]]:
    """Each camera's stacked shape and element count."""
    shapes = {camera: (sum(int(b.shape[0]) for b in blocks), *blocks[0].shape[1:]) for camera, blocks in parts.items()}
    return shapes, {camera: int(np.prod(shape)) for camera, shape in shapes.items()}


def _gather(parts: Mapping[str, Sequence[Any]], host_memory: HostMemory) -> dict[str, np.ndarray] | None:
    """Host views (numpy arrays or host tensors) copied into one block of ``host_memory``, each camera's
    rows one C-contiguous view of it; None when it has no room. The copy a transport in another process
    would otherwise make of each request, made once here for the batch."""
    shapes, sizes = _layout(parts)
    first = to_numpy(next(iter(parts.values()))[0])
    total = sum(sizes.values())
    block = host_memory(total * first.dtype.itemsize) if total > 0 else None
    if block is None:
        return None
    block = block.view(first.dtype)
    out, offset = {}, 0
    for camera, blocks in parts.items():
        target = block[offset : offset + sizes[camera]].reshape(shapes[camera])
        row = 0
        for part in blocks:
            array = to_numpy(part)
            np.copyto(target[row : row + array.shape[0]], array)
            row += array.shape[0]
        out[camera] = target
        offset += sizes[camera]
    return out


def _to_host(parts: Mapping[str, Sequence[Any]], host_memory: HostMemory | None = None) -> dict[str, np.ndarray]:
    """Each camera's GPU blocks as one host array, all cameras in one buffer and one transfer.

    The buffer is one block of ``host_memory`` when it gives one (memory the transport's workers read, so
    that this copy is the caller's only one), else a fresh page-locked buffer (PyTorch's host allocator
    reuses such buffers once the arrays that view them are gone). The blocks are copied asynchronously and
    waited for once. The arrays returned are views of that buffer (each C-contiguous; each keeps the buffer
    alive). Host tensors do not come here from :func:`resized_views`: their arrays are the tensors' own
    memory (a copy through torch would also wake its intra-op threads)."""
    import torch

    first = next(iter(parts.values()))[0]
    shapes, sizes = _layout(parts)
    total = sum(sizes.values())
    dtype = np.dtype(str(first.dtype).removeprefix("torch."))
    shared = host_memory(total * dtype.itemsize) if host_memory is not None and total > 0 else None
    if shared is not None:
        shared = shared.view(dtype)
        host = torch.from_numpy(shared)
    else:
        host = torch.empty(total, dtype=first.dtype, pin_memory=bool(getattr(first, "is_cuda", False)))
    out, offset = {}, 0
    for camera, blocks in parts.items():
        target = host[offset : offset + sizes[camera]].view(shapes[camera])
        row = 0
        for block in blocks:
            rows = int(block.shape[0])
            target[row : row + rows].copy_(block, non_blocking=True)
            row += rows
        out[camera] = (offset, target)
        offset += sizes[camera]
    if getattr(first, "is_cuda", False):
        torch.cuda.current_stream(first.device).synchronize()
    if shared is not None:  # views of the block itself, which release it when the last of them goes
        return {camera: shared[start : start + sizes[camera]].reshape(shapes[camera])
                for camera, (start, _) in out.items()}  # fmt: skip
    return {camera: tensor.numpy() for camera, (_, tensor) in out.items()}


def profile_image_keys(profile: ServerProfile | None, env_keys: Mapping[str, str] | None) -> dict[str, str]:
    """Each camera's request key for ``profile`` (None: DreamZero's), given the env's own mapping ``env_keys``
    (camera -> DreamZero key, or None): the env says which camera is which view, the profile how it is named.

    >>> profile_image_keys(PROFILES["sglang"], None)["wrist_cam"]
    'observation.images.wrist'
    >>> swapped = {"external_cam": "observation/exterior_image_1_left", "external_cam_2": "observation/exterior_image_0_left",
    ...            "wrist_cam": "observation/wrist_image_left"}
    >>> profile_image_keys(PROFILES["sglang"], swapped)["external_cam"]
    'observation.images.right'
    """
    dreamzero = PROFILES["dreamzero"].camera_keys
    if profile is None:
        return dict(dreamzero if env_keys is None else env_keys)
    names = profile.camera_keys
    if env_keys is None:
        return names
    slot = {key: camera for camera, key in dreamzero.items()}  # DreamZero key -> the view it stands for
    return {camera: names[slot[key]] for camera, key in env_keys.items()}


def assemble_requests(
    views: Mapping[str, np.ndarray],
    joints: np.ndarray,
    gripper: np.ndarray,
    env_ids: Sequence[int],
    *,
    prompts: Sequence[str],
    session_ids: Sequence[str],
    image_keys: Mapping[str, str] | None = None,
    profile: ServerProfile | None = None,
) -> RequestBatch:
    """The requests of ``env_ids`` from their host views (rows in sorted id order, as :func:`resized_views`
    returns them) and every env's ``joints``/``gripper`` (indexed by env id), as a :class:`RequestBatch`
    (env id -> request dict, made when asked for; checked now); see :func:`build_requests`."""
    image_keys = profile_image_keys(profile, image_keys)
    return RequestBatch(views, joints, gripper, env_ids, prompts=prompts, session_ids=session_ids,
                        image_keys={camera: image_keys[camera] for camera in droid.CAMERA_KEYS},
                        profile=profile)  # fmt: skip


def build_requests(
    policy: Mapping[str, Any],
    env_ids: Sequence[int],
    *,
    prompts: Sequence[str],
    session_ids: Sequence[str],
    image_resolution: tuple[int, int] | None,
    image_keys: Mapping[str, str] | None = None,
    host_memory: HostMemory | None = None,
    profile: ServerProfile | None = None,
) -> Mapping[int, dict]:
    """Infer requests for ``env_ids`` (keyed by env id); ``prompts``/``session_ids`` are indexed by env id.

    ``image_keys`` maps each camera to its DreamZero request key (default ``droid.REQUEST_IMAGE_KEYS``; an
    env whose task sends another camera as the first exterior view says so with its ``request_image_keys``);
    ``profile`` is the server's (:mod:`dz_gym.protocol.profiles`; None: DreamZero's), which names the keys.
    ``host_memory``: where GPU views are copied to (:func:`resized_views`)."""
    if len(env_ids) == 0:
        return {}
    views = resized_views(policy, env_ids, image_resolution, host_memory=host_memory)
    joints, gripper = proprio(policy)
    return assemble_requests(views, joints, gripper, env_ids, prompts=prompts, session_ids=session_ids,
                             image_keys=image_keys, profile=profile)  # fmt: skip


def hold_actions(policy: Mapping[str, Any]) -> np.ndarray:
    """``(N, 8)`` float32 actions that hold every arm where it is and keep the gripper's current state."""
    joints, gripper = proprio(policy)
    out = np.empty((joints.shape[0], droid.ACTION_DIM), dtype=np.float32)
    out[:, : droid.ARM_DOF] = joints
    out[:, -1] = (gripper[:, 0] > droid.GRIPPER_CLOSE_THRESHOLD).astype(np.float32)
    return out


def resolve_prompts(prompt: str | Sequence[str] | None, env: Any, num_envs: int) -> list[str]:
    """One prompt per env: ``prompt`` (one string, or one per env), else the env's scene prompt."""
    if prompt is None:
        scene = getattr(env.unwrapped, "scene", None)
        if not isinstance(getattr(scene, "prompt", None), str):
            raise ValueError("prompt: the env has no scene prompt; pass prompt='...'")
        return [scene.prompt] * num_envs
    if isinstance(prompt, str):
        return [prompt] * num_envs
    prompts = list(prompt)
    if len(prompts) != num_envs or not all(isinstance(p, str) for p in prompts):
        raise ValueError(f"prompt: expected a string or {num_envs} strings, got {prompt!r}")
    return prompts


def checked_actions(action: Any, num_envs: int) -> np.ndarray:
    """A caller's ``(num_envs, 8)`` action as float32; one-line ``ValueError`` for another shape."""
    array = to_numpy(action).astype(np.float32, copy=False)
    if array.shape != (num_envs, droid.ACTION_DIM):
        raise ValueError(f"action: expected shape ({num_envs}, {droid.ACTION_DIM}), got {array.shape}")
    return array


def env_actions(actions: np.ndarray, policy: Mapping[str, Any]) -> Any:
    """``actions`` in the env's own array type: a float32 torch tensor on the device of its joint
    observation when the env is torch-based (Isaac Lab), else the numpy array itself."""
    reference = policy[droid.OBS_JOINT_KEY]
    if is_torch_tensor(reference):
        import torch

        return torch.as_tensor(actions, dtype=torch.float32, device=reference.device)
    return actions
