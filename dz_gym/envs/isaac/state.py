"""Reading the task state of every env (object, container, gripper) for the DROID success check.

Isaac Lab resets a finished env inside ``step()`` before it returns, so the state an episode ended in is
gone by the time the caller sees the step's result. :class:`StateProbe` is therefore installed as a
termination term that never terminates: the termination manager calls it after the physics of every
step and before the in-step reset, on 2.2 and 3.0 alike, and it keeps a host copy of what the success
check needs. Positions are made env-local by subtracting ``scene.env_origins``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from dz_gym.envs import droid, episodes
from dz_gym.envs.isaac.compat import IsaacLabApi, as_tensor
from dz_gym.preprocess import to_numpy

# The Robotiq 2F-85 inner finger links of sim-evals' robot USD; their midpoint stands for the tool
# centre point (the links' origins, a few centimetres above the pads: good enough for the 6 cm
# release distance of the check).
DEFAULT_TCP_BODIES = ("left_inner_finger", "right_inner_finger")


@dataclass(frozen=True)
class TaskState:
    """Env-local positions ``(N,3)`` and the object's speed ``(N,)``, on the host, float64."""

    object_pos: np.ndarray
    container_pos: np.ndarray
    tcp_pos: np.ndarray
    object_speed: np.ndarray
    gripper: np.ndarray  # (N,) gripper joint / its closed angle (finger_joint / (pi/4)): 0 open, 1 closed

    def for_episodes(self, milestone_flags: np.ndarray | None = None) -> episodes.TaskState:
        """The record :class:`~dz_gym.envs.episodes.Episodes` takes, with a MILA task's milestone flags."""
        return episodes.TaskState(
            self.object_pos, self.container_pos, self.tcp_pos, self.object_speed, milestone_flags=milestone_flags
        )


class StateProbe:
    """Reads :class:`TaskState` from an Isaac env; ``term`` is its never-terminating termination term."""

    def __init__(
        self,
        api: IsaacLabApi,
        scene: droid.SceneSpec,
        tcp_bodies: Sequence[str] = DEFAULT_TCP_BODIES,
        gripper_joint: str = "finger_joint",
        gripper_closed: float = np.pi / 4,
        tcp_from_com: bool = False,
    ):
        self.api = api
        self.scene = scene
        self.tcp_bodies = tuple(tcp_bodies)
        self.gripper_joint = gripper_joint  # its angle over ``gripper_closed`` is the gripper's closure
        self.gripper_closed = float(gripper_closed)
        self.tcp_from_com = tcp_from_com  # the TCP bodies' centres of mass instead of their link origins
        self.latest: TaskState | None = None
        self.calls = 0
        self.before_reset = None  # optional callback(env), called last: every other termination term has run
        self._tcp_ids: list[int] | None = None
        self._finger: int | None = None

        def term(env):
            # A plain closure (configclass never deep-copies callables), called by the termination manager.
            self.latest = self.read(env)
            self.calls += 1
            if self.before_reset is not None:
                self.before_reset(env)
            import torch

            return torch.zeros(env.num_envs, dtype=torch.bool, device=env.device)

        self.term = term

    def validate(self, env: Any) -> None:
        """The scene has the task's entities and the gripper bodies; a clear error names what is missing."""
        for name in (self.scene.isaac_object, self.scene.isaac_container):
            self._entity(env, name)
        self._tcp_body_ids(env)

    def read(self, env: Any) -> TaskState:
        """The current state of every env, env-local, copied to the host."""
        origins = self.api.env_origins(env)
        obj = self._entity(env, self.scene.isaac_object)
        container = self._entity(env, self.scene.isaac_container)
        robot = env.scene["robot"]
        bodies = as_tensor(robot.data.body_com_pos_w) if self.tcp_from_com else self.api.body_pos_w(robot)
        tcp = bodies[:, self._tcp_body_ids(env), :].mean(dim=1)
        speed = self.api.root_lin_vel_w(obj).norm(dim=-1)
        if self._finger is None:
            self._finger = self.api.joint_names(robot).index(self.gripper_joint)
        return TaskState(
            object_pos=_host(self.api.root_pos_w(obj) - origins),
            container_pos=_host(self.api.root_pos_w(container) - origins),
            tcp_pos=_host(tcp - origins),
            object_speed=_host(speed),
            gripper=_host(self.api.joint_pos(robot)[:, self._finger]) / self.gripper_closed,
        )

    def _entity(self, env: Any, name: str):
        try:
            return env.scene[name]
        except KeyError:
            raise KeyError(
                f"scene entity {name!r} (scene {self.scene.scene_id}) not found: neither sim-evals nor the backend "
                f"registered it (run_eval.py layouts do in set_scene; the per-scene layout gets it from its prim)"
            ) from None

    def _tcp_body_ids(self, env: Any) -> list[int]:
        if self._tcp_ids is None:
            robot = env.scene["robot"]
            try:  # Isaac Lab raises ValueError for a name that matches no body
                ids, names = robot.find_bodies(list(self.tcp_bodies), preserve_order=True)
            except ValueError as exc:
                raise KeyError(f"robot bodies {list(self.tcp_bodies)}: not all in the articulation ({exc})") from None
            if len(ids) != len(self.tcp_bodies):
                raise KeyError(
                    f"robot bodies {list(self.tcp_bodies)}: expected all in the articulation, found {list(names)}"
                )
            self._tcp_ids = list(ids)
        return self._tcp_ids


def _host(tensor) -> np.ndarray:
    """A device tensor as a float64 host array (the success check's precision)."""
    return to_numpy(tensor).astype(np.float64)
