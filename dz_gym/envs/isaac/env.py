"""The batched DROID env on Isaac Lab + sim-evals: :class:`IsaacDroidEnv`.

Builds sim-evals' env for one scene or named task with N envs, in whichever sim-evals layout is installed
(:mod:`dz_gym.envs.isaac.build`), patched for N > 1 (:mod:`dz_gym.envs.isaac.config`), and exposes it
through the :class:`~dz_gym.envs.base.BatchedDroidEnv` contract; episode bookkeeping is the shared
``self.episodes`` (:mod:`dz_gym.envs.episodes`), this module keeps only the Isaac calls:

- observations are Isaac Lab's own (torch tensors on the sim device): three ``(N,720,1280,3)`` uint8
  views, ``arm_joint_pos`` ``(N,7)`` and ``gripper_pos`` ``(N,1)`` float32;
- ``step`` takes ``(N,8)`` actions (numpy or torch; a bool gripper column is turned into 0/1, since
  sim-evals' gripper term inverts bools); ``reward`` is the placement check as float ``(N,)``,
  ``terminated``/``truncated`` are copies of Isaac Lab's ``(N,)`` buffers (time-outs only, at 450 steps or
  a MILA task's ``max_timesteps``);
- ``info`` holds the keys of the base contract, computed from the state *before* the in-step reset; for a
  MILA task ``success`` and ``milestones`` are sim-evals' own flags, handed to ``self.episodes`` with the
  state (``TaskState.milestone_flags``; :mod:`dz_gym.envs.isaac.mila` when sim-evals lacks them);
- rendering: on a kit-less task the views render only at the steps :meth:`set_render_mask` asks for (all
  envs' views when any env's are due; :mod:`dz_gym.envs.isaac.views`) and at every step that resets an env
  (in the step or through :meth:`reset`); ``images_fresh`` is False where the frames are an earlier step's.
  sim-evals' views render at every step;
- start-up quirks: the first ``reset`` resets twice (materials load on the second render cycle), and
  after every reset of all envs one hold step (arm target = current joints, gripper unchanged) is taken
  and the episode counters zeroed, because the first frame after a reset can show the previous episode
  (IsaacLab#6394). A reset of only some envs cannot take that step without moving the others, so their
  ``images_fresh`` is False on that observation (as for every reset with ``settle_steps=0``).

What upstream lacks and this cannot add: sim-evals has no randomization, so every episode starts from the
same state whatever the seed; seeds are recorded (``episode_seed``) but change nothing.
"""

from __future__ import annotations

import importlib
import warnings
from collections.abc import Sequence
from typing import Any

import numpy as np

from dz_gym.envs import droid, scenes
from dz_gym.envs.base import BatchedDroidEnv
from dz_gym.envs.isaac import checks, kitless, launch, tasks, views
from dz_gym.envs.isaac.build import InitialConditions, MilestoneProbe, parse_task_cfg
from dz_gym.envs.isaac.config import keep_one_dome_light, patch_env_cfg, set_seed
from dz_gym.envs.isaac.mila import MilaFallback
from dz_gym.envs.isaac.state import DEFAULT_TCP_BODIES, StateProbe, TaskState
from dz_gym.preprocess import to_numpy

# Spacing of the env grid when N > 1 (sim-evals: 7 m). With 7 m, each env's table also gets about 5 % more
# light from its neighbours' sphere lights (inverse square) and the 104-degree external cameras can see the
# neighbouring robots; at 30 m both are below 1 %. Physics is env-local, so spacing changes nothing else.
MULTI_ENV_SPACING = 30.0
# Isaac Lab's non-tiled Camera fails at about 32 envs x 3 cameras ("Unable to allocate descriptor sets").
CAMERA_ENV_WARNING = 32


def request_image_keys(cfg: Any) -> dict[str, str]:
    """Which camera goes out under which request key: the reference mapping, except where sim-evals' task
    names another camera as the policy's exterior view (MILA's ``set_task`` sets ``policy_external_camera``
    to ``external_cam_2``, having moved ``external_cam``; upstream's client sends that one as
    ``exterior_image_0_left``): the two exterior views then swap keys."""
    keys = dict(droid.REQUEST_IMAGE_KEYS)
    camera = getattr(cfg, "policy_external_camera", None)
    if camera == "external_cam_2":
        keys["external_cam"], keys["external_cam_2"] = keys["external_cam_2"], keys["external_cam"]
    elif camera not in (None, "external_cam"):
        raise ValueError(f"sim-evals config: policy_external_camera {camera!r} is not one of {droid.CAMERA_KEYS[:2]}")
    return keys


