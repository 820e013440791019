"""dz_gym.eval.collector: a scene's stepping keeps what the process held out of the collector's full passes,
nests, thaws at the end, and leaves a freeze of the process's owner alone."""

from __future__ import annotations

import gc
import json

import pytest

from dz_gym.eval.collector import CollectorPauses, freeze_heap
from dz_gym.eval.config import EvalConfig
from dz_gym.eval.evaluate import evaluate
from dz_gym.eval.rundir import RunDir
from dz_gym.server.launch import start_server_thread
from dz_gym.testing.toy_env import ToyDroidEnv

PATH = "/v1/realtime/robot/openpi"


@pytest.fixture(autouse=True)
def thawed():
    """Each test starts thawed, and one that fails with a hold still taken leaves none to the next."""
    from dz_gym.eval import collector

    gc.unfreeze()
    yield
    with collector._lock:
        collector._holders = collector._growing = 0
        if collector._freeze_after_full_pass in gc.callbacks:
            gc.callbacks.remove(collector._freeze_after_full_pass)
    gc.unfreeze()


class Cycle:
    def __init__(self):
        self.me = self


def test_frozen_objects_are_not_walked_and_the_release_thaws():
    old = ["made before the freeze"]
    release = freeze_heap()
    frozen = gc.get_freeze_count()
    assert frozen > 0
    # the collector's generations no longer hold what existed; what is made after the freeze is still collected
    assert not any(obj is old for obj in gc.get_objects())
    Cycle()
    assert gc.collect() >= 1
    assert gc.get_freeze_count() == frozen
    release()
    assert gc.get_freeze_count() == 0
    assert any(obj is old for obj in gc.get_objects())
    release()  # a second call does nothing
    assert gc.get_freeze_count() == 0


def test_nested_freezes_thaw_at_the_last_release():
    first = freeze_heap()
    second = freeze_heap()
    first()
    first()  # released twice: still one holder left
    assert gc.get_freeze_count() > 0
    second()
    assert gc.get_freeze_count() == 0


def test_a_freeze_of_the_owner_is_left_alone():
    gc.freeze()
    owners = gc.get_freeze_count()
    release = freeze_heap()
    release()
    assert gc.get_freeze_count() >= owners > 0


def test_a_scene_steps_frozen_and_thaws_once_its_batch_is_closed(tmp_path):
    counts, at_close = [], []

    class Recording(ToyDroidEnv):
        def step(self, action):
            counts.append(gc.get_freeze_count())
            return super().step(action)

        def close(self):
            at_close.append(gc.get_freeze_count())
            super().close()

    def factory(scene, cfg):
        return Recording(cfg.plan.num_envs, scene=scene, max_episode_length=cfg.plan.max_steps)

    config = EvalConfig(scenes=[1, 2], episodes=2, num_envs=2, max_steps=4, video=False, profile=True)
    run_dir = RunDir.create(tmp_path, config)
    with start_server_thread("hold") as server:
        summary = evaluate(config, run_dir, [server.url + PATH], env_factory=factory, progress=False)
    assert summary["complete"]
    assert len(counts) == 8 and all(c > 0 for c in counts)  # two scenes of four steps, every one frozen
    assert len(at_close) == 2 and all(c > 0 for c in at_close)  # the thaw comes after the close
    assert gc.get_freeze_count() == 0
    # --profile: the collector's passes during each scene's stepping, per generation
    for report in json.loads((run_dir.path / "profile.json").read_text())["scenes"].values():
        collector = report["collector"]
        assert len(collector["passes"]) == 3 and all(n >= 0 for n in collector["passes"])
        assert all(s >= 0 for s in collector["seconds"])


def test_pauses_count_the_passes_per_generation_while_entered():
    with CollectorPauses() as pauses:
        gc.collect(0)
        gc.collect(2)
    assert pauses.passes[0] >= 1 and pauses.passes[2] >= 1
    assert all(s >= 0 for s in pauses.seconds)
    counted = pauses.report()
    gc.collect()  # after the exit nothing is counted
    assert pauses.report() == counted == {"passes": pauses.passes, "seconds": pauses.seconds}


