"""A scripted pick-and-place expert for the embedded scenes (a test fixture and a baseline).

It reads the privileged state (``MujocoDroidEnv.privileged_state()``: true object and container poses,
measured joints) and emits the same ``(N, 8)`` action a policy sends at 15 Hz: 7 absolute joint targets
from damped-least-squares IK (``kinematics.py``, warm-started from the previous command) plus the gripper
command (1 closes, 0 opens). One state machine per env, restarted whenever that env's episode changes
(``episode_count``):

  approach  above the grasp point (15 cm), gripper yawed to the object
  descend   to the grasp point
  close     gripper closed for 12 steps
  lift      up to 25 cm; if the object did not come along, start over (up to 3 attempts)
  carry     above the container
  lower     to the scene's release height
  open      gripper open for 15 steps
  retreat   up 10 cm, then hold

Cartesian waypoints are interpolated on straight lines at 0.15-0.25 m/s with a few settle steps each.
Per scene: the cube is grasped 5 mm above its centre with the yaw of one of its faces; the can higher up
(so it clears the mug's rim) and released above the mug; the banana across its middle segment, the
gripper's yaw aligned with its long axis.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from dz_gym.envs import droid
from dz_gym.envs.mujoco import scene as scene_module
from dz_gym.envs.mujoco.kinematics import Kinematics
from dz_gym.envs.vector_info import entries


@dataclass(frozen=True)
class ExpertParams:
    """Per-scene grasp and release geometry (metres, radians)."""

    grasp_dz: float  # TCP height above the object's origin when closing
    yaw_period: float  # the object's grasp symmetry (pi/2 for a cube, pi for a banana, 0: any yaw works)
    release_z: float  # TCP height above the container's origin when opening
    approach_dz: float = 0.15
    lift_z: float = 0.25
    carry_z: float = 0.28


PARAMS = {
    1: ExpertParams(grasp_dz=0.005, yaw_period=math.pi / 2, release_z=0.13),
    2: ExpertParams(grasp_dz=0.008, yaw_period=0.0, release_z=0.165),
    3: ExpertParams(grasp_dz=-0.006, yaw_period=math.pi, release_z=0.16),
}

APPROACH, DESCEND, CLOSE, LIFT, CARRY, LOWER, OPEN, RETREAT, HOLD = range(9)
PHASE_NAMES = ("approach", "descend", "close", "lift", "carry", "lower", "open", "retreat", "hold")
FAST, SLOW = 0.25, 0.15  # m/s
SETTLE_STEPS = 4
CLOSE_STEPS, OPEN_STEPS = 12, 15
MAX_ATTEMPTS = 3


def _quat_yaw(quat: np.ndarray) -> float:
    w, x, y, z = quat
    return math.atan2(2 * (w * z + x * y), 1 - 2 * (y * y + z * z))


def _wrap(angle: float, period: float) -> float:
    """``angle`` shifted by multiples of ``period`` into [-period/2, period/2)."""
    return (angle + period / 2) % period - period / 2


@dataclass
class _EnvPlan:
    phase: int = APPROACH
    step: int = 0
    duration: int = 1
    start: np.ndarray = None  # type: ignore[assignment]
    target: np.ndarray = None  # type: ignore[assignment]
    start_yaw: float = 0.0
    target_yaw: float = 0.0
    gripper: float = 0.0
    attempts: int = 1
    q: np.ndarray = None  # type: ignore[assignment]
    episode: int = -1


class ScriptedExpert:
    """Batched expert: ``act(env.privileged_state())`` -> ``(N, 8)`` float32 actions."""

    def __init__(self, scene: int, num_envs: int, kinematics: Kinematics | None = None):
        self.scene_id = droid.scene_spec(scene).scene_id
        self.num_envs = int(num_envs)
        self.params = PARAMS[self.scene_id]
        self.layout = scene_module.LAYOUTS[self.scene_id]
        self.kin = kinematics or Kinematics()
        self.home_tcp, _ = self.kin.fk(self.kin.home)
        self.plans = [_EnvPlan() for _ in range(self.num_envs)]

    def phase_names(self) -> list[str]:
        """The current phase of each env (for logs and tests)."""
        return [PHASE_NAMES[p.phase] for p in self.plans]

    def act(self, state: dict[str, np.ndarray]) -> np.ndarray:
        actions = np.zeros((self.num_envs, droid.ACTION_DIM), dtype=np.float32)
        for env, plan in enumerate(self.plans):
            if plan.episode != int(state["episode_count"][env]):
                self._restart(plan, int(state["episode_count"][env]))
            self._advance(plan, env, state)
            actions[env, : droid.ARM_DOF] = plan.q
            actions[env, droid.ARM_DOF] = plan.gripper
        return actions

    # ------------------------------------------------------------------------------------------ plan
    def _restart(self, plan: _EnvPlan, episode: int) -> None:
        plan.episode = episode
        plan.q = self.kin.home.copy()
        plan.gripper = 0.0
        plan.attempts = 1
        plan.start, plan.start_yaw = self.home_tcp.copy(), 0.0
        plan.target, plan.target_yaw = self.home_tcp.copy(), 0.0
        plan.step, plan.duration = 0, 0
        plan.phase = -1  # APPROACH is entered on the first _advance, from the state of that step

    def _grasp(self, env: int, state) -> tuple[np.ndarray, float]:
        """Grasp point (TCP target) and yaw for the object of ``env`` now."""
        yaw = _quat_yaw(state["object_quat"][env])
        c, s = math.cos(yaw), math.sin(yaw)
        off = np.asarray(self.layout.grasp_offset)
        point = state["object_pos"][env] + np.array([c * off[0] - s * off[1], s * off[0] + c * off[1], off[2]])
        point[2] = state["object_pos"][env][2] + self.params.grasp_dz
        grasp_yaw = _wrap(yaw, self.params.yaw_period) if self.params.yaw_period else 0.0
        return point, grasp_yaw

    def _enter(self, plan: _EnvPlan, phase: int, env: int, state) -> None:
        params = self.params
        plan.phase, plan.step = phase, 0
        plan.start, plan.start_yaw = plan.target.copy(), plan.target_yaw
        target, yaw, speed = plan.target.copy(), plan.target_yaw, FAST
        if phase == APPROACH:
            point, yaw = self._grasp(env, state)
            target = point + np.array([0.0, 0.0, params.approach_dz])
            plan.gripper = 0.0
        elif phase == DESCEND:
            target, yaw = self._grasp(env, state)
            speed = SLOW
        elif phase == CLOSE:
            plan.gripper = 1.0
        elif phase == LIFT:
            target[2] = params.lift_z
            speed = SLOW
        elif phase == CARRY:
            target = state["container_pos"][env].copy()
            target[2] = max(params.carry_z, state["container_pos"][env][2] + params.release_z)
        elif phase == LOWER:
            target = state["container_pos"][env].copy()
            target[2] = state["container_pos"][env][2] + params.release_z
            speed = SLOW
        elif phase == OPEN:
            plan.gripper = 0.0
        elif phase == RETREAT:
            target[2] += 0.10
            speed = SLOW
        plan.target, plan.target_yaw = target, yaw
        if phase in (CLOSE, OPEN):
            plan.duration = CLOSE_STEPS if phase == CLOSE else OPEN_STEPS
        elif phase == HOLD:
            plan.duration = 10**9
        else:
            distance = float(np.linalg.norm(target - plan.start))
            turn = abs(yaw - plan.start_yaw) / 1.5  # rad/s of wrist rotation
            plan.duration = max(1, math.ceil(max(distance / speed, turn) / droid.STEP_DT)) + SETTLE_STEPS

    def _advance(self, plan: _EnvPlan, env: int, state) -> None:
        if plan.phase == -1:
            self._enter(plan, APPROACH, env, state)
        elif plan.step >= plan.duration:
            next_phase = min(plan.phase + 1, HOLD)
            if plan.phase == LIFT and not self._lifted(env, state) and plan.attempts < MAX_ATTEMPTS:
                plan.attempts += 1
                plan.gripper = 0.0
                next_phase = APPROACH
            self._enter(plan, next_phase, env, state)
        plan.step += 1
        moving = plan.duration - SETTLE_STEPS
        alpha = 1.0 if plan.phase in (CLOSE, OPEN, HOLD) else min(1.0, plan.step / max(moving, 1))
        position = plan.start + alpha * (plan.target - plan.start)
        yaw = plan.start_yaw + alpha * (plan.target_yaw - plan.start_yaw)
        if plan.phase not in (CLOSE, OPEN, HOLD) or plan.step == 1:
            plan.q = self.kin.ik(position, yaw, plan.q).q

    def _lifted(self, env: int, state) -> bool:
        return bool(state["object_pos"][env][2] > self.layout.object_rest_z + 0.05)


def run_episodes(env, expert: ScriptedExpert, max_steps: int | None = None) -> dict[str, np.ndarray]:
    """Run one episode per env with ``expert`` (envs must start together); returns per-env results.

    Result keys: ``success`` (at the last step), ``success_any_step``, ``steps_to_success`` (first step
    with success, -1 if none), ``episode_seed``, ``milestones`` (name -> first step, -1 if never; see
    ``dz_gym.envs.episodes``).
    """
    steps = env.max_episode_length if max_steps is None else int(max_steps)
    n = env.num_envs
    first = np.full(n, -1, dtype=np.int64)
    any_step = np.zeros(n, dtype=bool)
    last = np.zeros(n, dtype=bool)
    milestones: dict[str, np.ndarray] = {}
    seeds = env.privileged_state()["episode_seed"].copy()
    env.set_render_mask(np.zeros(n, dtype=bool))
    for t in range(1, steps + 1):
        _, _, _, truncated, info = env.step(expert.act(env.privileged_state()))
        newly = info["success"] & (first < 0)
        first[newly] = t
        any_step |= info["success_any_step"]
        last = info["success"].copy()
        milestones = entries(info["milestones"])
        if truncated.any():
            break
    env.set_render_mask(None)
    return {
        "success": last,
        "success_any_step": any_step,
        "steps_to_success": first,
        "episode_seed": seeds,
        "milestones": milestones,
    }
