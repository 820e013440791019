"""Unit tests of dz_gym.eval.npz: the trajectory archive np.load and zipfile read, with np.savez's members."""

from __future__ import annotations

import io
import zipfile

import numpy as np
import pytest

from dz_gym.eval import trajectory
from dz_gym.eval.npz import npz_bytes


def _arrays(steps: int = 16) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(steps)
    return trajectory.pack({
        "actions": rng.random((steps, 8)), "joint_pos": rng.random((steps, 7)), "gripper_pos": rng.random((steps, 1)),
        "policy_called": np.arange(steps) % 8 == 0, "chunk_latency_ms": np.where(np.arange(steps) % 8 == 0, 5.0, np.nan),
        "success": np.zeros(steps, bool), "reward": rng.random(steps), "object_pos": rng.random((steps, 3)),
        "object_quat": np.full((steps, 4), np.nan), "object_start_pos": rng.random(3),
        "milestone_names": ["reached", "lifted"], "milestone_first_step": [3, -1], "seed": 11,
    })  # fmt: skip


@pytest.mark.parametrize("steps", [0, 1, 16, 64])
def test_npz_holds_np_savez_members(steps):
    arrays = _arrays(steps)
    ours = npz_bytes(arrays)
    theirs = io.BytesIO()
    np.savez(theirs, **arrays)
    with zipfile.ZipFile(io.BytesIO(ours)) as a, zipfile.ZipFile(theirs) as b:
        assert a.testzip() is None
        assert a.namelist() == b.namelist() == [f"{key}.npy" for key in arrays]
        for name in a.namelist():
            assert a.read(name) == b.read(name), name  # the same .npy bytes, header included
    with np.load(io.BytesIO(ours), allow_pickle=False) as data:
        for key, value in arrays.items():
            assert data[key].dtype == value.dtype and data[key].shape == value.shape
            assert data[key].tobytes() == value.tobytes()
    assert trajectory.check(trajectory.read(io.BytesIO(ours))) == steps


def test_npz_depends_only_on_its_arrays():
    assert npz_bytes(_arrays()) == npz_bytes(_arrays())  # no time of writing inside


def test_npz_stores_non_contiguous_arrays_in_c_order():
    array = np.arange(12, dtype=np.float32).reshape(3, 4).T
    with np.load(io.BytesIO(npz_bytes({"a": array, "s": np.asarray(3)}))) as data:
        assert np.array_equal(data["a"], array) and data["s"].shape == ()


def test_npz_rejects_object_arrays():
    with pytest.raises(ValueError, match="'bad' expected an array of numbers or strings"):
        npz_bytes({"bad": np.array([None, 1], dtype=object)})
