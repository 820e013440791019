"""A group of embedded DROID envs stepped and rendered by one process (a worker, or the caller itself).

All envs of a group share one compiled ``MjModel`` (the scene's geometry is fixed; randomization only
moves the object and container) and one :class:`~dz_gym.envs.mujoco.render.BatchRenderer` (every view the
step needs is drawn, then read back at once); each env has its own ``MjData``. The group
reads its commands from and writes its results into a :class:`Buffers` set of arrays with a leading
env axis over the whole batch (plain numpy in-process, shared memory across processes), touching only its
own slice ``[start, stop)``, so the env's main process never copies per-env data through pipes.

Per env and per command the op is one of ``STEP``, ``STEP_THEN_RESET`` (a time-out: the "info" arrays get
the state the step reached, everything else the next episode's first state), ``RESET`` or ``SKIP``.
An env renders where its ``render`` flag is set, and at every ``RESET``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import mujoco
import numpy as np

from dz_gym.envs import droid
from dz_gym.envs.mujoco import gl, robot, scene
from dz_gym.envs.mujoco.cameras import CAMERA_NAMES

STEP, STEP_THEN_RESET, RESET, SKIP = 0, 1, 2, 3
SETTLE_SUBSTEPS = scene.SUBSTEPS  # physics run after placing the objects, before the first observation

# Table region where a nudged object may land (env-local xy, metres).
NUDGE_X_RANGE = (0.30, 0.80)
NUDGE_Y_RANGE = (-0.45, 0.45)
DROP_OFFSET = 0.10


def buffer_fields(num_envs: int, image_shape: tuple[int, int]) -> dict[str, tuple[tuple[int, ...], str]]:
    """Name -> (shape, dtype) of every array the main process and the groups share."""
    n = num_envs
    height, width = image_shape
    fields: dict[str, tuple[tuple[int, ...], str]] = {
        # commands (main -> group)
        "op": ((n,), "u1"),
        "action": ((n, droid.ACTION_DIM), "f8"),
        "seed": ((n,), "i8"),
        "render": ((n,), "u1"),
        # state reached by the step, before any autoreset (group -> main)
        "info_object_pos": ((n, 3), "f8"),
        "info_object_quat": ((n, 4), "f8"),
        "info_container_pos": ((n, 3), "f8"),
        "info_object_speed": ((n,), "f8"),
        "info_tcp_pos": ((n, 3), "f8"),
        # current state, after any autoreset
        "joint_pos": ((n, droid.ARM_DOF), "f8"),
        "gripper_pos": ((n,), "f8"),
        "object_pos": ((n, 3), "f8"),
        "object_quat": ((n, 4), "f8"),
        "object_linvel": ((n, 3), "f8"),
        "container_pos": ((n, 3), "f8"),
        "container_quat": ((n, 4), "f8"),
        "tcp_pos": ((n, 3), "f8"),
        "tcp_rot": ((n, 3, 3), "f8"),
        "fresh": ((n,), "u1"),
    }
    for name in CAMERA_NAMES:
        fields[name] = ((n, height, width, 3), "u1")
    return fields


@dataclass(frozen=True)
class GroupConfig:
    """What a group needs to build its envs (picklable: it crosses into worker processes)."""

    scene: int
    start: int
    stop: int
    image_shape: tuple[int, int]
    randomization: scene.Randomization
    render: bool = True
    multisamples: int = 0


class EnvGroup:
    """Envs ``[start, stop)`` of a batch: physics, resets, perturbations and rendering into ``arrays``."""

    def __init__(self, config: GroupConfig, arrays: dict[str, np.ndarray]):
        self.config = config
        self.arrays = arrays
        self.scene_id = droid.scene_spec(config.scene).scene_id
        self.layout_spec = scene.LAYOUTS[self.scene_id]
        self.model = scene.build_model(self.scene_id, config.image_shape, config.multisamples)
        self.datas = [mujoco.MjData(self.model) for _ in range(config.stop - config.start)]
        self.index = robot.RobotIndex(self.model)
        model = self.model
        self.object_body = model.body(scene.OBJECT_BODY).id
        self.container_body = model.body(scene.CONTAINER_BODY).id
        self.object_qpos = model.joint(f"{scene.OBJECT_BODY}_free").qposadr[0]
        self.object_dof = model.joint(f"{scene.OBJECT_BODY}_free").dofadr[0]
        self.container_qpos = model.joint(f"{scene.CONTAINER_BODY}_free").qposadr[0]
        self.container_dof = model.joint(f"{scene.CONTAINER_BODY}_free").dofadr[0]
        self.camera_ids = [model.camera(name).id for name in CAMERA_NAMES]
        self.separation = scene.min_separation(self.scene_id, config.randomization)
        self.perturb_rngs: list[np.random.Generator | None] = [None] * len(self.datas)
        self.renderer = None
        if config.render:
            views = len(CAMERA_NAMES) * len(self.datas)
            self.renderer = gl.create_renderer(model, *config.image_shape, max_views=views)
            self._warm_up()

    def _warm_up(self) -> None:
        """Render every camera once at start-up: a GL context's first frames pay for uploading meshes and
        textures and compiling shaders, which would otherwise land on the first ``reset`` (measured: the
        first reset of 64 envs took ~1.8x a later one). Workers start in parallel, so this overlaps."""
        data = mujoco.MjData(self.model)
        mujoco.mj_forward(self.model, data)
        scratch = np.empty((*self.config.image_shape, 3), dtype=np.uint8)
        self.renderer.render([(data, camera_id, scratch) for camera_id in self.camera_ids])

    def close(self) -> None:
        if self.renderer is not None:
            self.renderer.close()
            self.renderer = None

    # ----------------------------------------------------------------------------------------- commands
    def run(self) -> None:
        """Apply the ``op`` of each env of the group, then render the envs that need it."""
        a = self.arrays
        to_render = []
        for local, data in enumerate(self.datas):
            env = self.config.start + local
            op = int(a["op"][env])
            if op == SKIP:
                continue
            if op in (STEP, STEP_THEN_RESET):
                self._step(data, a["action"][env])
                self._write_info(env, data)
            if op in (STEP_THEN_RESET, RESET):
                self._reset(local, data, int(a["seed"][env]))
                if op == RESET:
                    self._write_info(env, data)
            self._write_state(env, data)
            if op == RESET or a["render"][env]:  # a time-out renders as its render flag says (views_to_render)
                to_render.append(local)
        fresh = a["fresh"]
        fresh[self.config.start : self.config.stop] = 0
        self._render(to_render)
        for local in to_render:
            fresh[self.config.start + local] = 1

    def perturb(self, env: int, kind: str, distance: float | None = None) -> bool:
        """Perturb env ``env`` (batch index): "nudge" the resting object or "drop" it from the gripper."""
        local = env - self.config.start
        data = self.datas[local]
        rng = self.perturb_rngs[local]
        if kind == "nudge":
            applied = self._nudge(data, rng, 0.04 if distance is None else distance)
        elif kind == "drop":
            applied = self._drop(data, DROP_OFFSET if distance is None else distance)
        else:
            raise ValueError(f"kind: expected 'nudge' or 'drop', got {kind!r}")
        if applied:
            mujoco.mj_forward(self.model, data)
            self._write_state(env, data)
        return applied

    # ------------------------------------------------------------------------------------------ physics
    def _step(self, data: mujoco.MjData, action: np.ndarray) -> None:
        idx = self.index
        data.ctrl[idx.arm_ctrl] = np.clip(action[: droid.ARM_DOF], idx.ctrl_lower, idx.ctrl_upper)
        close = action[droid.ARM_DOF] > droid.GRIPPER_CLOSE_THRESHOLD
        data.ctrl[idx.gripper_ctrl] = robot.GRIPPER_CTRL_CLOSED if close else 0.0
        mujoco.mj_step(self.model, data, nstep=scene.SUBSTEPS)
        self._sync_poses(data)

    def _sync_poses(self, data: mujoco.MjData) -> None:
        # mj_step leaves body/site/camera poses one substep behind qpos; bring them up to date.
        mujoco.mj_kinematics(self.model, data)
        mujoco.mj_camlight(self.model, data)

    def _reset(self, local: int, data: mujoco.MjData, seed: int) -> None:
        model, idx = self.model, self.index
        seed_u64 = int(np.int64(seed).view(np.uint64))
        layout = scene.sample_layout(self.scene_id, np.random.default_rng(seed_u64), self.config.randomization)
        self.perturb_rngs[local] = np.random.default_rng([seed_u64, 1])
        mujoco.mj_resetData(model, data)
        data.qpos[idx.arm_qpos] = robot.HOME
        data.ctrl[idx.arm_ctrl] = robot.HOME
        data.ctrl[idx.gripper_ctrl] = 0.0
        oq, cq = self.object_qpos, self.container_qpos
        data.qpos[oq : oq + 3] = (*layout.object_xy, self.layout_spec.object_rest_z)
        data.qpos[oq + 3 : oq + 7] = scene.yaw_quat(layout.object_yaw)
        data.qpos[cq : cq + 3] = (*layout.container_xy, 0.0)
        data.qpos[cq + 3 : cq + 7] = scene.yaw_quat(layout.container_yaw)
        mujoco.mj_forward(model, data)
        mujoco.mj_step(model, data, nstep=SETTLE_SUBSTEPS)
        self._sync_poses(data)
        data.time = 0.0

    def _object_held(self, data: mujoco.MjData) -> bool:
        near = np.linalg.norm(data.xpos[self.object_body] - data.site_xpos[self.index.tcp_site]) < 0.06
        closed = self.index.gripper_position(data.qpos) > 0.2
        return bool(near and closed)

    def _nudge(self, data: mujoco.MjData, rng: np.random.Generator, distance: float) -> bool:
        oq, od = self.object_qpos, self.object_dof
        resting = data.qpos[oq + 2] < self.layout_spec.object_rest_z + 0.01
        if not resting or self._object_held(data):
            return False
        here = data.qpos[oq : oq + 2].copy()
        container = data.xpos[self.container_body][:2]
        start = rng.uniform(-math.pi, math.pi)
        for k in range(12):  # try directions around the circle until one keeps clear of the container
            angle = start + k * (2 * math.pi / 12)
            target = here + distance * np.array([math.cos(angle), math.sin(angle)])
            inside = (
                NUDGE_X_RANGE[0] <= target[0] <= NUDGE_X_RANGE[1] and NUDGE_Y_RANGE[0] <= target[1] <= NUDGE_Y_RANGE[1]
            )
            if inside and np.linalg.norm(target - container) >= self.separation:
                data.qpos[oq : oq + 2] = target
                data.qvel[od : od + 6] = 0.0
                return True
        return False

    def _drop(self, data: mujoco.MjData, distance: float) -> bool:
        if not self._object_held(data):
            return False
        oq, od = self.object_qpos, self.object_dof
        tcp = data.site_xpos[self.index.tcp_site]
        away = tcp[:2] - data.xpos[self.container_body][:2]
        norm = np.linalg.norm(away)
        direction = away / norm if norm > 1e-6 else np.array([0.0, -1.0])
        data.qpos[oq : oq + 2] = tcp[:2] + distance * direction
        data.qvel[od : od + 6] = 0.0
        return True

    # ------------------------------------------------------------------------------------------ outputs
    def _write_info(self, env: int, data: mujoco.MjData) -> None:
        a, od = self.arrays, self.object_dof
        a["info_object_pos"][env] = data.xpos[self.object_body]
        a["info_object_quat"][env] = data.xquat[self.object_body]
        a["info_container_pos"][env] = data.xpos[self.container_body]
        a["info_object_speed"][env] = np.linalg.norm(data.qvel[od : od + 3])
        a["info_tcp_pos"][env] = data.site_xpos[self.index.tcp_site]

    def _write_state(self, env: int, data: mujoco.MjData) -> None:
        a, idx, od = self.arrays, self.index, self.object_dof
        a["joint_pos"][env] = data.qpos[idx.arm_qpos]
        a["gripper_pos"][env] = idx.gripper_position(data.qpos)
        a["object_pos"][env] = data.xpos[self.object_body]
        a["object_quat"][env] = data.xquat[self.object_body]
        a["object_linvel"][env] = data.qvel[od : od + 3]
        a["container_pos"][env] = data.xpos[self.container_body]
        a["container_quat"][env] = data.xquat[self.container_body]
        a["tcp_pos"][env] = data.site_xpos[idx.tcp_site]
        a["tcp_rot"][env] = data.site_xmat[idx.tcp_site].reshape(3, 3)

    def _render(self, locals_: list[int]) -> None:
        """Render every camera of the envs ``locals_`` (group-local indices) into the image arrays, in one
        batch."""
        if self.renderer is None or not locals_:
            return
        views = []
        for local in locals_:
            env, data = self.config.start + local, self.datas[local]
            views.extend(
                (data, camera_id, self.arrays[name][env]) for name, camera_id in zip(CAMERA_NAMES, self.camera_ids)
            )
        self.renderer.render(views)
