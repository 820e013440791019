"""Fast tests of the evaluator's episode accounting, faults, stop and resume (deterministic fake env, real
reference server over loopback)."""

from __future__ import annotations

import numpy as np
import pytest

from dz_gym.envs import droid
from dz_gym.eval import results
from dz_gym.eval.config import EvalConfig
from dz_gym.eval.control import RunControl
from dz_gym.eval.evaluate import evaluate
from dz_gym.eval.plan import PlanEntry
from dz_gym.eval.row import PLACEMENT, comparable
from dz_gym.eval.rundir import RunDir
from dz_gym.server.launch import start_server_thread
from dz_gym.server.policies import HoldPolicy
from dz_gym.testing.toy_env import ToyDroidEnv, expected_success

PATH = "/v1/realtime/robot/openpi"


def stable(rows):
    """Rows without the fields that legitimately differ between runs (slot and server, session, timing)."""
    return comparable(rows, ignore=PLACEMENT)


class FailOnSeedPolicy(HoldPolicy):
    """Hold, but raise on requests of the episode whose first joint equals ``joint0`` (one seed of the fake)."""

    def __init__(self, joint0: float):
        super().__init__()
        self.joint0 = joint0
        self.calls = 0

    def infer(self, request, *, session_id, new_session):
        self.calls += 1
        if abs(float(request["observation/joint_position"][0]) - self.joint0) < 1e-6:
            raise RuntimeError("injected failure for this episode")
        return super().infer(request, session_id=session_id, new_session=new_session)


def fake_joint0(seed: int) -> float:
    env = ToyDroidEnv(1)
    env.reset_one(0, seed)
    return float(env.joints[0, 0])


@pytest.fixture(scope="module")
def hold_server():
    with start_server_thread("hold") as server:
        yield server.url + PATH


def run(
    tmp_path,
    servers,
    *,
    num_envs,
    episodes,
    max_steps=10,
    env_length=None,
    seed=0,
    control=None,
    video=False,
    scenes=(1,),
    run_dir=None,
    **fields,
):
    config = EvalConfig(
        scenes=list(scenes), episodes=episodes, num_envs=num_envs, seed=seed, max_steps=max_steps, video=video, **fields
    )
    run_dir = run_dir or RunDir.create(tmp_path, config)
    made = []

    def factory(scene, cfg):
        env = ToyDroidEnv(cfg.plan.num_envs, scene=scene, max_episode_length=env_length or cfg.plan.max_steps)
        made.append(env)
        return env

    summary = evaluate(config, run_dir, servers, env_factory=factory, control=control, progress=False)
    return summary, run_dir, made


def test_rows_do_not_depend_on_num_envs(tmp_path, hold_server):
    runs = {}
    for n in (1, 2, 3):
        summary, run_dir, _ = run(tmp_path / str(n), [hold_server], num_envs=n, episodes=5, max_steps=6)
        rows = run_dir.read_rows()
        assert len(rows) == 5 and summary["complete"]
        assert {r["env"] for r in rows} == set(range(min(n, 5)))
        assert all(r["env"] == r["episode"] % n for r in rows)
        runs[n] = stable(rows)
    assert runs[1] == runs[2] == runs[3]
    for row in runs[1]:
        assert row["seed"] == row["episode"] == row["env_seed"]
        assert (row["success_at_end"], row["success_any_step"]) == expected_success(row["seed"], 6)
        assert row["server_calls"] == 1  # steps 0..5 use one chunk (open-loop horizon 8)


