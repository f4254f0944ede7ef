"""A repeated condition is one event when it starts, a count every few ticks while it
lasts, and one when it ends (``koi.fold``)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from koi.fold import Folder


def test_start_still_and_end() -> None:
    f = Folder(every=3)
    phases = []
    for tick in range(1, 9):
        holding = {"chat": f"waiting at {tick}"} if tick <= 6 else {}
        phases += [(tick, e.phase, e.ticks) for e in f.tick(tick, holding)]
    assert phases == [(1, "start", 1), (3, "still", 3), (6, "still", 6), (7, "end", 6)]


def test_the_end_carries_the_last_message_and_the_start() -> None:
    f = Folder()
    f.tick(4, {"a": "first"})
    f.tick(5, {"a": "second"})
    (end,) = f.tick(6, {})
    assert (end.key, end.phase, end.since_tick, end.ticks, end.message) == (
        "a", "end", 4, 2, "second")


def test_a_redelivered_or_older_tick_changes_nothing() -> None:
    f = Folder()
    assert [e.phase for e in f.tick(1, {"a": "x"})] == ["start"]
    assert f.tick(1, {"a": "x"}) == [] and f.tick(0, {}) == []
    assert f.holding == {"a": 1}


def test_skipped_ticks_still_count() -> None:
    f = Folder(every=10)
    f.tick(1, {"a": "x"})
    (still,) = f.tick(25, {"a": "x"})  # ticks 2–24 never came
    assert (still.phase, still.ticks) == ("still", 25)


def test_every_must_be_positive() -> None:
    with pytest.raises(ValueError):
        Folder(every=0)


@given(st.lists(st.sets(st.sampled_from("abcd"), max_size=4), min_size=1, max_size=60),
       st.integers(1, 7))
def test_events_are_few_and_balanced(ticks: list[set[str]], every: int) -> None:
    """Each run of ticks a key holds gives one start, one end (unless it still holds),
    and a still at each multiple of ``every`` ticks held; nothing more."""
    f = Folder(every=every)
    events = [e for n, keys in enumerate(ticks) for e in f.tick(n, {k: "m" for k in keys})]
    for key in "abcd":
        runs, held = [], 0
        for keys in ticks:
            if key in keys:
                held += 1
            elif held:
                runs.append(held)
                held = 0
        mine = [e for e in events if e.key == key]
        starts = len(runs) + (held > 0)
        assert sum(e.phase == "start" for e in mine) == starts
        assert sum(e.phase == "end" for e in mine) == len(runs)
        assert [e.ticks for e in mine if e.phase == "end"] == runs
        # a still at each multiple of ``every`` held ticks after the first (the start)
        stills = sum(r // every - (every == 1) for r in [*runs, held] if r)
        assert sum(e.phase == "still" for e in mine) == stills
