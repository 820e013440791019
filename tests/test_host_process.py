"""dz_gym.host_process: nothing is done to a process that did not opt in; each setting is applied while
:func:`applied` is entered and undone where it can be; the evaluator opts in; the worker-count default is
TransportConfig's, for the wrapper and the evaluator alike."""

from __future__ import annotations

import gc
import json
import platform

import pytest

from dz_gym import host_process
from dz_gym.eval.config import EvalConfig
from dz_gym.eval.evaluate import evaluate
from dz_gym.eval.rundir import RunDir
from dz_gym.host_process import UNTOUCHED, HostProcessSettings, applied, freeze_collector, in_effect
from dz_gym.server.launch import start_server_thread
from dz_gym.testing.toy_env import ToyDroidEnv
from dz_gym.transport import SessionPool, TransportConfig

PATH = "/v1/realtime/robot/openpi"
GLIBC = platform.libc_ver()[0] == "glibc"
FREEZE_ONLY = HostProcessSettings(heap_thresholds=False, page_lock=False, populate_views=False)


@pytest.fixture(autouse=True)
def clean(monkeypatch):
    """Each test starts thawed, with no settings in effect and no user heap variables; one that fails inside
    a hold leaves none to the next."""
    for name in ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_"):
        monkeypatch.delenv(name, raising=False)
    gc.unfreeze()
    assert in_effect() == UNTOUCHED
    yield
    with host_process._lock:
        host_process._stack.clear()
        host_process._set_heap_thresholds(False)
        host_process._holders = host_process._growing = 0
        if host_process._freeze_after_full_pass in gc.callbacks:
            gc.callbacks.remove(host_process._freeze_after_full_pass)
    gc.unfreeze()


class Cycle:
    def __init__(self):
        self.me = self


# ------------------------------------------------------------------------------------------- the settings
def test_the_settings_are_all_on_by_default_and_all_off_untouched():
    assert HostProcessSettings() == HostProcessSettings(True, True, True, True)
    assert not any(getattr(UNTOUCHED, name) for name in ("heap_thresholds", "freeze_collector", "page_lock",
                                                         "populate_views"))  # fmt: skip
    arm = HostProcessSettings().without("page_lock", "populate_views")
    assert (arm.heap_thresholds, arm.freeze_collector, arm.page_lock, arm.populate_views) == (True, True, False, False)
    with pytest.raises(ValueError, match="HostProcessSettings: expected settings from heap_thresholds.*'pin'"):
        HostProcessSettings().without("pin")
    with pytest.raises(ValueError, match=r"HostProcessSettings.page_lock: expected True or False, got 1$"):
        HostProcessSettings(page_lock=1)
    with pytest.raises(ValueError, match="settings: expected a HostProcessSettings, got dict"):
        with applied({"page_lock": True}):
            pass


def test_applied_nests_keeps_an_outer_choice_and_puts_back_what_was_in_effect():
    arm = HostProcessSettings().without("freeze_collector")
    with applied(arm) as outer:
        assert outer is arm and in_effect() is arm
        with applied() as inner:  # the evaluator's own opt-in keeps the arm's choice
            assert inner is arm
        with applied(UNTOUCHED):
            assert in_effect() is UNTOUCHED
        assert in_effect() is arm
    assert in_effect() is UNTOUCHED
    with applied() as chosen:  # nothing chosen before: the defaults
        assert chosen == HostProcessSettings()
    with pytest.raises(RuntimeError, match="failed inside"), applied(arm):
        raise RuntimeError("failed inside")
    assert in_effect() is UNTOUCHED


