"""FLUX 3 Action's composite from three views (dz_gym.requests.compose_views): layout, the halving as the
sources do it (torch bilinear, align_corners=False, cast to uint8), numpy and torch alike."""

from __future__ import annotations

import numpy as np
import pytest

from dz_gym.envs import droid
from dz_gym.requests import compose_views, composite_of, resized_views


def random_views(n=2, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 256, size=(n, 360, 640, 3), dtype=np.uint8) for _ in range(3)]


def test_the_wrist_view_on_top_and_the_halved_exteriors_below_left_then_right():
    wrist, left, right = random_views()
    composite = compose_views(wrist, left, right)
    assert composite.shape == (2, 540, 640, 3) and composite.dtype == np.uint8
    np.testing.assert_array_equal(composite[:, :360], wrist)
    block_mean = lambda v: v.reshape(2, 180, 2, 320, 2, 3).astype(np.uint16).sum(axis=(2, 4)) // 4  # noqa: E731
    np.testing.assert_array_equal(composite[:, 360:, :320], block_mean(left))
    np.testing.assert_array_equal(composite[:, 360:, 320:], block_mean(right))


def test_numpy_and_torch_give_the_bytes_torch_bilinear_gives():
    torch = pytest.importorskip("torch")
    import torch.nn.functional as F

    views = random_views(seed=1)
    by_numpy = compose_views(*views)
    by_torch = compose_views(*(torch.from_numpy(v) for v in views))
    assert by_torch.dtype == torch.uint8
    np.testing.assert_array_equal(by_torch.numpy(), by_numpy)
    # the sources' halving: float bilinear with half-pixel centres, then a cast to uint8 (truncation)
    left = torch.from_numpy(views[1]).permute(0, 3, 1, 2).float()
    halved = F.interpolate(left, size=(180, 320), mode="bilinear", align_corners=False).to(torch.uint8)
    np.testing.assert_array_equal(by_numpy[:, 360:, :320], halved.permute(0, 2, 3, 1).numpy())


def test_bad_views_are_named():
    wrist, left, right = random_views(n=1)
    with pytest.raises(ValueError, match=r"left view: expected uint8 \(\.\.\., 360, 640, 3\)"):
        compose_views(wrist, left[:, :180, :320], right)
    with pytest.raises(ValueError, match="right view"):
        compose_views(wrist, left, right.astype(np.float32))


def test_the_composite_of_an_env_batchs_views():
    policy = {key: view for key, view in zip(("wrist_cam", "external_cam", "external_cam_2"), random_views(n=3))}
    views = resized_views(policy, [0, 2], None)
    composite = composite_of(views)
    assert composite.shape == (2, 540, 640, 3)
    np.testing.assert_array_equal(composite[1, :360], policy["wrist_cam"][2])
    assert set(droid.CAMERA_KEYS) == set(policy)
