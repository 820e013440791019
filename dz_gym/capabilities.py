"""What a policy server can serve, judged from its handshake and its replies (pure: no I/O).

:func:`check_handshake` refuses a server whose metadata contradicts what the DROID client sends.
:func:`single_session_note` recognises DreamZero's own server (``socket_test_optimized_AR.py``), which holds
ONE global session, so that several envs interleaved on it reset its state at every switch. That needs
evidence, never the URL alone:

- its handshake is DreamZero's ``PolicyServerConfig`` with ``needs_session_id: true`` (openpi's
  ``WebsocketPolicyServer``, ``openpi-server`` and ``policy-websocket`` send their policy's metadata, ``{}``
  by default);
- its replies carry no ``server_timing`` (those three always add it to their reply map; other extra keys
  prove nothing), and vLLM-Omni, which also replies bare arrays, serves under ``/v1/realtime/robot/openpi``;
- it is reached on a ``ws://``/``wss://`` URL without a path, and more than one env shares it.

>>> from dz_gym.protocol import DREAMZERO_METADATA, InferReply, parse_metadata, encode_metadata
>>> import numpy as np
>>> meta = parse_metadata(encode_metadata(DREAMZERO_METADATA))
>>> bare = InferReply(np.zeros((24, 8), np.float32))
>>> openpi_style = InferReply(np.zeros((24, 8), np.float32), server_timing={"infer_ms": 3.0})
>>> single_session_note(meta, "ws://gpu:5000", bare, envs_on_server=4) is not None
True
>>> single_session_note(meta, "ws://gpu:8000", openpi_style, envs_on_server=4) is None
True
>>> single_session_note(meta, "ws://gpu:8000/v1/realtime/robot/openpi", bare, envs_on_server=4) is None
True
"""

from __future__ import annotations

from urllib.parse import urlparse

from dz_gym.errors import HandshakeError
from dz_gym.protocol import InferReply, ServerMetadata

__all__ = ["check_handshake", "replies_like_openpi_server", "single_session_note"]


def check_handshake(metadata: ServerMetadata, url: str) -> None:
    """Raise ``HandshakeError`` when a server cannot take what the wrapper sends.

    The wrapper sends two external views and a wrist view, a session id per episode, and executes absolute
    joint-position actions. Whether the server holds one global session is judged once it has replied
    (:func:`single_session_note`); its robot policy contract by :mod:`dz_gym.protocol.contract`.
    """
    problems = []
    if metadata.n_external_cameras is not None and metadata.n_external_cameras > 2:
        problems.append(f"n_external_cameras={metadata.n_external_cameras} (the DROID rig has 2)")
    if metadata.needs_stereo_camera:
        problems.append("needs_stereo_camera=true (the DROID rig has no stereo camera)")
    if metadata.action_space not in (None, "joint_position"):
        problems.append(f"action_space={metadata.action_space!r} (the DROID env takes 'joint_position')")
    if metadata.image_resolution is not None:
        height, width = metadata.image_resolution
        if height < 1 or width < 1:
            problems.append(f"image_resolution={list(metadata.image_resolution)} (expected positive sizes)")
    if problems:
        raise HandshakeError(f"server {url}: cannot serve the DROID client: " + "; ".join(problems))


def replies_like_openpi_server(reply: InferReply) -> bool:
    """True for a reply in openpi's ``WebsocketPolicyServer`` form: a map with ``server_timing``, which that
    server always adds. Other keys next to ``actions`` do not tell (any policy may return them); a bare
    action array, as DreamZero's server and vLLM-Omni send, never has it."""
    return reply.server_timing is not None


def single_session_note(
    metadata: ServerMetadata | None, url: str, reply: InferReply, envs_on_server: int
) -> str | None:
    """The warning for DreamZero's single-session server, or None where the evidence does not support it.

    ``reply`` is a successful reply of that server and ``envs_on_server`` the number of envs that share it
    (see the module docstring for the evidence required).
    """
    if envs_on_server < 2 or metadata is None or metadata.needs_session_id is not True:
        return None
    parts = urlparse(url)
    if parts.scheme not in ("ws", "wss") or parts.path not in ("", "/") or replies_like_openpi_server(reply):
        return None
    return (
        f"server {url} behaves like DreamZero's own server (DreamZero handshake, bare action replies, no path): "
        f"it holds ONE global session, so the {envs_on_server} envs interleaved on it reset its state at every "
        "switch; serve with vLLM-Omni or run one env per server"
    )
