"""dz_gym.host_process: nothing is done to a process that did not opt in; each setting is applied while
:func:`applied` is entered and put back after; the evaluator opts in and gives the settings to its pools; the
worker-count default is TransportConfig's, for the wrapper and the evaluator alike."""

from __future__ import annotations

import gc
import json

import pytest

from dz_gym import host_process
from dz_gym.eval.config import EvalConfig
from dz_gym.eval.evaluate import evaluate
from dz_gym.eval.rundir import RunDir
from dz_gym.host_process import UNTOUCHED, HostProcessSettings, applied, in_effect
from dz_gym.server.launch import start_server_thread
from dz_gym.testing.toy_env import ToyDroidEnv
from dz_gym.transport import SessionPool, TransportConfig

PATH = "/v1/realtime/robot/openpi"


@pytest.fixture(autouse=True)
def clean():
    """Each test starts with no settings in effect; one that fails inside :func:`applied` leaves none to the
    next."""
    assert in_effect() == UNTOUCHED
    yield
    with host_process._lock:
        host_process._stack.clear()


# ------------------------------------------------------------------------------------------- the settings
def test_the_settings_are_all_on_by_default_and_all_off_untouched():
    assert HostProcessSettings() == HostProcessSettings(True, True)
    assert (UNTOUCHED.page_lock, UNTOUCHED.populate_views) == (False, False)
    arm = HostProcessSettings().without("page_lock")
    assert (arm.page_lock, arm.populate_views) == (False, True)
    with pytest.raises(ValueError, match="HostProcessSettings: expected settings from page_lock, populate_views, "
                                         "got 'freeze_collector'"):  # fmt: skip
        HostProcessSettings().without("freeze_collector")
    with pytest.raises(ValueError, match=r"HostProcessSettings.page_lock: expected True or False, got 1$"):
        HostProcessSettings(page_lock=1)
    with pytest.raises(ValueError, match="settings: expected a HostProcessSettings, got dict"):
        with applied({"page_lock": True}):
            pass


def test_applied_nests_keeps_an_outer_choice_and_puts_back_what_was_in_effect():
    arm = HostProcessSettings().without("populate_views")
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


def test_a_process_pool_gets_the_settings_it_is_given_and_none_means_nothing():
    """What a ProcessSessionPool does to this process (its view memory) is what ``host`` says; without it,
    nothing."""
    from dz_gym.transport import ProcessSessionPool

    with ProcessSessionPool("ws://127.0.0.1:1", 2, processes=1) as bare:
        assert (bare.host_views.page_lock, bare.host_views.populate) == (False, False)
    arm = HostProcessSettings().without("page_lock")
    with ProcessSessionPool("ws://127.0.0.1:1", 2, processes=1, host=arm) as pool:
        assert (pool.host_views.page_lock, pool.host_views.populate) == (False, True)
    with pytest.raises(ValueError, match="host: expected a HostProcessSettings or None, got bool"):
        ProcessSessionPool("ws://127.0.0.1:1", 2, processes=1, host=True)


# ----------------------------------------------------------------------------------- the evaluator opts in
def _recording_factory(counts: list, settings: list):
    class Recording(ToyDroidEnv):
        def step(self, action):
            counts.append(gc.get_freeze_count())
            settings.append(in_effect())
            return super().step(action)

    return lambda scene, cfg: Recording(cfg.plan.num_envs, scene=scene, max_episode_length=cfg.plan.max_steps)


def test_the_evaluator_opts_in_and_leaves_the_collector_alone(tmp_path):
    """The evaluator's steps run with its settings in effect and nothing frozen (the collector's heap is the
    process's own); --profile still counts the collector's passes."""
    counts, settings = [], []
    config = EvalConfig(scenes=[1, 2], episodes=2, num_envs=2, max_steps=4, video=False, profile=True)
    run_dir = RunDir.create(tmp_path, config)
    with start_server_thread("hold") as server:
        summary = evaluate(config, run_dir, [server.url + PATH], env_factory=_recording_factory(counts, settings),
                           progress=False)  # fmt: skip
    assert summary["complete"]
    assert len(settings) == 8 and all(s == HostProcessSettings() for s in settings)  # two scenes of four steps
    assert counts == [0] * 8
    assert in_effect() == UNTOUCHED
    # --profile: the collector's passes during each scene's stepping, per generation
    for report in json.loads((run_dir.path / "profile.json").read_text())["scenes"].values():
        collector = report["collector"]
        assert len(collector["passes"]) == 3 and all(n >= 0 for n in collector["passes"])


def test_an_arm_that_turned_a_setting_off_keeps_it_through_the_evaluator_and_its_pools(tmp_path, monkeypatch):
    """A benchmark's arm applies its settings around evaluate(): the evaluator keeps them and gives them to the
    pools it builds (policy_seed makes the evaluator build its own client)."""
    from dz_gym.eval import clients

    hosts = []
    real = clients.open_pool
    monkeypatch.setattr(clients, "open_pool", lambda *a, **k: hosts.append(k["host"]) or real(*a, **k))
    counts, settings = [], []
    arm = HostProcessSettings().without("page_lock")
    config = EvalConfig(scenes=[1], episodes=2, num_envs=2, max_steps=4, video=False, policy_seed=True)
    with start_server_thread("hold") as server, applied(arm):
        evaluate(config, RunDir.create(tmp_path, config), [server.url + PATH],
                 env_factory=_recording_factory(counts, settings), progress=False)  # fmt: skip
    assert hosts == [arm]
    assert settings and all(s is arm for s in settings)


def test_a_failing_scene_puts_the_settings_back(tmp_path):
    class Failing(ToyDroidEnv):
        def step(self, action):
            raise RuntimeError("the simulator broke")

    def factory(scene, cfg):
        return Failing(cfg.plan.num_envs, scene=scene, max_episode_length=cfg.plan.max_steps)

    config = EvalConfig(scenes=[1], episodes=2, num_envs=2, max_steps=4, video=False)
    with start_server_thread("hold") as server, pytest.raises(RuntimeError, match="the simulator broke"):
        evaluate(config, RunDir.create(tmp_path, config), [server.url + PATH], env_factory=factory, progress=False)
    assert in_effect() == UNTOUCHED


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