def test_sessions_seeds_and_steps(tmp_path, hold_server):
    summary, run_dir, _ = run(tmp_path, [hold_server], num_envs=2, episodes=5, max_steps=17, seed=100)
    rows = sorted(run_dir.read_rows(), key=lambda r: r["episode"])
    assert [r["seed"] for r in rows] == list(range(100, 105))
    assert len({r["session_id"] for r in rows}) == 5
    assert all(r["steps"] == 17 and r["server_calls"] == 3 and r["error"] is None for r in rows)
    # The summary is recomputable from the rows.
    again = results.summarize(rows, planned={1: 5})
    for key in ("1", "overall"):
        for field in ("episodes", "errored", "success_at_end", "success_any_step", "server_calls", "env_steps"):
            assert summary[key][field] == again[key][field]
    data = np.load(run_dir.path / rows[0]["trajectory"])
    assert data["actions"].shape == (17, droid.ACTION_DIM)
    assert data["joint_pos"].shape == (17, droid.ARM_DOF)
    assert data["policy_called"].nonzero()[0].tolist() == [0, 8, 16]
    assert np.isfinite(data["chunk_latency_ms"][[0, 8, 16]]).all()


def test_idle_slots_send_no_requests(tmp_path):
    with start_server_thread("hold") as server:
        summary, run_dir, _ = run(tmp_path, [server.url + PATH], num_envs=4, episodes=5, max_steps=9)
        requests = server.stats().inferences
    rows = run_dir.read_rows()
    # 5 episodes x 2 chunks; the three slots idle during the second round send nothing.
    assert sum(r["server_calls"] for r in rows) == 10 == requests


def test_the_env_hears_which_slots_run_their_last_episode(tmp_path, hold_server):
    """Before each step the runner tells the env which slots have nothing more queued (their autoreset's
    frames are read by nobody), and clears it at the end."""
    seen = []

    class Recording(ToyDroidEnv):
        def set_last_episodes(self, mask):
            seen.append(None if mask is None else np.asarray(mask).tolist())
            super().set_last_episodes(mask)

    def factory(scene, cfg):
        return Recording(cfg.plan.num_envs, scene=scene, max_episode_length=cfg.plan.max_steps)

    config = EvalConfig(scenes=[1], episodes=3, num_envs=2, max_steps=4, video=False)
    evaluate(config, RunDir.create(tmp_path, config), [hold_server], env_factory=factory, progress=False)
    # slot 0 runs episodes 0 and 2, slot 1 episode 1: four steps with episode 2 queued, four with nothing
    assert seen == [[False, True]] * 4 + [[True, True]] * 4 + [None]


def test_max_steps_shorter_than_the_env_uses_partial_resets(tmp_path, hold_server):
    summary, run_dir, made = run(tmp_path, [hold_server], num_envs=2, episodes=4, max_steps=5, env_length=50)
    rows = run_dir.read_rows()
    assert [r["steps"] for r in rows] == [5] * 4
    assert all(r["ended_by"] == "time_limit" for r in rows)
    assert made[0].partial_resets == [[0, 1]]  # both slots moved on to their second episode together
    assert stable(rows) == stable(
        run(tmp_path / "b", [hold_server], num_envs=1, episodes=4, max_steps=5)[1].read_rows()
    )


@pytest.mark.parametrize("flavor", ["vllm-omni", "dreamzero"])
def test_server_error_ends_only_that_episode(tmp_path, flavor):
    policy = FailOnSeedPolicy(fake_joint0(3))
    with start_server_thread(policy, flavor=flavor) as server:
        summary, run_dir, _ = run(tmp_path, [server.url + PATH], num_envs=2, episodes=6, max_steps=12)
    rows = sorted(run_dir.read_rows(), key=lambda r: r["episode"])
    assert [r["episode"] for r in rows] == list(range(6))
    bad = [r for r in rows if r["error"] is not None]
    assert [r["seed"] for r in bad] == [3]
    assert bad[0]["error_step"] == 1 and bad[0]["steps"] == 1
    assert bad[0]["error_event"] == "server_error"
    assert bad[0]["success_at_end"] is None and bad[0]["success_any_step"] is None
    assert "injected failure" in bad[0]["error"] or "Internal inference error" in bad[0]["error"]
    good = [r for r in rows if r["error"] is None]
    assert all(r["steps"] == 12 for r in good)
    assert len({r["session_id"] for r in rows}) == 6
    assert summary["overall"]["errored"] == 1 and summary["overall"]["success_at_end"]["n"] == 5


