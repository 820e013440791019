"""Every flag of ``dz-gym-eval``, declared once, grouped by what a user decides.

Each :class:`~dz_gym.cli_types.Flag` names the :class:`~dz_gym.eval.config.EvalConfig` field it sets, dotted
(``--prefetch`` sets ``schedule.prefetch``; its argparse dest stays the field's name), or the
:class:`~dz_gym.eval.shards.options.RayOptions` field, or none for the command's own flags; the parser
(:func:`dz_gym.eval.flags.build_parser`) and the flags table of ``docs/eval.md`` (:func:`markdown_table`) are
built from :data:`GROUPS`, and the defaults they show are the config's. Flags whose field is in
:data:`~dz_gym.eval.config.RESULT_KEYS` are locked on ``--resume``, and both say so.

Only light imports: the parser is built before numpy, the simulator or the transport are imported.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from dz_gym.cli_types import (
    AUTH_ENV,
    OPEN_LOOP_HORIZON,
    REQUEST_TIMEOUT,
    SEED,
    SERVER,
    SERVER_KIND,
    Flag,
    height_by_width,
    integer,
    number,
)
from dz_gym.envs import backends
from dz_gym.eval.shards.options import RAY_FLAGS

DEFAULT_OUTPUT_ROOT = Path("runs") / "dz_gym_eval"
DEFAULT_PATH = "/v1/realtime/robot/openpi"
DEFAULT_PORT = 8000
DEFAULT_HOST = "127.0.0.1"
LOCKED_NOTE = " [locked on --resume]"
BOOL = argparse.BooleanOptionalAction


RUN = (
    Flag("--scene", "DROID scene 1, 2 or 3 (repeatable)", field="plan.scenes", type=integer, action="append", metavar="S",
         doc="scene 1, 2 or 3; repeatable. Scenes run side by side, each with an env batch of its own "
             "(--num-envs envs per scene)"),
    Flag("--task", "a sim-evals task by name, e.g. place_spoon_in_sink or DROID-CubeInBowl (repeatable; isaac "
         "backend; its instruction is the prompt and its max_timesteps the default --max-steps; docs/isaac.md)",
         dest="tasks", action="append", metavar="NAME"),
    Flag("--episodes", "episodes per scene", field="plan.episodes", type=integer, metavar="E",
         shown="N (one per env)", doc="episodes **per scene**; a resume may add episodes, not remove them"),
    SEED.but(field="plan.seed", help="episode k of a scene has seed K+k"),
    Flag("--max-steps", "steps per episode (the env's episode length by default; a --task's max_timesteps)",
         field="plan.max_steps", type=integer, metavar="T"),
    Flag("--backend", "simulator; auto picks isaac when Isaac Lab is importable, else mujoco, and says so",
         field="plan.backend", choices=backends.NAMES),
    Flag("--render-shape", "embedded simulator: render the views at HxW (e.g. 360x640) instead of 180x320; a new "
         "run against servers whose handshake asks for other 16:9 views (or a 540x640 composite: 360x640 views) "
         "renders at their size by itself (dz_gym.envs.render_shape)", field="plan.render_shape", type=height_by_width,
         metavar="HxW", shown="180x320 or the servers'"),
)  # fmt: skip
SERVER_FLAGS = (
    SERVER.but(field="policies.servers", help="ws:// URL of a policy server (repeatable: env slot i talks to server i % len(servers))",
               shown="embedded"),
    Flag("--host", "server host, as the reference client (instead of --server)", dest="host", metavar="HOST",
         shown=DEFAULT_HOST),
    Flag("--port", "server port, as the reference client", dest="port", type=integer, metavar="PORT",
         shown=str(DEFAULT_PORT)),
    Flag("--path", "websocket path, as the reference client", dest="path", metavar="PATH", shown=DEFAULT_PATH),
    Flag("--policy", "embedded server: its policy (a built-in name or module:factory)", field="policies.policy",
         metavar="NAME", shown=backends.per_backend(lambda t: t.embedded_policy)),
    Flag("--serve-arg", "embedded server: an extra dz-gym-serve argument, e.g. --serve-arg=--latency-ms=200 "
         "(repeatable)", field="execution.serve_args", dest="serve_arg", action="append", default=[], metavar="ARG"),
    AUTH_ENV.but(field="transport.auth_env", shown="none", doc=AUTH_ENV.help + "; only the variable's name is saved in config.json"),
    SERVER_KIND.but(field="policies.server_kind"),
    Flag("--server-max-sessions", "sessions one server keeps resident (vLLM-Omni: at most 64, fewer with a small "
         "KV pool); more envs on one server is a warning", field="transport.server_max_sessions", type=integer, metavar="N"),
    Flag("--server-idle-timeout", "seconds after which the servers close an idle connection (vLLM-Omni: 30; 0: "
         "none); a warning when an env may wait longer between requests", field="transport.server_idle_timeout",
         type=number, metavar="S"),
    Flag("--policy-seed", "send a per-episode 'seed' derived from the episode's seed in every request (the same "
         "in both arms of an A/B run; servers that do not know it ignore it)", field="policies.policy_seed",
         action="store_true"),
    Flag("--num-inference-steps", "send sampling_params {num_inference_steps: N} in every request (vLLM-Omni's "
         "diffusion steps)", field="policies.num_inference_steps", type=integer, metavar="N", shown="server's"),
)  # fmt: skip
TIMING = (
    OPEN_LOOP_HORIZON.but(field="schedule.open_loop_horizon", help="actions executed from each chunk before the next request; longer than the "
                          "server's chunks is an error (exit status 2)", shown="server's",
                          doc="actions executed from each chunk before the next request (default: the server "
                          "profile's: 8 of DreamZero's 24, 32 of FLUX's 32); longer than the server's chunks is "
                          "an error (exit status 2)"),
    Flag("--prefetch", "latency hiding: send an env's next request when K actions of its window are left and "
         "keep executing; rows for the steps executed meanwhile are skipped (0: wait for every chunk, like the "
         "reference client)", field="schedule.prefetch", type=integer, metavar="K"),
    Flag("--simulated-delay", "apply every chunk exactly D steps after its request instead of when it arrives: "
         "reproducible latency (an env with no action left holds its pose)", field="schedule.simulated_delay",
         type=integer, metavar="D", shown="off"),
    Flag("--latency-honest", "apply every chunk ceil(latency / control period) steps after its request, from that "
         "request's own measured round trip: the world keeps moving while the policy thinks, as on a robot; each "
         "delay is recorded in the row's request_delays and an episode run again replays them (docs/eval.md, "
         "Latency-honest runs)", field="schedule.latency_honest", action="store_true"),
    Flag("--control-hz", "the robot's control rate of --latency-honest (DROID: 15)", field="schedule.control_hz",
         type=number, metavar="HZ"),
    Flag("--max-stale-steps", "with --prefetch: rows a late env may run past its window before it waits",
         field="schedule.max_stale_steps", type=integer, metavar="S", shown="whole chunk"),
    REQUEST_TIMEOUT.but(field="transport.request_timeout"),
    Flag("--retry-server-errors", "re-send a request that got a server error up to N times before its episode "
         "is flagged as errored (0: the reference client's behaviour); rows count retries",
         field="transport.retry_server_errors", type=integer, metavar="N"),
    Flag("--episode-retries", "run an episode that ended by an infrastructure error (lost connection, timeout, "
         "error frame, protocol error) again from its reset on the same seed and slot, up to N times; what still "
         "errors stays in its row, and counts against every claim of the A/B test and the race (0-10); a retry "
         "assumes the episode is reproducible from its seed (deterministic simulator and policy, or --policy-seed "
         "with a server that honours it): the run and summary.json say so",
         field="errors.episode_retries", type=integer, metavar="N"),
)  # fmt: skip
OUTPUTS = (
    Flag("--output-root", "where run directories are created", dest="output_root", type=Path, metavar="DIR",
         shown=str(DEFAULT_OUTPUT_ROOT)),
    Flag("--resume", "continue RUN_DIR without redoing finished episodes; the flags marked" + LOCKED_NOTE
         + " keep its saved values (another value is an error), --episodes may only grow", dest="resume",
         type=Path, metavar="RUN_DIR"),
    Flag("--video", "per-episode mp4 videos", field="outputs.video", action=BOOL),
    Flag("--report", "write report.html (dz-gym-report) into the run directory at the end of every run segment, "
         "also after Ctrl-C and on resume", field="outputs.report", action=BOOL),
    Flag("--log", "also log episodes, the summary and the decision to wandb (W&B; WANDB_MODE=offline works with "
         "no network) or tensorboard (event files in RUN_DIR/tensorboard); repeatable; optional extras",
         field="outputs.log", action="append", choices=("wandb", "tensorboard"), metavar="TRACKER", shown="none"),
    Flag("--log-project", "the W&B project of --log wandb", field="outputs.log_project", metavar="NAME"),
    Flag("--progress", "progress bars for episodes and env steps; when stderr is not a terminal, one progress "
         "line every 30 s instead", dest="progress", action=BOOL, shown="bars on a TTY, else lines",
         doc="tqdm bars for episodes (running success rate) and env steps (env-steps/s, last chunk latency); when "
         "stderr is not a terminal, one progress line every 30 s instead. `--no-progress`: neither"),
    Flag("--profile", "time every stage of the hot path (physics, rendering, host copy, encoding, send, server, "
         "decode, scatter, bookkeeping) per batch step and per request round; prints the table per scene and "
         "writes profile.json into the run directory; GPU stages wait for the GPU, so a profiled run is slightly "
         "slower", field="outputs.profile", action="store_true"),
    Flag("--max-errors", "abort once more than M episodes have errored", field="errors.max_errors", type=integer,
         metavar="M", shown="10% of the planned episodes, at least 5"),
)  # fmt: skip
SCALE = (
    Flag("--num-envs", "envs stepped together (slots); with --ray the total over all shards", field="plan.num_envs",
         type=integer, metavar="N"),
    Flag("--process-per-scene", "run each scene in a fresh process, the scenes' processes at the same time "
         "(rebuilding an Isaac stage in one process can render wrong poses)", field="execution.process_per_scene", action=BOOL,
         shown=backends.per_backend(lambda t: "on" if t.one_scene_per_process else "off")),
    Flag("--scene-processes", "with a process per scene: at most P scene processes at the same time (each holds "
         "its simulator; on Isaac Lab an app on the GPU); a sequential test can stop early only once every scene "
         "runs", field="execution.scene_processes", type=integer, metavar="P", shown="every scene's"),
    Flag("--transport-processes", "spread the policy sessions over P worker processes that send the requests "
         "(handed over in shared memory): for many sessions of large requests, e.g. --num-envs 256 or more on a "
         "GPU host, where one process's interpreter lock otherwise moves every request; 0: all in this process",
         field="transport.processes", dest="transport_processes", type=integer, metavar="P",
         shown="auto: one per 64 envs, at most one per core and 8; 0 below 128 envs or 4 cores"),
    *RAY_FLAGS,
)  # fmt: skip
AB = (
    Flag("--server-b", "arm B's server (repeatable); arm A is --server; env slots alternate A, B on the same "
         "seeds", field="policies.servers_b", action="append", metavar="URL"),
    Flag("--policy-b", "embedded servers: arm B's policy (arm A: --policy), e.g. --policy reference --policy-b "
         "reference:skill=0.3; a second embedded server serves it", field="policies.policy_b", metavar="NAME"),
    Flag("--arm", "one arm of a run of K >= 2 arms (repeatable): NAME=URL (ws:// or wss://) or NAME=POLICY (an "
         "embedded server each, e.g. c=reference:skill=0.3); slot K*j+i runs arm i on the same seeds; --num-envs "
         "a multiple of K; the summary ranks the arms", field="policies.arm_specs", action="append", metavar="NAME=SPEC"),
    Flag("--select-best", "with --arm: after each seed (all arms, in plan order) eliminate the arms clearly worse "
         "(anytime-valid); their episodes left are not run; stop when one arm is left (best with probability "
         ">= 1 - --alpha) or the episodes end (no winner named)", field="stats.select_best", action="store_true"),
    Flag("--sequential", "stop as soon as the sequential test on the discordant pairs (fed in plan order) decides "
         "which arm is better or finds no difference", field="stats.sequential", action="store_true"),
    Flag("--alpha", "with --sequential: the test's type-I error, exact at any stop; with --select-best: the chance "
         "that the arm named best is not a best arm", field="stats.alpha",
         type=number, metavar="A"),
    Flag("--min-difference", "with --sequential: the smallest difference in success rate you care about; the "
         "test is planned to find it with --power and to stop early when it is absent", field="stats.min_difference",
         type=number, metavar="D"),
    Flag("--power", "with --sequential: the test's power at --min-difference", field="stats.power", type=number,
         metavar="P"),
    Flag("--max-episodes", "with --sequential: stop undecided after N pairs (N episodes per arm); --episodes "
         "defaults to N spread over the scenes; fewer pairs than the design's cap are refused without "
         "--accept-lower-power", field="stats.max_episodes", type=integer, metavar="N",
         shown="the design's cap"),
    Flag("--accept-lower-power", "with --sequential: run a budget (--max-episodes, --episodes) below the design's "
         "cap; the power it has there, computed exactly, is what the summary, the report and the table show",
         field="stats.accept_lower_power", action="store_true"),
)  # fmt: skip

# (title, description, flags): the --help sections, in order.
GROUPS = (
    ("what to run", "what is measured: the scenes, their episodes and seeds, the simulator", RUN),
    ("which policy and server", "none given: start the embedded reference server", SERVER_FLAGS),
    ("how requests are timed", "the chunk schedule and the bounds on one request", TIMING),
    ("outputs and faults", None, OUTPUTS),
    ("scale-out", "envs per batch, a process per scene, shards on Ray (docs/ray.md)", SCALE),
    ("A/B and K arms: every seed under several policies", "docs/eval.md; dz-gym-compare RUN reads the run", AB),
)
ALL = tuple(flag for _, _, flags in GROUPS for flag in flags)
# Flags that set result-changing settings without being the field's own flag.
LOCKED_VIA = {"tasks": "plan.scenes"}


def config_class(flag: Flag):
    """The config whose field ``flag`` sets (EvalConfig, a dotted field; or RayOptions for the Ray flags), or None."""
    import dataclasses

    from dz_gym.eval.config import PATHS, EvalConfig
    from dz_gym.eval.shards.options import RayOptions

    if flag.field in PATHS.values():
        return EvalConfig
    return RayOptions if flag.field in {f.name for f in dataclasses.fields(RayOptions)} else None


def eval_flags() -> tuple[Flag, ...]:
    """The flags that set an EvalConfig field (the rest are the command's own, or RayOptions')."""
    from dz_gym.eval.config import EvalConfig

    return tuple(f for f in ALL if config_class(f) is EvalConfig)


def locked(flag: Flag) -> bool:
    """Whether ``--resume`` keeps the saved value of what ``flag`` sets."""
    from dz_gym.eval.config import RESULT_KEYS

    return (flag.field or LOCKED_VIA.get(flag.key)) in RESULT_KEYS


def shown(flag: Flag) -> str | None:
    """``flag``'s default as --help and the docs show it."""
    from dz_gym.cli_types import shown_default

    return shown_default(flag, config_class(flag))


def flag_of(field: str) -> str:
    """The flag that sets EvalConfig (dotted, or its name) or RayOptions field ``field``; ``--servers`` style for one
    without."""
    return next((f.name for f in ALL if field in (f.field, f.key)), "--" + field.rsplit(".", 1)[-1].replace("_", "-"))


def markdown_table() -> str:
    """The flags table of ``docs/eval.md``: flag, default, meaning, in the --help order."""
    lines = ["| flag | default | meaning |", "|---|---|---|"]
    for title, _, flags in GROUPS:
        lines.append(f"| **{title}** | | |")
        for flag in flags:
            meaning = (flag.doc or flag.help) + (" (locked on `--resume`)" if locked(flag) else "")
            cells = (f"`{flag.usage()}`", shown(flag) or "", meaning)
            lines.append("| " + " | ".join(cell.replace("|", "\\|") for cell in cells) + " |")
    return "\n".join(lines)
