"""SGLang's real OpenPI websocket route (``/openpi/policy``) on loopback, with a stub FLUX pipeline.

What runs is SGLang's own code from the PyPI wheel ``sglang==0.5.23`` (installed ``--no-deps``): the FastAPI
router of ``sglang/multimodal_gen/runtime/entrypoints/action/openpi.py``, its websocket loop
(``ws_utils.run_action_msgpack_ws``: the ``action.metadata`` handshake, msgpack frames, ``server_timing``,
binary ``{"error": traceback}`` then close 1011) and its request handling (``protocol.py``: key parsing,
camera and state lookup, the msgpack-numpy codec, ``Flux3ActionSamplingParams`` from
``configs/sample/flux3_action.py`` with its validation and seed default), under uvicorn on 127.0.0.1.

Importing ``sglang`` itself pulls in its whole LLM runtime (transformers, triton, ZMQ, ...), and the route's
request path ends in a GPU scheduler and the 7B model. So the wheel's files are imported under bare parent
packages (``sglang``, ``sglang.multimodal_gen``: their ``__init__`` side effects skipped), and only the
modules that reach the GPU side or pull in the model stack are stood in for, thinly, as they are in 0.5.23:

- ``runtime.scheduler_client.async_scheduler_client``: its ``forward`` runs :class:`ReferencePipeline` (one
  request at a time: SGLang's FLUX pipeline does not batch) and answers ``output=[dict]`` or ``error``;
- ``runtime.entrypoints.utils.prepare_request``: hands the sampling params on as the request;
- ``runtime.server_args.ServerArgs`` and the pipeline config (:class:`Flux3ActionConfig`: the defaults of
  ``configs/pipeline_configs/flux3_action.py`` 0.5.23 that the route reads, and its ``action_metadata``);
- ``registry.get_pipeline_config_classes`` (the FLUX sampling params class), and the Cosmos3 names
  ``protocol.py`` imports but never uses for FLUX.

:class:`ReferencePipeline` checks what the FLUX stage of 0.5.23 checks before the model
(``pipelines_core/stages/model_specific_stages/flux3_action.py``: three 360x640 views ``wrist``, ``left``,
``right`` or their aliases, or a 540x640 ``composite``; uint8 or float in [0, 1]; ``state`` of 8 finite
values; ``action_horizon`` at most 32) and then, instead of the model, asks dz-gym's reference policy for a
``(32, 8)`` chunk of which all 32 rows are meant to be executed, so episodes on the embedded scenes succeed.
SGLang has no sessions and FLUX keeps no memory, but the reference policy does (its plan's phase, its object
tracks): it keeps them under the request's ``session_id`` when the client sends one (the key reaches the
pipeline inside ``observation``), else under its ``seed`` (``dz-gym-eval --policy-seed`` sends one per episode),
else under one name for every request (then run one env at a time).

Run it by hand: ``python -m dz_gym.testing.sglang_real --port 30000`` serves
``ws://127.0.0.1:30000/openpi/policy`` until Ctrl-C.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import importlib
import importlib.metadata
import importlib.util
import socket
import sys
import threading
import time
import types
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import numpy as np

SGLANG_VERSION = "0.5.23"
ROUTE = "/openpi/policy"
VIEW_SHAPE = (360, 640)  # each DROID view, as the FLUX stage asserts
COMPOSITE_SHAPE = (540, 640)
CHUNK_ROWS = 32
_MG = "sglang.multimodal_gen"
_ACTION = f"{_MG}.runtime.entrypoints.action"


@dataclasses.dataclass
class Flux3ActionConfig:
    """The FLUX 3 Action pipeline config's values the route reads (``Flux3ActionPipelineConfig`` 0.5.23 defaults)."""

    policy_family: str = "flux3_action"
    policy_variant: str = "base"
    action_dim: int = 8
    state_dim: int = 8
    output_action_dim: int = 8
    action_horizon: int = CHUNK_ROWS
    camera_layout: str = "droid"
    image_keys: tuple[str, ...] = ("wrist", "left", "right")
    camera_aliases: dict[str, str] = dataclasses.field(
        default_factory=lambda: {
            "wrist_image_left": "wrist",
            "exterior_image_1_left": "left",
            "exterior_image_2_left": "right",
        }
    )
    fps: float = 15.0
    sampler: str = "cosmos_unipc"
    default_num_inference_steps: int = 4
    guidance_scale: float = 4.0
    guidance_scale_action: float | None = 1.0
    inference_seed: int = 0

    def resolve_task_type(self, task_type: Any) -> Any:
        return task_type

    def action_metadata(self, server_args: Any) -> dict[str, Any]:
        """The handshake the FLUX config sends (``action.metadata``)."""
        return {
            "object": "action.metadata",
            "model": server_args.served_model_name,
            "model_path": server_args.model_path,
            "policy_family": self.policy_family,
            "input": {"image_keys": list(self.image_keys), "camera_aliases": dict(self.camera_aliases),
                      "camera_layout": self.camera_layout, "state_dim": self.state_dim},
            "output": {"action_type": "continuous", "action_horizon": self.action_horizon,
                       "action_dim": self.output_action_dim, "padded_action_dim": self.action_dim, "dtype": "float32"},
            "defaults": {"num_inference_steps": self.default_num_inference_steps,
                         "guidance_scale": self.guidance_scale, "guidance_scale_action": self.guidance_scale_action,
                         "sampler": self.sampler, "variant": self.policy_variant},
            "capabilities": {"exact_prefix_cache": True, "realtime_websocket": True, "openpi_websocket": True,
                             "batch_inputs": False, "multiple_candidates": False},
        }  # fmt: skip


