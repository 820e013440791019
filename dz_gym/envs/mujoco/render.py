"""Batched offscreen rendering for a group of envs: many camera views, one read-back per page.

``mujoco.Renderer`` reads every view back with its own ``glReadPixels``, which waits until the GPU has drawn
that view: one pipeline drain per view and, with several processes on one GPU, one switch between their
contexts per view. With EGL on one GPU, 4 or 16 processes together drew no more views that way than one
process alone, so shards sharing the GPU could not render in parallel; with one read-back per page they drew
about twice as many (``benchmarks/bench_render.py``; its latest run is in benchmarks/README.md).

:class:`BatchRenderer` draws each view exactly as ``mujoco.Renderer`` does (same scene options, at the origin
of MuJoCo's offscreen buffer, same viewport), then copies it on the GPU with ``glBlitFramebuffer`` (pixel for
pixel, no filtering) into its own row of a tall *page* framebuffer, and reads the page back with one
``glReadPixels``. The pixels equal ``mujoco.Renderer``'s (tested): the draw is the same and a blit copies. So
an image does not depend on how many views share a page, i.e. on how many envs a worker holds, which keeps
runs independent of ``num_workers`` and of the shard count. (Drawing the views side by side at different
viewport offsets instead changes edge pixels, since rasterization depends on the offset.)

The page holds up to ``page_views`` views (bounded by ``GL_MAX_RENDERBUFFER_SIZE`` and ``PAGE_BYTES``);
more views take several pages. The GL calls beyond MuJoCo's own go through PyOpenGL, which MuJoCo's EGL and
OSMesa contexts already load (with the platform ``PYOPENGL_PLATFORM`` names); it is imported only once a
context is current.
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence

import mujoco
import numpy as np

PAGE_BYTES = 64 << 20  # at most this much RGBA page memory per renderer (on the GPU, or in RAM with llvmpipe)
MAX_GEOM = 10_000  # mujoco.Renderer's default scene capacity

View = tuple[mujoco.MjData, int, np.ndarray]  # (data, fixed camera id, output (H, W, 3) uint8)


def check_size(model: mujoco.MjModel, height: int, width: int) -> None:
    """ValueError unless ``height`` x ``width`` fits the model's offscreen buffer."""
    if width > model.vis.global_.offwidth or height > model.vis.global_.offheight:
        raise ValueError(
            f"image size: expected at most the model's offscreen buffer "
            f"{model.vis.global_.offheight}x{model.vis.global_.offwidth}, got {height}x{width}"
        )