class IsaacDroidEnv(BatchedDroidEnv):
    """sim-evals' DROID scene on Isaac Lab with ``num_envs`` envs, behind the batched DROID contract.

    Example (on a machine with Isaac Lab 2.2, sim-evals and an RTX GPU)::

        env = dz_gym.make_droid_env(backend="isaac", scene=1, num_envs=4)
        obs, info = env.reset(seed=0)
        obs, reward, terminated, truncated, info = env.step(hold_actions)
    """

    def __init__(
        self,
        scene: int | str = 1,
        num_envs: int = 1,
        *,
        device: str | None = None,
        headless: bool = True,
        app_args: Any = None,
        seed: int | None = None,
        settle_steps: int = 1,
        env_spacing: float | None = None,
        image_shape: tuple[int, int] | None = None,
        tiled_cameras: bool = False,
        check_gpu: bool = True,
        assets_dir: str | None = None,
        tcp_bodies: Sequence[str] = DEFAULT_TCP_BODIES,
        isaaclab_version: str | None = None,
        close_app_on_close: bool = True,
        max_episode_length: int | None = None,
        cfg_overrides: Sequence[str] = (),
    ):
        task = scenes.task_for(scene)
        cfg_overrides = kitless.check_overrides(cfg_overrides)
        if cfg_overrides and not task.kitless:
            raise ValueError(
                f"cfg_overrides: Hydra overrides are taken by the kit-less tasks (Isaac Lab 3.0) only, not by "
                f"{task.name}; got {list(cfg_overrides)}"
            )
        self.task = task
        default_shape = droid.DEFAULT_EMBEDDED_IMAGE_SHAPE if task.kitless else droid.ISAAC_IMAGE_SHAPE
        shape = tuple(int(v) for v in image_shape) if image_shape is not None else default_shape
        device = device or getattr(app_args, "device", None) or "cuda:0"
        super().__init__(
            num_envs, shape, task.scene or 1, device=str(device), seed=seed, milestone_names=task.milestones
        )
        self.scene = task.scene_spec()
        if not isinstance(settle_steps, (int, np.integer)) or settle_steps < 0:
            raise ValueError(f"settle_steps: expected an integer >= 0, got {settle_steps!r}")
        self.settle_steps = int(settle_steps)
        if max_episode_length is not None and (
            isinstance(max_episode_length, bool)
            or not isinstance(max_episode_length, (int, np.integer))
            or max_episode_length < 1
        ):  # checked before a minutes-long launch
            raise ValueError(f"max_episode_length: expected an integer >= 1 (env steps), got {max_episode_length!r}")
        self._close_app_on_close = close_app_on_close
        self._closed = True  # until built
        self._milestones: MilestoneProbe | None = None

        options = dict(app_args=app_args, device=str(device), version=isaaclab_version, image_shape=image_shape,
                       env_spacing=env_spacing, max_episode_length=max_episode_length, seed=seed)  # fmt: skip
        if task.kitless:
            self._build_kitless(task, cfg_overrides=cfg_overrides, **options)
        else:
            self._build_sim_evals(task, headless=headless, check_gpu=check_gpu, assets_dir=assets_dir,
                                  tiled_cameras=tiled_cameras, tcp_bodies=tcp_bodies, **options)  # fmt: skip
        self._closed = False

        import torch

        self._torch = torch
        self.device = str(self.isaac_env.device)
        self.max_episode_length = int(self.isaac_env.max_episode_length)
        self.step_dt = float(self.isaac_env.step_dt)
        self._fallback = MilaFallback(task, self.num_envs) if task.is_mila else None
        self._initial_conditions = InitialConditions.find(self.isaac_env)
        self._pending: tuple[np.ndarray, np.ndarray] | None = None  # (ids, seeds) of the in-step autoreset
        if self._initial_conditions is not None:
            self.patches.append("events.reset_initial_conditions: pose set = episode seed mod count")
        self._started = False
        self._last_obs = None
        # A kit-less task's camera terms render only when due (dz_gym.envs.isaac.views); sim-evals' render always.
        self._views = views.demand_of(self.isaac_env) if task.kitless else None
        self._views_restore: bool | None = None  # the views' demand before this step's in-step reset changed it
        self._settling = False
        if self._initial_conditions is not None or self._views is not None:
            self._probe.before_reset = self._before_in_step_reset

    def _build_sim_evals(self, task, *, app_args, headless, device, version, assets_dir, check_gpu, tiled_cameras,
                         env_spacing, image_shape, tcp_bodies, max_episode_length, seed) -> None:  # fmt: skip
        """sim-evals' env of ``task`` on Isaac Sim (Kit), patched for N envs."""
        # Everything that can fail fast, before a minutes-long start of Isaac Sim.
        checks.check_packages()
        installed = tasks.read_sim_evals(checks.sim_evals_package_dir())
        has_mila = installed.has_mila
        self.layout = "mila" if task.is_mila else installed.layout_for(task)  # decided before Kit starts
        if task.is_mila and not has_mila:
            raise checks.BackendUnavailable(
                f"task {task.name}: this sim-evals has no MILA tasks (src/sim_evals/environments/mila); update it, "
                "see docs/isaac.md"
            )
        checks.check_assets(task.key, assets_dir, files=task.assets)
        if check_gpu:
            checks.check_rtx_gpu(device)
        if self.num_envs >= CAMERA_ENV_WARNING and not tiled_cameras:
            warnings.warn(
                f"isaac: {self.num_envs} envs x 3 cameras: Isaac Lab's Camera is known to fail around 32 envs; "
                "consider tiled_cameras=True or fewer envs",
                stacklevel=2,
            )

        launch.claim_scene(task.key)
        try:
            app = launch.launch_app(app_args, headless=headless, device=device, version=version)
            self.api = app.api
            importlib.import_module("sim_evals.environments")  # registers the gym ids; only after the app runs
            cfg, built, self.layout = parse_task_cfg(self.api, task, self.layout, device=device, num_envs=self.num_envs)
            self.request_image_keys = request_image_keys(cfg)
            instruction = getattr(cfg, "language_instruction", None) if task.is_mila else None
            self.scene = task.scene_spec(instruction if isinstance(instruction, str) and instruction else None)
            self._probe = StateProbe(self.api, self.scene, tcp_bodies)
            self._milestones = MilestoneProbe(task.milestones) if task.is_mila else None
            if env_spacing is None and self.num_envs > 1:
                env_spacing = MULTI_ENV_SPACING
            self.patches = built + patch_env_cfg(
                cfg,
                self.api,
                probe_term=self._probe.term,
                env_spacing=env_spacing,
                image_shape=image_shape,
                tiled_cameras=tiled_cameras,
                max_episode_length=max_episode_length,
            )
            if seed is not None:
                self.patches.append(set_seed(cfg, seed))
            if self._milestones is not None:
                self.patches.append(self._milestones.install(cfg))
            self.cfg = cfg
            import gymnasium as gym

            self._gym_env = gym.make(
                scenes.MILA_GYM_ID if task.is_mila else (task.gym_id if self.layout == "per_scene" else "DROID"),
                cfg=cfg,
            )
            self.isaac_env = self._gym_env.unwrapped
            for path in keep_one_dome_light(self.api.stage(self.isaac_env), self.num_envs):
                self.patches.append(f"stage: infinite light {path} off (env 0's lights every env)")
            self._probe.validate(self.isaac_env)
        except BaseException:
            launch.release_scene()
            raise

    def _build_kitless(self, task, *, app_args, device, version, image_shape, env_spacing, max_episode_length,
                       seed, cfg_overrides) -> None:  # fmt: skip
        """A dz-gym task on Isaac Lab 3.0 kit-less (:mod:`dz_gym.envs.isaac.kitless`)."""
        self.layout = "kitless"
        launch.claim_scene(task.key)
        try:
            built = kitless.build(
                task, self.num_envs, device=device, app_args=app_args, version=version, image_shape=image_shape,
                env_spacing=env_spacing, max_episode_length=max_episode_length, seed=seed, overrides=cfg_overrides,
            )  # fmt: skip
        except BaseException:
            launch.release_scene()
            raise
        self.api, self.cfg, self._gym_env, self._probe, self.patches = (
            built.api, built.cfg, built.gym_env, built.probe, built.patches
        )  # fmt: skip
        self.isaac_env = self._gym_env.unwrapped

    # -- hooks ----------------------------------------------------------------------------------------
    def set_render_mask(self, mask: np.ndarray | None) -> None:
        """The base contract's hook; on a kit-less task, any env in the mask renders every env's views at the
        next step (the renderer draws all worlds in one pass) and an empty mask renders none (their
        ``images_fresh`` is False). sim-evals' cameras render at every step whatever the mask."""
        super().set_render_mask(mask)
        if self._views is not None:
            self._views.due = self._render_mask is None or bool(self._render_mask.any())

    # -- Gymnasium API --------------------------------------------------------------------------------
    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        """Reset every env, or ``options["env_ids"]`` (or ``options["reset_mask"]``); see the module
        docstring for the hold step. The observation of a reset is always rendered (after a reset of every
        env, by the hold step's last step only: the reset's own frames would be replaced at once)."""
        self._check_open()
        if self._views is None:
            return self._reset(seed, options)
        due = self._views.due
        try:
            return self._reset(seed, options)
        finally:
            self._views.due = due

    def _reset(self, seed, options):
        book = self.episodes
        env_ids, seeds = self._begin_reset(seed, options)
        full = env_ids.size == self.num_envs
        env = self.isaac_env
        obs = None
        if self._views is not None:
            self._views.due = not (full and self.settle_steps)  # else the hold step renders
        try:
            if not self._started:
                # sim-evals resets twice: the first render cycle runs before the materials have loaded.
                if full:
                    self._deal(env_ids, seeds)
                obs, _ = self.api.reset(env, seed=seed)
                self._started = True
            if full:
                self._deal(env_ids, seeds)
                obs, _ = self.api.reset(env, seed=seed)
            elif env_ids.size:
                self._deal(env_ids, seeds)
                ids = self._torch.as_tensor(env_ids, dtype=self._torch.int64, device=self.device)
                obs, _ = self.api.reset(env, env_ids=ids)
            elif obs is None:
                obs = self._last_obs  # an empty selection resets nothing
        finally:
            if self._initial_conditions is not None:
                self._initial_conditions.restore()
        fresh = np.ones(self.num_envs, dtype=bool)
        if full and self.settle_steps:
            obs = self._settle(obs)
        else:
            fresh[env_ids] = False  # no hold step since their reset: the frame may show the last episode
        state = self._probe.read(env)
        if self._fallback is not None:
            self._fallback.start(env_ids)
        flags = None if self._milestones is None else self._flags(self._milestones.read(env), state)
        info = book.record_reset(env_ids, seeds, state.for_episodes(flags), fresh)
        self._last_obs = obs
        return obs, info

    def step(self, action):
        """Step every env once with ``(N,8)`` actions; done envs are reset inside (same-step autoreset)."""
        self._check_started()
        self._pending = None
        self._views_restore = None
        try:
            obs, _, terminated, truncated, _ = self.isaac_env.step(self._torch_action(action))
        finally:
            if self._initial_conditions is not None:
                self._initial_conditions.restore()
        # Isaac Lab returns the termination manager's own buffers, which its next compute() clears in place:
        # copy them before anything else steps the sim (the hold step after a lock-step time-out does).
        terminated, truncated = terminated.clone(), truncated.clone()
        state = self._probe.latest
        if state is None:  # an Isaac Lab without the termination manager would land here
            raise RuntimeError("isaac: the task-state probe did not run during step()")
        self._probe.latest = None
        time_outs = to_numpy(truncated).astype(bool).reshape(-1)
        done_ids = np.flatnonzero(to_numpy(terminated).astype(bool).reshape(-1) | time_outs)
        fresh = np.full(self.num_envs, self._views is None or self._views.due)
        settle = self._settles(done_ids.size)
        if settle:
            fresh[:] = True  # the hold step's last step renders every env
        elif done_ids.size:
            fresh[done_ids] = False
        book = self.episodes
        flags = None
        if self._milestones is not None:
            flags, self._milestones.latest = self._flags(self._milestones.latest, state), None
        info = book.record_step(state.for_episodes(flags), time_outs, fresh)
        ended = np.zeros(self.num_envs, dtype=bool)
        ended[done_ids] = True
        info = self._step_info(info, ended)  # Isaac Lab resets inside its own step: final_info, no final_obs
        if done_ids.size:
            pending, self._pending = self._pending, None
            dealt = pending is not None and np.array_equal(pending[0], done_ids)
            book.start(done_ids, pending[1] if dealt else book.next_seeds(done_ids))
            if self._fallback is not None:
                self._fallback.start(done_ids)
            if settle:
                obs = self._settle(obs)
        reward = self._torch.as_tensor(info["success"], dtype=self._torch.float32, device=self.device)
        self._last_obs = obs
        if self._views_restore is not None:  # back to what the render mask asked for
            self._views.due, self._views_restore = self._views_restore, None
        return obs, reward, terminated, truncated, info

    def close(self):
        """Close the Isaac env and, unless ``close_app_on_close=False``, the simulator app."""
        if self._closed:
            return
        self._closed = True
        try:
            self._gym_env.close()
        finally:
            launch.release_scene()
            if self._close_app_on_close:
                launch.close_app()

    # -- internals ------------------------------------------------------------------------------------
    def _deal(self, ids, seeds) -> None:
        if self._initial_conditions is not None:
            self._initial_conditions.deal(np.asarray(seeds)[np.argsort(ids)] if len(ids) else seeds)

    def _before_in_step_reset(self, env) -> None:
        """From the state probe, after every other termination term: the envs the step will reset get
        their next episodes' seeds now, and sim-evals' initial conditions are dealt by those seeds; on a
        kit-less task the step's views are due where :meth:`views_to_render` says (a new episode's first
        request needs its own frames; one nobody starts needs none), and not at all where the hold step
        follows (it renders them)."""
        manager = getattr(env, "termination_manager", None)
        if manager is None or self._settling:
            return
        done = (to_numpy(manager.terminated) | to_numpy(manager.time_outs)).astype(bool).reshape(-1)
        ids = np.flatnonzero(done)
        if not ids.size:
            return
        if self._views is not None:
            due = not self._settles(ids.size) and bool(self.views_to_render(done).any())
            if due != self._views.due:
                self._views_restore, self._views.due = self._views.due, due
        if self._initial_conditions is not None:
            seeds = self.episodes.next_seeds(ids)
            self._pending = (ids, seeds)
            self._deal(ids, seeds)

    def _flags(self, flags, state: TaskState) -> np.ndarray:
        """sim-evals' MILA milestone flags ``(N, M)``, or the same checks from the poses without them."""
        if flags is not None:
            return flags
        return self._fallback.flags(state.object_pos, state.container_pos, state.tcp_pos, state.gripper)

    def _settles(self, done: int) -> bool:
        """Whether a step in which ``done`` envs ended takes the hold step: when every env reset, unless every
        one of them ended its last episode (nobody reads the next ones' frames)."""
        last = self._last_episodes
        return done == self.num_envs and self.settle_steps > 0 and not (last is not None and last.all())

    def _settle(self, obs):
        """Hold steps after a reset of every env (the views render at the last one only), then zero Isaac
        Lab's episode counters."""
        due = None if self._views is None else self._views.due
        self._settling = True
        try:
            for k in range(self.settle_steps):
                if due is not None:
                    self._views.due = k == self.settle_steps - 1
                obs, *_ = self.isaac_env.step(self._hold_action(obs))
        finally:
            self._settling = False
            if due is not None:
                self._views.due = due
        self.isaac_env.episode_length_buf[:] = 0
        self._probe.latest = None
        if self._milestones is not None:
            self._milestones.latest = None
        return obs

    def _hold_action(self, obs):
        policy = obs[droid.POLICY_GROUP]
        arm = policy[droid.OBS_JOINT_KEY].to(self._torch.float32)
        gripper = (policy[droid.OBS_GRIPPER_KEY] > droid.GRIPPER_CLOSE_THRESHOLD).to(self._torch.float32)
        return self._torch.cat([arm, gripper.reshape(-1, 1)], dim=1)
