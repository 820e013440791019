"""Stand-in ``ManagerBasedRLEnv``: a tiny kinematic world with Isaac Lab's step/reset/manager semantics.

What it reproduces (from Isaac Lab's ``manager_based_rl_env.py`` and sim_evals.md):

- ``step``: actions -> ``decimation`` physics substeps (render every ``render_interval``) ->
  ``episode_length_buf += 1`` -> termination terms (after the physics, before any reset) -> rewards
  (none) -> in-step reset of done envs -> re-render if ``rerender_on_reset`` -> observation terms;
- ``reset`` with 2.2's ``(seed=None, env_ids=None, options=None)`` or 3.0's
  ``(env_ids=slice(None), *, seed=None, options=None)`` (``env_ids`` an int tensor or a slice);
- the env-origin grid of ``InteractiveScene`` (N=8 at x in {+-3.5, +-10.5}, y in {+-3.5} for 7 m);
- 3.0 asset data as ``ProxyArray`` (``.torch``; indexing warns, arithmetic fails);
- sim-evals' gripper action (``> 0.5`` closes, bools inverted: ``== 0`` closes);
- the stale first frame after a reset (IsaacLab#6394): the renderer sees poses as of the last physics
  substep, so a render right after a reset shows the previous episode; and the first render cycle
  returns black images (materials not loaded), which sim-evals' double reset works around;
- lights as stage prims, with a simple irradiance model (sphere lights by inverse square distance,
  dome lights everywhere) so per-env lighting can be compared with the single-env reference.

Camera images encode state per env: R = irradiance relative to the N=1 reference (128 = equal),
G = the arm's first joint, B = the episode counter the renderer saw.
"""

from __future__ import annotations

import math
import re

import gymnasium as gym
import numpy as np
import torch

from isaac_stubs.scene import (
    Camera,
    Prim,
    ProxyArray,
    RigidObject,
    Scene,
    SimContext,
    env_origins,
)

REFERENCE_IRRADIANCE = 5000.0 / (0.5**2 + 0.6**2 + 0.7**2)  # the sphere light seen from the table at N=1
GRASP_RADIUS = 0.03


class EventManager:
    """``active_terms`` (mode -> names) and ``get_term_cfg`` of Isaac Lab's event manager."""

    def __init__(self, terms):
        self._terms = dict(terms)

    @property
    def active_terms(self):
        modes: dict[str, list[str]] = {}
        for name, term in self._terms.items():
            modes.setdefault(term.mode, []).append(name)
        return modes

    def get_term_cfg(self, name):
        if name not in self._terms:
            raise ValueError(f"Event term '{name}' not found.")
        return self._terms[name]


class TerminationManager:
    """``terminated``/``time_outs``: the env's buffers themselves, refilled term by term in place."""

    def __init__(self, env):
        self._env = env

    @property
    def terminated(self):
        return self._env._terminated_buf

    @property
    def time_outs(self):
        return self._env._truncated_buf


