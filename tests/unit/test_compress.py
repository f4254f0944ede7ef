"""Compressed state from the bus is inflated with a bound (a zip bomb is refused)."""

from __future__ import annotations

import zlib

import pytest

from koi.causal.store import BeliefStore
from koi.compress import MAX_INFLATED_BYTES, inflate
from koi.dro import DroCalibrator


def test_inflate_round_trips_and_refuses_what_grows_past_the_bound() -> None:
    assert inflate(zlib.compress(b"state" * 100)) == b"state" * 100
    with pytest.raises(ValueError, match="inflates past 1,000 bytes"):
        inflate(zlib.compress(b"0" * 1001), max_bytes=1000)
    assert inflate(zlib.compress(b"0" * 1000), max_bytes=1000) == b"0" * 1000


def test_truncated_and_garbage_input_is_an_error_not_a_crash() -> None:
    with pytest.raises(ValueError, match="truncated"):
        inflate(zlib.compress(b"abcdef" * 50)[:-4])
    with pytest.raises(zlib.error):
        inflate(b"not zlib at all")


@pytest.mark.parametrize("decode", [BeliefStore.from_bytes, DroCalibrator.from_bytes])
def test_a_zip_bomb_in_place_of_state_is_refused(decode) -> None:
    # ~300 kB on the wire, 300 MB inflated: over the bound, refused without inflating it
    bomb = zlib.compress(b" " * (MAX_INFLATED_BYTES + 1_000_000), 9)
    assert len(bomb) < 2_000_000
    with pytest.raises(ValueError, match="inflates past"):
        decode(bomb)
