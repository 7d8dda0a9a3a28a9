"""Rebuilding from the memory-change topic as it is on the wire: events whose vector is the
float list written before 2026-12-02, packed ones since, or both mixed, fold into the store
the live path wrote, checksum for checksum (memory.store.checksum compares vectors as float32)."""

from __future__ import annotations

import json
from array import array
from types import SimpleNamespace

import pytest

from benchmarks.changegen import changes
from memstream.memory.applying import apply_change, apply_decision, build_decision
from memstream.memory.embedding import HashingEmbedder
from memstream.memory.extraction import Extractor, RulesModel
from memstream.memory.store import Scope, checksum
from memstream.memory.store.edge import pack, unpack
from memstream.memory.store.rebuild_fold import Fold, rebuild
from memstream.memory.store.rebuild_topics import UnreadableChange, fold_records
from memstream.topics.codec import decode, decode_own
from memstream.topics.schemas import JobDecision, MemoryChange
from tests.unit.builders import job, make_store

pytestmark = pytest.mark.unit
DIM = 16
SCRIPT = [["I live in Oslo", "I am allergic to nuts"], ["I moved to Bergen"],
          ["I have 2 children"], ["I have 3 children"], ["I no longer live in Bergen"]]


def digests(store):
    return checksum.digests(store.scan(vectors=True))


def unrounded(vector: list[float]) -> list[float]:
    """float64 values as an embedder gave them (and older events carried): each rounds to
    the float32 given, none is one."""
    return [x * (1 + 2**-30) if x else x for x in vector]


def old_wire(c: MemoryChange) -> bytes:
    data = json.loads(c.model_dump_json())
    if c.vector is not None:
        data["vector"] = unrounded(c.vector)
        assert array("f", data["vector"]).tolist() == c.vector != data["vector"]
    return json.dumps(data).encode()


def records(values: list[bytes]) -> list[SimpleNamespace]:
    return [SimpleNamespace(topic="memstream.memory-changes", partition=0, offset=i, value=v)
            for i, v in enumerate(values)]


def folded(store, values: list[bytes], batch: int = 7) -> None:
    fold = Fold(store, batch=batch)
    fold_records(fold, records(values))  # type: ignore[arg-type]
    fold.finish()


@pytest.mark.parametrize("kind", ["edge", "server"])
def test_old_new_and_mixed_events_fold_into_the_same_store(kind, tmp_path):
    entries = list(changes(30, 16, DIM, duplicates=0.05, forget_every=9))
    assert any(c.op == "erase" for c in entries) and any(c.vector for c in entries)
    old = [old_wire(c) for c in entries]
    new = [c.dumps() for c in entries]
    mixed = [o if i % 3 else n for i, (o, n) in enumerate(zip(old, new, strict=True))]
    assert any(isinstance(json.loads(v)["vector"], str) for v in mixed)
    assert any(isinstance(json.loads(v)["vector"], list) for v in mixed)
    reference = make_store(kind, tmp_path / "one", DIM)
    for c in entries:
        apply_change(reference, c)
    expected = digests(reference)
    assert expected.records > 300
    for name, values in (("old", old), ("new", new), ("mixed", mixed)):
        store = make_store(kind, tmp_path / name, DIM)
        folded(store, values)
        verdict = checksum.compare(expected, digests(store))
        assert verdict.ok, (name, verdict.summary())
        for t, u in expected.users:
            assert store.cursor(Scope(t, u)) == reference.cursor(Scope(t, u))
        store.close()
    reference.close()