class StandInRLEnv(gym.Env):
    """The stand-in of ``isaaclab.envs.ManagerBasedRLEnv`` (see the module docstring)."""

    metadata = {"render_modes": [None, "human", "rgb_array"]}
    is_vector_env = True
    world = None  # set by the stand-in installer

    def __init__(self, cfg, render_mode=None, **kwargs):
        world = self.world
        world.log("env.__init__", cfg.scene.num_envs)
        if not world.launched:
            raise RuntimeError("stand-in: the simulation app is not running")
        self.cfg = cfg
        self.render_mode = render_mode
        self.num_envs = int(cfg.scene.num_envs)
        self.device = cfg.sim.device
        self.physics_dt = cfg.sim.dt
        self.step_dt = cfg.sim.dt * cfg.decimation
        self.origins = env_origins(self.num_envs, float(cfg.scene.env_spacing), float_sqrt=world.is_v3)
        self.episode_length_buf = torch.zeros(self.num_envs, dtype=torch.long)
        # the termination manager's buffers: compute() clears and refills them in place every step
        self._truncated_buf = torch.zeros(self.num_envs, dtype=torch.bool)
        self._terminated_buf = torch.zeros(self.num_envs, dtype=torch.bool)
        self.episode_id = torch.zeros(self.num_envs, dtype=torch.long)
        self.scene = Scene(self, cfg.scene)
        self.sim = SimContext(self)
        self._build_stage()
        self._sim_step_counter = 0
        self.render_cycles = 0
        self._sync_renderer()
        self._refresh()
        self.metadata["render_fps"] = 1 / self.step_dt  # Isaac Lab mutates the class-level dict
        self._obs_terms = {
            name: term
            for name, term in vars(cfg.observations.policy).items()
            if type(term).__name__ == "ObservationTermCfg"
        }
        self._termination_terms = {
            name: term for name, term in vars(cfg.terminations).items() if type(term).__name__ == "TerminationTermCfg"
        }
        self._reward_terms = {
            name: term for name, term in vars(cfg.rewards).items() if type(term).__name__ == "RewardTermCfg"
        }
        self._event_terms = {
            name: term for name, term in vars(cfg.events).items() if type(term).__name__ == "EventTermCfg"
        }
        for term in self._event_terms.values():  # class terms are instantiated by the event manager
            if isinstance(term.func, type):
                term.func = term.func(term, self)
        self.event_manager = EventManager(self._event_terms)
        self.termination_manager = TerminationManager(self)
        self.observation_dims = {name: tuple(self._term(term).shape[1:]) for name, term in self._obs_terms.items()}
        self.closed = False

    # -- helpers ----------------------------------------------------------------------------------
    def wrap(self, tensor):
        return ProxyArray(tensor) if self.world.is_v3 else tensor

    @property
    def max_episode_length(self):
        return math.ceil(self.cfg.episode_length_s / self.step_dt)

    @property
    def robot(self):
        return self.scene["robot"]

    def rigid_objects(self):
        return [e for e in self.scene.entities.values() if isinstance(e, RigidObject)]

    def _refresh(self):
        for entity in self.scene.entities.values():
            if hasattr(entity, "refresh"):
                entity.refresh()

    def _build_stage(self):
        prims = self.sim.stage.prims
        for value in vars(self.cfg.scene).values():
            spawn = getattr(value, "spawn", None)
            kind = type(spawn).__name__
            if kind not in ("SphereLightCfg", "DomeLightCfg"):
                continue
            type_name = kind.replace("Cfg", "")
            local = np.asarray(value.init_state.pos, dtype=np.float64)
            if str(value.prim_path).startswith("{ENV_REGEX_NS}"):
                leaf = value.prim_path.split("/", 1)[1]
                for i in range(self.num_envs):
                    pos = self.origins[i].numpy() + local
                    prims.append(
                        Prim(f"/World/envs/env_{i}/{leaf}", type_name, pos, **{"inputs:intensity": spawn.intensity})
                    )
            else:
                prims.append(Prim(value.prim_path, type_name, local, **{"inputs:intensity": spawn.intensity}))
        if self.world.scene_dome_light:
            for i in range(self.num_envs):
                prims.append(Prim(f"/World/envs/env_{i}/scene/DomeLight", "DomeLight", **{"inputs:intensity": 300.0}))
        if self.world.scene_distant_light:
            for i in range(self.num_envs):
                prims.append(
                    Prim(f"/World/envs/env_{i}/scene/DistantLight", "DistantLight", **{"inputs:intensity": 200.0})
                )
        from isaac_stubs import sim_evals_layouts

        for i in range(self.num_envs):
            for name in sim_evals_layouts.scene_rigid_bodies(self.cfg):
                prims.append(Prim(f"/World/envs/env_{i}/scene/{name}", "Xform"))
        for i in range(self.num_envs):
            prims.append(Prim(f"/World/envs/env_{i}/scene/table", "Mesh"))

    def irradiance(self) -> np.ndarray:
        """Light reaching each env's table (sphere lights by 1/d^2, dome lights everywhere)."""
        table = self.origins.numpy() + np.array([0.5, 0.0, 0.0])
        total = np.zeros(self.num_envs)
        for prim in self.sim.stage.prims:
            intensity = float(prim.attrs["inputs:intensity"].Get()) if "inputs:intensity" in prim.attrs else 0.0
            if prim.type_name == "SphereLight":
                total += intensity / np.sum((table - prim.position) ** 2, axis=1)
            elif prim.type_name in ("DomeLight", "DistantLight"):  # infinite: they light every env
                total += intensity
        return total

    # -- rendering: the renderer sees the poses of the last physics substep -------------------------
    def _sync_renderer(self):
        self._render_q = self.robot.q.clone()
        self._render_episode = self.episode_id.clone()

    def _render(self):
        self.render_cycles += 1
        n = self.num_envs
        if self.render_cycles == 1:
            values = torch.zeros(n, 3, dtype=torch.uint8)  # materials not loaded on the first cycle
        else:
            bright = np.clip(np.round(128 * self.irradiance() / self._reference_irradiance()), 0, 255)
            joint = torch.remainder(torch.round((self._render_q[:, 0] + math.pi) * 40), 256)
            values = torch.stack(
                [
                    torch.as_tensor(bright, dtype=torch.float32),
                    joint,
                    torch.remainder(self._render_episode, 256).float(),
                ],
                dim=1,
            ).to(torch.uint8)
        for entity in self.scene.entities.values():
            if isinstance(entity, Camera):
                out = entity.data.output["rgb"]
                out[:] = values[:, None, None, :]

    def _reference_irradiance(self):
        world = self.world
        return (
            REFERENCE_IRRADIANCE
            + (300.0 if world.scene_dome_light else 0.0)
            + (200.0 if world.scene_distant_light else 0.0)
        )

    def world_check_rigid_prim(self, prim_path):
        """A ``RigidObjectCfg`` without spawn needs a rigid body at its prim path (Isaac Lab raises otherwise)."""
        from isaac_stubs import sim_evals_layouts

        prefix = "{ENV_REGEX_NS}/scene/"
        if str(prim_path).startswith(prefix):
            leaf = str(prim_path)[len(prefix) :]
            if leaf not in sim_evals_layouts.scene_rigid_bodies(self.cfg):
                raise RuntimeError(
                    f"Could not find prim with path {prim_path} (stand-in: no rigid body {leaf!r} in the scene USD)"
                )

    # -- managers ---------------------------------------------------------------------------------
    def _term(self, term):
        value = term.func(self, **term.params)
        if term.clip is not None:
            value = value.clamp(*term.clip)
        return value

    def _compute_obs(self):
        self._refresh()
        return {"policy": {name: self._term(term) for name, term in self._obs_terms.items()}}

    def _compute_terminations(self):
        self._refresh()
        terminated, truncated = self._terminated_buf, self._truncated_buf
        terminated[:] = False
        truncated[:] = False
        for name, term in self._termination_terms.items():
            value = term.func(self, **term.params)
            if value.dtype != torch.bool or tuple(value.shape) != (self.num_envs,):
                raise ValueError(
                    f"termination term {name}: expected ({self.num_envs},) bool, got {value.dtype} {tuple(value.shape)}"
                )
            if term.time_out:
                truncated |= value
            else:
                terminated |= value
        return terminated, truncated

    def _compute_rewards(self):
        """Reward terms in config order after the terminations; terms of weight 0 are skipped (as Isaac Lab)."""
        self._refresh()
        reward = torch.zeros(self.num_envs)
        for term in self._reward_terms.values():
            if term.weight == 0.0:
                continue
            reward += term.func(self, **term.params) * term.weight * self.step_dt
        return reward

    # -- actions and physics ----------------------------------------------------------------------
    def _process_action(self, action):
        if not isinstance(action, torch.Tensor):
            raise TypeError(f"stand-in: action must be a torch tensor, got {type(action).__name__}")
        self.world.log("env.action_dtype", str(action.dtype))
        if tuple(action.shape) != (self.num_envs, 8):
            raise ValueError(f"stand-in: action shape {tuple(action.shape)}")
        robot = self.robot
        arm_ids = [i for i, n in enumerate(robot.joint_names) if re.fullmatch("panda_joint.*", n)]
        robot.target[:, arm_ids] = action[:, :7].float()
        grip = action[:, 7]
        close = (grip == 0) if grip.dtype == torch.bool else (grip > 0.5)
        robot.target[:, 7] = torch.where(close, torch.tensor(math.pi / 4), torch.tensor(0.0))

    def _physics_substep(self):
        robot = self.robot
        robot.q += 0.5 * (robot.target - robot.q)
        tcp = robot.tcp_local() + self.origins
        closing = robot.target[:, 7] > 0.1
        for obj in self.rigid_objects():
            old = obj.pos.clone()
            near = torch.linalg.norm(obj.pos - tcp, dim=1) <= GRASP_RADIUS
            attached = torch.where(closing, obj.attached | near, torch.zeros_like(obj.attached))
            released = obj.attached & ~attached
            obj.attached = attached
            obj.pos[obj.attached] = tcp[obj.attached]
            obj.pos[released, 2] = obj.default_local[released, 2]  # dropped: back to its resting height
            obj.vel = (obj.pos - old) / self.physics_dt
        self._sync_renderer()

    def teleport(self, name, env_id, local_pos, speed=0.0):
        """Test hook: place an object (env-local position) with a given speed along x."""
        obj = self.scene[name]
        obj.pos[env_id] = torch.tensor(local_pos, dtype=torch.float32) + self.origins[env_id]
        obj.vel[env_id] = torch.tensor([speed, 0.0, 0.0])
        obj.attached[env_id] = False
        self._refresh()

    # -- Gymnasium API ----------------------------------------------------------------------------
    def step(self, action):
        self._process_action(action)
        for _ in range(self.cfg.decimation):
            self._sim_step_counter += 1
            self._physics_substep()
            if self._sim_step_counter % self.cfg.sim.render_interval == 0:
                self._render()
        self.episode_length_buf += 1
        terminated, truncated = self._compute_terminations()
        reward = self._compute_rewards()
        done_ids = torch.nonzero(terminated | truncated).flatten()
        if done_ids.numel():
            self._reset_idx(done_ids)
            self._rerender_after_reset()
        self.world.log("env.step")
        return self._compute_obs(), reward, terminated, truncated, {}

    def _reset_idx(self, ids):
        for term in self._event_terms.values():  # the event manager: reset-mode terms in config order
            if term.mode == "reset":
                self._event_ids(ids)
                term.func(self, ids, **term.params)
        self.episode_length_buf[ids] = 0
        self.episode_id[ids] += 1
        self._refresh()

    def _event_ids(self, ids):
        return len(ids)  # the event manager counts the ids: a slice fails (TypeError)

    def _rerender_after_reset(self):
        count = (
            getattr(self.cfg, "num_rerenders_on_reset", None)
            if self.world.is_v3
            else int(bool(self.cfg.rerender_on_reset))
        )
        for _ in range(int(count or 0)):
            self._render()

    def _reset(self, env_ids, seed):
        if seed is not None:
            self.world.log("env.seed", seed)
        ids = torch.arange(self.num_envs) if env_ids is None else env_ids  # 3.0: a slice passes through
        self._reset_idx(ids)
        self._rerender_after_reset()
        return self._compute_obs(), {}

    def close(self):
        self.world.log("env.close")
        self.closed = True


