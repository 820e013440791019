"""BatchRenderer: the same pixels as mujoco.Renderer, however many views share a page."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("dz_gym.envs.mujoco")  # sets MUJOCO_GL before mujoco's first import

import mujoco  # noqa: E402

from dz_gym.envs.mujoco import gl, scene  # noqa: E402
from dz_gym.envs.mujoco.cameras import CAMERA_NAMES  # noqa: E402
from dz_gym.envs.mujoco.render import BatchRenderer  # noqa: E402

SHAPE = (48, 80)


def _datas(model, count: int, seed: int) -> list:
    rng = np.random.default_rng(seed)
    datas = []
    for _ in range(count):
        data = mujoco.MjData(model)
        data.qpos[:7] += rng.normal(0.0, 0.3, 7)  # arm poses differ, so every view differs
        mujoco.mj_forward(model, data)
        datas.append(data)
    return datas


def _reference_images(model, datas, shape) -> list[np.ndarray]:
    """One mujoco.Renderer read-back per view, shadows and reflections off (the env's settings)."""
    renderer = mujoco.Renderer(model, height=shape[0], width=shape[1])
    renderer.scene.flags[mujoco.mjtRndFlag.mjRND_SHADOW] = False
    renderer.scene.flags[mujoco.mjtRndFlag.mjRND_REFLECTION] = False
    try:
        images = []
        for data in datas:
            for name in CAMERA_NAMES:
                renderer.update_scene(data, camera=name)
                images.append(renderer.render().copy())
        return images
    finally:
        renderer.close()


@pytest.mark.parametrize(("scene_id", "multisamples", "page_views"), [(1, 0, None), (2, 0, 2), (3, 4, 4)])
def test_pixels_equal_mujoco_renderer_whatever_the_page(scene_id, multisamples, page_views):
    model = scene.build_model(scene_id, SHAPE, multisamples)
    datas = _datas(model, 3, seed=scene_id)
    expected = _reference_images(model, datas, SHAPE)
    cameras = [model.camera(name).id for name in CAMERA_NAMES]
    out = np.zeros((len(expected), *SHAPE, 3), dtype=np.uint8)
    views = [(data, cam, out[3 * d + c]) for d, data in enumerate(datas) for c, cam in enumerate(cameras)]
    _, context = gl.open_context(*SHAPE)
    renderer = BatchRenderer(model, *SHAPE, context, max_views=len(views), page_views=page_views)
    try:
        assert renderer.page_views == (page_views or len(views))
        renderer.render(views)
        for k, image in enumerate(expected):
            np.testing.assert_array_equal(out[k], image, err_msg=f"view {k}")
        # A view alone on its page, and in another order, gives the same image (no dependence on placement).
        single = np.zeros((*SHAPE, 3), dtype=np.uint8)
        renderer.render([(datas[2], cameras[1], single)])
        np.testing.assert_array_equal(single, expected[7])
        reordered = np.zeros_like(out)
        renderer.render([(v[0], v[1], reordered[k]) for k, v in reversed(list(enumerate(views)))])
        np.testing.assert_array_equal(reordered, out)
    finally:
        renderer.close()
    assert len({image.tobytes() for image in expected}) == len(expected)  # the check compared distinct images


def test_page_is_bounded_and_errors_are_clear():
    model = scene.build_model(1, SHAPE)
    renderer = gl.create_renderer(model, *SHAPE, max_views=10_000)
    try:
        assert 1 <= renderer.page_views < 10_000  # bounded by the renderbuffer limit and PAGE_BYTES
        renderer.render([])  # nothing to draw is fine
    finally:
        renderer.close()
        renderer.close()  # idempotent
    with pytest.raises(RuntimeError, match="closed"):
        renderer.render([(mujoco.MjData(model), 0, np.zeros((*SHAPE, 3), np.uint8))])
    with pytest.raises(ValueError, match="image size"):
        gl.create_renderer(model, SHAPE[0] * 2, SHAPE[1])
