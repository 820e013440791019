"""A named test double of the Isaac Lab DROID env: :class:`IsaacDroidStandIn` (not a simulator).

It has the contract the wrapper and the evaluator see from the Isaac Lab backend, so their Isaac code
paths (torch tensors on a device, 720x1280 views, same-step autoreset at a time-out) can be tested and
benchmarked on any CPU:

- ``obs["policy"]`` holds ``external_cam``, ``external_cam_2``, ``wrist_cam`` ``(N,H,W,3)`` uint8 (720x1280
  by default) and ``arm_joint_pos`` ``(N,7)``, ``gripper_pos`` ``(N,1)`` float32, all torch tensors on
  ``device``;
- ``step(action)`` takes ``(N,8)`` actions (numpy or torch) and returns torch ``reward`` (float32, the
  placement check), ``terminated`` (always False) and ``truncated`` (time-outs) of shape ``(N,)``; envs
  that time out are reset inside the step, so their observation already shows the next episode, while
  ``info`` describes the state the step reached (the keys of :mod:`dz_gym.envs.base`, numpy arrays);
- ``reset(seed=None, env_ids=None, options=None)`` (Isaac Lab 2.2's keywords; ``options={"env_ids": ...}``
  as in the base contract works too), ``episode_length_buf``, ``num_envs``, ``device``,
  ``max_episode_length``, ``unwrapped``; episode bookkeeping (seeds, counters, success at any step,
  milestones, the ``info`` keys) is the shared :class:`~dz_gym.envs.episodes.Episodes` of every backend;
- ``scene[name].data.root_pos_w`` ``(N,3)`` world-frame positions of the scene's object and container
  under their Isaac names (``rubiks_cube``, ``_24_bowl``, ...), ``scene["robot"]``, and
  ``scene.env_origins`` ``(N,3)`` on Isaac Lab's grid; ``scene.prompt`` and the other
  :class:`~dz_gym.envs.droid.SceneSpec` fields are there too.

Behaviour, deterministic and cheap:

- joints follow the commanded targets with a first-order lag (time constant ``joint_tau``), the gripper
  follows the binarized command (``> 0.5`` closes) the same way, clipped to [0, 1];
- the object is placed in the container from episode step ``success_steps[i]`` on (never by default),
  so the shared placement check reports success from then on;
- env ``i`` times out after ``episode_lengths[i]`` steps (default ``max_episode_length``), which lets envs
  finish at different steps;
- every view is a fixed per-env, per-camera background plus a row of grey blocks that encode the env id,
  episode, episode step, camera, first joint and gripper (:func:`decode_stamp` reads them back, also
  from a resized view). Only the blocks are redrawn per step, into a ring of ``obs_buffers`` image
  buffers: an observation's image tensors stay valid for ``obs_buffers - 1`` further steps (or resets);
  copy what you keep longer.

What of Isaac Lab it does not reproduce: physics (no contacts, gravity, grasping or IK; the object moves
only by the success schedule), rendering (no lights, materials or camera models; the render mask is
ignored and every view is redrawn, as the Isaac backend does), the Kit app and its start-up time, the
double reset for materials, the stale first frame after a reset (IsaacLab#6394) and the hold step that
works around it, Isaac Lab 2.2's env-0 proprio bug and its one-term observation space, 3.0's
``ProxyArray`` asset data and ``reset(env_ids=slice)`` signature, ``final_obs``, sim-evals' layouts and
MILA tasks (the test suite's module stand-ins, ``tests/isaac_stubs/``, model those, behind the real
backend), and per-step cost: a
step takes about half a millisecond of CPU at N=8 with 720x1280 views (the views are not rewritten, only
their stamp blocks), so a benchmark of the wrapper on it measures the wrapper.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from dz_gym.envs import droid
from dz_gym.envs.base import BatchedDroidEnv
from dz_gym.envs.episodes import TaskState
from dz_gym.preprocess import padded_geometry, to_numpy

# Grey blocks along the top-left of every view: a marker, then the encoded values (one byte each).
STAMP_MARKER = 0xA5
STAMP_FIELDS = ("marker", "env_id", "episode_hi", "episode_lo", "step_hi", "step_lo", "camera", "joint0", "gripper")
# Env-local start positions (m) of the object and the container; the container stays put.
OBJECT_START = (0.55, 0.12, 0.03)
CONTAINER_POS = (0.55, -0.15, 0.0)
PLACED_OFFSET = (0.0, 0.0, 0.03)  # object centre above the container's origin once placed
TCP_CLEARANCE = 0.25  # the tool centre point's height above a placed object (released)
DEFAULT_SPACING = 30.0  # the Isaac backend's env spacing for N > 1


def stamp_block_size(height: int, width: int) -> int:
    """Side (pixels) of one stamp block in a ``height x width`` view."""
    return max(2, min(height, width * 9 // 16) // 20)


@dataclass(frozen=True)
class Stamp:
    """What a stand-in view shows: the env, episode, step and camera it was drawn for, and its state."""

    env_id: int
    episode: int
    step: int
    camera: int
    joint0_byte: int
    gripper_byte: int


def decode_stamp(image: Any, source_shape: tuple[int, int] | None = None) -> Stamp:
    """Read the stamp of one stand-in view ``(H, W, 3)`` (numpy or torch).

    ``source_shape`` is the size the view was drawn at when ``image`` is a resize-with-pad of it (for
    instance the 180x320 view a request carries). Raises ``ValueError`` if the marker block is missing.
    """
    image = to_numpy(image)
    if image.ndim != 3 or image.shape[-1] != 3:
        raise ValueError(f"image: expected shape (H, W, 3), got {image.shape}")
    height, width = image.shape[:2]
    src_h, src_w = source_shape if source_shape is not None else (height, width)
    if (src_h, src_w) == (height, width):
        new_h, new_w, top, left = height, width, 0, 0
    else:
        new_h, new_w, top, left = padded_geometry(src_h, src_w, height, width)
    block = stamp_block_size(src_h, src_w)
    values = []
    for index in range(len(STAMP_FIELDS)):
        y = top + int((block + 0.5 * block) * new_h / src_h)
        x = left + int((block + index * block + 0.5 * block) * new_w / src_w)
        values.append(int(round(float(image[y, x].astype(np.float64).mean()))))
    fields = dict(zip(STAMP_FIELDS, values))
    if fields["marker"] != STAMP_MARKER:
        raise ValueError(f"image: no stand-in stamp found (marker {fields['marker']}, expected {STAMP_MARKER})")
    return Stamp(
        env_id=fields["env_id"],
        episode=fields["episode_hi"] * 256 + fields["episode_lo"],
        step=fields["step_hi"] * 256 + fields["step_lo"],
        camera=fields["camera"],
        joint0_byte=fields["joint0"],
        gripper_byte=fields["gripper"],
    )


def joint_byte(angle: float) -> int:
    """The stamp byte of a joint angle: [-pi, pi] mapped to [0, 255]."""
    return int(np.clip(np.round((angle + math.pi) / (2 * math.pi) * 255.0), 0, 255))


def isaac_env_origins(num_envs: int, spacing: float):
    """Env origins ``(N,3)`` on Isaac Lab's default grid (rows along -x, columns along +y, centred)."""
    import torch

    rows = math.ceil(num_envs / int(math.sqrt(num_envs)))
    cols = math.ceil(num_envs / rows)
    index = torch.arange(num_envs)
    row, col = index // cols, index % cols
    origins = torch.zeros(num_envs, 3, dtype=torch.float32)
    origins[:, 0] = -(row.to(torch.float32) - (rows - 1) / 2) * spacing
    origins[:, 1] = (col.to(torch.float32) - (cols - 1) / 2) * spacing
    return origins


