"""The evaluator's own work per batch step (``--profile``'s ``bookkeeping``) at large N, on an env that costs nothing.

``bookkeeping`` is the wall time of a scene's stepping that is not spent inside the policy wrapper: the
runner's per-step record of the batch, the finished episodes' rows and trajectories and the episode writer's
thread (which shares the interpreter lock); ``write_tail`` is the wait for that thread at the end (before it
had its own stage, bookkeeping held it). On a GPU simulator at N = 1024 it
was a large part of each batch step (benchmarks/journal/isaac3.md). To see it without a simulator's cost, :class:`FastDroidEnv` produces DROID
observations of the real shapes (three 180x320x3 uint8 views, joints, gripper) from preallocated arrays, and
the evaluator runs through its public path (:func:`dz_gym.eval.evaluate.evaluate` with ``profile=True``,
trajectories written, videos off) against a ``hold`` server in another process. Every env runs one episode
of ``--max-steps`` steps, so all N episodes end at the same step, as in the GPU benchmark. ``--prefetch K`` and
``--simulated-delay D`` set the chunk schedule's latency hiding as ``dz-gym-eval``'s flags do (``--prefetch 4
--simulated-delay 4``: the locked mode, requests sent four steps before their window ends and applied exactly
four steps later, so the transport works while the envs step).

It prints, per N, the profile's ``bookkeeping`` (and ``scatter``, ``encode``) in ms per batch step. With
``--baseline REF`` it runs the same measurement on the tree of git revision ``REF`` too (checked out into a
temporary worktree, its own child process), interleaved with this tree's runs, and prints the ratio; with
``--cprofile N`` it writes this tree's run at N under :mod:`cProfile` and prints its top functions.
``--heap-objects M`` makes the child hold M objects the garbage collector tracks before the runs, as a
simulator's process does (Isaac Lab's holds about 1.3 million); ``full gc ms`` and ``full gcs`` are the
collector's full (generation 2) passes from the env's first reset to its close.

Usage::

    python benchmarks/bench_bookkeeping.py [--sizes 256,1024] [--max-steps 64] [--repeats 2] [--baseline main]
        [--prefetch 4 --simulated-delay 4] [--heap-objects 1300000]
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from dz_gym.envs import droid
from dz_gym.envs.base import BatchedDroidEnv
from dz_gym.envs.episodes import TaskState

HERE = Path(__file__).resolve().parent
STAGES = ("bookkeeping", "write_tail", "scatter", "encode", "env_step", "wait")


class FastDroidEnv(BatchedDroidEnv):
    """``num_envs`` DROID envs that do nothing: the same preallocated views at every step, the joints half way
    to the commanded targets, the object at rest beside its container (no success), the shared episode
    bookkeeping of every backend (info keys, same-step autoreset, partial resets, queued seeds)."""

    def __init__(self, num_envs: int, scene: int = 1, max_episode_length: int = 64, image_shape=(180, 320)):
        super().__init__(num_envs, tuple(image_shape), scene, seed=0)
        self.max_episode_length = int(max_episode_length)
        n = self.num_envs
        rng = np.random.default_rng(0)
        self._views = {key: rng.integers(0, 256, (n, *image_shape, 3), dtype=np.uint8) for key in droid.CAMERA_KEYS}
        self.joints = np.tile(np.asarray(droid.HOME_JOINT_POSITIONS, dtype=np.float32), (n, 1))
        self.gripper = np.zeros((n, 1), dtype=np.float32)
        self._state = TaskState.resting(np.tile([0.55, 0.12, 0.03], (n, 1)), np.tile([0.55, -0.15, 0.0], (n, 1)))
        self.first_reset_at: float | None = None  # the stepping's span, from the first reset to the close
        self.closed_at: float | None = None

    def _obs(self) -> dict:
        policy = dict(self._views)
        policy[droid.OBS_JOINT_KEY] = self.joints.copy()
        policy[droid.OBS_GRIPPER_KEY] = self.gripper.copy()
        return {droid.POLICY_GROUP: policy}

    def reset(self, *, seed=None, options=None):
        self._check_open()
        if self.first_reset_at is None:
            self.first_reset_at = time.perf_counter()
        book = self.episodes
        ids = book.resolve_reset_ids(options)
        seeds = book.reset_seeds(ids, seed)
        return self._obs(), book.record_reset(ids, seeds, self._state)

    def step(self, action):
        self._check_started()
        action = self._numpy_action(action).astype(np.float32)
        self.joints += 0.5 * (action[:, : droid.ARM_DOF] - self.joints)
        self.gripper[:, 0] = action[:, -1]
        book = self.episodes
        time_outs = book.ending_next_step(self.max_episode_length)
        info = book.record_step(self._state, time_outs)
        done = np.flatnonzero(time_outs)
        if done.size:
            book.start(done, book.next_seeds(done), self._state)
        zeros = np.zeros(self.num_envs, dtype=bool)
        return self._obs(), np.zeros(self.num_envs, dtype=np.float32), zeros, time_outs.copy(), info

    def close(self):
        self._closed = True
        self.closed_at = time.perf_counter()


def measure(
    url: str,
    num_envs: int,
    max_steps: int,
    cprofile: str | None = None,
    prefetch: int = 0,
    simulated_delay: int | None = None,
) -> dict:
    """One evaluator run of ``num_envs`` episodes on as many :class:`FastDroidEnv` envs (``prefetch`` and
    ``simulated_delay``: the chunk schedule's): the profile's stages in ms per batch step, and the run's wall
    time and env-steps/s."""
    from dz_gym.eval.config import EvalConfig
    from dz_gym.eval.evaluate import evaluate
    from dz_gym.eval.rundir import RunDir

    made: list[FastDroidEnv] = []

    def factory(scene_id, config, **_):
        made.append(FastDroidEnv(config.plan.num_envs, scene_id, max_episode_length=config.plan.max_steps))
        return made[-1]

    config = EvalConfig(scenes=[1], episodes=num_envs, num_envs=num_envs, max_steps=max_steps, video=False,
                        report=False, profile=True, prefetch=prefetch, simulated_delay=simulated_delay,
                        transport_processes=0)  # fmt: skip  # in-process, as every figure of this benchmark
    full_passes: list[tuple[float, float]] = []  # the collector's generation-2 passes: (end, seconds)
    started = [0.0]

    def on_collection(phase: str, info: dict) -> None:
        if info.get("generation") == 2:
            if phase == "start":
                started[0] = time.perf_counter()
            else:
                full_passes.append((time.perf_counter(), time.perf_counter() - started[0]))

    gc.callbacks.append(on_collection)
    with contextlib.ExitStack() as stack, tempfile.TemporaryDirectory() as root:
        stack.callback(gc.callbacks.remove, on_collection)
        run_dir = RunDir.create(root, config)
        profiler = None
        if cprofile:
            import cProfile

            profiler = cProfile.Profile()
        with contextlib.redirect_stdout(sys.stderr):  # the profile table: our stdout is one JSON line
            if profiler is not None:
                profiler.enable()
            summary = evaluate(config, run_dir, [url], env_factory=factory, progress=False, log=lambda _: None)
            if profiler is not None:
                profiler.disable()
                profiler.dump_stats(cprofile)
        report = json.loads((run_dir.path / "profile.json").read_text())["scenes"]["1"]
        rows = run_dir.read_rows()
    if len(rows) != num_envs:
        raise RuntimeError(f"expected {num_envs} rows, got {len(rows)}")
    # a tree before write_tail (its bookkeeping holds the tail) reads 0 there
    out = {stage: report["stages"].get(stage, {"per_step_ms": 0.0})["per_step_ms"] for stage in STAGES}
    env = made[0]  # the full passes from the env's first reset to its close: the scene's stepping and its end
    stepping = [seconds for end, seconds in full_passes if env.first_reset_at <= end <= env.closed_at]
    out.update(steps=report["steps"], wall_s=report["wall_s"], env_steps_per_s=summary["env_steps_per_s"],
               full_gc_ms=1000 * sum(stepping), full_gcs=len(stepping))  # fmt: skip
    return out


def _child(args) -> int:
    from dz_gym.server.launch import start_server_process

    serve = ["--policy", "hold", "--workers", "8", "--quiet"]
    # a simulator's process holds many objects the collector tracks (Isaac Lab's: about 1.3 million)
    held = [[i] for i in range(args.heap_objects)]  # noqa: F841 - held for the collector to walk
    with start_server_process(serve) as server:  # the evaluator applies its own settings
        url = server.url + "/v1/realtime/robot/openpi"
        results = {n: measure(url, n, args.max_steps, args.cprofile if n == args.cprofile_n else None,
                              args.prefetch, args.simulated_delay) for n in args.sizes}  # fmt: skip
    print(json.dumps(results))
    return 0


def _run_tree(tree: Path, args, cprofile_n: int = 0, cprofile: str = "") -> dict[int, dict]:
    """This benchmark's child run on the package of ``tree`` (its own process), the results per N."""
    env = dict(os.environ, PYTHONPATH=str(tree))
    cmd = [sys.executable, str(HERE / "bench_bookkeeping.py"), "--child", "--sizes", ",".join(map(str, args.sizes)),
           "--max-steps", str(args.max_steps), "--prefetch", str(args.prefetch),
           "--heap-objects", str(args.heap_objects)]  # fmt: skip
    if args.simulated_delay is not None:
        cmd += ["--simulated-delay", str(args.simulated_delay)]
    if cprofile_n:
        cmd += ["--cprofile-n", str(cprofile_n), "--cprofile", cprofile]
    proc = subprocess.run(cmd, env=env, cwd=tree, stdout=subprocess.PIPE, timeout=3600, check=True, text=True)
    return {int(k): v for k, v in json.loads(proc.stdout.strip().splitlines()[-1]).items()}


def _times_less(before: float, after: float) -> str:
    """``before / after`` as "N.NNx less", or "none left" when nothing is left to divide by."""
    return "none left" if after <= 0 else f"{before / after:.2f}x less"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=lambda s: [int(v) for v in s.split(",")], default=[256, 1024])
    parser.add_argument("--max-steps", type=int, default=64, help="steps per episode (every env runs one)")
    parser.add_argument("--prefetch", type=int, default=0, help="ask for the next chunk this many actions early")
    parser.add_argument("--simulated-delay", type=int, default=None, help="apply each reply exactly this many steps on")
    parser.add_argument("--repeats", type=int, default=1, help="runs per tree, interleaved")
    parser.add_argument("--baseline", default=None, help="git revision to compare against (e.g. main)")
    parser.add_argument("--cprofile-n", type=int, default=0, help="write this tree's run at this N under cProfile")
    parser.add_argument("--cprofile", default="/tmp/bench_bookkeeping.prof", help="where --cprofile-n writes")
    parser.add_argument(
        "--heap-objects",
        type=int,
        default=0,
        help="objects the collector tracks, held in the child as a simulator's process holds them",
    )
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        return _child(args)

    tree = HERE.parent
    trees: dict[str, Path] = {"this tree": tree}
    base_name = None
    with contextlib.ExitStack() as stack:
        if args.baseline:
            base = Path(stack.enter_context(tempfile.TemporaryDirectory())) / "baseline"
            subprocess.run(["git", "-C", str(tree), "worktree", "add", "--detach", str(base), args.baseline],
                           check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
            stack.callback(subprocess.run, ["git", "-C", str(tree), "worktree", "remove", "--force", str(base)],
                           check=False)  # fmt: skip
            base_name = f"baseline {args.baseline}"
            trees = {base_name: base, "this tree": tree}
        results: dict[str, list[dict[int, dict]]] = {name: [] for name in trees}
        for repeat in range(args.repeats):
            for name, path in trees.items():
                profile_n = args.cprofile_n if name == "this tree" and repeat == 0 else 0
                results[name].append(_run_tree(path, args, profile_n, args.cprofile))
    mode = f"prefetch {args.prefetch}" + (
        "" if args.simulated_delay is None else f", simulated delay {args.simulated_delay}"
    )
    print(f"{args.max_steps}-step episodes, one per env (all end at the same step), hold server, {mode}, trajectories "
          f"written, no videos; ms per batch step (median of {args.repeats} run(s) per tree)")  # fmt: skip
    print(f"{'tree':<16} {'N':>5} " + " ".join(f"{s:>11}" for s in STAGES)
          + f" {'env-steps/s':>11} {'full gc ms':>10} {'full gcs':>8}")  # fmt: skip
    medians: dict[str, dict[int, dict]] = {}
    for name, runs in results.items():
        medians[name] = {}
        for n in args.sizes:
            keys = (*STAGES, "env_steps_per_s", "full_gc_ms", "full_gcs")
            med = {key: float(np.median([r[n][key] for r in runs])) for key in keys}
            medians[name][n] = med
            print(f"{name:<16} {n:>5} " + " ".join(f"{med[s]:>11.2f}" for s in STAGES)
                  + f" {med['env_steps_per_s']:>11.0f} {med['full_gc_ms']:>10.1f} {med['full_gcs']:>8.0f}")  # fmt: skip
    if base_name is not None:
        for n in args.sizes:
            before, after = medians[base_name][n], medians["this tree"][n]
            old, new = before["bookkeeping"], after["bookkeeping"]
            print(f"N={n}: bookkeeping {old:.2f} -> {new:.2f} ms per step ({_times_less(old, new)}); "
                  f"full gc {before['full_gc_ms']:.1f} -> {after['full_gc_ms']:.1f} ms a run "
                  f"({_times_less(before['full_gc_ms'], after['full_gc_ms'])}); env-steps/s "
                  f"{after['env_steps_per_s'] / max(before['env_steps_per_s'], 1e-9):.2f}x")  # fmt: skip
    if args.cprofile_n:
        import pstats

        print(f"\ncProfile of this tree's run at N={args.cprofile_n} ({args.cprofile}), by own time:")
        pstats.Stats(args.cprofile).sort_stats("tottime").print_stats(25)
    return 0


if __name__ == "__main__":
    sys.exit(main())