class BatchRenderer:
    """Renders ``(data, camera_id, out)`` views of one model at ``height`` x ``width`` into ``out`` arrays.

    ``context`` is a MuJoCo GL context (``make_current()``, ``free()``) that works on this machine: make one
    with :func:`dz_gym.envs.mujoco.gl.open_context`, or use :func:`dz_gym.envs.mujoco.gl.create_renderer`,
    which never lets MuJoCo's context set-up run without one (a failed set-up aborts the process on the next
    try). The renderer owns the context and frees it on :meth:`close`. Shadows and reflections are off (as
    the env always had them). ``page_views`` caps the views per page (default: as many as the limits allow,
    up to ``max_views``).
    """

    def __init__(
        self,
        model: mujoco.MjModel,
        height: int,
        width: int,
        context,
        max_views: int = 1,
        page_views: int | None = None,
    ):
        check_size(model, height, width)
        self.model = model
        self.height, self.width = int(height), int(width)
        self._gl_context = self._mjr_context = self._GL = None
        self._fbo = self._renderbuffer = None
        self._gl_context = context
        self._gl_context.make_current()
        self._mjr_context = mujoco.MjrContext(model, mujoco.mjtFontScale.mjFONTSCALE_150.value)
        mujoco.mjr_setBuffer(mujoco.mjtFramebuffer.mjFB_OFFSCREEN.value, self._mjr_context)
        self.scene = mujoco.MjvScene(model, maxgeom=MAX_GEOM)
        self.scene.flags[mujoco.mjtRndFlag.mjRND_SHADOW] = False
        self.scene.flags[mujoco.mjtRndFlag.mjRND_REFLECTION] = False
        self._option = mujoco.MjvOption()
        self._camera = mujoco.MjvCamera()
        self._camera.type = mujoco.mjtCamera.mjCAMERA_FIXED
        self._rect = mujoco.MjrRect(0, 0, self.width, self.height)

        from OpenGL import GL  # after a context is current: PyOpenGL binds the platform MuJoCo chose
        from OpenGL.raw.GL.VERSION.GL_1_0 import glReadPixels

        self._GL, self._read_pixels = GL, glReadPixels
        limit = int(GL.glGetIntegerv(GL.GL_MAX_RENDERBUFFER_SIZE))
        fit = min(limit // self.height, PAGE_BYTES // (4 * self.height * self.width))
        self.page_views = max(1, min(int(max_views), fit, int(page_views) if page_views else fit))
        page_height = self.page_views * self.height
        self._renderbuffer = int(GL.glGenRenderbuffers(1))
        GL.glBindRenderbuffer(GL.GL_RENDERBUFFER, self._renderbuffer)
        GL.glRenderbufferStorage(GL.GL_RENDERBUFFER, GL.GL_RGBA8, self.width, page_height)
        self._fbo = int(GL.glGenFramebuffers(1))
        GL.glBindFramebuffer(GL.GL_FRAMEBUFFER, self._fbo)
        GL.glFramebufferRenderbuffer(GL.GL_FRAMEBUFFER, GL.GL_COLOR_ATTACHMENT0, GL.GL_RENDERBUFFER, self._renderbuffer)
        status = GL.glCheckFramebufferStatus(GL.GL_FRAMEBUFFER)
        mujoco.mjr_setBuffer(mujoco.mjtFramebuffer.mjFB_OFFSCREEN.value, self._mjr_context)
        if status != GL.GL_FRAMEBUFFER_COMPLETE:
            self.close()
            raise RuntimeError(f"page framebuffer {self.width}x{page_height} incomplete (status 0x{int(status):x})")
        self._page = np.empty((page_height, self.width, 3), dtype=np.uint8)

    def render(self, views: Sequence[View]) -> None:
        """Draw every view and write its image (top row first, as ``mujoco.Renderer`` returns it) into its
        ``out``."""
        if self._mjr_context is None:
            raise RuntimeError("render: the renderer is closed")
        self._gl_context.make_current()
        for start in range(0, len(views), self.page_views):
            self._render_page(views[start : start + self.page_views])

    def _render_page(self, views: Sequence[View]) -> None:
        GL, con, h, w = self._GL, self._mjr_context, self.height, self.width
        offscreen = mujoco.mjtFramebuffer.mjFB_OFFSCREEN.value
        for k, (data, camera_id, _) in enumerate(views):
            self._camera.fixedcamid = int(camera_id)
            mujoco.mjv_updateScene(
                self.model, data, self._option, None, self._camera, mujoco.mjtCatBit.mjCAT_ALL.value, self.scene
            )
            mujoco.mjr_setBuffer(offscreen, con)  # draw into MuJoCo's buffer again after the last blit
            mujoco.mjr_render(self._rect, self.scene, con)
            GL.glBindFramebuffer(GL.GL_READ_FRAMEBUFFER, con.offFBO)
            GL.glBindFramebuffer(GL.GL_DRAW_FRAMEBUFFER, self._fbo)
            GL.glBlitFramebuffer(0, 0, w, h, 0, k * h, w, (k + 1) * h, GL.GL_COLOR_BUFFER_BIT, GL.GL_NEAREST)
        rows = len(views) * h
        GL.glBindFramebuffer(GL.GL_READ_FRAMEBUFFER, self._fbo)
        GL.glReadBuffer(GL.GL_COLOR_ATTACHMENT0)
        GL.glPixelStorei(GL.GL_PACK_ALIGNMENT, 1)
        page = self._page[:rows]
        self._read_pixels(0, 0, w, rows, GL.GL_RGB, GL.GL_UNSIGNED_BYTE, page.ctypes.data_as(ctypes.c_void_p))
        mujoco.mjr_setBuffer(offscreen, con)
        for k, (_, _, out) in enumerate(views):  # GL rows run bottom-up: flip each view
            np.copyto(out, page[k * h : (k + 1) * h][::-1])

    def close(self) -> None:
        """Free the GL objects and the context (idempotent)."""
        if self._gl_context is None:
            return
        try:
            self._gl_context.make_current()
            if self._fbo is not None:
                self._GL.glDeleteFramebuffers(1, [self._fbo])
            if self._renderbuffer is not None:
                self._GL.glDeleteRenderbuffers(1, [self._renderbuffer])
            if self._mjr_context is not None:
                self._mjr_context.free()
        finally:
            self._fbo = self._renderbuffer = self._mjr_context = None
            self._gl_context.free()
            self._gl_context = None

    def __del__(self):
        try:
            self.close()
        except Exception:  # noqa: BLE001 - never raise from a finalizer
            pass
