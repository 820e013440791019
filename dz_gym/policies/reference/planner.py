"""The pick-and-place plan of the reference policy: phases, checks, retries and Cartesian rows.

A plan is a sequence of phases whose targets follow the latest estimates of the object and container:

    APPROACH (above the object) -> DESCEND -> CLOSE -> LIFT -> [grasp check]
    -> CARRY (above the container) -> LOWER -> RELEASE -> RETREAT -> [placement check] -> HOME -> DONE

and, after a failed check or a lost object, REOPEN (open while rising) -> APPROACH again, at most
``max_retries`` times; then HOME.

Every call does two things:

1. :meth:`Planner.advance` moves the plan on from *measurements* (joints -> TCP, gripper, this call's
   views): a gated phase ends only when the measured arm arrived (or stalled for a while), a gripper
   phase only when the measured gripper settled, and the checks after LIFT, during the carry and after
   RETREAT decide between going on and retrying.
2. :meth:`Planner.rollout` predicts the next ``horizon`` rows: the commanded TCP moves from where the
   previous chunk's executed part left it (the *anchor*) toward the phase's target at the phase's speed;
   free-space phases (APPROACH, CARRY) hand over to the next phase inside the rollout when the command
   reaches their target, gated phases hold there until a later call confirms arrival. The state after
   the rows the client executes (``executed`` rows, the open-loop horizon) is kept for the next call.

Pure: no images, no IK, no I/O. Positions in metres in the env-local world frame (table top z = 0); yaw
in radians about +z relative to the DROID home orientation (the kinematics' convention).
"""

from __future__ import annotations

import copy
import enum
import math
from dataclasses import dataclass, field

import numpy as np

from dz_gym.envs import droid
from dz_gym.policies.reference.perception import ELONGATED, EntityView, Track
from dz_gym.policies.reference.tasks import TaskSpec


class Phase(enum.Enum):
    APPROACH = "approach"
    DESCEND = "descend"
    CLOSE = "close"
    LIFT = "lift"
    CARRY = "carry"
    LOWER = "lower"
    RELEASE = "release"
    RETREAT = "retreat"
    REOPEN = "reopen"
    HOME = "home"
    DONE = "done"


# Phases the rollout may leave by itself once the command reaches the target.
PASS_THROUGH = {Phase.APPROACH: Phase.DESCEND, Phase.CARRY: Phase.LOWER}
MAX_YAW = 2.0  # rad from the home orientation (joint 7 has about +/-3 rad)
GRIPPER_CLOSED_PHASES = {Phase.CLOSE, Phase.LIFT, Phase.CARRY, Phase.LOWER}


@dataclass(frozen=True)
class PlannerConfig:
    """Heights (m), speeds (m/s), tolerances (m) and limits of the plan."""

    hover_height: float = 0.11  # TCP above the object's centre before descending
    lift_height: float = 0.20  # TCP height after grasping
    carry_height: float = 0.22  # minimum TCP height while carrying
    retreat_rise: float = 0.10
    min_tcp_z: float = 0.015  # never command the TCP lower (table top + margin)
    fast_speed: float = 0.30
    slow_speed: float = 0.12
    lift_speed: float = 0.22
    yaw_rate: float = 1.5  # rad/s
    grasp_tolerance: float = 0.012
    place_tolerance: float = 0.015
    loose_tolerance: float = 0.03
    freeze_distance: float = 0.05  # freeze the object estimate when the TCP is this close (xy)...
    freeze_height: float = 0.05  # ...and this close above the object's centre
    wrist_view_distance: float = 0.04  # TCP this close (xy) to the object: look with the wrist camera
    moved_distance: float = 0.025  # descending, an object estimate this far (xy) from the TCP: approach again
    max_moves: int = 3  # re-approaches per attempt before it counts as a failed attempt
    workspace_x: tuple[float, float] = (0.25, 0.85)  # where objects can be grasped from above (m)
    workspace_y: tuple[float, float] = (-0.55, 0.55)
    stall_calls: int = 5  # calls a gated phase may wait for arrival before moving on anyway
    blocked_height: float = 0.015  # descending, the arm held this far above a reached command is blocked
    empty_gripper: float = 0.85  # a closed gripper reading above this holds nothing
    lifted_margin: float = 0.05  # object centre this far above its resting height counts as lifted
    max_hand_offset: float = 0.04
    max_retries: int = 4
    home_tolerance: float = 0.05  # rad, max joint error at home
    dt: float = droid.STEP_DT