# ------------------------------------------------------------------------------------------ heap thresholds
def test_the_heap_thresholds_are_set_at_a_pools_first_round_while_applied_and_put_back_after():
    """On glibc mallopt accepts them (its result, not a timing, says so); they are set when a pool sends its
    first round (the simulator is built by then), go back to glibc's initial values on the way out, and an
    arm without them sets none."""
    on = host_process.TRIM_THRESHOLD if GLIBC else 0
    assert host_process.trim_threshold() == 0
    with applied(HostProcessSettings()):
        assert host_process.trim_threshold() == 0  # nothing sent yet
        host_process.keep_round(0)
        assert host_process.trim_threshold() == on
        with applied(HostProcessSettings().without("heap_thresholds")):
            assert host_process.trim_threshold() == 0
            host_process.keep_round(2**30)
            assert host_process.trim_threshold() == 0
        host_process.keep_round(0)
        assert host_process.trim_threshold() == on
    assert host_process.trim_threshold() == 0
    assert host_process.set_heap_thresholds() == GLIBC  # a transport worker's, whatever is applied
    assert host_process.trim_threshold() == on


def test_a_large_round_raises_the_trim_threshold_up_to_the_cap_only_where_opted_in():
    """A pool holding more than the trim threshold (a round of N requests) raises it: doubled at least, never
    lowered, never past the cap (mallopt takes a C int); a process that did not opt in is left alone."""
    host_process.keep_round(2**30)
    assert host_process.trim_threshold() == 0
    if not GLIBC:
        return
    with applied(HostProcessSettings()):
        host_process.keep_round(300 * 2**20)
        assert host_process.trim_threshold() == min(host_process.TRIM_CAP, 512 * 2**20)  # doubled
        host_process.keep_round(1)
        host_process.keep_round(2**40)
        assert host_process.trim_threshold() == host_process.TRIM_CAP <= 2**31 - 1


def test_the_users_heap_variables_win(monkeypatch):
    monkeypatch.setenv("MALLOC_TRIM_THRESHOLD_", "1048576")
    calls = []
    monkeypatch.setattr(host_process.ctypes, "CDLL", lambda *a, **k: calls.append(a))
    with applied(HostProcessSettings()):
        host_process.keep_round(2**30)
        assert host_process.trim_threshold() == 0
    assert calls == []  # the C library was not even looked up


def test_a_session_pool_leaves_the_heap_alone(monkeypatch):
    """Building a SessionPool and submitting a round larger than the trim threshold calls no mallopt in a
    process that did not opt in (the C library's lookup is recorded instead)."""
    looked_up = []
    monkeypatch.setattr(host_process, "_mallopt", lambda: looked_up.append(True))
    payload = bytes(200 * 2**20)
    with SessionPool("ws://127.0.0.1:1", 2) as pool:
        outcomes = [f.result(30) for f in pool.submit_many([(0, payload), (1, payload)])]
    assert not any(o.ok for o in outcomes)  # never connected
    assert looked_up == [] and host_process.trim_threshold() == 0


def test_a_session_pool_of_an_opted_in_process_keeps_its_rounds():
    if not GLIBC:
        return
    payload = bytes(100 * 2**20)
    with applied(HostProcessSettings()), SessionPool("ws://127.0.0.1:1", 2) as pool:
        [f.result(30) for f in pool.submit_many([(0, payload), (1, payload)])]
        assert host_process.trim_threshold() >= min(host_process.TRIM_CAP, 400 * 2**20)


def test_a_process_pool_gets_the_settings_it_is_given_and_none_means_nothing():
    """What a ProcessSessionPool does to this process (its view memory) and to its workers (their heap
    thresholds, in the init message) is what ``host`` says; without it, nothing."""
    from dz_gym.transport import ProcessSessionPool

    with ProcessSessionPool("ws://127.0.0.1:1", 2, processes=1) as bare:
        assert (bare.host_views.page_lock, bare.host_views.populate) == (False, False)
        assert [w.heap_thresholds for w in bare._workers] == [False]
    arm = HostProcessSettings().without("page_lock")
    with ProcessSessionPool("ws://127.0.0.1:1", 2, processes=1, host=arm) as pool:
        assert (pool.host_views.page_lock, pool.host_views.populate) == (False, True)
        assert [w.heap_thresholds for w in pool._workers] == [True]
    assert host_process.trim_threshold() == 0  # the workers', not this process's
    with pytest.raises(ValueError, match="host: expected a HostProcessSettings or None, got bool"):
        ProcessSessionPool("ws://127.0.0.1:1", 2, processes=1, host=True)


