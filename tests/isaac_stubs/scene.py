"""Stand-in Isaac Lab scene objects: assets and their data, cameras, stage prims and the env-origin grid.

The pieces :mod:`isaac_stubs.sim`'s env is made of, with Isaac Lab's names and shapes:
``Articulation`` (joints, bodies, ``find_bodies`` raising ``ValueError`` on a missing name), ``RigidObject``,
``Camera``, ``Scene`` (``scene[name]``, ``env_origins`` on ``InteractiveScene``'s grid), 3.0's ``ProxyArray``
(``.torch``; indexing warns, arithmetic fails), and USD-like ``Stage``/``Prim``/``Attr`` for the lights.
"""

from __future__ import annotations

import math
import re
import warnings

import numpy as np
import torch

from isaac_stubs.cfgs import ARM_JOINTS, HOME

JOINT_NAMES = ARM_JOINTS + [
    "finger_joint",
    "right_outer_knuckle_joint",
    "left_inner_finger_joint",
    "right_inner_finger_joint",
]
BODY_NAMES = (
    ["panda_link0"] + [f"panda_link{i}" for i in range(1, 8)] + ["base_link", "left_inner_finger", "right_inner_finger"]
)


class ProxyArray:
    """3.0's asset-data wrapper: ``.torch`` is the tensor; indexing works but is deprecated."""

    def __init__(self, tensor):
        self._tensor = tensor

    @property
    def torch(self):
        return self._tensor

    def __getitem__(self, index):
        warnings.warn("ProxyArray indexing is deprecated; use .torch", DeprecationWarning, stacklevel=2)
        return self._tensor[index]


def env_origins(num_envs: int, spacing: float, float_sqrt: bool = False) -> torch.Tensor:
    """Isaac Lab's default grid of env origins (3.0 divides by the float square root: N=8 is 3x3, not 4x2)."""
    root = math.sqrt(num_envs) if float_sqrt else int(math.sqrt(num_envs))
    num_rows = math.ceil(num_envs / root)
    num_cols = math.ceil(num_envs / num_rows)
    ii, jj = torch.meshgrid(torch.arange(num_rows), torch.arange(num_cols), indexing="ij")
    origins = torch.zeros(num_envs, 3)
    origins[:, 0] = -(ii.flatten()[:num_envs] - (num_rows - 1) / 2) * spacing
    origins[:, 1] = (jj.flatten()[:num_envs] - (num_cols - 1) / 2) * spacing
    return origins


class Attr:
    def __init__(self, value):
        self.value = value

    def __bool__(self):
        return True

    def IsValid(self):
        return True

    def Get(self):
        return self.value

    def Set(self, value):
        self.value = value


class Prim:
    def __init__(self, path: str, type_name: str, position=(0.0, 0.0, 0.0), **attrs):
        self.path, self.type_name, self.position = path, type_name, np.asarray(position, dtype=np.float64)
        self.attrs = {name: Attr(value) for name, value in attrs.items()}

    def GetPath(self):
        return self.path

    def GetTypeName(self):
        return self.type_name

    def GetAttribute(self, name):
        return self.attrs.get(name)


class Stage:
    def __init__(self):
        self.prims: list[Prim] = []

    def Traverse(self):
        return iter(list(self.prims))


class SimContext:
    def __init__(self, env):
        self._env = env
        self.stage = Stage()
        self.device = env.device

    def render(self):
        self._env._render()


class Data:
    pass