@dataclasses.dataclass
class ServerArgs:
    """The ``ServerArgs`` fields the route and the sampling params read."""

    pipeline_config: Flux3ActionConfig = dataclasses.field(default_factory=Flux3ActionConfig)
    model_path: str = "black-forest-labs/flux-3-action-droid"
    served_model_name: str = "black-forest-labs/flux-3-action-droid"
    pipeline_class_name: str | None = "Flux3ActionPipeline"
    backend: str | None = None
    model_id: str | None = None
    output_path: str | None = None
    comfyui_mode: bool = False


def _view(value: Any, name: str, shape: tuple[int, int]) -> np.ndarray:
    """One request image as uint8 HWC, checked as the FLUX stage checks it (uint8, or float in [0, 1])."""
    array = np.asarray(value)
    if array.ndim != 3 or array.shape[-1] != 3:
        raise ValueError(f"expected an HWC RGB image, got shape {array.shape}")
    if tuple(array.shape[:2]) != shape:
        raise ValueError(f"{name}: droid layout needs {shape[0]}x{shape[1]}, got {array.shape[:2]}")
    if np.issubdtype(array.dtype, np.floating):
        if array.size and (array.min() < 0.0 or array.max() > 1.0):
            raise ValueError("float images must be in [0, 1]")
        return np.round(array * 255.0).astype(np.uint8)
    if array.dtype != np.uint8:
        raise ValueError(f"unsupported image dtype {array.dtype}")
    return array