# ------------------------------------------------------------------------------------- the collector's freeze
def test_nothing_is_frozen_without_the_setting():
    release = freeze_collector()
    assert gc.get_freeze_count() == 0
    release()
    with applied(HostProcessSettings().without("freeze_collector")):
        freeze_collector(as_it_grows=True)()
        assert gc.get_freeze_count() == 0 and host_process._freeze_after_full_pass not in gc.callbacks


def test_frozen_objects_are_not_walked_and_the_release_thaws():
    old = ["made before the freeze"]
    with applied(FREEZE_ONLY):
        release = freeze_collector()
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
    with applied(FREEZE_ONLY):
        first = freeze_collector()
        second = freeze_collector()
    first()
    first()  # released twice: still one holder left
    assert gc.get_freeze_count() > 0
    second()
    assert gc.get_freeze_count() == 0


def test_a_freeze_of_the_owner_is_left_alone():
    gc.freeze()
    owners = gc.get_freeze_count()
    with applied(FREEZE_ONLY):
        freeze_collector()()
    assert gc.get_freeze_count() >= owners > 0


def test_a_growing_hold_freezes_what_survives_each_full_pass():
    with applied(FREEZE_ONLY):
        release = freeze_collector(as_it_grows=True)
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
    assert gc.get_freeze_count() == 0 and host_process._freeze_after_full_pass not in gc.callbacks
    gc.collect()
    assert gc.get_freeze_count() == 0  # no longer following


def test_the_plain_hold_taken_before_the_growing_one_ends_keeps_the_freeze():
    with applied(FREEZE_ONLY):
        growing = freeze_collector(as_it_grows=True)
        gc.collect()
        plain = freeze_collector()
    growing()
    assert host_process._freeze_after_full_pass not in gc.callbacks
    made_after = [[i] for i in range(100)]
    gc.collect()
    assert gc.get_freeze_count() > 0  # still frozen
    assert any(obj is made_after[0] for obj in gc.get_objects())  # not following any more
    plain()
    assert gc.get_freeze_count() == 0


# ----------------------------------------------------------------------------------- the evaluator opts in
def _recording_factory(counts: list, at_close: list, settings: list):
    class Recording(ToyDroidEnv):
        def step(self, action):
            counts.append(gc.get_freeze_count())
            settings.append(in_effect())
            return super().step(action)

        def close(self):
            at_close.append(gc.get_freeze_count())
            super().close()

    return lambda scene, cfg: Recording(cfg.plan.num_envs, scene=scene, max_episode_length=cfg.plan.max_steps)


def test_the_evaluator_opts_in_steps_frozen_and_thaws_once_its_batch_is_closed(tmp_path):
    counts, at_close, settings = [], [], []
    config = EvalConfig(scenes=[1, 2], episodes=2, num_envs=2, max_steps=4, video=False, profile=True)
    run_dir = RunDir.create(tmp_path, config)
    with start_server_thread("hold") as server:
        summary = evaluate(config, run_dir, [server.url + PATH], env_factory=_recording_factory(counts, at_close,
                           settings), progress=False)  # fmt: skip
    assert summary["complete"]
    assert settings and all(s == HostProcessSettings() for s in settings)  # the evaluator's opt-in
    assert len(counts) == 8 and all(c > 0 for c in counts)  # two scenes of four steps, every one frozen
    assert len(at_close) == 2 and all(c > 0 for c in at_close)  # the thaw comes after the close
    assert gc.get_freeze_count() == 0 and in_effect() == UNTOUCHED and host_process.trim_threshold() == 0
    # --profile: the collector's passes during each scene's stepping, per generation
    for report in json.loads((run_dir.path / "profile.json").read_text())["scenes"].values():
        collector = report["collector"]
        assert len(collector["passes"]) == 3 and all(n >= 0 for n in collector["passes"])


