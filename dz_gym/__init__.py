"""dz-gym: batched, trustworthy evaluation of OpenPI/DreamZero policy servers on DROID simulation scenes.

Public API:
    make_droid_env(backend="mujoco"|"isaac", scene=1, num_envs=8, ...)  -> a batched DROID env
    DreamZeroPolicyWrapper(env, server=..., prompt=...)                 -> a gymnasium.Wrapper that
                                                                           queries the policy server
    PolicyClient                                                        -> the interface the wrapper talks
                                                                           to (``client=``); websocket default
    embedded_server(policy="reference")                                 -> a context manager: a reference
                                                                           policy server on loopback
    EvalConfig(scenes=[1], episodes=16, ...), run_eval(config, ...)     -> what ``dz-gym-eval`` runs, from
                                                                           Python (``env_factory=``: your env)

Importing dz_gym registers the Gymnasium ids of every backend's scenes (``gym.make_vec(
"dz_gym/DROID-CubeInBowl-v0", num_envs=8)``, ``gym.make(...)``: :mod:`dz_gym.envs.registration`).
"""

from __future__ import annotations

__version__ = "0.1.0"

__all__ = [
    "DreamZeroPolicyWrapper",
    "EvalConfig",
    "PolicyClient",
    "__version__",
    "embedded_server",
    "make_droid_env",
    "run_eval",
]

from dz_gym.envs.registration import register_envs as _register_envs

_register_envs()


def __getattr__(name: str):
    # Lazy: importing dz_gym must not import MuJoCo, torch or websockets machinery until asked for.
    if name == "make_droid_env":
        from dz_gym.envs import make_droid_env

        return make_droid_env
    if name == "DreamZeroPolicyWrapper":
        from dz_gym.wrapper import DreamZeroPolicyWrapper

        return DreamZeroPolicyWrapper
    if name == "embedded_server":
        from dz_gym.server.embedded import embedded_server

        return embedded_server
    if name == "EvalConfig":
        from dz_gym.eval.config import EvalConfig

        return EvalConfig
    if name == "run_eval":
        from dz_gym.eval.run import run_eval

        return run_eval
    if name == "PolicyClient":
        from dz_gym.policy_client import PolicyClient

        return PolicyClient
    raise AttributeError(f"module 'dz_gym' has no attribute {name!r}")
