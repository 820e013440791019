"""Lazy camera views of an Isaac Lab env: whether its next observation renders, shared by the env and its terms.

Isaac Lab's cameras render when their data is read (``InteractiveSceneCfg.lazy_sensor_update``), and the
observation manager reads every camera term at every step. A policy that replans every 8 steps needs the
views 1 step in 8; at 1024 envs x 3 views the Newton Warp renderer is 70 % of a step. A task's camera terms
(:class:`dz_gym.envs.isaac_droid3.mdp.LazyImageRGB`) ask :func:`demand_of` before reading their camera: when
``due`` is False they repeat their last frames (no render) and count the skip.

The isaac backend sets ``due`` from :meth:`~dz_gym.envs.base.BatchedDroidEnv.set_render_mask` (any env in
the mask renders every env: the renderer draws all worlds in one pass) and reports the views it did not
render as ``info["images_fresh"] = False``. An env nobody tells anything renders at every step, as Isaac
Lab's own ``image_rgb`` does. Nothing here imports Isaac Lab.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass


@dataclass
class ViewDemand:
    """``due``: the next observation's camera terms render. ``rendered`` / ``skipped``: term calls that did
    and did not read their camera (counts over the env's life, for tests and profiles)."""

    due: bool = True
    rendered: int = 0
    skipped: int = 0

    def note(self, rendered: bool) -> None:
        """A camera term's call: whether it read (rendered) its camera."""
        if rendered:
            self.rendered += 1
        else:
            self.skipped += 1


_DEMANDS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def demand_of(env) -> ViewDemand:
    """The :class:`ViewDemand` of ``env`` (the unwrapped Isaac Lab env), created on first use; it lives as
    long as the env."""
    demand = _DEMANDS.get(env)
    if demand is None:
        demand = _DEMANDS[env] = ViewDemand()
    return demand
