"""What the servers' handshakes fix for a batch of envs (pure, no I/O): :func:`agree_terms`.

Once every env's connection has its handshake, the policy wrapper needs four things that hold for the whole
batch: the servers' one profile (:mod:`dz_gym.protocol.profiles`; servers of different kinds in one batch
are refused), the open-loop horizon (the user's, else the actions the profile executes, checked against each
server's announced contract and fixed chunk geometry), the rows each server's replies must have, and the
size the views are resized to (the user's, else the profile's, else the one all handshakes announce).

>>> from dz_gym.protocol import DREAMZERO_METADATA, encode_metadata, parse_metadata
>>> meta = parse_metadata(encode_metadata(DREAMZERO_METADATA))
>>> terms = agree_terms([meta, meta], ["ws://gpu:8000", "ws://gpu:8000"])
>>> terms.profile.name, terms.open_loop_horizon, terms.reply_rows, terms.image_resolution
('dreamzero', 8, {'ws://gpu:8000': None}, (180, 320))
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from dz_gym.chunks import HorizonError
from dz_gym.envs import droid
from dz_gym.errors import HandshakeError
from dz_gym.protocol import ServerMetadata
from dz_gym.protocol.contract import PolicyContract, expected_horizon, resolve_horizon
from dz_gym.protocol.profiles import ServerProfile, chunk_rows, detect_profile

__all__ = ["ServerTerms", "agree_terms"]


@dataclasses.dataclass(frozen=True)
class ServerTerms:
    """See the module docstring; ``reply_rows`` maps each server URL to its replies' rows (None: any)."""

    profile: ServerProfile
    open_loop_horizon: int
    reply_rows: dict[str, int | None]
    image_resolution: tuple[int, int] | None


def agree_terms(
    metadata: Sequence[ServerMetadata],
    urls: Sequence[str],
    *,
    server_kind: str | None = None,
    open_loop_horizon: int | None = None,
    image_resolution: tuple[int, int] | None | str = "server",
    action_dim: int = droid.ACTION_DIM,
) -> ServerTerms:
    """The batch's :class:`ServerTerms` from each env's handshake ``metadata[i]`` on ``urls[i]``;
    ``server_kind`` names the profile (None: from the handshakes), ``open_loop_horizon`` the user's horizon
    (None: the profile's), ``image_resolution`` the user's view size (``"server"``: the servers'; None: as
    rendered). One-line :class:`~dz_gym.errors.HandshakeError` or :class:`HorizonError` where they conflict."""
    found = {url: detect_profile(meta.raw, url=url, server_kind=server_kind) for url, meta in zip(urls, metadata)}
    names = sorted({profile.name for profile in found.values()})
    if len(names) != 1:
        raise HandshakeError(f"servers are of different kinds ({', '.join(names)}); run one kind at a time")
    profile = next(iter(found.values()))
    contracts: dict[str, PolicyContract] = {}
    for url, meta in zip(urls, metadata):
        contracts.setdefault(url, meta.contract)
    rows = chunk_rows(profile, metadata[0].raw)
    reply_rows = {url: expected_horizon(contract) or rows for url, contract in contracts.items()}
    default = profile.executed_actions or droid.DEFAULT_OPEN_LOOP_HORIZON
    horizon = resolve_horizon(contracts, open_loop_horizon, default, action_dim)
    if rows is not None and horizon > rows:
        raise HorizonError(horizon, rows, f"server {urls[0]}, {profile.name}")
    return ServerTerms(profile, horizon, reply_rows, _resolution(image_resolution, profile, metadata))


def _resolution(
    requested: tuple[int, int] | None | str, profile: ServerProfile, metadata: Sequence[ServerMetadata]
) -> tuple[int, int] | None:
    if requested != "server":
        if requested is None:
            return None
        height, width = (int(v) for v in requested)
        return height, width
    if profile.image_resolution is not None:
        return profile.image_resolution
    resolutions = {meta.image_resolution for meta in metadata}
    if len(resolutions) != 1:
        raise HandshakeError(f"servers disagree on image_resolution: {sorted(map(str, resolutions))}")
    resolution = resolutions.pop()
    return None if resolution is None else (int(resolution[0]), int(resolution[1]))
