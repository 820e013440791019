"""Reduced skill for the reference policy: a tunable, reproducible way to make it fail more often.

An A/B comparison on the embedded simulator needs two policies that really differ. ``skill`` S in [0, 1]
degrades the reference policy in three ways a weaker learned policy also fails:

- **missed grasps**: each grasp attempt, with probability ``1 - S``, aims ``MAX_GRASP_OFFSET`` away from the
  object's estimate in a random direction, so the fingers land on or beside the object;
- **less persistence**: ``round(S * max_retries)`` retries after a failed grasp or placement instead of all;
- **dropped calls**: with probability ``(1 - S) * MAX_DROP`` a call returns a chunk that holds the arm where
  it is (the plan does not advance), which costs time against the episode's step limit.

A miss is all or nothing (rather than a smaller error at every attempt) so that success falls gradually with
S instead of dropping off a cliff where the error outgrows the gripper's clearance: with ``r`` retries the
chance that every attempt misses is ``(1 - S)^(1 + r)``.

At S = 1 nothing is drawn and nothing changes: the policy is bit-identical to the full-skill one.

Draws are deterministic per episode: they come from a seed taken from the request's ``seed`` field when the
client sends one, else from a hash of the session's first request (prompt, joints and the first external
view), which depends only on the episode's seed in the simulator. The same episode seed therefore gets the
same perturbations in every run, so A/B runs stay paired and reruns reproduce.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping
from typing import Any

import numpy as np

MAX_GRASP_OFFSET = 0.05  # metres of grasp error of a missed attempt (the cube is 5 cm wide; the gripper opens 8.5 cm)
MAX_DROP = 0.3  # probability that a call is dropped at skill 0

__all__ = ["MAX_DROP", "MAX_GRASP_OFFSET", "SkillDraws", "check_skill", "episode_seed", "retries_at"]


def check_skill(skill: Any) -> float:
    """``skill`` as a float in [0, 1]; one-line error otherwise."""
    if isinstance(skill, bool):
        raise ValueError(f"skill: expected a number in [0, 1], got {skill!r}")
    try:
        value = float(skill)
    except (TypeError, ValueError):
        raise ValueError(f"skill: expected a number in [0, 1], got {skill!r}") from None
    if not 0.0 <= value <= 1.0 or math.isnan(value):
        raise ValueError(f"skill: expected a number in [0, 1], got {skill!r}")
    return value


def episode_seed(request: Mapping[str, Any], image: np.ndarray, joints: np.ndarray) -> int:
    """The seed of an episode's draws, from the session's first request (see the module docstring): its
    ``seed``, else a digest of its prompt, its ``joints`` and its first exterior view ``image``."""
    seed = request.get("seed")
    if isinstance(seed, (int, np.integer)) and not isinstance(seed, bool):
        return int(seed) & (2**63 - 1)
    digest = hashlib.blake2b(digest_size=8)
    digest.update(str(request.get("prompt", "")).encode())
    digest.update(np.ascontiguousarray(np.asarray(joints, dtype=np.float32)).tobytes())
    digest.update(np.ascontiguousarray(image).tobytes())
    return int.from_bytes(digest.digest(), "little") & (2**63 - 1)


class SkillDraws:
    """One episode's perturbations at skill ``skill``, drawn from ``seed`` (see the module docstring)."""

    def __init__(self, skill: float, seed: int):
        self.skill = check_skill(skill)
        self.seed = int(seed)

    def grasp_offset(self, attempt: int) -> np.ndarray:
        """The xy grasp error (metres) of grasp attempt ``attempt`` (0-based): zero, or a miss."""
        rng = np.random.default_rng([self.seed, 1, int(attempt)])
        missed, angle = rng.random() < 1.0 - self.skill, rng.uniform(0.0, 2 * math.pi)
        radius = MAX_GRASP_OFFSET if missed else 0.0
        return np.array([radius * math.cos(angle), radius * math.sin(angle)])

    def drops(self, call: int) -> bool:
        """Whether call number ``call`` (1-based) of the episode is dropped."""
        rng = np.random.default_rng([self.seed, 2, int(call)])
        return bool(rng.random() < (1.0 - self.skill) * MAX_DROP)


def retries_at(skill: float, max_retries: int) -> int:
    """Retries allowed at ``skill`` when the full-skill policy allows ``max_retries``."""
    return round(check_skill(skill) * max_retries)
