"""``ReferencePolicy``: a classical pick-and-place policy for the embedded scenes, served by ``dz-gym-serve``.

It is a reference for checking the evaluator end to end, not a learned model. It sees only what a
DreamZero request carries: the two external views and the wrist view, the joint and gripper positions and
the prompt (which selects the scene). It knows the fixed camera calibration and the robot model of the
embedded simulator, never the object poses. Per call:

1. the prompt selects the task (:mod:`tasks`); the session's state is looked up by session id;
2. perception (:mod:`perception`) finds the object and the container in both external views and
   triangulates them; the session's tracks fold the result in under their visibility/freeze rules;
3. the planner (:mod:`planner`) advances its phase from the measured joints and gripper and the checks,
   then rolls out 24 Cartesian rows from where the previous chunk's executed rows left the arm;
4. the motion layer (:mod:`motion`) solves them into safe joint rows; the reply is a ``(24, 8)`` float32
   chunk (7 absolute joint targets + gripper, 1 closes).

Sessions are kept per session id (bounded, least recently used out) and dropped on a reset or when the
server flags a new session; calls may come from several server threads at once.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from dz_gym.envs import droid
from dz_gym.policies.reference.geometry import PinholeCamera
from dz_gym.policies.reference.motion import MotionSolver
from dz_gym.policies.reference.perception import Perception, Track
from dz_gym.policies.reference.planner import Measurement, Planner, PlannerConfig, PlannerState
from dz_gym.policies.reference.sessions import DEFAULT_MAX_SESSIONS, SessionStore
from dz_gym.policies.reference.skill import SkillDraws, check_skill, episode_seed, retries_at
from dz_gym.policies.reference.tasks import TaskSpec, task_for_prompt
from dz_gym.protocol import DREAMZERO_METADATA
from dz_gym.protocol.composite import halve
from dz_gym.protocol.observation import request_profile, request_proprio, request_views


@dataclass
class Session:
    """One episode's memory: its task, the plan's state and the two estimates."""

    task: TaskSpec | None = None
    plan: PlannerState = field(default_factory=PlannerState)
    object: Track = field(default_factory=Track)
    container: Track = field(default_factory=lambda: Track(min_visible=0.7))
    calls: int = 0
    draws: SkillDraws | None = None  # reduced skill only: this episode's perturbations
    last_gripper: float = 0.0  # reduced skill only: the gripper command a dropped call holds

    def restart(self, task: TaskSpec) -> None:
        self.task = task
        self.plan = PlannerState()
        self.object = Track()
        self.container = Track(min_visible=0.7)
        self.calls = 0
        self.draws = None
        self.last_gripper = 0.0


def _views(request: Mapping[str, Any], profile) -> tuple[tuple[np.ndarray, np.ndarray], np.ndarray]:
    """The two exterior views and the wrist view, whichever the request's layout; a wrist view of twice the
    exteriors' size (a FLUX composite: the server halved the exteriors) is halved to match them."""
    views = request_views(request, profile)
    images = (views["external_cam"], views["external_cam_2"])
    if images[0].shape != images[1].shape:
        raise ValueError(f"exterior views: expected the same shape, got {images[1].shape} vs {images[0].shape}")
    wrist = views["wrist_cam"]
    if wrist.shape != images[0].shape:
        if wrist.shape[:2] != (2 * images[0].shape[0], 2 * images[0].shape[1]):
            raise ValueError(f"wrist view: expected {images[0].shape} or twice that, got {wrist.shape}")
        wrist = halve(wrist)
    return images, wrist


