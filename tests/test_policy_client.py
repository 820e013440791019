"""PolicyClient's defaults: a client that implements only ``submit`` takes a batch step's requests through
``submit_batch`` as the request dicts of the batch, in order (the in-process client, no sockets)."""

from __future__ import annotations

import numpy as np

from dz_gym.envs import droid
from dz_gym.requests import assemble_requests
from dz_gym.server.policies import HoldPolicy
from dz_gym.testing.memory_client import MemoryPolicyClient


def test_submit_batch_sends_the_batchs_request_dicts_in_order():
    num_envs, env_ids = 4, [3, 0, 2]
    views = {camera: np.full((len(env_ids), 180, 320, 3), k, np.uint8) for k, camera in enumerate(droid.CAMERA_KEYS)}
    joints = np.arange(num_envs * 7, dtype=np.float64).reshape(num_envs, 7) / 10
    gripper = np.zeros((num_envs, 1))
    batch = assemble_requests(views, joints, gripper, env_ids, prompts=["pick"] * num_envs,
                              session_ids=[f"episode-{k}" for k in range(num_envs)])  # fmt: skip
    client = MemoryPolicyClient(HoldPolicy(), num_envs)
    client.connect()
    outcomes = [f.result(5) for f in client.submit_batch(batch, env_ids)]
    assert [o.index for o in outcomes] == env_ids and all(o.ok for o in outcomes)
    for env_id, outcome in zip(env_ids, outcomes):  # the hold policy sends back each request's joints
        np.testing.assert_allclose(outcome.reply.actions[0, :7], joints[env_id], rtol=1e-6)
    assert [(env_id, session) for env_id, session, _ in client.sessions_seen] == [
        (env_id, f"episode-{env_id}") for env_id in env_ids
    ]