class _Data:
    """Asset data: torch tensors updated in place as the stand-in steps."""


class StandInAsset:
    """A scene entity: ``.data.root_pos_w`` ``(N,3)`` (world frame) and ``.data.root_lin_vel_w`` ``(N,3)``."""

    def __init__(self, name: str, num_envs: int, device: str):
        import torch

        self.name = name
        self.data = _Data()
        self.data.root_pos_w = torch.zeros(num_envs, 3, dtype=torch.float32, device=device)
        self.data.root_lin_vel_w = torch.zeros(num_envs, 3, dtype=torch.float32, device=device)


class StandInScene:
    """Isaac Lab's ``InteractiveScene`` as far as the evaluator reads it, plus the DROID scene spec.

    ``scene[name]`` returns an entity (the scene's object and container under their Isaac names, and
    ``"robot"``, whose ``data.joint_pos`` is ``(N,8)``: seven arm joints and the finger joint);
    ``env_origins`` is ``(N,3)``; attributes of :class:`~dz_gym.envs.droid.SceneSpec` (``prompt``,
    ``scene_id``, ``success``, ...) are forwarded to the spec.
    """

    def __init__(self, spec: droid.SceneSpec, env_origins, entities: dict[str, StandInAsset]):
        self.spec = spec
        self.env_origins = env_origins
        self._entities = dict(entities)

    def __getitem__(self, name: str) -> StandInAsset:
        try:
            return self._entities[name]
        except KeyError:
            raise KeyError(f"scene entity {name!r}: expected one of {sorted(self._entities)}") from None

    def __contains__(self, name: object) -> bool:
        return name in self._entities

    def keys(self) -> list[str]:
        return list(self._entities)

    def __getattr__(self, name: str):
        if name.startswith("_") or name == "spec":
            raise AttributeError(name)
        return getattr(self.spec, name)


