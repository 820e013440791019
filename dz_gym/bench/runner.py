"""One benchmark end to end: readiness, payloads, the load (one run or a concurrency sweep), the metrics.

:func:`run_benchmark` is what ``dz-gym-bench`` calls; it is usable from Python too::

    import asyncio
    from dz_gym.bench.runner import BenchConfig, run_benchmark

    result = asyncio.run(run_benchmark(BenchConfig(servers=["ws://127.0.0.1:8000"], concurrency=4, num_requests=100)))
    print(result["runs"][0]["requests_per_s"])

The result is a plain dict: ``servers`` (URL, metadata, health, readiness time), ``payload`` (resolution,
bytes, image source) and ``runs``, one metrics dict per concurrency (see :func:`dz_gym.bench.metrics.summarize`).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

from dz_gym.bench.load import LoadSpec, SimSession, run_load
from dz_gym.bench.metrics import LATENCY_KEYS, latency_stats, summarize
from dz_gym.bench.payloads import DEFAULT_RESOLUTION, PayloadSet, load_views, synthetic_views
from dz_gym.bench.readiness import ServerInfo, wait_ready
from dz_gym.cli_types import field_default
from dz_gym.envs import droid
from dz_gym.protocol.contract import check_contract
from dz_gym.protocol.profiles import AUTO, SERVER_KINDS, ServerProfile, chunk_rows, detect_profile
from dz_gym.transport import TransportConfig, validate_url

__all__ = ["BenchConfig", "run_benchmark"]


@dataclasses.dataclass(frozen=True)
class BenchConfig:
    """Everything one benchmark needs (the ``dz-gym-bench`` flags set these fields; times in seconds).

    ``concurrencies`` lists the closed-loop session counts to run one after the other (one entry without a
    sweep); with ``request_rate`` the run is open loop over ``max_outstanding`` sessions instead.
    ``warmup=None`` means one untimed request per session. The connection bounds (``open_timeout``,
    ``connect_retries``, ``request_timeout``) default to :class:`~dz_gym.transport.TransportConfig`'s, whose
    rules also check them (:meth:`transport_config`); a bad value is a one-line ``ValueError`` naming the field.

    >>> BenchConfig(servers=["ws://127.0.0.1:8000"]).request_timeout == TransportConfig().request_timeout
    True
    >>> BenchConfig(servers=["ws://127.0.0.1:8000"], request_timeout=0)
    Traceback (most recent call last):
    ValueError: request_timeout: expected a finite number > 0, got 0
    """

    servers: Sequence[str]
    concurrencies: Sequence[int] = (1,)
    request_rate: float | None = None
    arrival: str = "poisson"
    max_outstanding: int = 16
    num_requests: int | None = None
    duration_s: float | None = None
    warmup: int | None = None
    episode_length: int | None = None  # None: ceil(MAX_EPISODE_LENGTH / the open-loop horizon), as an episode
    open_loop_horizon: int | None = None  # None: the actions the server's profile executes per chunk
    server_kind: str = AUTO  # the servers' profile (dz_gym.protocol.profiles); auto: from the handshake
    think_s: float = 0.0
    slo_s: float | None = None
    images_dir: str | None = None
    image_layout: str = "auto"
    max_frames: int = 16
    prompt: str = droid.SCENES[1].prompt
    seed: int = 0
    ready_timeout: float = 60.0
    open_timeout: float = field_default(TransportConfig, "open_timeout")
    request_timeout: float = field_default(TransportConfig, "request_timeout")
    connect_retries: int = field_default(TransportConfig, "connect_retries")
    max_consecutive_errors: int = 20
    auth_env: str | None = None

    def __post_init__(self) -> None:
        if not self.servers:
            raise ValueError("servers: expected at least one ws:// URL")
        for url in self.servers:
            try:
                validate_url(url)
            except ValueError as exc:
                raise ValueError(f"servers: {exc}") from None
        if self.server_kind not in SERVER_KINDS:
            raise ValueError(f"server_kind: expected one of {', '.join(SERVER_KINDS)}, got {self.server_kind!r}")
        for name, low in (("open_loop_horizon", 1), ("seed", 0)):
            value = getattr(self, name)
            if value is None and name == "open_loop_horizon":
                continue
            if not isinstance(value, int) or isinstance(value, bool) or value < low:
                raise ValueError(f"{name}: expected an integer >= {low}, got {value!r}")
        self.transport_config()

    def transport_config(self) -> TransportConfig:
        """The :class:`TransportConfig` of every session (its own rules check the bounds)."""
        fields = {"open_timeout": self.open_timeout, "connect_retries": self.connect_retries}
        fields.update(request_timeout=self.request_timeout, auth_env=self.auth_env)
        try:
            return TransportConfig(**fields)
        except ValueError as exc:
            text = str(exc).removeprefix("TransportConfig.")
            raise ValueError(text if text.split(":")[0] in fields else f"transport: {text}") from None


def _resolution(info: ServerInfo, profile: ServerProfile) -> tuple[int, int]:
    """The view size a server of ``profile`` takes: the profile's, else its handshake's, else DreamZero's."""
    return tuple(profile.image_resolution or info.metadata.image_resolution or DEFAULT_RESOLUTION)  # type: ignore[return-value]