class StandInRLEnv22(StandInRLEnv):
    def reset(self, seed=None, env_ids=None, options=None):
        self.world.log("env.reset", {"seed": seed, "env_ids": _describe(env_ids), "options": options})
        if env_ids is not None and not isinstance(env_ids, torch.Tensor):
            env_ids = torch.as_tensor(list(env_ids), dtype=torch.long)
        return self._reset(env_ids, seed)


class StandInRLEnv30(StandInRLEnv):
    """Isaac Lab 3.0 (the 3.0.0 release's ``envs/manager_based_env.py``, and develop):
    ``reset(env_ids=slice(None), *, seed=None, options=None)``, None normalised to ``slice(None)``; its
    event manager counts a slice and hands it on to the event terms unchanged."""

    def _event_ids(self, ids):
        return len(range(self.num_envs)[ids]) if isinstance(ids, slice) else len(ids)

    def reset(self, env_ids=slice(None), *, seed=None, options=None):
        self.world.log("env.reset", {"seed": seed, "env_ids": _describe(env_ids), "options": options})
        if env_ids is None:
            env_ids = slice(None)
        if not isinstance(env_ids, slice):
            if not isinstance(env_ids, torch.Tensor) or env_ids.dtype not in (torch.int32, torch.int64):
                raise TypeError(f"env_ids must be an int tensor on the device or a slice, got {type(env_ids).__name__}")
        return self._reset(env_ids, seed)


def _describe(env_ids):
    if env_ids is None or isinstance(env_ids, slice):
        return env_ids
    if isinstance(env_ids, torch.Tensor):
        return ("tensor", str(env_ids.dtype), env_ids.tolist())
    return (type(env_ids).__name__, list(env_ids))