def test_an_arm_that_turned_a_setting_off_keeps_it_through_the_evaluator_and_its_pools(tmp_path, monkeypatch):
    """A benchmark's arm applies its settings around evaluate(): the evaluator keeps them, steps unfrozen, and
    gives them to the pools it builds (policy_seed makes the evaluator build its own client)."""
    from dz_gym.eval import clients

    hosts = []
    real = clients.open_pool
    monkeypatch.setattr(clients, "open_pool", lambda *a, **k: hosts.append(k["host"]) or real(*a, **k))
    counts, at_close, settings = [], [], []
    arm = HostProcessSettings().without("freeze_collector", "page_lock")
    config = EvalConfig(scenes=[1], episodes=2, num_envs=2, max_steps=4, video=False, policy_seed=True)
    with start_server_thread("hold") as server, applied(arm):
        evaluate(config, RunDir.create(tmp_path, config), [server.url + PATH],
                 env_factory=_recording_factory(counts, at_close, settings), progress=False)  # fmt: skip
    assert hosts == [arm]
    assert counts and all(c == 0 for c in counts) and all(s is arm for s in settings)


def test_a_failing_scene_thaws(tmp_path):
    class Failing(ToyDroidEnv):
        def step(self, action):
            raise RuntimeError("the simulator broke")

    def factory(scene, cfg):
        return Failing(cfg.plan.num_envs, scene=scene, max_episode_length=cfg.plan.max_steps)

    config = EvalConfig(scenes=[1], episodes=2, num_envs=2, max_steps=4, video=False)
    with start_server_thread("hold") as server, pytest.raises(RuntimeError, match="the simulator broke"):
        evaluate(config, RunDir.create(tmp_path, config), [server.url + PATH], env_factory=factory, progress=False)
    assert gc.get_freeze_count() == 0 and in_effect() == UNTOUCHED


def test_a_scene_is_built_under_a_growing_hold_and_steps_under_the_plain_one(tmp_path):
    seen = {}

    class Built(ToyDroidEnv):
        def step(self, action):
            seen.setdefault("following while stepping", host_process._freeze_after_full_pass in gc.callbacks)
            return super().step(action)

    def factory(scene, cfg):
        seen["following while built"] = host_process._freeze_after_full_pass in gc.callbacks
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
    def factory(scene, cfg):
        raise RuntimeError("no simulator here")

    config = EvalConfig(scenes=[1], episodes=2, num_envs=2, max_steps=4, video=False)
    with start_server_thread("hold") as server, pytest.raises(RuntimeError, match="no simulator here"):
        evaluate(config, RunDir.create(tmp_path, config), [server.url + PATH], env_factory=factory, progress=False)
    assert gc.get_freeze_count() == 0 and host_process._freeze_after_full_pass not in gc.callbacks


# ------------------------------------------------------------------------ one default for the worker count
def test_the_worker_count_default_is_transport_configs_for_the_wrapper_and_the_evaluator(monkeypatch):
    """TransportConfig.processes None is the one default: the wrapper's pool (through open_pool), the
    evaluator's count and EvalConfig's default all resolve it through auto_processes, with the same
    sessions; on this machine's cores (2 here) it is 0, so every test keeps the in-process pool."""
    from dz_gym.transport import config as transport_config
    from dz_gym.wrapper import DreamZeroPolicyWrapper

    assert TransportConfig().processes is None and EvalConfig.default("transport_processes") is None
    asked = []
    real = transport_config.auto_processes
    monkeypatch.setattr(transport_config, "auto_processes", lambda n, **k: asked.append(n) or real(n, **k))
    with start_server_thread("hold") as server:
        wrapper = DreamZeroPolicyWrapper(ToyDroidEnv(3), server=server.url + PATH)
        try:
            assert type(wrapper.client) is SessionPool  # 3 sessions: in this process on any machine
        finally:
            wrapper.close()
    assert asked == [3]
    assert EvalConfig(num_envs=5, backend="mujoco").transport_process_count() == real(5)
    assert asked == [3, 5]
    assert EvalConfig(num_envs=5, backend="mujoco", transport_processes=0).transport_process_count() == 0
    assert asked == [3, 5]  # a count given is kept
    monkeypatch.setattr(transport_config, "usable_cores", lambda: 16)
    assert (
        TransportConfig().process_count(1024) == EvalConfig(num_envs=1024, backend="mujoco").transport_process_count()
    )
    assert TransportConfig().process_count(1024) == 8 and TransportConfig().process_count(1024, pools=4) == 4
