"""The batched rebuild (memory.store.rebuild_fold.Fold) leaves exactly the records that
replaying the change log one change at a time through memory.applying.apply_change leaves;
the per-user checksums (memory.store.checksum) see any difference."""

from __future__ import annotations

import pytest

from benchmarks.changegen import changes
from memstream.memory.applying import apply_change
from memstream.memory.embedding import HashingEmbedder
from memstream.memory.model import Memory
from memstream.memory.store import Scope, checksum
from memstream.memory.store.rebuild_fold import Fold, rebuild
from tests.unit.builders import make_store

pytestmark = pytest.mark.unit
DIM = 16


def log(**kw):
    return list(changes(30, 16, DIM, duplicates=0.05, forget_every=9, **kw))


def digests(store, vectors=True):
    return checksum.digests(store.scan(vectors=vectors))


@pytest.mark.parametrize(("kind", "batch"), [("edge", 1), ("edge", 7), ("edge", 4096),
                                             ("server", 7)])
def test_the_batched_fold_equals_the_change_by_change_replay(kind, batch, tmp_path):
    entries = log()
    one_by_one = make_store(kind, tmp_path / "a", DIM)
    applied = sum(apply_change(one_by_one, c) for c in entries)
    folded = make_store(kind, tmp_path / "b", DIM)
    done = rebuild(folded, entries, batch=batch)
    assert done.changes == applied and done.skipped == len(entries) - applied
    live, rebuilt = digests(one_by_one), digests(folded)
    assert live.records > 300
    verdict = checksum.compare(live, rebuilt)
    assert verdict.ok, verdict.summary()
    # the cursors (left out of the checksum) are equal too
    for t, u in live.users:
        assert folded.cursor(Scope(t, u)) == one_by_one.cursor(Scope(t, u))
    one_by_one.close()
    folded.close()


def test_a_forgotten_user_is_not_resurrected_and_no_duplicate_counts(tmp_path):
    entries = log()
    erased = {c.user_id for c in entries if c.op == "erase"}
    assert erased
    store = make_store("server", tmp_path, DIM)
    rebuild(store, entries + entries)  # the whole log twice: the second pass changes nothing
    once = make_store("server", tmp_path, DIM)
    rebuild(once, entries)
    assert checksum.compare(digests(store), digests(once)).ok
    for user in erased:
        at = next(i for i, c in enumerate(entries) if c.op == "erase" and c.user_id == user)
        later = {c.memory_id for c in entries[at:] if c.user_id == user and c.op == "add"}
        kept = {m.memory_id for m in store.list(Scope("bench", user), statuses=None)}
        # what the user had before the forget-me is gone; only facts added after remain
        assert kept <= later


def test_a_partial_rebuild_holds_only_the_selected_users(tmp_path):
    entries = log()
    store = make_store("edge", tmp_path, DIM)
    done = rebuild(store, entries, select=lambda t, u: u in ("u1", "u2"))
    users = {u for _, u in digests(store).users}
    assert users == {"u1", "u2"}
    full = make_store("edge", tmp_path / "full", DIM)
    rebuild(full, entries)
    whole = digests(full).users
    part = digests(store).users
    assert all(part[k] == whole[k] for k in part) and done.changes < len(entries) / 5
    store.close()
    full.close()


def test_reembedding_keeps_the_content_and_recomputes_every_vector(tmp_path):
    entries = log()
    embedder = HashingEmbedder(dim=DIM)
    plain = make_store("server", tmp_path, DIM)
    rebuild(plain, entries)
    fresh = make_store("server", tmp_path, DIM)
    rebuild(fresh, entries, reembed=embedder.embed, batch=50)
    assert checksum.compare(digests(plain, vectors=False), digests(fresh, vectors=False)).ok
    assert not checksum.compare(digests(plain), digests(fresh)).ok
    for _, payload, vector in fresh.scan(vectors=True):
        if payload.get("status") not in ("cursor", "access"):
            m = Memory.from_payload(payload)
            assert vector == pytest.approx(embedder.embed([m.content])[0], abs=1e-5)


def test_the_checksum_sees_one_changed_record(tmp_path):
    store = make_store("server", tmp_path, DIM)
    rebuild(store, log())
    before = digests(store)
    m = store.list(Scope("bench", "u3"))[0]
    store.write([m.evolve(importance=m.importance % 10 + 1)], [None])
    verdict = checksum.compare(before, digests(store))
    assert verdict.differ == [("bench", "u3")] and verdict.equal == verdict.users - 1
    assert "MISMATCH" in verdict.summary() and "bench/u3" in verdict.summary()


def test_fold_counts_sealed_changes_it_cannot_open(tmp_path):
    entries = log()[:50]
    store = make_store("server", tmp_path, DIM)
    fold = Fold(store, opener=lambda c: None if c.user_id == "u1" else c)
    for c in entries:
        fold.add(c)
    fold.finish()
    assert fold.unreadable == sum(c.user_id == "u1" for c in entries) > 0
    assert store.list(Scope("bench", "u1"), statuses=None) == []


def test_hits_from_before_a_forget_me_are_not_folded_back(tmp_path):
    from datetime import UTC, datetime

    from memstream.topics.schemas import AccessEvent

    entries = log()
    erase = next(c for c in entries if c.op == "erase")
    scope = Scope("bench", erase.user_id)
    kept = next(c for c in entries if c.user_id == erase.user_id and c.op == "add"
                and entries.index(c) > entries.index(erase))
    at = erase.decided_at.timestamp()

    def hit(n, ts):
        return AccessEvent(event_id=f"e{n}", tenant_id="bench", user_id=erase.user_id,
                           memory_ids=[kept.memory_id], query_id=f"q{n}",
                           ts=datetime.fromtimestamp(ts, UTC))

    store = make_store("server", tmp_path, DIM)
    done = rebuild(store, entries, [hit(1, at - 5), hit(2, at + 5)])
    stats = store.access_stats(scope, [kept.memory_id])
    assert done.access_records == 1 and stats[kept.memory_id].access_count == 1