def _payload_sets(cfg: BenchConfig, infos: Sequence[ServerInfo], profiles: Sequence[ServerProfile]) -> dict:
    """A :class:`PayloadSet` per (profile, resolution) of the servers."""
    sets: dict[tuple[str, tuple[int, int]], PayloadSet] = {}
    for info, profile in zip(infos, profiles):
        resolution = _resolution(info, profile)
        if (profile.name, resolution) in sets:
            continue
        if cfg.images_dir is not None:
            views = load_views(cfg.images_dir, resolution, max_frames=cfg.max_frames, layout=cfg.image_layout)
        else:
            views = synthetic_views(cfg.max_frames, resolution, seed=cfg.seed)
        sets[profile.name, resolution] = PayloadSet(views, prompt=cfg.prompt, seed=cfg.seed, profile=profile)
    return sets


def _per_server(records, urls: Sequence[str]) -> list[dict]:
    rows = []
    for k, url in enumerate(urls):
        mine = [r for r in records if r.server == k]
        good = [r.latency_s * 1e3 for r in mine if r.ok]
        rows.append(
            {
                "url": url,
                "completed": len(good),
                "failed": len(mine) - len(good),
                "latency_ms": latency_stats(good),
            }
        )
    return rows


def record_rows(load, run_index: int, concurrency: int) -> list[dict]:
    """One JSON-ready row per timed request (times in seconds from the start of the timed phase)."""
    rows = []
    for r in load.records:
        rows.append(
            {
                "run": run_index,
                "concurrency": concurrency,
                "session": r.session,
                "server": r.server,
                "scheduled_s": None if r.scheduled_at is None else r.scheduled_at - load.started_at,
                "sent_s": r.sent_at - load.started_at,
                "latency_ms": r.latency_s * 1e3,
                "ok": r.ok,
                "error_kind": r.error_kind,
                "error": r.error_message,
                "first_of_episode": r.first_of_episode,
                "infer_ms": r.infer_ms,
                "chunk_rows": r.chunk_rows,
                "request_bytes": r.request_bytes,
            }
        )
    return rows


