"""Real run directories for the report's tests, made quickly by the evaluator itself.

The episodes run on :class:`~dz_gym.testing.toy_env.ToyDroidEnv` (outcomes known from the seed, no rendering
cost) against the reference server over loopback, with real videos, trajectories, rows and summary written by
:func:`dz_gym.eval.evaluate.evaluate`. One seed's requests fail on the server, so every run has an errored
episode with a reason.
"""

from __future__ import annotations

from pathlib import Path

from dz_gym.eval.config import EvalConfig
from dz_gym.eval.evaluate import evaluate
from dz_gym.eval.rundir import RunDir
from dz_gym.server.launch import start_server_thread
from dz_gym.server.policies import HoldPolicy
from dz_gym.testing.toy_env import GripperToyEnv, ToyDroidEnv

PATH = "/v1/realtime/robot/openpi"


def first_joint(seed: int) -> float:
    env = ToyDroidEnv(1, image_shape=(18, 32))
    env.reset_one(0, seed)
    return float(env.joints[0, 0])


class FailOnSeed(HoldPolicy):
    """Hold, but fail every request of the episode with ``seed`` (recognised by its first joint)."""

    def __init__(self, seed: int, gripper: float = 0.0):
        super().__init__(gripper=gripper)
        self.joint0 = first_joint(seed)

    def infer(self, request, *, session_id, new_session):
        if abs(float(request["observation/joint_position"][0]) - self.joint0) < 1e-6:
            raise RuntimeError("injected failure for this episode")
        return super().infer(request, session_id=session_id, new_session=new_session)


def toy_run(
    root: Path,
    *,
    scenes=(1, 2),
    episodes: int = 6,
    num_envs: int = 3,
    max_steps: int = 12,
    video: bool = True,
    fail_seed: int | None = 4,
    control=None,
    run_dir: RunDir | None = None,
) -> RunDir:
    """A run directory under ``root`` (see the module docstring), finished unless ``control`` stops it;
    ``run_dir`` resumes an existing one."""
    config = EvalConfig(scenes=list(scenes), episodes=episodes, num_envs=num_envs, max_steps=max_steps, video=video)
    run_dir = run_dir or RunDir.create(root, config)
    policy = FailOnSeed(fail_seed) if fail_seed is not None else HoldPolicy()

    def factory(scene, cfg):
        return ToyDroidEnv(cfg.plan.num_envs, scene=scene, max_episode_length=cfg.plan.max_steps)

    with start_server_thread(policy) as server:
        evaluate(
            config,
            run_dir,
            [server.url + PATH],
            env_factory=factory,
            control=control,
            progress=False,
            command="toy run for the report tests",
        )
    return run_dir


def toy_ab_run(root: Path, *, episodes: int = 4, num_envs: int = 2, max_steps: int = 6, fail_seed_b: int = 2) -> RunDir:
    """A finished A/B run (rows with ``arm``): arm A holds, arm B holds but fails every request of one seed."""

    def factory(scene, cfg):
        return ToyDroidEnv(cfg.plan.num_envs, scene=scene, max_episode_length=cfg.plan.max_steps)

    with start_server_thread(HoldPolicy()) as a, start_server_thread(FailOnSeed(fail_seed_b)) as b:
        config = EvalConfig(
            scenes=[1],
            episodes=episodes,
            num_envs=num_envs,
            max_steps=max_steps,
            video=True,
            servers=[a.url + PATH],
            servers_b=[b.url + PATH],
        )
        run_dir = RunDir.create(root, config)
        evaluate(config, run_dir, env_factory=factory, progress=False, command="toy A/B run for the report tests")
    return run_dir


def toy_arms_run(
    root: Path, policies: dict, *, episodes: int = 6, select_best: bool = False, video: bool = True
) -> RunDir:
    """A finished run of named arms (``--arm NAME=URL``), one reference server per arm running ``policies[NAME]``,
    on :class:`GripperToyEnv` (one env slot per arm, 6 steps per episode)."""
    from contextlib import ExitStack

    with ExitStack() as stack:
        urls = {name: stack.enter_context(start_server_thread(p)).url + PATH for name, p in policies.items()}
        config = EvalConfig(scenes=[1], episodes=episodes, num_envs=len(urls), max_steps=6, video=video,
                            report=False, arm_specs=[f"{n}={u}" for n, u in urls.items()], select_best=select_best)  # fmt: skip
        run_dir = RunDir.create(root, config)

        def factory(scene, cfg):
            return GripperToyEnv(cfg.plan.num_envs, scene=scene, max_episode_length=cfg.plan.max_steps)

        evaluate(
            config, run_dir, env_factory=factory, progress=False, command="toy run of named arms for the report tests"
        )
    return run_dir


def replicated_run(source: RunDir, target: Path, episodes: int) -> RunDir:
    """A run directory of ``episodes`` rows made of ``source``'s (new episode numbers and seeds; the rows keep
    pointing at the source's trajectories and videos through relative paths), with its summary recomputed."""
    import json
    import os

    from dz_gym.eval import results

    rows = source.read_rows()
    target.mkdir(parents=True)
    config = json.loads((source.path / "config.json").read_text())
    config["plan"].update(scenes=[1], episodes=episodes)
    (target / "config.json").write_text(json.dumps(config))
    scene1 = next(r for r in rows if r["scene"] == 1)  # every row becomes one of scene 1: its task and prompt
    out = []
    for k in range(episodes):
        row = dict(
            rows[k % len(rows)], scene=1, episode=k, seed=k, task=scene1.get("task"), prompt=scene1.get("prompt")
        )
        for field in ("trajectory", "video"):
            if row.get(field):
                row[field] = os.path.relpath(source.path / row[field], target)
        out.append(row)
    (target / "episodes.jsonl").write_text("".join(json.dumps(r) + "\n" for r in out))
    summary = results.summarize(out, planned={1: episodes})
    (target / "summary.json").write_text(json.dumps(summary))
    return RunDir(target)
