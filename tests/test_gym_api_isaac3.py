"""The Gymnasium face on Isaac Lab 3.0 kit-less, on the CPU, with the real wheels (the third CI environment).

``gym.make_vec("DZ-DROID-CubeInBowl-Newton-v0", num_envs=2, device="cpu")`` gives the isaac backend's batched
env (a ``gymnasium.vector.VectorEnv``), and :class:`~dz_gym.wrapper.DreamZeroPolicyWrapper` drives it and the
raw Isaac Lab ``ManagerBasedRLEnv`` underneath alike. Each case runs in a process of its own (one simulation
per process), bounded in time. Skipped where the kit-less stack (isaaclab 3, newton, warp, mujoco-warp) is
not installed.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys

import pytest

from dz_gym.envs.isaac.kitless import REQUIRED


def _installed(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


MISSING = [name for name in REQUIRED if not _installed(name)]
pytestmark = [
    pytest.mark.skipif(bool(MISSING), reason=f"needs the Isaac Lab 3.0 kit-less stack (missing: {', '.join(MISSING)})"),
    pytest.mark.slow,
]

COMMON = """
import gymnasium as gym
import dz_gym
from dz_gym.preprocess import to_numpy
from dz_gym.server.policies import HoldPolicy
from dz_gym.testing.memory_client import MemoryPolicyClient

vec = gym.make_vec("DZ-DROID-CubeInBowl-Newton-v0", num_envs=2, device="cpu", seed=0)
assert isinstance(vec, gym.vector.VectorEnv), type(vec)
assert vec.metadata["autoreset_mode"] == gym.vector.AutoresetMode.SAME_STEP
client = MemoryPolicyClient(HoldPolicy(), num_envs=2)
"""

CASE = (
    COMMON
    + """
wrapper = dz_gym.DreamZeroPolicyWrapper(vec, client=client)  # over the VectorEnv
obs, info = wrapper.reset(seed=0)
for _ in range(10):
    obs, reward, terminated, truncated, info = wrapper.step()
assert info["_success"].all() and info["milestones"]["_placed"].all() and info["_policy_called"].all()
assert to_numpy(obs["policy"]["wrist_cam"]).shape[0] == 2
print("VECTOR OK")

raw = vec.unwrapped.isaac_env  # over Isaac Lab's ManagerBasedRLEnv itself (the same simulation: one per process)
wrapper = dz_gym.DreamZeroPolicyWrapper(raw, client=MemoryPolicyClient(HoldPolicy(), num_envs=2),
                                        prompt="put the cube in the bowl")
obs, info = wrapper.reset(seed=0)
received = 0
for _ in range(10):  # requests at steps 0 and 8 (open-loop horizon 8): 2 chunks per env
    obs, reward, terminated, truncated, info = wrapper.step()
    assert info["_policy_called"].all()
    received += int(info["chunk_received"].sum())
assert received == 4, received
wrapper.close()
print("RAW OK")
"""
)


def test_wrapper_drives_the_kitless_env_on_the_cpu():
    """One build (Isaac Lab builds one simulation per process): the wrapper over the registered vector env,
    then over the ManagerBasedRLEnv underneath it."""
    done = subprocess.run([sys.executable, "-c", CASE], capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0 and "VECTOR OK" in done.stdout and "RAW OK" in done.stdout, done.stderr[-4000:]