def _per_env(value, num_envs: int, name: str, default: int | None) -> np.ndarray:
    """A per-env integer setting from a scalar, a sequence (None entries: ``default``) or None."""
    if value is None:
        value = default
    if value is None or isinstance(value, (int, np.integer)):
        values = [value] * num_envs
    else:
        values = list(value)
        if len(values) != num_envs:
            raise ValueError(f"{name}: expected {num_envs} values (one per env), got {len(values)}")
    out = np.full(num_envs, -1, dtype=np.int64)
    for i, v in enumerate(values):
        if v is None:
            v = default
        if v is None:
            continue
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 0:
            raise ValueError(f"{name}: expected integers >= 0 or None, got {v!r}")
        out[i] = int(v)
    return out


class IsaacDroidStandIn(BatchedDroidEnv):
    """Test double of the Isaac Lab DROID env (see the module docstring for what it does and does not do).

    Example::

        env = IsaacDroidStandIn(scene=1, num_envs=8, device="cpu", episode_lengths=[40, 60] * 4)
        obs, info = env.reset(seed=0)
        obs, reward, terminated, truncated, info = env.step(actions)  # (8, 8)
        decode_stamp(obs["policy"]["wrist_cam"][3]).env_id  # 3
    """

    def __init__(
        self,
        scene: int = 1,
        num_envs: int = 1,
        *,
        device: str = "cpu",
        image_shape: tuple[int, int] = droid.ISAAC_IMAGE_SHAPE,
        max_episode_length: int = droid.MAX_EPISODE_LENGTH,
        episode_lengths: int | Sequence[int | None] | None = None,
        success_steps: int | Sequence[int | None] | None = None,
        joint_tau: float = 0.1,
        env_spacing: float | None = None,
        obs_buffers: int = 3,
        seed: int | None = None,
    ):
        import torch

        shape = tuple(int(v) for v in image_shape)
        if len(shape) != 2 or min(shape) < 8:
            raise ValueError(f"image_shape: expected (H, W) with H, W >= 8, got {image_shape!r}")
        block = stamp_block_size(*shape)
        if block * (len(STAMP_FIELDS) + 2) > shape[1] or block * 3 > shape[0]:
            raise ValueError(f"image_shape: {shape} is too small for the stamp blocks")
        super().__init__(num_envs, shape, scene, device=str(torch.device(device)), seed=seed)
        if isinstance(max_episode_length, bool) or not isinstance(max_episode_length, (int, np.integer)):
            raise ValueError(f"max_episode_length: expected an integer >= 1, got {max_episode_length!r}")
        if max_episode_length < 1:
            raise ValueError(f"max_episode_length: expected an integer >= 1, got {max_episode_length!r}")
        if not joint_tau > 0:
            raise ValueError(f"joint_tau: expected seconds > 0, got {joint_tau!r}")
        if isinstance(obs_buffers, bool) or not isinstance(obs_buffers, (int, np.integer)) or obs_buffers < 1:
            raise ValueError(f"obs_buffers: expected an integer >= 1, got {obs_buffers!r}")
        self._torch = torch
        self.image_shape = shape
        self.max_episode_length = int(max_episode_length)
        self.episode_lengths = _per_env(episode_lengths, self.num_envs, "episode_lengths", self.max_episode_length)
        if (self.episode_lengths < 1).any():
            raise ValueError("episode_lengths: expected integers >= 1")
        self.success_steps = _per_env(success_steps, self.num_envs, "success_steps", None)
        self.joint_alpha = 1.0 - math.exp(-self.step_dt / float(joint_tau))
        self.spec = droid.scene_spec(scene)
        n, dev = self.num_envs, self.device

        spacing = env_spacing if env_spacing is not None else (DEFAULT_SPACING if n > 1 else 7.0)
        origins = isaac_env_origins(n, float(spacing)).to(dev)
        entities = {
            name: StandInAsset(name, n, dev) for name in (self.spec.isaac_object, self.spec.isaac_container, "robot")
        }
        entities["robot"].data.joint_pos = torch.zeros(n, droid.ARM_DOF + 1, dtype=torch.float32, device=dev)
        self.scene = StandInScene(self.spec, origins, entities)

        self.episode_length_buf = torch.zeros(n, dtype=torch.long, device=dev)
        self._home = torch.tensor(droid.HOME_JOINT_POSITIONS, dtype=torch.float32, device=dev)
        self._joints = self._home.repeat(n, 1)
        self._gripper = torch.zeros(n, 1, dtype=torch.float32, device=dev)
        self._placed = np.zeros(n, dtype=bool)

        self._stamp_block = block
        backgrounds = {camera: self._background(c) for c, camera in enumerate(droid.CAMERA_KEYS)}
        self._frames = [backgrounds] + [
            {camera: image.clone() for camera, image in backgrounds.items()} for _ in range(obs_buffers - 1)
        ]
        self._slot = -1
        self.renders = 0  # views drawn so far (per camera), for tests of the cost

    # -- Gymnasium / Isaac Lab API --------------------------------------------------------------------
    def reset(self, seed: int | None = None, env_ids: Any = None, options: dict[str, Any] | None = None):
        """Reset every env, or those of ``env_ids`` (or ``options["env_ids"]``); returns ``(obs, info)``.

        With ``seed`` the reset envs' episode seeds become ``seed + env_id`` unless seeds were queued with
        :meth:`set_episode_seeds`. The observation is the whole batch; ``info`` describes the state after
        the reset.
        """
        book = self.episodes
        ids, seeds = self._begin_reset(seed, options, env_ids)
        self._reset_envs(ids)
        self._update_scene()
        info = book.record_reset(ids, seeds, self._task_state())
        return self._observe(), info

    def step(self, action):
        """Step every env once with ``(N,8)`` actions; timed-out envs are reset inside the step."""
        self._check_started()
        torch = self._torch
        action = self._torch_action(action)
        target_arm = action[:, : droid.ARM_DOF]
        target_gripper = (action[:, droid.ARM_DOF :] > droid.GRIPPER_CLOSE_THRESHOLD).to(torch.float32)
        self._joints += self.joint_alpha * (target_arm - self._joints)
        self._gripper += self.joint_alpha * (target_gripper - self._gripper)
        self._gripper.clamp_(0.0, 1.0)
        self.episode_length_buf += 1
        book = self.episodes
        step = book.episode_step + 1
        self._placed |= (self.success_steps >= 0) & (step >= self.success_steps)
        self._update_scene()

        lengths = torch.as_tensor(self.episode_lengths, device=self.device)
        truncated = self.episode_length_buf >= lengths
        terminated = torch.zeros(self.num_envs, dtype=torch.bool, device=self.device)
        time_outs = to_numpy(truncated)
        info = book.record_step(self._task_state(), time_outs)
        reward = torch.as_tensor(info["success"], dtype=torch.float32, device=self.device)

        done = np.flatnonzero(time_outs)
        info = self._step_info(info, time_outs)  # Isaac Lab's reset is inside its step: no final_obs
        if done.size:
            book.start(done, book.next_seeds(done))
            self._reset_envs(done)
            self._update_scene()
        return self._observe(), reward, terminated, truncated, info

    def close(self):
        """Release the image buffers; later calls raise."""
        self._closed = True
        self._frames = []

    # -- internals ------------------------------------------------------------------------------------
    def _reset_envs(self, ids: np.ndarray) -> None:
        index = self._torch.as_tensor(ids, dtype=self._torch.long, device=self.device)
        self._joints[index] = self._home
        self._gripper[index] = 0.0
        self.episode_length_buf[index] = 0
        self._placed[ids] = self.success_steps[ids] == 0

    def _local_state(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Env-local object, container and tool-centre positions ``(N,3)`` (float64, host)."""
        n = self.num_envs
        container = np.tile(np.asarray(CONTAINER_POS, dtype=np.float64), (n, 1))
        start = np.tile(np.asarray(OBJECT_START, dtype=np.float64), (n, 1))
        placed = container + np.asarray(PLACED_OFFSET)
        obj = np.where(self._placed[:, None], placed, start)
        tcp = obj + np.array([0.0, 0.0, TCP_CLEARANCE])
        return obj, container, tcp

    def _task_state(self) -> TaskState:
        obj, container, tcp = self._local_state()
        return TaskState(obj, container, tcp, np.zeros(self.num_envs))

    def _update_scene(self) -> None:
        torch = self._torch
        obj, container, _ = self._local_state()
        origins = self.scene.env_origins

        def as_tensor(array):
            return torch.as_tensor(array, dtype=torch.float32, device=self.device)

        self.scene[self.spec.isaac_object].data.root_pos_w.copy_(as_tensor(obj) + origins)
        self.scene[self.spec.isaac_container].data.root_pos_w.copy_(as_tensor(container) + origins)
        robot = self.scene["robot"].data
        robot.root_pos_w.copy_(origins)
        robot.joint_pos[:, : droid.ARM_DOF] = self._joints
        robot.joint_pos[:, droid.ARM_DOF] = self._gripper[:, 0] * (math.pi / 4)

    def _background(self, camera: int):
        """``(N,H,W,3)`` uint8 background of one camera: a smooth textured pattern, tinted per env."""
        height, width = self.image_shape
        v = np.linspace(0.0, 1.0, height, dtype=np.float32)[:, None]
        u = np.linspace(0.0, 1.0, width, dtype=np.float32)[None, :]
        phase = 0.21 * camera
        texture = 8.0 * np.sin(0.9 * u * width) * np.sin(0.7 * v * height)
        base = np.stack(
            np.broadcast_arrays(
                70.0 + 110.0 * u + 20.0 * np.sin(6.283 * (v + phase)),
                90.0 + 90.0 * v + 30.0 * np.sin(6.283 * (u + phase)),
                110.0 + 60.0 * np.cos(6.283 * (2.0 * v + phase)) + texture,
            ),
            axis=-1,
        ).astype(np.int16)
        env = np.arange(self.num_envs)
        tint = np.stack([(env * 37) % 61, (env * 23 + 11) % 47, (env * 53 + 29) % 71], axis=1) - 30  # (N, 3)
        image = np.empty((self.num_envs, height, width, 3), dtype=np.uint8)
        for i in range(self.num_envs):
            image[i] = np.clip(base + tint[i].astype(np.int16), 0, 255)
        return self._torch.from_numpy(image).to(self.device)

    def _stamp_values(self):
        """``(N, fields)`` uint8 block values of the current state; the camera column is filled per view."""
        n = self.num_envs
        episode = np.maximum(self.episodes.episode_count - 1, 0) % 65536
        step = to_numpy(self.episode_length_buf) % 65536
        joint0 = to_numpy(self._joints[:, 0])
        gripper = to_numpy(self._gripper[:, 0])
        columns = [
            np.full(n, STAMP_MARKER),
            np.arange(n) % 256,
            episode // 256,
            episode % 256,
            step // 256,
            step % 256,
            np.zeros(n),
            np.clip(np.round((joint0.astype(np.float64) + math.pi) / (2 * math.pi) * 255.0), 0, 255),
            np.clip(np.round(gripper * 255.0), 0, 255),
        ]
        return np.stack([np.asarray(c, dtype=np.int64) for c in columns], axis=1).astype(np.uint8)

    def _observe(self) -> dict[str, dict[str, Any]]:
        """Draw the stamps into the next ring slot and return the observation dict."""
        torch = self._torch
        self._slot = (self._slot + 1) % len(self._frames)
        frames = self._frames[self._slot]
        block = self._stamp_block
        fields = len(STAMP_FIELDS)
        values = self._stamp_values()
        camera_column = STAMP_FIELDS.index("camera")
        on_cpu = self.device.startswith("cpu")
        for c, camera in enumerate(droid.CAMERA_KEYS):
            values[:, camera_column] = c
            row = np.repeat(np.repeat(values, block, axis=1)[:, :, None], 3, axis=2)  # (N, fields*block, 3)
            region = (slice(None), slice(block, 2 * block), slice(block, block + fields * block))
            if on_cpu:  # numpy writes through the tensor's memory: torch's broadcast copy is far slower here
                frames[camera].numpy()[region] = row[:, None]
            else:
                frames[camera][region] = torch.as_tensor(row, device=self.device)[:, None]
        self.renders += 1
        policy = {camera: frames[camera] for camera in droid.CAMERA_KEYS}
        policy[droid.OBS_JOINT_KEY] = self._joints.clone()
        policy[droid.OBS_GRIPPER_KEY] = self._gripper.clone()
        return {droid.POLICY_GROUP: policy}
