"""The reference policy server (``dz-gym-serve``): vLLM-Omni, DreamZero and openpi flavors.

- :mod:`~dz_gym.server.app`: the websocket server and its per-flavor behaviour;
- :mod:`~dz_gym.server.engine`: the FIFO inference engine (workers, emulated latency, fault injection, stats);
- :mod:`~dz_gym.server.policies`: the policy plug-in interface and the built-in policies;
- :mod:`~dz_gym.server.launch`: start a server in a thread or a subprocess;
- :mod:`~dz_gym.server.cli`: the command line.
"""

from dz_gym.server.app import FLAVORS, PolicyServer, ServerConfig
from dz_gym.server.engine import EngineStats, InferenceEngine
from dz_gym.server.launch import ServerProcess, ServerThread, start_server_process, start_server_thread
from dz_gym.server.policies import BUILTIN_POLICIES, HoldPolicy, ProbePolicy, load_policy

__all__ = [
    "BUILTIN_POLICIES",
    "EngineStats",
    "FLAVORS",
    "HoldPolicy",
    "InferenceEngine",
    "PolicyServer",
    "ProbePolicy",
    "ServerConfig",
    "ServerProcess",
    "ServerThread",
    "load_policy",
    "start_server_process",
    "start_server_thread",
]