@dataclass
class Measurement:
    """What the robot reports at the start of a call (measured joints mapped through FK)."""

    q: np.ndarray  # (7,)
    gripper: float
    tcp: np.ndarray  # (3,)
    yaw: float


@dataclass
class Row:
    """One predicted command: a Cartesian TCP target with yaw, or a joint target (``joints``), + gripper."""

    position: np.ndarray
    yaw: float
    gripper: float
    joints: np.ndarray | None = None
    phase: Phase = Phase.APPROACH


@dataclass
class PlannerState:
    """Everything a session remembers between calls (see the module docstring)."""

    phase: Phase = Phase.APPROACH
    phase_calls: int = 0  # calls made so far in this phase
    retries: int = 0
    anchor_position: np.ndarray | None = None
    anchor_yaw: float = 0.0
    anchor_joints: np.ndarray | None = None  # set by the motion layer (IK warm start, step bounds)
    grasp_yaw: float = 0.0
    hand_offset: np.ndarray = field(default_factory=lambda: np.zeros(2))
    lift_xy: np.ndarray | None = None
    retreat_xy: np.ndarray | None = None
    retreat_z: float = 0.0
    blocked_calls: int = 0  # consecutive calls the descending arm was held above its command
    moves: int = 0  # re-approaches in this attempt (the object moved while descending)
    grasp_offset: np.ndarray | None = None  # xy error added to the grasp target (reduced skill; None: exact)
    events: list[str] = field(default_factory=list)

    def enter(self, phase: Phase, event: str | None = None) -> None:
        self.phase = phase
        self.phase_calls = 0
        self.blocked_calls = 0
        if event:
            self.events.append(event)


def wrap_angle(angle: float) -> float:
    """``angle`` wrapped to (-pi, pi]."""
    return -((-angle + math.pi) % (2 * math.pi) - math.pi)


def nearest_equivalent(angle: float, reference: float, period: float) -> float:
    """The angle equal to ``angle`` modulo ``period`` that is closest to ``reference``."""
    return reference + ((angle - reference + period / 2) % period - period / 2)


