"""The robot's action limits: the arm's joint ranges and the gripper command's range, for the action spaces.

A DROID action is 7 absolute joint-position targets (rad) and a gripper command in ``[0, 1]`` (> 0.5 closes).
The joint ranges are read from the embedded robot's MJCF (``envs/mujoco/assets/droid/model.xml``, the
``range`` of ``joint1`` ... ``joint7``), the model the embedded simulator steps and the Isaac Lab 3.0 kit-less
task converts, so that the bounded ``single_action_space`` and the simulated robot cannot disagree. The file
is parsed as XML, without importing MuJoCo (``import dz_gym`` and the spaces stay light).

>>> low, high = joint_limits()
>>> low.shape, bool((low < high).all())
((7,), True)
>>> low, high = action_limits()
>>> float(low[-1]), float(high[-1])
(0.0, 1.0)
"""

from __future__ import annotations

import functools
import xml.etree.ElementTree as ElementTree
from pathlib import Path

import numpy as np

from dz_gym.envs import droid

MODEL_XML = Path(__file__).resolve().parent / "mujoco" / "assets" / "droid" / "model.xml"
ARM_JOINTS = tuple(f"joint{k}" for k in range(1, droid.ARM_DOF + 1))
# How far past its range a joint's observed position may go: the simulator's joint limit is a stiff spring, and
# a target at the range's end reached at full speed overshoots it (0.084 rad at most in a probe of actions
# switching between the action space's bounds; tests/test_gym_contract.py runs such a probe).
JOINT_OVERSHOOT = 0.2
GRIPPER_RANGE = (0.0, 1.0)  # the command: 0 open, 1 closed (binarized at droid.GRIPPER_CLOSE_THRESHOLD)


@functools.lru_cache(maxsize=4)
def joint_limits(model_xml: Path = MODEL_XML) -> tuple[np.ndarray, np.ndarray]:
    """``(low, high)``, each ``(7,)`` float64 rad: the ``range`` of the arm's joints in ``model_xml``.

    A one-line ``ValueError`` naming the joint when the model lacks one or its range is not two increasing
    numbers. The arrays are read-only (cached).
    """
    root = ElementTree.parse(model_xml).getroot()
    ranges = {joint.get("name"): joint.get("range") for joint in root.iter("joint") if joint.get("name")}
    low, high = np.empty(droid.ARM_DOF), np.empty(droid.ARM_DOF)
    for k, name in enumerate(ARM_JOINTS):
        text = ranges.get(name)
        try:
            low[k], high[k] = (float(v) for v in (text or "").split())
        except ValueError:
            raise ValueError(f"{model_xml.name}: joint {name}: expected a range of two numbers, got {text!r}") from None
        if not low[k] < high[k]:
            raise ValueError(f"{model_xml.name}: joint {name}: expected low < high, got range {text!r}")
    low.flags.writeable = high.flags.writeable = False
    return low, high


def action_limits() -> tuple[np.ndarray, np.ndarray]:
    """``(low, high)``, each ``(8,)`` float32: the joint ranges, then the gripper command's ``[0, 1]``."""
    low, high = joint_limits()
    return (
        np.append(low, GRIPPER_RANGE[0]).astype(np.float32),
        np.append(high, GRIPPER_RANGE[1]).astype(np.float32),
    )
