"""The restored-state cache is only trusted while the table holds the very same snapshot."""

from __future__ import annotations

import pytest

from memstream.memory.coalescing import UserState
from memstream.streams.pipeline import RestoredStates

pytestmark = pytest.mark.unit


def test_hit_only_for_the_same_snapshot_object_and_bounded():
    cache = RestoredStates(size=2)
    snap = {"v": 1}
    state = UserState("t", "u")
    cache.put(b"t/u", snap, state)
    assert cache.get(b"t/u", snap) is state
    assert cache.get(b"t/u", {"v": 1}) is None  # equal but recovered: restore again
    assert cache.get(b"t/u", None) is None
    cache.put(b"a", {}, UserState("t", "a"))
    cache.put(b"b", {}, UserState("t", "b"))  # evicts the least recently used
    assert cache.get(b"t/u", snap) is None
    cache.forget(b"b")
    assert len(cache._items) == 1
