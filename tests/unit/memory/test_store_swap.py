"""The store switch's parts (memory.store.swappable), without Kafka: the users written since a
moment, the switch with writes held and reads going on, the exact per-user copy, cursors
never going back, and the whole switch against a writer that never stops."""

from __future__ import annotations

import threading

import pytest

from benchmarks.changegen import changes
from memstream.memory.applying import apply_change
from memstream.memory.fencing import Cursor
from memstream.memory.store import Scope, checksum
from memstream.memory.store.rebuild_fold import rebuild
from memstream.memory.store.swappable import SwappableStore, copy_cursors, copy_user
from tests.unit.builders import make_store

pytestmark = pytest.mark.unit
DIM = 16


def log():
    return list(changes(20, 20, DIM, duplicates=0.05, forget_every=7))


def digests(store):
    return checksum.digests(store.scan(vectors=True))


class Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


def test_the_users_written_since_a_moment_are_known(tmp_path):
    clock = Clock()
    store = SwappableStore(make_store("server", tmp_path, DIM), clock)
    entries = log()
    for i, c in enumerate(entries[:50]):
        clock.t = float(i)
        apply_change(store, c)
    assert store.written_since(40.0) == {(c.tenant_id, c.user_id) for c in entries[40:50]}
    assert store.written_since(100.0) == set()


def test_a_switch_holds_writes_not_reads_and_later_writes_land_in_the_new_store(tmp_path):
    live, new = make_store("edge", tmp_path / "a", DIM), make_store("edge", tmp_path / "b", DIM)
    store = SwappableStore(live)
    entries = log()
    for c in entries[:30]:
        apply_change(store, c)
    inside, release, wrote = threading.Event(), threading.Event(), threading.Event()

    def critical(current, users):
        assert current is live
        inside.set()
        assert release.wait(10)
        for tenant, user in {(c.tenant_id, c.user_id) for c in entries[:30]}:
            copy_user(current, new, tenant, user)
        return True

    switcher = threading.Thread(target=store.locked, args=(0.0, critical, new))
    switcher.start()
    assert inside.wait(10)
    writer = threading.Thread(target=lambda: (apply_change(store, entries[30]), wrote.set()))
    writer.start()
    assert not wrote.wait(0.3)  # the write waits for the switch
    assert store.list(Scope("bench", entries[0].user_id), statuses=None)  # reads do not
    release.set()
    switcher.join(10)
    writer.join(10)
    assert wrote.is_set() and store.current is new
    reference = make_store("edge", tmp_path / "c", DIM)
    for c in entries[:31]:
        apply_change(reference, c)
    assert checksum.compare(digests(reference), digests(new)).ok


def test_copy_user_makes_one_user_exact_and_touches_no_other(tmp_path):
    entries = log()
    src, dst = make_store("edge", tmp_path / "a", DIM), make_store("edge", tmp_path / "b", DIM)
    rebuild(src, entries)
    rebuild(dst, entries[: len(entries) // 2])  # behind, with records src no longer has
    user = entries[-1].user_id
    others = {k: v for k, v in digests(dst).users.items() if k != ("bench", user)}
    copy_user(src, dst, "bench", user)
    assert digests(dst).users[("bench", user)] == digests(src).users[("bench", user)]
    assert dst.cursor(Scope("bench", user)) == src.cursor(Scope("bench", user))
    assert {k: v for k, v in digests(dst).users.items() if k != ("bench", user)} == others


def test_cursors_move_forward_only(tmp_path):
    live, new = make_store("server", tmp_path, DIM), make_store("server", tmp_path, DIM)
    live.set_cursor(Scope("t", "a"), Cursor(6, "job6", "dA"))  # a job that changed nothing
    new.set_cursor(Scope("t", "a"), Cursor(5, "job5"))
    live.set_cursor(Scope("t", "b"), Cursor(2, "job2"))
    new.set_cursor(Scope("t", "b"), Cursor(3, "job3"))
    assert copy_cursors(live, new) == 1
    assert new.cursor(Scope("t", "a")) == Cursor(6, "job6", "dA")
    assert new.cursor(Scope("t", "b")).seq == 3


def test_the_switch_protocol_loses_nothing_under_a_writer_that_never_stops(tmp_path):
    """The rebuild reads a prefix of the log (the snapshot), the catch-up a longer prefix
    (the topic when it catches up), while the writer goes on; the users written since the
    catch-up's moment are copied from the live store with writes held. Afterwards the
    writer goes on into the new store: it ends equal to a store that applied everything."""
    clock = Clock()
    entries = log()
    # one backend for both: Edge normalises vectors (cosine), local Qdrant keeps them
    store = SwappableStore(make_store("edge", tmp_path / "live", DIM), clock)
    applied = 0

    def write(upto):
        nonlocal applied
        while applied < upto:
            clock.t = float(applied)
            apply_change(store, entries[applied])
            applied += 1

    write(100)
    new = make_store("edge", tmp_path / "new", DIM)
    rebuild(new, entries[:100])  # the snapshot
    write(150)  # live goes on meanwhile
    since = clock.t + 1  # the catch-up's moment: the topic holds what was applied before
    for c in entries[100:150]:
        apply_change(new, c)
    write(170)  # ... and on
    copy_cursors(store.current, new)
    verdict = checksum.compare(*(checksum.Digests({k: v for k, v in d.users.items()
                                                   if k not in store.written_since(since)})
                                 for d in (digests(store.current), digests(new))))
    assert verdict.ok, verdict.summary()

    def take_over(live, written):
        for tenant, user in written:
            copy_user(live, new, tenant, user)
        return True

    assert store.locked(since, take_over, new) and store.current is new
    write(len(entries))
    reference = make_store("edge", tmp_path / "reference", DIM)
    for c in entries:
        apply_change(reference, c)
    assert checksum.compare(digests(reference), digests(new)).ok