class ReferencePipeline:
    """Stands in for the FLUX 3 Action model: the stage's input checks, then dz-gym's reference policy.

    ``policy``: anything with ``infer(request, session_id=, new_session=)`` taking DreamZero request keys
    (default: :class:`~dz_gym.policies.reference.ReferencePolicy` with 32-row chunks, all executed).
    ``fail_on``: a prompt that makes the pipeline raise; ``fail_every``: every N-th call raises (0: never).
    Either is an injected server error: SGLang answers it with ``{"error"}`` and closes the connection 1011."""

    def __init__(self, policy: Any = None, fail_on: str | None = None, fail_every: int = 0):
        if policy is None:
            from dz_gym.policies.reference.policy import ReferencePolicy

            policy = ReferencePolicy(open_loop_horizon=CHUNK_ROWS, horizon=CHUNK_ROWS)
        self.policy = policy
        self.fail_on = fail_on
        self.fail_every = int(fail_every)
        self.calls = 0

    def views(self, observation: Mapping[str, Any], config: Flux3ActionConfig) -> dict[str, np.ndarray]:
        """``wrist``/``left``/``right`` uint8 360x640 views (a composite is split back into them)."""
        named = {k: v for k, v in observation.items() if k.startswith("observation.images.")}
        named.update(observation.get("images") or {})
        images = {}
        for name, value in named.items():
            key = name.removeprefix("observation.images.").removeprefix("images.")
            images[config.camera_aliases.get(key, key)] = value
        if "composite" in images:
            composite = _view(images["composite"], "composite", COMPOSITE_SHAPE)
            top, bottom = composite[: VIEW_SHAPE[0]], composite[VIEW_SHAPE[0] :]
            half = VIEW_SHAPE[1] // 2  # the exteriors come back at half size: doubled, nearest
            left, right = (np.repeat(np.repeat(p, 2, axis=0), 2, axis=1) for p in (bottom[:, :half], bottom[:, half:]))
            return {"wrist": top, "left": left, "right": right}
        missing = [key for key in config.image_keys if key not in images]
        if missing:
            raise KeyError(
                f"observation lacks cameras {missing}; expected {list(config.image_keys)} or a droid 'composite'"
            )
        return {key: _view(images[key], key, VIEW_SHAPE) for key in config.image_keys}

    def __call__(self, params: Any, config: Flux3ActionConfig) -> dict[str, Any]:
        from dz_gym.envs import droid

        started = time.perf_counter()
        self.calls += 1
        observation = dict(params.observation or {})
        if self.fail_on is not None and params.prompt == self.fail_on:
            raise RuntimeError(f"injected failure for prompt {params.prompt!r}")
        if self.fail_every and self.calls % self.fail_every == 0:
            raise RuntimeError(f"injected failure of call {self.calls} (every {self.fail_every})")
        views = self.views(observation, config)
        state = params.state if params.state is not None else observation.get("observation.state")
        if state is None:
            raise KeyError("observation lacks 'state'")
        state = np.asarray(state, dtype=np.float32).reshape(-1)
        if state.shape != (config.state_dim,) or not np.isfinite(state).all():
            raise ValueError(f"state must be {config.state_dim} finite values, got {state.shape}")
        horizon = params.action_horizon or config.action_horizon
        if horizon > config.action_horizon:
            raise ValueError(f"action_horizon {horizon} exceeds the policy chunk {config.action_horizon}")
        keys = droid.REQUEST_IMAGE_KEYS
        request = {keys["external_cam"]: views["left"], keys["external_cam_2"]: views["right"],
                   keys["wrist_cam"]: views["wrist"], droid.REQUEST_JOINT_KEY: state[:7],
                   droid.REQUEST_GRIPPER_KEY: state[7:], "prompt": params.prompt or ""}  # fmt: skip
        session = observation.get("session_id")
        if not session:
            session = f"seed-{observation['seed']}" if observation.get("seed") is not None else "sglang"
        actions = np.asarray(self.policy.infer(request, session_id=session, new_session=False), dtype=np.float32)
        return {
            "request_id": params.request_id,
            "actions": actions[:horizon],
            "parameters": {"num_inference_steps": params.num_inference_steps},
            "timings": {"pipeline_ms": (time.perf_counter() - started) * 1e3},
            "cache": {"enabled": bool(params.enable_prefix_cache), "hit": False, "scope": "caption", "mode": "exact"},
        }


class _SchedulerClient:
    """``async_scheduler_client``: runs the pipeline, one request at a time, off the event loop."""

    def __init__(self) -> None:
        self.pipeline: Callable[[Any, Flux3ActionConfig], dict] | None = None
        self.config = Flux3ActionConfig()
        self._lock = threading.Lock()

    def _run(self, request: Any) -> types.SimpleNamespace:
        with self._lock:
            try:
                return types.SimpleNamespace(output=[self.pipeline(request, self.config)], error=None)
            except Exception as exc:  # the scheduler reports a worker's failure as the response's error
                return types.SimpleNamespace(output=None, error=f"{type(exc).__name__}: {exc}")

    async def forward(self, request: Any) -> types.SimpleNamespace:
        return await asyncio.to_thread(self._run, request)


_SCHEDULER = _SchedulerClient()
_SERVING = threading.Lock()  # held while serve() runs


def _module(name: str, **attrs: Any) -> types.ModuleType:
    module = types.ModuleType(name)
    module.__dict__.update(attrs)
    sys.modules[name] = module
    return module


def _package(name: str, path: str) -> None:
    if name not in sys.modules:
        _module(name, __path__=[path])


def installed_version() -> str | None:
    """The installed sglang version, or None."""
    try:
        return importlib.metadata.version("sglang")
    except importlib.metadata.PackageNotFoundError:
        return None