class FailFirstAttemptsPolicy(HoldPolicy):
    """Hold, but fail the first ``times`` episodes (sessions) that start from ``joint0``, then serve it."""

    def __init__(self, joint0: float, times: int):
        super().__init__()
        self.joint0, self.times = joint0, times
        self.failed: set[str] = set()

    def infer(self, request, *, session_id, new_session):
        if abs(float(request["observation/joint_position"][0]) - self.joint0) < 1e-6:
            if session_id in self.failed or len(self.failed) < self.times:
                self.failed.add(session_id)
                raise RuntimeError("injected failure for this attempt")
        return super().infer(request, session_id=session_id, new_session=new_session)


def test_an_errored_attempt_runs_again_on_its_seed_and_the_row_equals_a_run_without_errors(tmp_path, hold_server):
    clean = stable(run(tmp_path / "clean", [hold_server], num_envs=2, episodes=5, max_steps=8)[1].read_rows())
    policy = FailFirstAttemptsPolicy(fake_joint0(2), times=2)
    with start_server_thread(policy) as server:
        summary, run_dir, _ = run(tmp_path / "retried", [server.url + PATH], num_envs=2, episodes=5, max_steps=8,
                                  episode_retries=2)  # fmt: skip
    rows = run_dir.read_rows()
    assert len(rows) == 5 and summary["overall"]["errored"] == 0 and len(policy.failed) == 2
    assert stable(rows) == clean  # same seed, slot and outcome: attempts are volatile
    (retried,) = [r for r in rows if r["attempts"] > 1]
    assert retried["seed"] == 2 and retried["attempts"] == 3 and retried["retried_events"] == ["server_error"] * 2
    assert all(r["attempts"] == 1 and r["retried_events"] == [] for r in rows if r is not retried)
    log = run_dir.read_attempts()
    assert [(a["episode"], a["attempt"], a["error_event"]) for a in log] == [
        (2, 1, "server_error"),
        (2, 2, "server_error"),
    ]
    # Retries used up: what still errors stays in the row. A resume continues the count from attempts.jsonl.
    policy = FailFirstAttemptsPolicy(fake_joint0(2), times=3)
    with start_server_thread(policy) as server:
        _, spent, _ = run(tmp_path / "spent", [server.url + PATH], num_envs=2, episodes=5, max_steps=8,
                          episode_retries=2)  # fmt: skip
        (bad,) = [r for r in spent.read_rows() if r["error"] is not None]
        assert bad["seed"] == 2 and bad["attempts"] == 3 and len(spent.read_attempts()) == 2
        resumed = RunDir.create(tmp_path / "resumed", spent.load_config())
        for record in spent.read_attempts():
            resumed.append_attempt(record)
        policy.failed.clear()
        policy.times = 1  # one more failure; the two logged attempts already used the retries
        run(tmp_path / "resumed", [server.url + PATH], num_envs=2, episodes=5, max_steps=8, episode_retries=2,
            run_dir=resumed)  # fmt: skip
    (bad,) = [r for r in resumed.read_rows() if r["error"] is not None]
    assert bad["seed"] == 2 and bad["attempts"] == 3 and bad["retried_events"] == ["server_error"] * 2


def test_max_errors_aborts_cleanly(tmp_path):
    policy = FailOnSeedPolicy(fake_joint0(0))
    control = RunControl(error_budget=0)
    with start_server_thread(policy) as server:
        summary, run_dir, _ = run(tmp_path, [server.url + PATH], num_envs=2, episodes=6, max_steps=4, control=control)
    rows = run_dir.read_rows()
    assert summary["aborted"] and "max-errors" in summary["aborted"]
    assert summary["interrupted"] is False and summary["complete"] is False
    assert [r["seed"] for r in rows if r["error"]] == [0]
    assert len(rows) < 6


