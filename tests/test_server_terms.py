"""agree_terms: the profile, horizon, reply rows and view size a batch's handshakes fix (pure)."""

from __future__ import annotations

import pytest

from dz_gym.chunks import HorizonError
from dz_gym.errors import HandshakeError, UnknownServer
from dz_gym.protocol import DREAMZERO_METADATA, encode_metadata, parse_metadata
from dz_gym.server.flux import bfl_handshake, sglang_handshake
from dz_gym.server_terms import agree_terms

DZ = parse_metadata(encode_metadata(DREAMZERO_METADATA))
SGLANG = parse_metadata(encode_metadata(sglang_handshake()))
BFL = parse_metadata(encode_metadata(bfl_handshake()))


def test_dreamzero_keeps_its_horizon_and_the_handshake_s_resolution():
    terms = agree_terms([DZ, DZ], ["ws://a:1", "ws://b:2"])
    assert (terms.profile.name, terms.open_loop_horizon, terms.image_resolution) == ("dreamzero", 8, (180, 320))
    assert terms.reply_rows == {"ws://a:1": None, "ws://b:2": None}


def test_flux_servers_fix_32_of_32_their_view_size_and_their_replies_rows():
    terms = agree_terms([SGLANG], ["ws://a:1/openpi/policy"])
    assert (terms.profile.name, terms.open_loop_horizon, terms.image_resolution) == ("sglang", 32, (360, 640))
    assert terms.reply_rows == {"ws://a:1/openpi/policy": 32}
    assert agree_terms([BFL], ["ws://a:1"], open_loop_horizon=16).open_loop_horizon == 16
    with pytest.raises(HorizonError):
        agree_terms([BFL], ["ws://a:1"], open_loop_horizon=40)  # longer than the chunk


def test_the_user_s_resolution_and_server_kind_win():
    assert agree_terms([DZ], ["ws://a:1"], image_resolution=(90, 160)).image_resolution == (90, 160)
    assert agree_terms([DZ], ["ws://a:1"], image_resolution=None).image_resolution is None
    assert agree_terms([DZ], ["ws://a:1"], server_kind="openpi").profile.name == "openpi"


def test_servers_of_different_kinds_or_sizes_are_refused_in_one_line():
    with pytest.raises(HandshakeError, match=r"^servers are of different kinds \(dreamzero, sglang\)"):
        agree_terms([DZ, SGLANG], ["ws://a:1", "ws://b:2/openpi/policy"])
    other = parse_metadata(encode_metadata({**DREAMZERO_METADATA, "image_resolution": [224, 224]}))
    with pytest.raises(HandshakeError, match="servers disagree on image_resolution"):
        agree_terms([DZ, other], ["ws://a:1", "ws://b:2"])
    with pytest.raises(UnknownServer, match="--server-kind"):
        agree_terms([parse_metadata(encode_metadata({"policy": "mine"}))], ["ws://a:1"])