class Articulation:
    def __init__(self, env):
        self.env = env
        n = env.num_envs
        self.joint_names = list(JOINT_NAMES)
        self.home = torch.zeros(n, len(JOINT_NAMES))
        self.home[:, :7] = torch.tensor(HOME)
        self.q = self.home.clone()
        self.target = self.home.clone()
        self.data = Data()

    def refresh(self):
        wrap = self.env.wrap
        data = self.data
        data.joint_names = list(self.joint_names)
        data.body_names = list(BODY_NAMES)
        data.joint_pos = wrap(self.q.clone())
        bodies = self.body_positions()
        data.body_link_pos_w = wrap(bodies)
        if not self.env.world.is_v3:
            data.body_pos_w = bodies

    def tcp_local(self, q=None):
        q = self.q if q is None else q
        return torch.stack(
            [0.45 + 0.3 * (q[:, 1] - HOME[1]), 0.3 * (q[:, 0] - HOME[0]), 0.45 + 0.3 * (q[:, 3] - HOME[3])], dim=1
        )

    def body_positions(self):
        n = self.env.num_envs
        tcp = self.tcp_local() + self.env.origins
        opening = 0.04 * (1.0 - self.q[:, 7:8] / (math.pi / 4))
        bodies = tcp.unsqueeze(1).repeat(1, len(BODY_NAMES), 1)
        bodies[:, BODY_NAMES.index("left_inner_finger"), 1] += opening[:, 0]
        bodies[:, BODY_NAMES.index("right_inner_finger"), 1] -= opening[:, 0]
        bodies[:, 0] = self.env.origins
        return bodies.reshape(n, len(BODY_NAMES), 3)

    def find_bodies(self, name_keys, preserve_order=False):
        keys = [name_keys] if isinstance(name_keys, str) else list(name_keys)
        found = []
        for key in keys:
            matches = [(i, n) for i, n in enumerate(BODY_NAMES) if re.fullmatch(key, n)]
            if not matches:  # Isaac Lab's resolve_matching_names raises for a key that matches nothing
                raise ValueError(f"Not all regular expressions are matched! {key}: []. Available strings: {BODY_NAMES}")
            found += matches
        if not preserve_order:
            found.sort()
        return [i for i, _ in found], [n for _, n in found]

    def reset(self, ids):
        self.q[ids] = self.home[ids]
        self.target[ids] = self.home[ids]


class RigidObject:
    def __init__(self, env, name, local_pos, prim_path=""):
        self.env, self.name, self.prim_path = env, name, prim_path
        n = env.num_envs
        self.default_local = torch.tensor(local_pos, dtype=torch.float32).repeat(n, 1)
        self.pos = self.default_local + env.origins
        self.vel = torch.zeros(n, 3)
        self.attached = torch.zeros(n, dtype=torch.bool)
        self.data = Data()

    def refresh(self):
        self.data.root_pos_w = self.env.wrap(self.pos.clone())
        self.data.root_lin_vel_w = self.env.wrap(self.vel.clone())

    def reset(self, ids):
        self.pos[ids] = self.default_local[ids] + self.env.origins[ids]
        self.vel[ids] = 0.0
        self.attached[ids] = False


class Camera:
    def __init__(self, env, cfg):
        self.env, self.cfg = env, cfg
        self.data = Data()
        self.data.output = {"rgb": torch.zeros(env.num_envs, cfg.height, cfg.width, 3, dtype=torch.uint8)}


class Scene:
    """``InteractiveScene``: entities by name, ``env_origins``, reset to defaults."""

    def __init__(self, env, scene_cfg):
        self.env = env
        self.num_envs = env.num_envs
        self.env_origins = env.origins.clone()
        self.entities = {}
        for name, value in vars(scene_cfg).items():
            kind = type(value).__name__
            if kind == "ArticulationCfg":
                self.entities[name] = Articulation(env)
            elif kind == "RigidObjectCfg":
                env.world_check_rigid_prim(value.prim_path)
                self.entities[name] = RigidObject(env, name, value.init_state.pos, value.prim_path)
            elif kind in ("CameraCfg", "TiledCameraCfg"):
                self.entities[name] = Camera(env, value)

    def __getitem__(self, key):
        if key not in self.entities:
            raise KeyError(f"Scene entity with key '{key}' not found. Available Entities: '{sorted(self.entities)}'")
        return self.entities[key]

    def keys(self):
        return list(self.entities)

    def reset_to_default(self, ids):
        for entity in self.entities.values():
            if hasattr(entity, "reset"):
                entity.reset(ids)