def test_injected_stop_then_resume_equals_an_uninterrupted_run(tmp_path, hold_server):
    full = stable(run(tmp_path / "full", [hold_server], num_envs=3, episodes=7, max_steps=9, seed=5)[1].read_rows())

    control = RunControl()
    control.on_row = lambda row: control.stop.set() if control.rows_written >= 2 else None
    summary, run_dir, _ = run(
        tmp_path / "cut", [hold_server], num_envs=3, episodes=7, max_steps=9, seed=5, control=control
    )
    assert summary["interrupted"] is True and summary["complete"] is False
    partial = run_dir.read_rows()
    assert 2 <= len(partial) < 7
    # Resume with another num_envs: only the missing episodes run, with the same seeds.
    summary, _, _ = run(tmp_path, [hold_server], num_envs=2, episodes=7, max_steps=9, seed=5, run_dir=run_dir)
    rows = run_dir.read_rows()
    assert summary["complete"] and not summary["interrupted"]
    assert len(rows) == 7 and len({(r["scene"], r["episode"]) for r in rows}) == 7
    assert stable(rows) == full
    assert len(summary["segments"]) == 2


def test_videos_have_one_frame_per_step(tmp_path, hold_server):
    import imageio.v2 as imageio

    summary, run_dir, _ = run(tmp_path, [hold_server], num_envs=2, episodes=3, max_steps=7, video=True)
    for row in run_dir.read_rows():
        reader = imageio.get_reader(run_dir.path / row["video"])
        frames = [frame for frame in reader]
        reader.close()
        assert len(frames) == row["steps"] == 7
        assert frames[0].shape == (180, 960, 3)
    assert summary["video_errors"] == {}


def test_strip_frames_order_and_isaac_sized_torch_views():
    pytest.importorskip("torch")
    from dz_gym.eval.video import strip_frames
    from dz_gym.testing.isaac_standin import IsaacDroidStandIn, decode_stamp

    env = IsaacDroidStandIn(scene=1, num_envs=3)
    obs, _ = env.reset(seed=0)
    for _ in range(2):
        obs, *_ = env.step(np.zeros((3, droid.ACTION_DIM), dtype=np.float32))
    frames = strip_frames(obs[droid.POLICY_GROUP], [0, 2])
    assert sorted(frames) == [0, 2]
    for env_id, frame in frames.items():
        assert frame.shape == (180, 960, 3) and frame.dtype == np.uint8
        views = [
            decode_stamp(frame[:, k * 320 : (k + 1) * 320], source_shape=droid.ISAAC_IMAGE_SHAPE) for k in range(3)
        ]
        assert [v.env_id for v in views] == [env_id] * 3 and [v.step for v in views] == [2] * 3
        # right external | wrist | left external
        assert [v.camera for v in views] == [droid.CAMERA_KEYS.index(c) for c in droid.VIDEO_STRIP_KEYS]


def test_isaac_stand_in_end_to_end(tmp_path, hold_server):
    """The Isaac code path: torch observations at 720x1280, torch rewards and dones, videos resized."""
    pytest.importorskip("torch")
    import imageio.v2 as imageio

    from dz_gym.testing.isaac_standin import IsaacDroidStandIn

    config = EvalConfig(scenes=[1], episodes=3, num_envs=2, max_steps=6, video=True)
    run_dir = RunDir.create(tmp_path, config)

    def factory(scene, cfg, **_):
        return IsaacDroidStandIn(
            scene=scene, num_envs=cfg.plan.num_envs, max_episode_length=50, success_steps=[3, None]
        )

    summary = evaluate(config, run_dir, [hold_server], env_factory=factory, progress=False)
    rows = sorted(run_dir.read_rows(), key=lambda r: r["episode"])
    assert [r["steps"] for r in rows] == [6, 6, 6] and summary["complete"]
    # Slot 0 places the object from step 3 on; slot 1 never does.
    assert [(r["env"], r["success_at_end"], r["first_success_step"]) for r in rows] == [
        (0, True, 3),
        (1, False, None),
        (0, True, 3),
    ]
    for row in rows:
        reader = imageio.get_reader(run_dir.path / row["video"])
        assert sum(1 for _ in reader) == 6
        reader.close()


