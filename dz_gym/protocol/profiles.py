"""The declared table of policy servers (pure, no I/O): one :class:`ServerProfile` per server kind.

Every place where a server's behaviour decides what dz-gym does reads it from the server's profile: the
request's keys and layout (:mod:`dz_gym.protocol.messages`, :mod:`dz_gym.protocol.request_batch`), the
resolution the views are rendered and resized to, the reply and error frames, whether a session is reset,
the chunk's geometry and how many of its actions run before the next request. The profile is chosen from
the server's handshake (:func:`detect_profile`), or named (``--server-kind``).

========== ====================================================================================
dreamzero  DreamZero's own server: ``policy_server_config`` handshake, bare ``(24, 8)`` replies
openpi     openpi's ``WebsocketPolicyServer``: ``{}`` handshake, ``{"actions", "server_timing"}``
vllm-omni  vLLM-Omni on ``/v1/realtime/robot/openpi``: DreamZero's handshake and replies
flux3-bfl  BFL's ``flux-action serve-robolab``: ``{"serving_setup"}``, ``{"action": (32, 8)}``
sglang     SGLang's ``/openpi/policy``: ``action.metadata``, ``{"actions": (32, 8), ...}``
========== ====================================================================================

The first three keep dz-gym's requests as they always were (the reference DreamZero client's keys); the
FLUX servers take 360x640 views (or one 540x640 composite: :mod:`dz_gym.protocol.composite`), have no
session or reset, and execute all 32 actions of a chunk.

>>> detect_profile({"serving_setup": {"compile": True}}).name
'flux3-bfl'
>>> detect_profile({"image_resolution": [180, 320]}, url="ws://h:8000/v1/realtime/robot/openpi").name
'vllm-omni'
>>> detect_profile({"policy": "mine"}, url="ws://gpu:9000")
Traceback (most recent call last):
...
dz_gym.errors.UnknownServer: server ws://gpu:9000: its handshake matches no server profile (it sent keys ['policy']); name the server with --server-kind dreamzero|openpi|vllm-omni|flux3-bfl|sglang
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

from dz_gym.errors import UnknownServer

__all__ = [
    "AUTO",
    "PROFILES",
    "SERVER_KINDS",
    "ServerProfile",
    "chunk_rows",
    "detect_profile",
    "markdown_table",
    "profile_named",
    "resolve_server_kind",
]

AUTO = "auto"

# The handshake keys of DreamZero's PolicyServerConfig and of the policy contract (dz_gym.protocol.contract).
POLICY_SERVER_CONFIG_KEYS = (
    "image_resolution", "n_external_cameras", "needs_wrist_camera", "needs_stereo_camera", "needs_session_id",
    "action_space", "action_horizon", "max_action_horizon", "default_action_horizon", "action_dim", "action_keys",
    "max_sessions",
)  # fmt: skip
VLLM_OMNI_PATH = "/v1/realtime/robot/openpi"
CAMERAS = ("external_cam", "external_cam_2", "wrist_cam")  # left exterior, right exterior, wrist (dz_gym.envs.droid)
ERROR_FRAMES = {
    "text-1011": "text traceback, then close 1011",
    "binary-error-1011": 'binary `{"error"}`, then close 1011',
    "binary-type-error": 'binary `{"type": "error"}`, connection stays open',
}


@dataclasses.dataclass(frozen=True)
class ServerProfile:
    """How one kind of policy server speaks (see the module docstring); every field is declared data.

    Requests: ``image_keys`` maps each camera (``external_cam``: left exterior, ``external_cam_2``: right
    exterior, ``wrist_cam``) to its request key under ``layout == "views"``; under ``"composite"`` the three
    views go as one image under ``composite_key``. ``image_resolution`` is the size of each view (None: the
    handshake's ``image_resolution``, else the env's own). Proprio goes out as ``joint_key`` (7) and
    ``gripper_key`` (1), or as one 8-vector under ``state_key``, in ``proprio_dtype``; ``cartesian_key``
    adds zeros (6) as DreamZero's client does. ``session_key``/``endpoint_key`` (None: not sent) carry the
    episode's session id and ``"infer"``; ``seed_key`` is where a request's seed goes (None: not accepted).

    Replies: ``reply_keys`` are the map keys that hold the chunk (``bare_reply``: a bare array too);
    ``error_frames`` one of :data:`ERROR_FRAMES`; ``chunk_shape`` the geometry its chunks have (None: any),
    enforced per reply when ``checks_chunk`` (a chunk of another geometry is an error of that episode);
    ``executed_actions`` the rows run before the next request unless the user says otherwise (None:
    dz-gym's default). ``supports_reset``: a ``reset`` frame frees an ended episode's session there.
    """

    name: str
    server: str
    url_path: str
    handshake: str
    layout: str
    image_keys: tuple[tuple[str, str], ...]
    composite_key: str | None
    image_resolution: tuple[int, int] | None
    joint_key: str | None
    gripper_key: str | None
    state_key: str | None
    cartesian_key: str | None
    prompt_key: str
    proprio_dtype: str
    session_key: str | None
    endpoint_key: str | None
    seed_key: str | None
    reply_keys: tuple[str, ...]
    bare_reply: bool
    error_frames: str
    supports_reset: bool
    chunk_shape: tuple[int, int] | None
    checks_chunk: bool
    executed_actions: int | None

    def __post_init__(self) -> None:
        if self.layout not in ("views", "composite"):
            raise ValueError(f"layout: expected 'views' or 'composite', got {self.layout!r}")
        if self.layout == "composite" and self.composite_key is None:
            raise ValueError(f"profile {self.name}: a composite layout needs composite_key")
        if (self.state_key is None) == (self.joint_key is None):
            raise ValueError(f"profile {self.name}: expected either state_key or joint_key/gripper_key")
        if self.error_frames not in ERROR_FRAMES:
            raise ValueError(f"error_frames: expected one of {', '.join(ERROR_FRAMES)}, got {self.error_frames!r}")

    @property
    def camera_keys(self) -> dict[str, str]:
        """Camera -> request key of each view (the ``views`` layout)."""
        return dict(self.image_keys)

    @property
    def render_resolution(self) -> tuple[int, int] | None:
        """The view size a simulator should render for this server (None: its own or the handshake's)."""
        return self.image_resolution

    @property
    def composite(self) -> bool:
        """Whether the three views go as one composite image."""
        return self.layout == "composite"

    @property
    def image_request_keys(self) -> tuple[str, ...]:
        """The request keys of the images, in the order they are sent."""
        if self.composite:
            return (self.composite_key,)  # type: ignore[return-value]
        return tuple(key for _, key in self.image_keys)

    @property
    def proprio_keys(self) -> tuple[str, ...]:
        """The request keys of the proprio vectors that vary per request, in the order they are sent."""
        if self.state_key is not None:
            return (self.state_key,)
        return (self.joint_key, self.gripper_key)  # type: ignore[return-value]

    def with_layout(self, layout: str) -> ServerProfile:
        """This profile with the other camera layout (for servers that take both)."""
        if layout == "composite" and self.composite_key is None:
            raise ValueError(f"layout: server kind {self.name} takes no composite image")
        return dataclasses.replace(self, layout=layout)


_DZ_VIEWS = (
    ("external_cam", "observation/exterior_image_0_left"),
    ("external_cam_2", "observation/exterior_image_1_left"),
    ("wrist_cam", "observation/wrist_image_left"),
)
_DREAMZERO_FAMILY = dict(
    url_path="",
    layout="views",
    image_keys=_DZ_VIEWS,
    composite_key=None,
    image_resolution=None,
    joint_key="observation/joint_position",
    gripper_key="observation/gripper_position",
    state_key=None,
    cartesian_key="observation/cartesian_position",
    prompt_key="prompt",
    proprio_dtype="float64",
    session_key="session_id",
    endpoint_key="endpoint",
    seed_key=None,
    reply_keys=("actions",),
    bare_reply=True,
    chunk_shape=(24, 8),
    checks_chunk=False,
    executed_actions=8,
    supports_reset=True,
)
_FLUX = dict(image_resolution=(360, 640), cartesian_key=None, proprio_dtype="float32", endpoint_key=None,
             bare_reply=False, chunk_shape=(32, 8), checks_chunk=True, executed_actions=32, supports_reset=False,
             prompt_key="prompt", session_key="session_id")  # fmt: skip

PROFILES: dict[str, ServerProfile] = {
    p.name: p
    for p in (
        ServerProfile(
            name="dreamzero",
            server="DreamZero's own server",
            handshake="`policy_server_config` keys (`image_resolution`, `needs_session_id`, ...)",
            error_frames="text-1011",
            **_DREAMZERO_FAMILY,
        ),
        ServerProfile(
            name="openpi",
            server="openpi's `WebsocketPolicyServer`",
            handshake="`{}` (the policy's metadata; name others with `--server-kind openpi`)",
            error_frames="text-1011",
            **{**_DREAMZERO_FAMILY, "chunk_shape": None, "executed_actions": None, "supports_reset": False},
        ),
        ServerProfile(
            name="vllm-omni",
            server="vLLM-Omni",
            handshake="`policy_server_config` keys (DreamZero's)",
            error_frames="binary-type-error",
            **{**_DREAMZERO_FAMILY, "url_path": VLLM_OMNI_PATH, "seed_key": "seed"},
        ),
        ServerProfile(
            name="flux3-bfl",
            server="BFL's `flux-action serve-robolab`",
            url_path="",
            handshake='`{"serving_setup": {...}}`',
            layout="composite",
            image_keys=(
                ("external_cam", "observation/exterior_image_1_left"),
                ("external_cam_2", "observation/exterior_image_2_left"),
                ("wrist_cam", "observation/wrist_image_left"),
            ),
            composite_key="observation/image",
            joint_key="observation/joint_position",
            gripper_key="observation/gripper_position",
            state_key=None,
            seed_key=None,
            reply_keys=("action",),
            error_frames="text-1011",
            **_FLUX,
        ),
        ServerProfile(
            name="sglang",
            server="SGLang (`sglang serve ... --model-type diffusion`)",
            url_path="/openpi/policy",
            handshake="`action.metadata` (`policy_family: flux3_action`, `output.action_horizon`)",
            layout="views",
            image_keys=(
                ("external_cam", "observation.images.left"),
                ("external_cam_2", "observation.images.right"),
                ("wrist_cam", "observation.images.wrist"),
            ),
            composite_key="observation.images.composite",
            joint_key=None,
            gripper_key=None,
            state_key="state",
            seed_key="seed",
            reply_keys=("actions",),
            error_frames="binary-error-1011",
            **_FLUX,
        ),
    )
}
SERVER_KINDS = (AUTO, *PROFILES)


def profile_named(name: str) -> ServerProfile:
    """The profile called ``name``; a one-line ``ValueError`` naming the server kinds otherwise."""
    profile = PROFILES.get(name)
    if profile is None:
        raise ValueError(f"--server-kind: expected one of {', '.join(SERVER_KINDS)}, got {name!r}")
    return profile


def resolve_server_kind(value: str | None) -> str | None:
    """``--server-kind``'s value as a profile name, None for ``auto`` (chosen from the handshake)."""
    if value is None or value == AUTO:
        return None
    return profile_named(value).name


def _is_sglang(raw: Mapping[str, Any]) -> bool:
    output = raw.get("output")
    return (
        raw.get("policy_family") == "flux3_action"
        or raw.get("object") == "action.metadata"
        or (isinstance(output, Mapping) and "action_horizon" in output)
    )


def detect_profile(raw: Any, *, url: str = "", server_kind: str | None = None) -> ServerProfile:
    """The profile of a server from its decoded handshake ``raw`` (and the ``url`` it was reached on), or
    the one named by ``server_kind`` (``auto``/None: detect). A handshake that matches none raises a
    one-line :class:`~dz_gym.errors.UnknownServer` (a ``HandshakeError``) naming the keys it sent and the ``--server-kind`` values.

    Rules: ``serving_setup`` -> flux3-bfl; ``policy_family: flux3_action``, ``object: action.metadata`` or
    an ``output`` map with ``action_horizon`` -> sglang; any ``policy_server_config`` key -> vllm-omni on its
    route ``/v1/realtime/robot/openpi``, dreamzero elsewhere; an empty map -> openpi.
    """
    named = resolve_server_kind(server_kind)
    if named is not None:
        return PROFILES[named]
    if isinstance(raw, Mapping):
        if "serving_setup" in raw:
            return PROFILES["flux3-bfl"]
        if _is_sglang(raw):
            return PROFILES["sglang"]
        if any(key in raw for key in POLICY_SERVER_CONFIG_KEYS):
            path = urlsplit(url).path.rstrip("/") if url else ""
            return PROFILES["vllm-omni" if path.endswith(VLLM_OMNI_PATH) else "dreamzero"]
        if not raw:
            return PROFILES["openpi"]
        sent = f"keys {sorted(str(k) for k in raw)[:12]}"
    else:
        sent = f"a {type(raw).__name__}"
    where = f"server {url}" if url else "server"
    raise UnknownServer(
        f"{where}: its handshake matches no server profile (it sent {sent}); "
        f"name the server with --server-kind {'|'.join(PROFILES)}"
    )


def chunk_rows(profile: ServerProfile, raw: Any = None) -> int | None:
    """The rows every reply of a server of ``profile`` must have (None: any): for a profile that checks its
    chunks, the handshake's ``output.action_horizon`` where it announces one (SGLang), else the profile's.

    >>> chunk_rows(PROFILES["sglang"], {"output": {"action_horizon": 16}}), chunk_rows(PROFILES["dreamzero"])
    (16, None)
    """
    if not profile.checks_chunk or profile.chunk_shape is None:
        return None
    output = raw.get("output") if isinstance(raw, Mapping) else None
    announced = output.get("action_horizon") if isinstance(output, Mapping) else None
    if isinstance(announced, int) and not isinstance(announced, bool) and announced >= 1:
        return announced
    return profile.chunk_shape[0]


# ------------------------------------------------------------------------------------------------ docs
def _keys_cell(p: ServerProfile) -> str:
    views = ", ".join(f"`{key}`" for _, key in p.image_keys)
    images = f"{views} or `{p.composite_key}`" if p.composite_key else views
    if p.composite:
        images = f"`{p.composite_key}` (540x640 composite) or {views}"
    state = f"`{p.state_key}` (8)" if p.state_key else f"`{p.joint_key}` (7), `{p.gripper_key}` (1)"
    extra = [f"`{k}`" for k in (p.prompt_key, p.session_key, p.endpoint_key) if k]
    size = "x".join(map(str, p.image_resolution)) if p.image_resolution else "handshake's"
    return f"{images} ({size}); {state}; {', '.join(extra)}"


def _reply_cell(p: ServerProfile) -> str:
    forms = (["bare array"] if p.bare_reply else []) + [f'`{{"{k}"}}`' for k in p.reply_keys]
    return " or ".join(forms)


def markdown_table() -> str:
    """The table of ``docs/server_profiles.md``: server | handshake | keys | chunk | executed | reset | errors,
    generated from :data:`PROFILES` (a test keeps the docs equal to it)."""
    lines = [
        "| server | handshake | keys | chunk | executed | reset | errors |",
        "|---|---|---|---|---|---|---|",
    ]
    for p in PROFILES.values():
        chunk = "any" if p.chunk_shape is None else "x".join(map(str, p.chunk_shape))
        chunk += f" ({_reply_cell(p)})"
        executed = "default (8)" if p.executed_actions is None else f"{p.executed_actions}"
        if p.chunk_shape is not None and p.executed_actions is not None:
            executed = f"{p.executed_actions} of {p.chunk_shape[0]}"
        path = f" on `{p.url_path}`" if p.url_path else " (root path)"
        reset = "yes" if p.supports_reset else "no"
        server = f"**{p.name}**: {p.server}{path}"
        lines.append(
            f"| {server} | {p.handshake} | {_keys_cell(p)} | {chunk} | {executed} | {reset} | "
            f"{ERROR_FRAMES[p.error_frames]} |"
        )
    return "\n".join(lines)