def test_a_failing_scene_thaws(tmp_path):
    class Failing(ToyDroidEnv):
        def step(self, action):
            raise RuntimeError("the simulator broke")

    def factory(scene, cfg):
        return Failing(cfg.plan.num_envs, scene=scene, max_episode_length=cfg.plan.max_steps)

    config = EvalConfig(scenes=[1], episodes=2, num_envs=2, max_steps=4, video=False)
    with start_server_thread("hold") as server, pytest.raises(RuntimeError, match="the simulator broke"):
        evaluate(config, RunDir.create(tmp_path, config), [server.url + PATH], env_factory=factory, progress=False)
    assert gc.get_freeze_count() == 0


def test_a_growing_hold_freezes_what_survives_each_full_pass():
    from dz_gym.eval import collector

    release = freeze_heap(as_it_grows=True)
    built = [[i] for i in range(5000)]  # a heap being built
    Cycle()  # garbage made before the pass is still collected by it
    assert gc.collect() >= 1
    after_pass = gc.get_freeze_count()
    # every survivor is frozen: the next full pass does not walk it (the count alone could also fall, as
    # frozen objects that other threads let go of are freed)
    walked = {id(obj) for obj in gc.get_objects()}
    assert after_pass >= len(built) and not any(id(obj) in walked for obj in built)
    later = [[i] for i in range(100)]
    gc.collect(0)  # a young pass freezes nothing
    assert any(obj is later[0] for obj in gc.get_objects())
    release()
    assert gc.get_freeze_count() == 0 and collector._freeze_after_full_pass not in gc.callbacks
    gc.collect()
    assert gc.get_freeze_count() == 0  # no longer following


def test_the_plain_hold_taken_before_the_growing_one_ends_keeps_the_freeze():
    from dz_gym.eval import collector

    growing = freeze_heap(as_it_grows=True)
    gc.collect()
    plain = freeze_heap()
    growing()
    assert collector._freeze_after_full_pass not in gc.callbacks
    made_after = [[i] for i in range(100)]
    gc.collect()
    assert gc.get_freeze_count() > 0  # still frozen
    assert any(obj is made_after[0] for obj in gc.get_objects())  # not following any more
    plain()
    assert gc.get_freeze_count() == 0


def test_a_scene_is_built_under_a_growing_hold_and_steps_under_the_plain_one(tmp_path):
    from dz_gym.eval import collector

    seen = {}

    class Built(ToyDroidEnv):
        def step(self, action):
            seen.setdefault("following while stepping", collector._freeze_after_full_pass in gc.callbacks)
            return super().step(action)

    def factory(scene, cfg):
        seen["following while built"] = collector._freeze_after_full_pass in gc.callbacks
        heap = [[i] for i in range(5000)]
        gc.collect()
        seen["frozen by the build's pass"] = not any(obj is heap[0] for obj in gc.get_objects())
        env = Built(cfg.plan.num_envs, scene=scene, max_episode_length=cfg.plan.max_steps)
        env.heap = heap
        return env

    config = EvalConfig(scenes=[1], episodes=2, num_envs=2, max_steps=4, video=False)
    with start_server_thread("hold") as server:
        assert evaluate(config, RunDir.create(tmp_path, config), [server.url + PATH], env_factory=factory,
                        progress=False)["complete"]  # fmt: skip
    assert seen == {"following while built": True, "frozen by the build's pass": True,
                    "following while stepping": False}  # fmt: skip
    assert gc.get_freeze_count() == 0


def test_a_failing_build_releases_its_hold(tmp_path):
    from dz_gym.eval import collector

    def factory(scene, cfg):
        raise RuntimeError("no simulator here")

    config = EvalConfig(scenes=[1], episodes=2, num_envs=2, max_steps=4, video=False)
    with start_server_thread("hold") as server, pytest.raises(RuntimeError, match="no simulator here"):
        evaluate(config, RunDir.create(tmp_path, config), [server.url + PATH], env_factory=factory, progress=False)
    assert gc.get_freeze_count() == 0 and collector._freeze_after_full_pass not in gc.callbacks
