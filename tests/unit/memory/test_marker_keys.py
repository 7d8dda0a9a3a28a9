"""Forget markers are signed with a key only the workers hold (derived from the master key,
by version), and records of the user-keys topic that do not verify leave no state
(memory.crypto.key_records / key_view), without a broker: the fake topic of
test_user_keys."""

from __future__ import annotations

import json

import pytest

from memstream.core.settings import Settings
from memstream.memory.crypto.user_keys import UserKeys
from memstream.sealing import key_records as rec
from tests.unit.memory.test_user_keys import TOPIC, V1, V2, opens, reader, replay, sealed, writer

pytestmark = pytest.mark.unit
BOTH = dict(master_key=V2, master_key_version=2, master_key_previous=f"1:{V1}")
ONLY_V2 = dict(master_key=V2, master_key_version=2)


def compacted(log: list) -> list:
    """What compaction keeps: the last record of each key, in offset order."""
    last = {key: n for n, (key, _) in enumerate(log)}
    return [r for n, r in enumerate(log) if last[r[0]] == n]


def reader_forged(w: UserKeys, user: str, keys: list[str], at: float = 1e12) -> bytes:
    """What a downstream reader of t1 can write: a marker signed with the tenant KEK (its
    read key), in the old layout or with an ``msig`` it made up."""
    kek_id, kek = min(w.keks_of("t1").items())
    m = rec.signed_marker(kek, kek_id, "t1", user, at=at, request_id="x", actor="y", keys=keys)
    return rec.dumps(m)


async def test_a_reader_with_produce_rights_cannot_make_a_worker_shred():
    log: list = []
    w = writer(log)
    key = await w.key_for_write("t1", "u1")
    _, kek = min(w.keks_of("t1").items())
    data_key_record = log[1][0]
    guessed = rec.resigned(rec.marker(reader_forged(w, "u1", [key[0]])), kek, "t1", "u1",
                           (1, rec.crypto.reader_marker_key(kek, "t1")))
    for value in (reader_forged(w, "u1", [key[0]]), rec.dumps(guessed)):
        log += [(b"t1/u1/!forgotten", value), (data_key_record, None)]
    fresh = writer(log)  # a worker (re)started after the forgery
    assert fresh.forgotten_at("t1", "u1") is None and opens(fresh, sealed(w, key))
    assert fresh.rejected_kinds == {"unsigned": 1, "undecryptable": 1}
    await fresh.repair()
    assert log[-1] == (data_key_record, log[1][1])  # the key written back
    read_key = rec.encode_read_key("t1", w.keks_of("t1"))
    tenant_reader = replay(UserKeys(Settings(read_keys=read_key), TOPIC), log)
    assert tenant_reader.forgotten_at("t1", "u1") == 1e12  # a reader cannot tell: a denial


async def test_a_workers_marker_verifies_for_workers_and_readers():
    log: list = []
    w = writer(log)
    key = await w.key_for_write("t1", "u1")
    await w.forget("t1", "u1", 42.0, "r", "a")
    marker = rec.marker(dict(log)[b"t1/u1/!forgotten"])
    assert marker.master == 1 and marker.msig and marker.sig
    read_key = rec.encode_read_key("t1", w.keks_of("t1"))
    for view in (writer(list(log)), replay(UserKeys(Settings(read_keys=read_key), TOPIC), log)):
        assert view.forgotten_at("t1", "u1") == 42.0 and not opens(view, sealed(w, key))


async def test_a_master_rotation_signs_markers_again_and_old_ones_verify_until_then():
    log: list = []
    w = writer(log)
    key = await w.key_for_write("t1", "u1")
    await w.forget("t1", "u1", 42.0, "r", "a")
    before = list(log)
    assert reader(before, **BOTH).forgotten_at("t1", "u1") == 42.0  # current + previous
    assert reader(before, **ONLY_V2).forgotten_at("t1", "u1") is None  # v1 dropped too soon
    rot = writer(log, **BOTH)
    plan = rot.rotation()
    assert plan.markers == 1
    await rot.write(plan.records)
    only_v2 = writer(list(log), **ONLY_V2)
    assert only_v2.forgotten_at("t1", "u1") == 42.0 and only_v2.rejected == 0
    assert not opens(only_v2, sealed(w, key))
    await only_v2.repair()
    assert rec.marker(dict(log)[b"t1/u1/!forgotten"]).master == 2
    assert only_v2.rotation().markers == 0  # nothing left under version 1


