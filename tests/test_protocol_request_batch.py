"""RequestBatch: a batch step's requests as columns, framed from one template (pure, no sockets).

Every frame of the template is the bytes ``packb`` gives the request dict ``build_infer_request`` builds;
the batch is the Mapping of those dicts; it refuses what ``build_infer_request`` refuses, with its message;
where the requests share no template (a session id of None, text that is not UTF-8) it says so.
"""

from __future__ import annotations

import numpy as np
import pytest

from dz_gym.envs import droid
from dz_gym.profile_hooks import encoded_size
from dz_gym.protocol import InvalidRequest, build_infer_request, packb
from dz_gym.protocol.packer import fast_template, join_template, pack_fast, str_bytes
from dz_gym.protocol.request_batch import RequestBatch
from dz_gym.requests import assemble_requests

NUM_ENVS = 6


def columns(rows: int, shape=(4, 6, 3), seed=0):
    rng = np.random.default_rng(seed)
    views = {c: rng.integers(0, 255, (rows, *shape), dtype=np.uint8) for c in droid.CAMERA_KEYS}
    return views, rng.normal(size=(NUM_ENVS, 7)), rng.uniform(size=(NUM_ENVS, 1))


PROMPTS = ["pick", "p" * 31, "q" * 32, "é" * 200, "put the cube in the bowl", "x" * 70000]
SESSIONS = [f"env{i}-" + "s" * (40 * i) for i in range(NUM_ENVS)]


def expected(views, joints, gripper, env_ids, prompts=PROMPTS, sessions=SESSIONS):
    """The requests as assemble_requests built them before: one build_infer_request per env."""
    out = {}
    for row, env_id in enumerate(sorted(env_ids)):
        images = {droid.REQUEST_IMAGE_KEYS[c]: views[c][row] for c in droid.CAMERA_KEYS}
        out[env_id] = build_infer_request(images=images, joint_position=joints[env_id],
                                          gripper_position=gripper[env_id], prompt=prompts[env_id],
                                          session_id=sessions[env_id])  # fmt: skip
    return out


@pytest.mark.parametrize("shape", [(4, 6, 3), (180, 320, 3), (2, 4, 6, 3)])
def test_every_frame_of_the_template_is_packb_of_the_built_request(shape):
    env_ids = [5, 0, 3, 2]
    views, joints, gripper = columns(len(env_ids), shape)
    batch = assemble_requests(views, joints, gripper, env_ids, prompts=PROMPTS, session_ids=SESSIONS)
    want = expected(views, joints, gripper, env_ids)
    template = batch.frame_template()
    assert template is not None and len(template.columns) == 5  # three views, joints, gripper
    assert template.row_bytes(0) == int(np.prod(shape)) and template.row_bytes(3) == 56
    for env_id in env_ids:
        frame = batch.frame(env_id)
        assert frame == packb(want[env_id]) == packb(batch[env_id])
        assert len(frame) == template.fixed_bytes + sum(template.row_bytes(j) for j in range(5)) + sum(
            len(s) for s in batch.strings(env_id)
        )


def test_the_batch_is_the_mapping_of_its_request_dicts():
    env_ids = [4, 1, 2]
    views, joints, gripper = columns(len(env_ids))
    batch = assemble_requests(views, joints, gripper, env_ids, prompts=PROMPTS, session_ids=SESSIONS)
    want = expected(views, joints, gripper, env_ids)
    assert list(batch) == [1, 2, 4] and len(batch) == 3 and 1 in batch and 0 not in batch
    with pytest.raises(KeyError):
        batch[0]
    for env_id in env_ids:
        request = batch[env_id]
        assert list(request) == list(want[env_id])
        assert np.shares_memory(request["observation/exterior_image_0_left"], views["external_cam"])  # not copied
    assert [packb(batch[i]) for i in (2, 4)] == [packb(want[i]) for i in (2, 4)]
    assert batch.array_bytes() == encoded_size(want)
    assert encoded_size(batch) == encoded_size(want)


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("joints", np.nan, "joint_position: expected finite values"),
        ("gripper", np.inf, "gripper_position: expected finite values"),
        ("prompt", 7, "prompt: expected a string, got int"),
        ("session", "", "session_id: expected a non-empty string or None"),
    ],
)
def test_a_bad_row_is_refused_with_build_infer_requests_message(field, value, message):
    env_ids = [0, 2, 3]
    views, joints, gripper = columns(len(env_ids))
    prompts, sessions = list(PROMPTS), list(SESSIONS)
    if field == "joints":
        joints[3, 4] = value
    elif field == "gripper":
        gripper[3, 0] = value
    elif field == "prompt":
        prompts[3] = value
    else:
        sessions[3] = value
    with pytest.raises(InvalidRequest, match=message):
        assemble_requests(views, joints, gripper, env_ids, prompts=prompts, session_ids=sessions)
    assemble_requests(views, joints, gripper, [0, 2], prompts=prompts, session_ids=sessions)  # env 3 not due


def test_bad_views_and_vectors_are_refused_as_before():
    views, joints, gripper = columns(2)
    views["wrist_cam"] = views["wrist_cam"].astype(np.float32)
    with pytest.raises(InvalidRequest, match="observation/wrist_image_left: expected dtype uint8"):
        assemble_requests(views, joints, gripper, [0, 1], prompts=PROMPTS, session_ids=SESSIONS)
    views, joints, gripper = columns(2)
    with pytest.raises(InvalidRequest, match=r"joint_position: expected shape \(7,\)"):
        assemble_requests(views, joints[:, :6], gripper, [0, 1], prompts=PROMPTS, session_ids=SESSIONS)


def test_requests_that_share_no_template_say_so_and_stay_dicts():
    views, joints, gripper = columns(2)
    sessions = [None] * NUM_ENVS
    batch = assemble_requests(views, joints, gripper, [0, 1], prompts=PROMPTS, session_ids=sessions)
    assert batch.frame_template() is None and batch.frame(0) is None
    assert "session_id" not in batch[0] and packb(batch[1]) == packb(expected(views, joints, gripper, [0, 1],
                                                                              sessions=sessions)[1])  # fmt: skip
    prompts = ["bad \ud800 text"] * NUM_ENVS  # a lone surrogate: msgpack's general path words the error
    batch = assemble_requests(views, joints, gripper, [0, 1], prompts=prompts, session_ids=SESSIONS)
    assert batch.frame_template() is not None and batch.strings(0) is None and batch.frame(0) is None
    assert len(assemble_requests(views, joints, gripper, [], prompts=PROMPTS, session_ids=SESSIONS)) == 0


def test_fast_template_leaves_slots_where_the_values_were():
    value = {"a": np.arange(5, dtype=np.int16), "b": "text", "c": [1, 2.5, None], "d": np.zeros(3)}
    template = fast_template(value, {"a": 0, "b": 1})
    assert sum(type(p) is int for p in template) == 2
    filled = join_template(template, [value["a"].tobytes(), str_bytes("text")])
    assert filled == pack_fast(value) == packb(value)
    assert fast_template([1, 2], {}) is None and fast_template({1: 2}, {}) is None
    assert fast_template({"x": np.zeros(2, dtype=complex)}, {}) is None  # left to the general path
    assert str_bytes("\ud800") is None and str_bytes("é") == b"\xa2\xc3\xa9"
    assert isinstance(RequestBatch, type)