@pytest.mark.parametrize("kind", ["edge", "server"])
def test_the_live_store_and_one_rebuilt_from_the_packed_topic_are_equal(kind, tmp_path):
    """The live path: the embedder's float64 vectors, decisions through the decisions topic,
    the store written, the events published; the rebuild reads those events."""
    live = make_store(kind, tmp_path / "live", HashingEmbedder().dim)
    ex = Extractor(RulesModel(), HashingEmbedder(), live)
    published: list[bytes] = []
    for seq, texts in enumerate(SCRIPT, 1):
        j = job(texts, job_id=f"job-{seq}", start=10 * seq).model_copy(update={"seq": seq})
        decided = build_decision(j, ex.decide(j, 100.0 * seq), ex.model, 100.0 * seq)
        on_topic = decode(JobDecision, decided.dumps(), j.key().encode())
        published += [c.dumps() for c in apply_decision(live, on_topic).publish]
    assert all(isinstance(json.loads(v)["vector"], str | None) for v in published)
    assert sum(1 for v in published if json.loads(v)["vector"]) >= 4
    rebuilt = make_store(kind, tmp_path / "rebuilt", HashingEmbedder().dim)
    rebuild(rebuilt, (decode_own(MemoryChange, v) for v in published))
    verdict = checksum.compare(digests(live), digests(rebuilt))
    assert verdict.ok, verdict.summary()
    live.close()
    rebuilt.close()


def test_the_checksum_compares_vectors_as_float32():
    """A store written before (the embedder's float64 vector, kept by Edge as float32, by a
    Qdrant server maybe not) and one written since (float32 values) have equal digests."""
    vector = [0.1, -0.2, 1 / 3]
    rounded = array("f", vector).tolist()
    payload = {"tenant_id": "t1", "user_id": "u1", "memory_id": "m1", "status": "active"}
    assert checksum.canonical("p1", payload, vector) == checksum.canonical("p1", payload,
                                                                           rounded)
    assert checksum.canonical("p1", payload, vector) != checksum.canonical(
        "p1", payload, [0.1, -0.2, 0.34])


def test_a_record_that_is_no_change_event_stops_the_fold_with_where_and_why(tmp_path):
    good = [c.dumps() for c in changes(2, 3, DIM)]
    bad = json.dumps({**json.loads(good[0]), "vector": "%%%%"}).encode()
    store = make_store("server", tmp_path, DIM)
    fold = Fold(store)
    with pytest.raises(UnreadableChange) as err:
        fold_records(fold, records([*good, bad]))  # type: ignore[arg-type]
    assert err.value.kind == "schema"
    assert f"partition 0 offset {len(good)}" in str(err.value) and "vector" in str(err.value)
    fold_records(fold, records([None]))  # type: ignore[list-item]  # tombstones: skipped


def test_edge_payloads_read_back_as_written():
    payload = {"tenant_id": "t1", "user_id": "u1", "memory_id": "m1", "status": "active",
               "type": "episodic", "slot": None, "content": "Zürich — 住在 \u2028 \"q\"",
               "importance": 7, "created_at": 1700000000.25, "valid_to": None,
               "source": {"op_id": "o1", "message_ids": ["a", "b"]}, "extra": {"w": 1e-7},
               "big": 2**70}
    packed = pack(payload)
    assert unpack(packed) == payload
    assert json.loads(packed["_doc"]) == payload
    assert unpack(pack({**payload, "content": "lone \ud800"}))["content"] == "lone \ud800"


def test_the_fold_erases_with_its_batches_and_flushes_once_at_the_end(tmp_path):
    from memstream.memory.store.edge import EdgeStore

    calls: list[tuple[int, bool]] = []

    class Spy(EdgeStore):
        def erase_users(self, scopes, *, flush=True):
            calls.append((len(scopes), flush))
            return super().erase_users(scopes, flush=flush)

    entries = list(changes(30, 16, DIM, forget_every=9))
    forgotten = {c.user_id for c in entries if c.op == "erase"}
    store = Spy(tmp_path / "spy", DIM)
    rebuild(store, entries, batch=50)
    assert sum(n for n, _ in calls) == len(forgotten) >= 3
    assert [flush for _, flush in calls] == [False] * (len(calls) - 1) + [True]
    assert calls[-1] == (0, True)  # the one flush
    reference = make_store("edge", tmp_path / "ref", DIM)
    for c in entries:
        apply_change(reference, c)
    assert checksum.compare(digests(reference), digests(store)).ok
    store.close()
    reference.close()