async def test_markers_of_before_master_keys_verify_only_in_the_transition():
    """A marker an older release wrote (``sig`` under the tenant KEK only) is taken with
    forget_markers_legacy, and the rotation then signs it under the master version."""
    log: list = []
    w = writer(log)
    key = await w.key_for_write("t1", "u1")
    log += [(b"t1/u1/!forgotten", reader_forged(w, "u1", [key[0]], at=9.0)),
            (log[1][0], None)]
    assert writer(list(log), forget_markers_legacy=True).forgotten_at("t1", "u1") == 9.0
    rot = writer(log, forget_markers_legacy=True)
    plan = rot.rotation()
    assert plan.markers == 1
    await rot.write(plan.records)
    after = writer(compacted(log))  # the transition over: the setting unset
    assert after.forgotten_at("t1", "u1") == 9.0 and after.rejected == 0
    assert not opens(after, sealed(w, key))


async def test_unverified_records_leave_no_state():
    log: list = []
    dead: list = []
    w = writer(log, dead)
    await w.key_for_write("t1", "u1")
    users, tenants = dict(w._users), dict(w._tenants)
    bad_key = json.dumps({"wrapped": "AAAA", "kek": min(w.keks_of("t1"))}).encode()
    bad_kek = json.dumps({"wrapped": "AAAA", "master": 1}).encode()
    forged_marker = json.dumps({"at": 1.0, "kek": "k", "sig": "00", "msig": "00",
                                "master": 1}).encode()
    for n in range(300):
        for key, value in ((f"t1/bogus{n}/k{n}", bad_key), (f"t1/bogus{n}/k{n}", None),
                           (f"t1/bogus{n}/!forgotten", forged_marker),
                           (f"t1/bogus{n}/!forgotten", None), (f"t{n}/!kek/x", bad_kek),
                           (f"t{n}/!kek/x", None)):
            w.take(key.encode(), value)
    assert w._users.keys() == users.keys() and w._tenants.keys() == tenants.keys()
    assert w.rejected == 900 and w.repairs() == []
    await w.repair()
    assert len(dead) == 900 and all(json.loads(v)["value_b64"] == "" for _, v in dead)


async def test_a_readers_keys_under_tenant_keys_it_lacks_are_bounded(monkeypatch):
    """A reader cannot check a key under a tenant KEK its read key lacks (it keeps it as
    "locked"): those are bounded, so a flood of them grows no state past the bound."""
    from memstream.sealing import key_view

    monkeypatch.setattr(key_view, "LOCKED_MAX", 3)
    log: list = []
    w = writer(log)
    await w.key_for_write("t1", "u1")
    read_key = rec.encode_read_key("t1", w.keks_of("t1"))
    locked = json.dumps({"wrapped": "AAAA", "kek": "a-newer-kek"}).encode()
    log += [(f"t1/flood{n}/k".encode(), locked) for n in range(5)]
    r = replay(UserKeys(Settings(read_keys=read_key), TOPIC), log)
    assert r.locked("t1", "flood2", "k") and not r.locked("t1", "flood3", "k")
    assert len(r._users) == 1 + 3 and r.rejected == 2  # u1, and the bound


async def test_an_older_marker_after_a_newer_one_is_answered_by_the_newer():
    """A rotation signs the marker it read again; a forget of the same user between its
    read and its write makes that an older marker (fewer keys): were it taken, compaction
    would keep it alone and the newer key's tombstone would be written back."""
    log: list = []
    w = writer(log)
    await w.key_for_write("t1", "u1")
    await w.forget("t1", "u1", 10.0, "r1", "a")
    plan = writer(list(log), **BOTH).rotation()  # read before the second forget
    k2 = await w.key_for_write("t1", "u1")
    await w.forget("t1", "u1", 20.0, "r2", "a")
    newer = dict(log)[b"t1/u1/!forgotten"]
    rot = writer(log, **BOTH)
    await rot.write(plan.records)  # the older marker, signed again, lands last
    fresh = writer(log, **BOTH)
    assert fresh.forgotten_at("t1", "u1") == 20.0 and k2[0] in fresh.shredded("t1", "u1")
    await fresh.repair()
    assert log[-1] == (b"t1/u1/!forgotten", newer)  # the newer marker written back
    after = writer(compacted(log), **BOTH)
    assert after.forgotten_at("t1", "u1") == 20.0 and not opens(after, sealed(w, k2))
    assert after.repairs() == []