class ReferencePolicy:
    """The ``reference`` policy of ``dz-gym-serve`` (see the module docstring).

    ``horizon``: rows of each chunk; ``open_loop_horizon``: rows the client executes from each chunk (the
    plan's state is kept as of that row). Left None, both follow the server the request was made for
    (:func:`~dz_gym.protocol.observation.request_profile`): 24 and 8 for DreamZero's keys, 32 and 32 for
    the FLUX servers'. ``max_sessions``: sessions remembered at once (least recently used out); ``skill`` in
    [0, 1]: 1 is the full policy, lower values fail more often (:mod:`dz_gym.policies.reference.skill`).
    """

    def __init__(self, open_loop_horizon: int | None = None, max_sessions: int = DEFAULT_MAX_SESSIONS,
                 horizon: int | None = None, skill: float = 1.0):  # fmt: skip
        if horizon is not None and (not isinstance(horizon, int) or horizon < 1):
            raise ValueError(f"horizon: expected an integer >= 1, got {horizon!r}")
        top = droid.ACTION_HORIZON if horizon is None else horizon
        if open_loop_horizon is not None and (
            not isinstance(open_loop_horizon, int) or not 1 <= open_loop_horizon <= top
        ):
            raise ValueError(f"open_loop_horizon: expected an integer in [1, {top}], got {open_loop_horizon!r}")
        # DreamZero's handshake: 180x320 views, two external cameras + wrist, session ids, joint positions.
        self.metadata = dict(DREAMZERO_METADATA)
        self.horizon = horizon
        self.open_loop_horizon = open_loop_horizon
        self.sessions: SessionStore[Session] = SessionStore(Session, max_sessions=max_sessions)
        self.skill = check_skill(skill)
        config = PlannerConfig()
        if self.skill < 1.0:
            config = replace(config, max_retries=retries_at(self.skill, config.max_retries))
        self.config = config
        self.motion = MotionSolver(min_tcp_z=self.config.min_tcp_z)
        # Kinematics instances are not thread-safe: each call borrows one (one per concurrent call).
        self._kinematics_pool: queue.SimpleQueue = queue.SimpleQueue()
        self._perception: dict[tuple[int, int], Perception] = {}
        self._perception_lock = threading.Lock()
        # Warm up (robot model, calibration) here rather than in the first request.
        kin = self._new_kinematics()
        self._home_tcp = kin.fk(kin.home)[0]
        self._kinematics_pool.put(kin)
        self.perception(droid.DEFAULT_EMBEDDED_IMAGE_SHAPE)

    # ------------------------------------------------------------------------------- resources
    @staticmethod
    def _new_kinematics():
        from dz_gym.envs.mujoco.kinematics import Kinematics

        return Kinematics()

    @contextmanager
    def _kinematics(self):
        try:
            kin = self._kinematics_pool.get_nowait()
        except queue.Empty:
            kin = self._new_kinematics()
        try:
            yield kin
        finally:
            self._kinematics_pool.put(kin)

    def perception(self, image_shape: tuple[int, int]) -> Perception:
        """The perception for images of ``image_shape`` (calibration computed once per shape)."""
        key = (int(image_shape[0]), int(image_shape[1]))
        with self._perception_lock:
            found = self._perception.get(key)
            if found is None:
                from dz_gym.envs.mujoco.cameras import camera_calibration

                calib = camera_calibration(key)
                cams = tuple(
                    PinholeCamera(calib[n].K, calib[n].world_from_camera) for n in ("external_cam", "external_cam_2")
                )
                found = self._perception[key] = Perception(cams, calib["wrist_cam"].K)
            return found

    # ------------------------------------------------------------------------------------- API
    def reset(self, session_id: str | None = None) -> None:
        """Forget ``session_id`` (every session when ``None``)."""
        self.sessions.drop(session_id)

    def geometry(self, request: Mapping[str, Any]) -> tuple[int, int]:
        """``(horizon, open_loop_horizon)`` for ``request``: the ones given, else its server's."""
        profile = request_profile(request)
        rows, executed = profile.chunk_shape[0], profile.executed_actions  # type: ignore[index]
        horizon = rows if self.horizon is None else self.horizon
        executed = min(executed, horizon) if self.open_loop_horizon is None else self.open_loop_horizon
        return horizon, min(executed, horizon)

    def infer(self, request: dict, *, session_id: str = "default", new_session: bool = False) -> np.ndarray:
        """One ``(horizon, 8)`` float32 chunk for ``request`` (see the module docstring)."""
        task = task_for_prompt(request.get("prompt"))
        profile = request_profile(request)
        images, wrist_image = _views(request, profile)
        q, gripper = request_proprio(request, profile)
        perception = self.perception(images[0].shape[:2])
        with self._kinematics() as kin, self.sessions.session(str(session_id), new=bool(new_session)) as session:
            if session.task is None or session.task.scene_id != task.scene_id:
                session.restart(task)
            if self.skill < 1.0 and session.draws is None:
                session.draws = SkillDraws(self.skill, episode_seed(request, images[0], q))
            return self._step(session, perception, kin, images, wrist_image, q, gripper, self.geometry(request))

    def _step(
        self,
        session: Session,
        perception: Perception,
        kin,
        images,
        wrist_image,
        q: np.ndarray,
        gripper: float,
        geometry: tuple[int, int],
    ) -> np.ndarray:
        horizon, executed = geometry
        session.calls += 1
        draws = session.draws
        if draws is not None and session.calls > 1 and draws.drops(session.calls):
            # A dropped call: hold the arm and the gripper command; the plan does not advance.
            row = np.empty(droid.ACTION_DIM, dtype=np.float32)
            row[: droid.ARM_DOF] = q
            row[droid.ARM_DOF] = session.last_gripper
            return np.tile(row, (horizon, 1))
        position, rotation = kin.fk(q)
        meas = Measurement(q, gripper, position, MotionSolver.yaw_of(kin, rotation))
        planner = Planner(session.task, self.config, kin.home, self._home_tcp)
        state = session.plan
        planner.begin_call(state, meas, session.object, session.container)
        observation = perception.observe(images, session.task)
        session.object.update(observation.object)
        session.container.update(observation.container)
        if planner.wants_wrist_view(state, meas, session.object):
            top = float(session.object.position[2]) + session.task.top_above_centre
            seen = perception.observe_wrist(wrist_image, kin.camera_pose(q), session.task.object_colour, top)
            session.object.update_shape(seen)
        if draws is not None:
            state.grasp_offset = draws.grasp_offset(state.retries)
        planner.advance(state, meas, session.object, session.container)
        if draws is not None:  # a failed attempt inside advance starts the next one with its own error
            state.grasp_offset = draws.grasp_offset(state.retries)
        rows, kept = planner.rollout(state, session.object, session.container, horizon, executed)
        q_start = state.anchor_joints if state.anchor_joints is not None else q
        actions, joints = self.motion.solve(kin, rows, q_start, exact_rows=executed)
        # The next call continues from the joints the executed rows ended on.
        kept.anchor_joints = joints[executed - 1]
        end_position, end_rotation = kin.fk(kept.anchor_joints)
        kept.anchor_position, kept.anchor_yaw = end_position, MotionSolver.yaw_of(kin, end_rotation)
        session.plan = kept
        if draws is not None:
            session.last_gripper = float(actions[executed - 1, droid.ARM_DOF])
        return actions


def make_reference_policy(**kwargs: Any) -> ReferencePolicy:
    """Factory for ``dz-gym-serve --policy reference`` (keyword arguments as in :class:`ReferencePolicy`)."""
    return ReferencePolicy(**kwargs)
