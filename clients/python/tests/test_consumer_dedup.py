"""The reader's window of recent change ids per partition (memstream.consumer.dedup)."""

from __future__ import annotations

import pytest

from memstream.consumer.dedup import RecentIds

pytestmark = pytest.mark.unit


def test_an_id_is_new_once_then_a_duplicate():
    r = RecentIds(10)
    assert r.add(0, "c1") is True
    assert r.add(0, "c1") is False
    assert r.add(0, "c2") is True
    assert r.size(0) == 2


def test_partitions_have_windows_of_their_own():
    r = RecentIds(2)
    assert r.add(0, "c1") and r.add(1, "c1")  # the same id on another partition is new
    r.add(1, "c2")
    r.add(1, "c3")  # evicts c1 from partition 1 only
    assert r.add(0, "c1") is False
    assert (r.size(0), r.size(1)) == (1, 2)


def test_the_oldest_id_leaves_the_window_first():
    r = RecentIds(3)
    for cid in ("a", "b", "c", "d"):
        assert r.add(0, cid)
    assert r.size(0) == 3
    assert r.add(0, "a") is True  # evicted: new again
    assert [r.add(0, cid) for cid in ("c", "d", "a")] == [False, False, False]


def test_a_duplicate_seen_again_stays_in_the_window():
    r = RecentIds(2)
    r.add(0, "a")
    r.add(0, "b")
    assert r.add(0, "a") is False  # refreshed: now the newest
    r.add(0, "c")  # evicts b, not a
    assert r.add(0, "a") is False
    assert r.add(0, "b") is True


def test_forget_drops_a_partitions_ids_only():
    r = RecentIds(5)
    r.add(0, "a")
    r.add(1, "a")
    r.forget(0)
    r.forget(7)  # never seen: nothing to do
    assert (r.size(0), r.size(1)) == (0, 1)
    assert r.add(0, "a") is True and r.add(1, "a") is False


def test_the_window_holds_at_least_one_id():
    with pytest.raises(ValueError):
        RecentIds(0)
    r = RecentIds(1)
    assert r.add(0, "a") and r.add(0, "b") and r.add(0, "a")