class Planner:
    """Advance and roll out the plan of one task (stateless itself; state lives in :class:`PlannerState`)."""

    def __init__(
        self,
        task: TaskSpec,
        config: PlannerConfig | None = None,
        home: np.ndarray | None = None,
        home_tcp: np.ndarray | None = None,
    ):
        self.task = task
        self.config = config or PlannerConfig()
        self.home = np.asarray(droid.HOME_JOINT_POSITIONS if home is None else home, dtype=np.float64)
        # Where the TCP is at the home joints: a lookout that leaves both external views clear.
        self.home_tcp = np.asarray((0.36, 0.0, 0.335) if home_tcp is None else home_tcp, dtype=np.float64)

    # ---------------------------------------------------------------------------------- targets
    def grasp_yaw(self, obj: Track, current: float) -> float:
        """Gripper yaw for grasping the object as currently estimated (the equivalent closest to ``current``).

        A long object is grasped across its axis (period pi), a box across a pair of sides (period pi/2),
        a round object at the current yaw. Yaws stay within +/- ``MAX_YAW`` of home.
        """
        if obj.elongation >= ELONGATED:
            period = math.pi
        elif self.task.yaw_mode == "square" and obj.shape_from_wrist:
            period = math.pi / 2
        else:
            return current
        yaw = nearest_equivalent(obj.yaw, current, period)
        if yaw > MAX_YAW:
            yaw -= period
        elif yaw < -MAX_YAW:
            yaw += period
        return float(yaw)

    def grasp_height(self, obj: Track) -> float:
        z = float(obj.position[2])
        # An object lying lower than it stands (a can on its side) is grasped at its centre.
        dz = self.task.grasp_dz if z > self.task.rest_height - 0.01 else 0.0
        return max(z + dz, self.config.min_tcp_z)

    def target(self, state: PlannerState, obj: Track, con: Track) -> tuple[np.ndarray | None, float]:
        """Target TCP position and yaw of the current phase (``None``: hold where the anchor is)."""
        cfg, phase = self.config, state.phase
        here = state.anchor_position
        if phase == Phase.APPROACH:
            if obj.position is None:
                # Nothing seen: hold briefly, then go to the lookout (the arm may hide the object).
                return (self.home_tcp.copy() if state.phase_calls >= 2 else None), state.anchor_yaw
            z = max(float(obj.position[2]) + cfg.hover_height, cfg.min_tcp_z)
            return self._grasp_point(state, obj, z), state.grasp_yaw
        if phase == Phase.DESCEND:
            return self._grasp_point(state, obj, self.grasp_height(obj)), state.grasp_yaw
        if phase == Phase.LIFT:
            xy = state.lift_xy if state.lift_xy is not None else here[:2]
            return np.array([xy[0], xy[1], cfg.lift_height]), state.anchor_yaw
        if phase in (Phase.CARRY, Phase.LOWER):
            if con.position is None:
                return None, state.anchor_yaw
            xy = con.position[:2] - state.hand_offset
            z = (
                max(cfg.carry_height, self.task.release_height + 0.05)
                if phase == Phase.CARRY
                else self.task.release_height
            )
            return np.array([xy[0], xy[1], z]), state.anchor_yaw
        if phase == Phase.RETREAT:
            xy = state.retreat_xy if state.retreat_xy is not None else here[:2]
            return np.array([xy[0], xy[1], state.retreat_z]), state.anchor_yaw
        if phase == Phase.REOPEN:
            z = max(float(here[2]), cfg.lift_height * 0.75)
            return np.array([here[0], here[1], z]), state.anchor_yaw
        return None, state.anchor_yaw  # CLOSE, RELEASE hold; HOME, DONE are joint targets

    @staticmethod
    def _grasp_point(state: PlannerState, obj: Track, z: float) -> np.ndarray:
        """Above or at the object's estimate, shifted by the state's grasp offset when there is one."""
        if state.grasp_offset is None:
            return np.array([obj.position[0], obj.position[1], z])
        return np.array([obj.position[0] + state.grasp_offset[0], obj.position[1] + state.grasp_offset[1], z])

    def speed(self, phase: Phase) -> float:
        cfg = self.config
        if phase in (Phase.DESCEND, Phase.LOWER):
            return cfg.slow_speed
        if phase in (Phase.LIFT, Phase.RETREAT, Phase.REOPEN):
            return cfg.lift_speed
        return cfg.fast_speed

    @staticmethod
    def gripper_command(phase: Phase) -> float:
        return 1.0 if phase in GRIPPER_CLOSED_PHASES else 0.0

    def wants_wrist_view(self, state: PlannerState, meas: Measurement, obj: Track) -> bool:
        """Whether this call's wrist image should refine the object's orientation: the gripper hovers
        over the object (the wrist camera then looks down at it) and the grasp yaw is still open."""
        if state.phase not in (Phase.APPROACH, Phase.DESCEND) or obj.position is None or obj.frozen:
            return False
        above = meas.tcp[2] - obj.position[2]
        near = np.linalg.norm(meas.tcp[:2] - obj.position[:2]) < self.config.wrist_view_distance
        return bool(near and self.config.freeze_height < above < 0.3)

    # ---------------------------------------------------------------------------------- advance
    def begin_call(self, state: PlannerState, meas: Measurement, obj: Track, con: Track) -> None:
        """Start-of-call bookkeeping: anchor sanity, estimate freezing, phase call count."""
        cfg = self.config
        state.phase_calls += 1
        if state.anchor_position is None or np.linalg.norm(meas.tcp - state.anchor_position) > 0.10:
            # First call, or the arm is far from where the plan left it: continue from the measurement.
            if state.anchor_position is None:
                state.grasp_yaw = float(meas.yaw)
            state.anchor_position = np.array(meas.tcp, dtype=np.float64)
            state.anchor_yaw = float(meas.yaw)
            state.anchor_joints = np.array(meas.q, dtype=np.float64)
        # The object estimate follows the views until the fingers are about to reach it.
        if state.phase == Phase.DESCEND and obj.position is not None:
            near = np.linalg.norm(meas.tcp[:2] - obj.position[:2]) < cfg.freeze_distance
            low = meas.tcp[2] < obj.position[2] + cfg.freeze_height
            if near and low:
                obj.frozen = True
        if state.phase in (Phase.CLOSE, Phase.LIFT, Phase.CARRY, Phase.LOWER, Phase.RELEASE):
            obj.frozen = True
        # The container estimate stops following once the held object is lowered over it.
        con.frozen = state.phase in (Phase.LOWER, Phase.RELEASE)

    def advance(self, state: PlannerState, meas: Measurement, obj: Track, con: Track) -> None:
        """Move the plan on from this call's measurements (see the module docstring)."""
        cfg = self.config
        for _ in range(4):  # a call may pass a check and enter the next phase
            phase = state.phase
            target, _ = self.target(state, obj, con) if phase not in (Phase.HOME, Phase.DONE) else (None, 0.0)
            if phase in (Phase.APPROACH, Phase.DESCEND) and obj.position is not None and not obj.frozen:
                if not self.reachable(obj.position):
                    self._fail(state, obj, "out_of_reach")
                    continue
                state.grasp_yaw = self.grasp_yaw(obj, state.grasp_yaw)
            if phase == Phase.APPROACH:
                return
            if phase == Phase.DESCEND:
                if obj.position is None:
                    state.enter(Phase.APPROACH)
                    return
                if not obj.frozen and np.linalg.norm(target[:2] - state.anchor_position[:2]) > cfg.moved_distance:
                    # The object moved under the descending gripper (or the arm cannot follow it).
                    state.moves += 1
                    if state.moves > cfg.max_moves:
                        self._fail(state, obj, "object_keeps_moving")
                        continue
                    state.enter(Phase.APPROACH, "object_moved")
                    return
                error = target - meas.tcp
                arrived = np.linalg.norm(error[:2]) < cfg.grasp_tolerance and abs(error[2]) < cfg.grasp_tolerance
                commanded = np.linalg.norm(state.anchor_position - target) < 0.002
                stuck_above = commanded and -error[2] > cfg.blocked_height
                state.blocked_calls = state.blocked_calls + 1 if stuck_above else 0
                if state.blocked_calls >= 2:
                    # The fingers rest on something (the object moved under them): back off and re-locate.
                    self._fail(state, obj, "blocked")
                    continue
                if arrived or state.phase_calls >= cfg.stall_calls:
                    state.enter(Phase.CLOSE)
                return
            if phase == Phase.CLOSE:
                if state.phase_calls >= 2 or meas.gripper > 0.1:
                    if meas.gripper > cfg.empty_gripper:
                        self._fail(state, obj, "grasp_missed")
                        continue
                    state.lift_xy = np.array(meas.tcp[:2])
                    state.enter(Phase.LIFT)
                return
            if phase == Phase.LIFT:
                if self._lost(meas, obj, state):
                    continue
                if abs(target[2] - meas.tcp[2]) < cfg.loose_tolerance or state.phase_calls >= cfg.stall_calls:
                    if self._grasp_ok(meas, obj):
                        state.hand_offset = self.hand_offset(meas, obj.last_view)
                        state.enter(Phase.CARRY, "grasp_ok")
                        continue
                    self._fail(state, obj, "grasp_check_failed")
                    continue
                return
            if phase in (Phase.CARRY, Phase.LOWER):
                if self._lost(meas, obj, state):
                    continue
                if phase == Phase.LOWER and target is not None:
                    error = target - meas.tcp
                    arrived = np.linalg.norm(error[:2]) < cfg.place_tolerance and abs(error[2]) < cfg.place_tolerance
                    if arrived or state.phase_calls >= cfg.stall_calls:
                        state.enter(Phase.RELEASE)
                return
            if phase == Phase.RELEASE:
                if state.phase_calls >= 2 or meas.gripper < 0.15:
                    state.retreat_xy = np.array(meas.tcp[:2])
                    state.retreat_z = float(meas.tcp[2]) + cfg.retreat_rise
                    state.enter(Phase.RETREAT)
                return
            if phase == Phase.RETREAT:
                if abs(target[2] - meas.tcp[2]) < cfg.loose_tolerance or state.phase_calls >= cfg.stall_calls:
                    if self._placed(obj, con):
                        state.enter(Phase.HOME, "placed")
                        continue
                    self._fail(state, obj, "place_check_failed")
                    continue
                return
            if phase == Phase.REOPEN:
                risen = target is None or abs(target[2] - meas.tcp[2]) < cfg.loose_tolerance
                if meas.gripper < 0.15 and (risen or state.phase_calls >= cfg.stall_calls):
                    state.enter(Phase.APPROACH)
                return
            if phase == Phase.HOME:
                if np.max(np.abs(meas.q - self.home)) < cfg.home_tolerance:
                    state.enter(Phase.DONE)
                return
            return

    def reachable(self, position: np.ndarray) -> bool:
        """Whether an object estimate lies on the part of the table the arm can grasp from above."""
        (x0, x1), (y0, y1) = self.config.workspace_x, self.config.workspace_y
        return bool(x0 <= position[0] <= x1 and y0 <= position[1] <= y1 and position[2] > -0.05)

    def _fail(self, state: PlannerState, obj: Track, event: str) -> None:
        state.retries += 1
        state.moves = 0
        obj.reset()
        state.hand_offset = np.zeros(2)
        if state.retries > self.config.max_retries:
            state.enter(Phase.HOME, event + ";giving_up")
        else:
            state.enter(Phase.REOPEN, event)

    def _lost(self, meas: Measurement, obj: Track, state: PlannerState) -> bool:
        """Whether the held object is gone (gripper closed on nothing, or the object seen on the table)."""
        cfg = self.config
        lost = meas.gripper > cfg.empty_gripper
        view = obj.last_view
        if not lost and view is not None and meas.tcp[2] > self.task.rest_height + 0.08:
            on_table = view.position[2] < self.task.rest_height + 0.02
            away = np.linalg.norm(view.position[:2] - meas.tcp[:2]) > 0.08
            lost = on_table and away
        if lost:
            self._fail(state, obj, "object_lost")
        return lost

    def _grasp_ok(self, meas: Measurement, obj: Track) -> bool:
        """After lifting: the gripper holds something and, where visible, the object rose with it."""
        cfg = self.config
        if meas.gripper > cfg.empty_gripper:
            return False
        view = obj.last_view
        if view is None:
            return True  # hidden (e.g. by the gripper): trust the gripper reading
        lifted = view.position[2] > self.task.rest_height + cfg.lifted_margin
        near = np.linalg.norm(view.position[:2] - meas.tcp[:2]) < 0.06
        return bool(lifted and near)

    def hand_offset(self, meas: Measurement, view: EntityView | None) -> np.ndarray:
        """Object minus TCP (xy) of the held object, as seen now (0 when not visible)."""
        if view is None:
            return np.zeros(2)
        offset = np.asarray(view.position[:2]) - meas.tcp[:2]
        norm = np.linalg.norm(offset)
        limit = self.config.max_hand_offset
        return offset if norm <= limit else offset * (limit / norm)

    def _placed(self, obj: Track, con: Track) -> bool:
        """After releasing: the object is inside the container (or hidden by it)."""
        view = obj.last_view
        if view is None or con.position is None:
            return True
        inside = np.linalg.norm(view.position[:2] - con.position[:2]) < self.task.place_radius
        low = view.position[2] < self.task.rim_height + 0.03
        return bool(inside and low)

    # ---------------------------------------------------------------------------------- rollout
    def rollout(
        self, state: PlannerState, obj: Track, con: Track, rows: int, executed: int
    ) -> tuple[list[Row], PlannerState]:
        """``rows`` predicted commands from the anchor, and the state after the first ``executed`` of them."""
        cfg = self.config
        sim = copy.deepcopy(state)
        sim.events = []
        out: list[Row] = []
        kept = None
        for i in range(rows):
            phase = sim.phase
            grip = self.gripper_command(phase)
            if phase in (Phase.HOME, Phase.DONE):
                out.append(Row(sim.anchor_position.copy(), sim.anchor_yaw, grip, self.home, phase))
            else:
                target, yaw = self.target(sim, obj, con)
                position = sim.anchor_position.copy()
                if target is not None:
                    target = target.copy()
                    target[2] = max(target[2], cfg.min_tcp_z)
                    delta = target - position
                    dist = float(np.linalg.norm(delta))
                    step = self.speed(phase) * cfg.dt
                    position = target if dist <= step else position + delta * (step / dist)
                    dyaw = wrap_angle(yaw - sim.anchor_yaw)
                    max_dyaw = cfg.yaw_rate * cfg.dt
                    sim.anchor_yaw = sim.anchor_yaw + float(np.clip(dyaw, -max_dyaw, max_dyaw))
                    # An approach to the lookout (object not seen) must not hand over to a descent onto nothing.
                    seen = phase != Phase.APPROACH or obj.position is not None
                    if dist <= step and abs(dyaw) <= max_dyaw and phase in PASS_THROUGH and seen:
                        sim.enter(PASS_THROUGH[phase])
                sim.anchor_position = position
                out.append(Row(position.copy(), sim.anchor_yaw, grip, None, phase))
            if i + 1 == executed:
                kept = copy.deepcopy(sim)
        if kept is None:
            kept = sim
        # Executed rows count as this call in the phase they ended in (phase_calls restarts on entry).
        kept.events = list(state.events)
        return out, kept
