"""dz_gym.envs.isaac.views: one demand per env object, alive as long as the env, counting its terms' calls."""

from __future__ import annotations

import gc
import weakref

from dz_gym.envs.isaac import views


class _Env:
    pass


def test_each_env_has_one_demand_due_by_default():
    first, second = _Env(), _Env()
    demand = views.demand_of(first)
    assert demand is views.demand_of(first) and demand is not views.demand_of(second)
    assert demand.due and (demand.rendered, demand.skipped) == (0, 0)


def test_a_demand_counts_rendered_and_skipped_calls():
    demand = views.demand_of(_Env())
    demand.note(True)
    demand.note(False)
    demand.note(False)
    assert (demand.rendered, demand.skipped) == (1, 2)


def test_a_demand_goes_with_its_env():
    env = _Env()
    views.demand_of(env).due = False
    alive = weakref.ref(env)
    del env
    gc.collect()
    assert alive() is None  # the registry does not keep the env alive
    assert views.demand_of(_Env()).due  # nor does a new env inherit anything