def load_openpi_route() -> types.ModuleType:
    """SGLang's ``entrypoints.action.openpi`` module (its ``router``), imported from the installed wheel with
    the stand-ins above. Raises ``RuntimeError`` naming what to install when sglang 0.5.23 is not there."""
    version = installed_version()
    if version != SGLANG_VERSION:
        raise RuntimeError(f"sglang: expected {SGLANG_VERSION} (pip install --no-deps sglang=={SGLANG_VERSION}), "
                           f"got {version or 'none'}")  # fmt: skip
    if f"{_ACTION}.openpi" in sys.modules:
        return sys.modules[f"{_ACTION}.openpi"]
    top = sys.modules.get("sglang")
    root = (
        list(top.__path__)[0] if top is not None else importlib.util.find_spec("sglang").submodule_search_locations[0]
    )
    _package("sglang", root)
    _package(_MG, f"{root}/multimodal_gen")

    class Cosmos3Config:  # protocol.py tells Cosmos3 apart by isinstance; FLUX is not one
        pass

    class Cosmos3SamplingParams:
        pass

    def cosmos3_only(*args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError("Cosmos3 is not served by this harness")

    flux_params = importlib.import_module(f"{_MG}.configs.sample.flux3_action").Flux3ActionSamplingParams
    _module(f"{_MG}.configs.pipeline_configs.cosmos3", Cosmos3Config=Cosmos3Config)
    _module(f"{_MG}.configs.sample.cosmos3", Cosmos3SamplingParams=Cosmos3SamplingParams)
    _module(f"{_ACTION}.cosmos3", build_cosmos3_action_sampling_params=cosmos3_only,
            cosmos3_action_metadata=cosmos3_only)  # fmt: skip
    _module(f"{_MG}.runtime.entrypoints.utils", prepare_request=lambda server_args, params: params)
    _module(f"{_MG}.runtime.scheduler_client", async_scheduler_client=_SCHEDULER)
    _module(f"{_MG}.runtime.server_args", ServerArgs=ServerArgs)
    _module(f"{_MG}.registry", get_pipeline_config_classes=lambda name: (Flux3ActionConfig, flux_params),
            get_model_info=cosmos3_only)  # fmt: skip
    return importlib.import_module(f"{_ACTION}.openpi")


def build_app(pipeline: Callable[[Any, Flux3ActionConfig], dict] | None = None, server_args: ServerArgs | None = None):
    """A FastAPI app with SGLang's ``/openpi/policy`` router, served by ``pipeline`` (default: a
    :class:`ReferencePipeline`)."""
    from fastapi import FastAPI

    openpi = load_openpi_route()
    server_args = server_args or ServerArgs()
    _SCHEDULER.pipeline = pipeline if pipeline is not None else ReferencePipeline()
    _SCHEDULER.config = server_args.pipeline_config
    app = FastAPI()
    app.include_router(openpi.router)
    app.state.server_args = server_args
    return app


@dataclasses.dataclass
class RunningServer:
    url: str  # ws://127.0.0.1:PORT/openpi/policy
    port: int
    pipeline: Any


@contextlib.contextmanager
def serve(pipeline: Any = None, *, host: str = "127.0.0.1", port: int = 0, stop_timeout_s: float = 10.0,
          log_level: str = "warning") -> Iterator[RunningServer]:  # fmt: skip
    """SGLang's route under uvicorn in a daemon thread on ``host:port`` (0: a free port). The socket listens
    before this yields, so a client may connect at once (it waits in the backlog until the loop runs). One at
    a time per process: SGLang's route reaches its pipeline through one module-level scheduler client."""
    import uvicorn

    if not _SERVING.acquire(blocking=False):
        raise RuntimeError("serve: an SGLang route already runs in this process (its scheduler client is global)")
    sock = server = thread = None
    try:
        pipeline = pipeline if pipeline is not None else ReferencePipeline()
        app = build_app(pipeline)
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(128)
        bound = sock.getsockname()[1]
        server = uvicorn.Server(uvicorn.Config(app, log_level=log_level, lifespan="off", ws_max_size=64 << 20))
        thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, name="sglang-openpi", daemon=True)
        thread.start()
        yield RunningServer(f"ws://{host}:{bound}{ROUTE}", bound, pipeline)
    finally:
        if server is not None:
            server.should_exit = True
        if thread is not None:
            thread.join(stop_timeout_s)
        if sock is not None:
            sock.close()
        _SERVING.release()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m dz_gym.testing.sglang_real", description=__doc__.split("\n")[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=30000)
    parser.add_argument("--fail-every", type=int, default=0, help="every N-th request fails (an injected error)")
    args = parser.parse_args(argv)
    pipeline = ReferencePipeline(fail_every=args.fail_every)
    with serve(pipeline, host=args.host, port=args.port, log_level="info") as running:
        print(f"sglang {SGLANG_VERSION} {ROUTE} (stub FLUX pipeline: dz-gym's reference policy) at {running.url}",
              flush=True)  # fmt: skip
        with contextlib.suppress(KeyboardInterrupt):
            threading.Event().wait()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