async def _one_run(cfg: BenchConfig, infos: Sequence[ServerInfo], profiles: Sequence[ServerProfile], sets,
                   sessions: int, transport: TransportConfig, horizon: int):  # fmt: skip
    urls = [info.url for info in infos]
    episode_length = cfg.episode_length or math.ceil(droid.MAX_EPISODE_LENGTH / horizon)
    sims = []
    for i in range(sessions):
        k = i % len(infos)
        payloads = sets[profiles[k].name, _resolution(infos[k], profiles[k])]
        sim = SimSession(i, k, urls[k], payloads, transport, episode_length)
        sim.chunk_rows = chunk_rows(profiles[k], infos[k].metadata.raw)
        sims.append(sim)
    spec = LoadSpec(
        sessions=sessions,
        request_rate=cfg.request_rate,
        arrival=cfg.arrival,
        num_requests=cfg.num_requests,
        duration_s=cfg.duration_s,
        warmup=sessions if cfg.warmup is None else cfg.warmup,
        episode_length=episode_length,
        think_s=cfg.think_s,
        seed=cfg.seed,
        max_consecutive_errors=cfg.max_consecutive_errors,
        open_loop_horizon=horizon,
    )
    load = await run_load(sims, spec, connect_concurrency=transport.connect_concurrency)
    metrics = summarize(
        load.records,
        duration_s=load.duration_s,
        open_loop_horizon=horizon,
        sessions=sessions,
        client_cpu_s=load.client_cpu_s,
        budget_s=cfg.slo_s,
    )
    if metrics["latency_ms"] is None:
        metrics["latency_ms"] = dict.fromkeys(LATENCY_KEYS)
    open_loop = cfg.request_rate is not None
    metrics.update(
        {
            "mode": "request-rate" if open_loop else "concurrency",
            "concurrency": sessions,
            "request_rate": cfg.request_rate,
            "arrival": cfg.arrival if open_loop else None,
            "warmup_completed": load.warmup_completed,
            "warmup_errors": load.warmup_errors,
            "reconnects": load.reconnects,
            "admitted_sessions": load.admitted_peak,
            "admission_refusals": load.refusals,
            "per_server": _per_server(load.records, urls),
        }
    )
    return metrics, load


async def run_benchmark(cfg: BenchConfig, *, on_run=None, keep_records: bool = False) -> dict:
    """Check every server is ready, build the payloads, run each concurrency; ``on_run(metrics)`` after each.

    With ``keep_records`` the result also has ``records``: one row per timed request (see :func:`record_rows`).

    Raises the typed errors of :mod:`dz_gym.errors` (a server never ready, a refused handshake, a policy
    contract the open-loop horizon or DROID's action width cannot follow) and
    :class:`~dz_gym.errors.BenchAborted` (a run that cannot go on).
    """
    transport = cfg.transport_config()
    infos = [await wait_ready(url, cfg.ready_timeout, transport) for url in cfg.servers]
    # as dz-gym-eval does: a handshake of no known server, or a contract this client cannot follow, ends the
    # run at once; the open-loop horizon is by default the actions the first server's profile executes
    profiles = [detect_profile(info.metadata.raw, url=info.url, server_kind=cfg.server_kind) for info in infos]
    horizon = cfg.open_loop_horizon or profiles[0].executed_actions or droid.DEFAULT_OPEN_LOOP_HORIZON
    for info in infos:
        check_contract(info.metadata.contract, open_loop_horizon=horizon, action_dim=droid.ACTION_DIM,
                       url=info.url)  # fmt: skip
    sets = _payload_sets(cfg, infos, profiles)
    counts = [cfg.max_outstanding] if cfg.request_rate is not None else list(cfg.concurrencies)
    runs = []
    records: list[dict] = []
    for index, sessions in enumerate(counts):
        metrics, load = await _one_run(cfg, infos, profiles, sets, sessions, transport, horizon)
        runs.append(metrics)
        if keep_records:
            records.extend(record_rows(load, index, sessions))
        if on_run is not None:
            on_run(metrics)
    first = next(iter(sets.values()))
    result = {
        "servers": [
            {
                "url": info.url,
                "profile": profile.name,
                "metadata": info.metadata.raw,
                "image_resolution": list(_resolution(info, profile)),
                "health": info.health,
                "ready_s": info.ready_s,
            }
            for info, profile in zip(infos, profiles)
        ],
        "open_loop_horizon": horizon,
        "payload": {
            "source": cfg.images_dir or "synthetic",
            "templates": len(first),
            "resolutions": [list(r) for r in dict.fromkeys(r for _, r in sets)],
            "request_bytes": first.size(0),
            "prompt": cfg.prompt,
            "episode_length": cfg.episode_length or math.ceil(droid.MAX_EPISODE_LENGTH / horizon),
        },
        "runs": runs,
    }
    if keep_records:
        result["records"] = records
    return result