def test_rows_count_the_reconnects_after_idle_closes(tmp_path):
    """One FIFO worker at 50 ms and 4 envs that replan in lockstep: the first-served env waits >= 150 ms for
    its next request, longer than the server's 0.1 s idle timeout, so the server closes its connection in
    between. Every episode still completes; the rows count the reconnects; no request was processed twice
    (the server's inference count equals the requests the rows record)."""
    with start_server_thread("hold", flavor="vllm-omni", workers=1, latency_ms=50, idle_timeout_s=0.1) as server:
        summary, run_dir, _ = run(tmp_path, [server.url + PATH], num_envs=4, episodes=4, max_steps=17)
        inferences = server.stats().inferences
    rows = run_dir.read_rows()
    assert summary["complete"] and all(r["error"] is None and r["steps"] == 17 for r in rows)
    assert sum(r["reconnects"] for r in rows) > 0 and all(r["retries"] == 0 for r in rows)
    assert inferences == sum(r["server_calls"] for r in rows) == 4 * 3


def test_rows_count_server_error_retries(tmp_path):
    with start_server_thread("hold", flavor="vllm-omni", fail_every=2) as server:
        summary, run_dir, _ = run(
            tmp_path, [server.url + PATH], num_envs=1, episodes=2, max_steps=17, retry_server_errors=1
        )
    rows = run_dir.read_rows()
    assert summary["complete"] and all(r["error"] is None for r in rows)
    assert [r["retries"] for r in rows] == [2, 3]  # every second inference fails: requests 2, 3 | 4, 5, 6 retry once
    assert all(r["reconnects"] == 0 for r in rows)


@pytest.mark.parametrize("flavor", ["vllm-omni", "dreamzero"])
def test_the_same_cause_gives_the_same_error_event_in_every_env(tmp_path, flavor):
    """Every env's first request fails on the server: one name, whatever the flavor's connection handling."""
    with start_server_thread("hold", flavor=flavor, fail_every=1) as server:
        _, run_dir, _ = run(tmp_path, [server.url + PATH], num_envs=3, episodes=3, max_steps=4)
    rows = run_dir.read_rows()
    assert len(rows) == 3 and {r["error_event"] for r in rows} == {"server_error"}


def test_explicit_slot_episodes_run_on_their_slots_in_order(tmp_path):
    from dz_gym.eval.runner import SceneRunner
    from dz_gym.testing.memory_client import MemoryPolicyClient
    from dz_gym.wrapper import DreamZeroPolicyWrapper

    config = EvalConfig(scenes=[1], episodes=6, num_envs=2, max_steps=5)
    run_dir = RunDir.create(tmp_path, config)
    env = ToyDroidEnv(2, max_episode_length=5)
    wrapper = DreamZeroPolicyWrapper(env, client=MemoryPolicyClient(HoldPolicy(), 2))
    try:
        queues = [[5, 1], [0, 2, 4]]  # not the k % num_envs placement
        entries = [
            [PlanEntry(order=0, scene=1, episode=k, arm=None, seed=k, slot=slot, server="-") for k in queue]
            for slot, queue in enumerate(queues)
        ]
        runner = SceneRunner(wrapper, scene=1, queues=entries, max_steps=5, run_dir=run_dir, control=RunControl())
        runner.run()
        with pytest.raises(ValueError, match="queues: expected one entry list per env slot"):
            SceneRunner(wrapper, scene=1, queues=entries[:1], max_steps=5, run_dir=run_dir, control=RunControl())
    finally:
        wrapper.close()
    rows = run_dir.read_rows()
    for slot, queue in enumerate(queues):
        assert [r["episode"] for r in rows if r["env"] == slot] == queue
    assert all(r["seed"] == r["env_seed"] == r["episode"] for r in rows)
