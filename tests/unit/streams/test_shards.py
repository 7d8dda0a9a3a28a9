"""A partition's shard restored from its changelog (streams.shards), without Kafka: the
memory-change records folded into an empty shard (memory.store.rebuild_fold.Fold) or replayed onto a
caught-up one (memory.applying.apply_change) give what memory.store.rebuild_fold.rebuild
gives; DONE job results hold the user's cursor; hits from before a forget-me stay erased; the
checkpoint files of a closed shard."""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import UTC, datetime

import pytest

from benchmarks.changegen import changes
from memstream.memory.fencing import Cursor
from memstream.memory.store import Scope, checksum
from memstream.memory.store.rebuild_fold import rebuild
from memstream.streams import shard_restore
from memstream.streams import shards as shards_module
from memstream.streams.shards import Restore, ShardFiles, restore
from memstream.topics.schemas import AccessEvent, JobResult, JobStatus, MemoryChange
from tests.unit.builders import make_store

pytestmark = pytest.mark.unit
DIM = 8
TENANT = "bench"


@dataclass(frozen=True)
class Rec:
    """What the restore reads of a consumer record."""

    value: bytes | None
    offset: int
    topic: str = "t"
    partition: int = 0


def log() -> list[MemoryChange]:
    return list(changes(12, 14, DIM, duplicates=0.1, forget_every=5))


def records(events, first: int = 0) -> list[Rec]:
    return [Rec(e.model_dump_json().encode(), first + i) for i, e in enumerate(events)]


def digests(store):
    return checksum.digests(store.scan(vectors=True))


def users(entries):
    return sorted({(c.tenant_id, c.user_id) for c in entries})


def cursors(store, entries):
    return {key: store.cursor(Scope(*key)) for key in users(entries)}


def job_result(user: str, seq: int, status: JobStatus = JobStatus.DONE,
               job_id: str | None = None) -> JobResult:
    return JobResult(job_id=job_id or f"{user}-r{seq}", seq=seq, tenant_id=TENANT,
                     user_id=user, session_id="s", from_seq=0, to_seq=0, status=status,
                     finished_at=datetime(2026, 1, 1, tzinfo=UTC))


def hit(n: int, user: str, memory_id: str, ts: float) -> AccessEvent:
    return AccessEvent(event_id=f"e{n}", tenant_id=TENANT, user_id=user,
                       memory_ids=[memory_id], query_id=f"q{n}",
                       ts=datetime.fromtimestamp(ts, UTC))


@pytest.fixture
def entries():
    found = log()
    assert any(c.op == "erase" for c in found)
    assert len({c.change_id for c in found}) < len(found)  # duplicates in it
    return found


# --- the change topic ----------------------------------------------------------------------

@pytest.mark.parametrize(("kind", "batches"), [("edge", 1), ("edge", 5), ("server", 3)])
def test_an_empty_shard_folds_the_changes_as_a_rebuild_does(entries, tmp_path, kind, batches):
    # the same backend on both sides: the backends keep vectors to different float bits
    expected = make_store(kind, tmp_path / "expected", DIM)
    rebuild(expected, entries)
    shard = make_store(kind, tmp_path / "shard", DIM)
    job = Restore(shard, None, empty=True)
    recs = records(entries)
    size = -(-len(recs) // batches)
    for i in range(0, len(recs), size):
        job.on_changes(recs[i:i + size])
    job.finish()
    assert job.changes == len(entries)
    want, got = digests(expected), digests(shard)
    assert want.records > 50
    verdict = checksum.compare(want, got)
    assert verdict.ok, verdict.summary()
    assert cursors(shard, entries) == cursors(expected, entries)
    assert all(c is not None for c in cursors(shard, entries).values())
    shard.close()
    expected.close()


def test_tombstones_are_skipped_and_not_counted(entries, tmp_path):
    shard = make_store("server", tmp_path, DIM)
    job = Restore(shard, None, empty=True)
    recs = records(entries[:20])
    job.on_changes([Rec(None, 0), *recs, Rec(None, 99)])
    job.finish()
    assert job.changes == 20
    expected = make_store("server", tmp_path / "e", DIM)
    rebuild(expected, entries[:20])
    assert checksum.compare(digests(expected), digests(shard)).ok


def test_a_caught_up_shard_replays_an_overlap_idempotently(entries, tmp_path):
    mid = len(entries) // 2
    shard = make_store("edge", tmp_path / "shard", DIM)
    rebuild(shard, entries[:mid])  # what the checkpointed shard holds
    job = Restore(shard, None, empty=False)
    assert job.fold is None
    job.on_changes(records(entries[mid // 2:], first=mid // 2))  # from an earlier offset
    job.finish()
    assert job.changes == len(entries) - mid // 2
    expected = make_store("edge", tmp_path / "expected", DIM)
    rebuild(expected, entries)
    verdict = checksum.compare(digests(expected), digests(shard))
    assert verdict.ok, verdict.summary()
    assert cursors(shard, entries) == cursors(expected, entries)
    shard.close()
    expected.close()


def test_the_whole_log_replayed_onto_a_full_shard_changes_nothing(entries, tmp_path):
    shard = make_store("server", tmp_path, DIM)
    rebuild(shard, entries)
    before = digests(shard)
    job = Restore(shard, None, empty=False)
    job.on_changes(records(entries))
    job.finish()
    assert checksum.compare(before, digests(shard)).ok


@pytest.mark.parametrize("empty", [True, False])
def test_a_change_the_opener_cannot_open_is_not_restored(entries, tmp_path, empty):
    gone = entries[0].user_id
    shard = make_store("server", tmp_path, DIM)
    job = Restore(shard, lambda c: None if c.user_id == gone else c, empty=empty)
    job.on_changes(records(entries))
    job.finish()
    assert shard.list(Scope(TENANT, gone), statuses=None) == []
    expected = make_store("server", tmp_path / "e", DIM)
    rebuild(expected, entries, select=lambda t, u: u != gone)
    assert checksum.compare(digests(expected), digests(shard)).ok


# --- the job results: the cursor ----------------------------------------------------------

@pytest.mark.parametrize("empty", [True, False])
def test_a_done_result_moves_the_cursor_up_only(entries, tmp_path, empty):
    shard = make_store("server", tmp_path, DIM)
    if not empty:
        rebuild(shard, entries)
    job = Restore(shard, None, empty=empty)
    if empty:
        job.on_changes(records(entries))
    user = entries[0].user_id
    top = max(c.lineage.seq for c in entries if c.user_id == user)
    job.on_results(records([job_result(user, top + 3)]))
    assert shard.cursor(Scope(TENANT, user)) != Cursor(top + 3, f"{user}-r{top + 3}")
    job.finish()  # gathered first, folded after every change
    assert shard.cursor(Scope(TENANT, user)) == Cursor(top + 3, f"{user}-r{top + 3}")
    # lower seqs, other statuses and unsequenced results never move it
    job.on_results(records([
        job_result(user, top + 1),
        job_result(user, top + 3, job_id="other"),
        job_result(user, top + 9, JobStatus.TRIVIAL),
        job_result(user, top + 9, JobStatus.FAILED),
        job_result(user, top + 9, JobStatus.FENCED),
        job_result(user, 0),
    ]))
    job.finish()
    assert shard.cursor(Scope(TENANT, user)) == Cursor(top + 3, f"{user}-r{top + 3}")


def test_results_of_a_user_without_changes_set_its_cursor_to_the_highest(tmp_path):
    shard = make_store("server", tmp_path, DIM)
    job = Restore(shard, None, empty=True)
    job.on_results([Rec(None, 0), *records([job_result("quiet", 4), job_result("quiet", 9),
                                            job_result("quiet", 6),
                                            job_result("lazy", 2, JobStatus.TRIVIAL)])])
    job.finish()
    assert shard.cursor(Scope(TENANT, "quiet")) == Cursor(9, "quiet-r9")
    assert shard.cursor(Scope(TENANT, "lazy")) is None


def test_a_record_that_is_no_result_or_hit_is_skipped_not_fatal(tmp_path):
    """Anyone who may write the results or the access topic can write junk there (the
    stages set it aside): a restore skips it; it must not stop the partition's take."""
    shard = make_store("server", tmp_path, DIM)
    job = Restore(shard, None, empty=True)
    junk = b'{"job_id": "x", "llm_calls": Infinity}'
    job.on_results([Rec(junk, 0), *records([job_result("quiet", 4)], first=1)])
    job.on_access([Rec(b"{not json", 0)])
    job.finish()
    assert shard.cursor(Scope(TENANT, "quiet")) == Cursor(4, "quiet-r4")


def test_a_result_below_the_folded_cursor_does_not_move_it_back(entries, tmp_path):
    shard = make_store("server", tmp_path, DIM)
    job = Restore(shard, None, empty=True)
    job.on_changes(records(entries))
    user = entries[-1].user_id
    top = max(c.lineage.seq for c in entries if c.user_id == user)
    last = next(c for c in reversed(entries) if c.user_id == user)
    job.on_results(records([job_result(user, top - 1), job_result(user, top)]))
    job.finish()
    assert shard.cursor(Scope(TENANT, user)) == Cursor(top, last.lineage.job_id)
    # the fold was finished before the results: its records are in the shard
    expected = make_store("server", tmp_path / "e", DIM)
    rebuild(expected, entries)
    assert checksum.compare(digests(expected), digests(shard)).ok


# --- the access topic, and forget-me -------------------------------------------------------

@pytest.mark.parametrize("empty", [True, False])
def test_hits_are_folded_but_not_those_before_a_forget_me(entries, tmp_path, empty):
    erase = next(c for c in entries if c.op == "erase")
    at = entries.index(erase)
    user = erase.user_id
    kept = next(c for c in entries[at:] if c.user_id == user and c.op == "add")
    other = next(c for c in entries if c.user_id != user and c.op == "add")
    t = erase.decided_at.timestamp()
    events = [hit(1, user, kept.memory_id, t - 5), hit(2, user, kept.memory_id, t + 5),
              hit(3, other.user_id, other.memory_id, t - 5),
              hit(2, user, kept.memory_id, t + 5)]  # delivered twice: counted once
    shard = make_store("server", tmp_path, DIM)
    if not empty:
        rebuild(shard, entries[:at])  # the forget-me is in the part replayed now
    job = Restore(shard, None, empty=empty)
    job.on_changes(records(entries if empty else entries[at:]))
    job.on_results([])
    job.on_access([*records(events), Rec(None, 9)])
    job.finish()
    assert job.erased[(TENANT, user)] == t
    mine = shard.access_stats(Scope(TENANT, user), [kept.memory_id])[kept.memory_id]
    assert mine.access_count == 1 and mine.last_accessed_at == t + 5
    theirs = shard.access_stats(Scope(TENANT, other.user_id), [other.memory_id])
    assert theirs[other.memory_id].access_count == 1
    expected = make_store("server", tmp_path / "e", DIM)
    rebuild(expected, entries, events)
    verdict = checksum.compare(digests(expected), digests(shard))
    assert verdict.ok, verdict.summary()
    assert job.accesses == []


# --- restore(): the three topics in order, the ends ---------------------------------------

async def test_restore_reads_changes_then_results_then_hits_and_returns_the_ends(
        entries, tmp_path, monkeypatch):
    topics = ["changes", "results", "access"]
    user = entries[0].user_id
    top = max(c.lineage.seq for c in entries if c.user_id == user)
    logs = {"changes": records(entries), "results": records([job_result(user, top + 2)]),
            "access": []}
    calls: list[tuple[str, int, int | None]] = []

    async def fake_read_ranges(settings, tps, handle, *, start=None):
        read = 0
        for tp in tps:  # one reader for the three topics
            first = (start or {}).get(tp)
            calls.append((tp.topic, tp.partition, first))
            todo = [r for r in logs[tp.topic] if r.offset >= (first or 0)]
            for i in range(0, len(todo), 40):
                await handle(tp, todo[i:i + 40])
            read += len(todo)
        return read

    monkeypatch.setattr(shard_restore, "read_ranges", fake_read_ranges)
    shard = make_store("server", tmp_path, DIM)
    ends, folded = await restore(None, topics, 3, shard, None, None)
    assert calls == [("changes", 3, None), ("results", 3, None), ("access", 3, None)]
    assert ends == {"changes": len(entries), "results": 1, "access": 0}
    assert folded.changes == len(entries)
    assert shard.cursor(Scope(TENANT, user)) == Cursor(top + 2, f"{user}-r{top + 2}")
    expected = make_store("server", tmp_path / "e", DIM)
    rebuild(expected, entries)
    assert checksum.compare(digests(expected), digests(shard)).ok

    calls.clear()  # caught up from a checkpoint: only the tail, onto the shard as it is
    ends2, folded2 = await restore(None, topics, 3, shard, None,
                                   {"changes": len(entries) - 10, "results": 1, "access": 0})
    assert calls == [("changes", 3, len(entries) - 10), ("results", 3, 1),
                     ("access", 3, 0)]
    assert ends2 == {"changes": len(entries), "results": 1, "access": 0}
    assert folded2.changes == 10
    assert checksum.compare(digests(expected), digests(shard)).ok


async def test_a_result_read_before_its_changes_never_makes_them_skipped(
        entries, tmp_path, monkeypatch):
    """The three topics come interleaved (one reader): a job's result may be read before its
    changes. Its cursor is folded after every change, so no change is skipped as old."""
    topics = ["changes", "results", "access"]
    half = len(entries) // 2
    tail = entries[half:]
    results = records([job_result(c.user_id, c.lineage.seq) for c in tail if c.lineage.seq])

    async def results_first(settings, tps, handle, *, start=None):
        by_topic = {tp.topic: tp for tp in tps}
        await handle(by_topic["results"], results)
        await handle(by_topic["changes"], records(entries)[half:])
        return len(results) + len(tail)

    monkeypatch.setattr(shard_restore, "read_ranges", results_first)
    shard = make_store("server", tmp_path, DIM)
    rebuild(shard, entries[:half])
    await restore(None, topics, 0, shard, None, {"changes": half, "results": 0, "access": 0})
    expected = make_store("server", tmp_path / "e", DIM)
    rebuild(expected, entries)
    verdict = checksum.compare(digests(expected), digests(shard))
    assert verdict.ok, verdict.summary()


async def test_a_standby_keeps_its_cursors_gathered_until_handed_over(entries, tmp_path,
                                                                      monkeypatch):
    topics = ["changes", "results", "access"]
    user = entries[0].user_id
    top = max(c.lineage.seq for c in entries if c.user_id == user)

    async def read(settings, tps, handle, *, start=None):
        by_topic = {tp.topic: tp for tp in tps}
        await handle(by_topic["changes"], records(entries))
        await handle(by_topic["results"], records([job_result(user, top + 5)]))
        return len(entries) + 1

    monkeypatch.setattr(shard_restore, "read_ranges", read)
    shard = make_store("server", tmp_path, DIM)
    _, job = await restore(None, topics, 0, shard, None, None, fold_cursors=False)
    assert shard.cursor(Scope(TENANT, user)) == Cursor(top, shard.cursor(
        Scope(TENANT, user)).job_id)  # from its changes only
    assert job.cursors[(TENANT, user)] == Cursor(top + 5, f"{user}-r{top + 5}")


# --- checkpoint files ----------------------------------------------------------------------

CR = ["changes", "results"]  # the topics a shard's checkpoint names


def test_a_checkpoint_round_trips_within_the_erasure_bound(tmp_path):
    files = ShardFiles(tmp_path, erasure_bound_s=100.0)
    assert files.checkpoint(3, 0.0, CR) is None
    files.write_checkpoint(3, {"changes": 42, "results": 7}, now=1000.0)
    assert files.checkpoint(3, 1000.0, CR) == {"changes": 42, "results": 7}
    assert files.checkpoint(3, 1100.0, CR) == {"changes": 42, "results": 7}  # at the bound
    assert files.checkpoint(3, 1100.5, CR) is None  # older than the bound: restored anew
    assert files.checkpoint(4, 1000.0, CR) is None  # another partition's
    assert files.checkpoint("3", 1000.0, CR) == {"changes": 42, "results": 7}
    # the same partition of another topic set (after `memstream topics grow`): anew
    assert files.checkpoint(3, 1000.0, ["other.changes", "other.results"]) is None
    assert files.checkpoint(3, 1000.0, ["changes"]) is None
    assert files.path(3) == tmp_path / "3"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["3.checkpoint.json"]
    assert json.loads((tmp_path / "3.checkpoint.json").read_text())["at"] == 1000.0


def test_a_broken_checkpoint_is_none(tmp_path):
    files = ShardFiles(tmp_path, erasure_bound_s=100.0)
    for text in ("", "not json", "{}", "null", "[]", '{"at": 1.0}', '{"offsets": {"a": 1}}',
                 '{"offsets": {"a": "x"}, "at": 1.0}', '{"offsets": {"a": 1}, "at": "x"}'):
        (tmp_path / "5.checkpoint.json").write_text(text)
        assert files.checkpoint(5, 1.0, ["a"]) is None, text


@pytest.mark.parametrize("offsets", ["3", "[1, 2]", "null"])
def test_a_checkpoint_whose_offsets_are_not_a_mapping_is_none(tmp_path, offsets):
    files = ShardFiles(tmp_path, erasure_bound_s=100.0)
    (tmp_path / "5.checkpoint.json").write_text(f'{{"offsets": {offsets}, "at": 1.0}}')
    assert files.checkpoint(5, 1.0, ["a"]) is None


def test_wipe_removes_the_shard_and_its_checkpoint(tmp_path):
    files = ShardFiles(tmp_path, erasure_bound_s=100.0)
    shard = make_store("edge", files.path(2), DIM)
    shard.close()
    (files.path(2) / "extra").write_text("x")
    files.write_checkpoint(2, {"changes": 1}, now=0.0)
    files.write_checkpoint(7, {"changes": 9}, now=0.0)
    files.wipe(2)
    assert not files.path(2).exists()
    assert files.checkpoint(2, 0.0, ["changes"]) is None
    assert files.checkpoint(7, 0.0, ["changes"]) == {"changes": 9}  # another partition's stays
    files.wipe(2)  # nothing left: no error
    files.drop_checkpoint(7)
    assert files.checkpoint(7, 0.0, ["changes"]) is None
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_the_quickest_takes_come_first(tmp_path):
    """A warm standby (its tail), then a clean checkpoint (the tail since it), then a full
    restore; a checkpoint past the erasure bound counts as none."""
    from types import SimpleNamespace

    from memstream.memory.store.partitioned import PartitionedStore
    from memstream.streams.shards import ShardKeeper

    store = PartitionedStore(lambda tenant, user: 0)
    store.standby[7] = make_store("server", None, DIM)
    settings = SimpleNamespace(data_dir=tmp_path, erasure_bound_s=100.0)
    keeper = ShardKeeper(settings, store, lambda path: None, ["changes"], lambda: None,  # type: ignore[arg-type]
                         clock=lambda: 1000.0)
    (tmp_path / "store").mkdir()
    keeper.files.write_checkpoint(5, {"changes": 1}, now=990.0)
    keeper.files.write_checkpoint(1, {"changes": 1}, now=800.0)  # too old
    assert keeper.order({1, 3, 5, 7}) == [7, 5, 1, 3]


async def test_a_partition_handed_over_stays_requested_for_when_it_is_given_up_again(
        tmp_path):
    """A take that a rebalance overtakes gives the partition up again: the map still names
    this worker its standby, so it is followed again (it was dropped from the request)."""
    from memstream.memory.store.partitioned import PartitionedStore
    from memstream.streams.standby import Standbys

    store = PartitionedStore(lambda tenant, user: 0)
    files = ShardFiles(tmp_path, erasure_bound_s=100.0)
    standbys = Standbys(None, store, lambda path: None, [], lambda: None, files)  # type: ignore[arg-type]
    standbys.refresh = lambda: None  # type: ignore[method-assign]  # no task here
    standbys.want({3, 4})
    busy: set[int] = {3}
    standbys.busy = lambda: busy
    assert await standbys.hand_over(3) is None  # no warm copy: the keeper restores it
    assert standbys.wanted == {4}  # being taken
    busy.clear()
    assert standbys.wanted == {3, 4}  # given up again: followed again


def _keeper_with_standbys(tmp_path, requested: set[int]):
    from types import SimpleNamespace

    from memstream.memory.store.partitioned import PartitionedStore
    from memstream.streams.shards import ShardKeeper
    from memstream.streams.standby import Standbys

    store = PartitionedStore(lambda tenant, user: 0)
    settings = SimpleNamespace(data_dir=tmp_path, erasure_bound_s=100.0)
    topics = ["changes", "results", "access"]
    keeper = ShardKeeper(settings, store, lambda path: None, topics, lambda: None)  # type: ignore[arg-type]
    standbys = Standbys(settings, store, lambda path: None, topics, lambda: None, keeper.files)
    standbys.refresh = lambda: None  # type: ignore[method-assign]  # no task here
    standbys.want(requested)
    keeper.standbys = standbys
    return keeper, standbys, store


@pytest.mark.parametrize("requested", [True, False])
async def test_a_shard_given_up_stays_as_the_standby_the_map_names_or_is_wiped(
        tmp_path, monkeypatch, requested):
    """Kept: followed from what it holds (the restore's ends, then its own committed
    writes; the hits from the access topic's end); not a standby here: closed, deleted."""
    keeper, standbys, store = _keeper_with_standbys(tmp_path, {3} if requested else set())
    (tmp_path / "store").mkdir()
    shard = make_store("edge", keeper.files.path(3), DIM)
    store.owned[3] = shard
    keeper.held[3] = {"changes": 40, "results": 7, "access": 2}  # the restore's ends
    keeper.wrote(3, {"changes": 45, "results": 9, "global": 1})  # a transaction of its own
    keeper.wrote(4, {"changes": 99})  # not a shard of ours

    async def ends(settings, topics):
        assert topics == ["access"]
        return {"access": {3: 11}}

    monkeypatch.setattr(shards_module, "end_offsets", ends)
    await keeper.release({3})
    assert 3 not in store.owned and 3 not in keeper.held
    if requested:
        assert store.standby[3] is shard and not standbys.behind[3]
        assert standbys.offsets[3] == {"changes": 45, "results": 9, "access": 11}
        assert standbys.durable[3] == 9 and standbys.cursors[3] == {}
        assert keeper.files.path(3).exists()
        shard.close()
    else:
        assert 3 not in store.standby and not keeper.files.path(3).exists()


async def test_a_shard_given_up_when_the_ends_cannot_be_read_is_wiped(tmp_path, monkeypatch):
    keeper, _, store = _keeper_with_standbys(tmp_path, {3})
    (tmp_path / "store").mkdir()
    store.owned[3] = make_store("edge", keeper.files.path(3), DIM)
    keeper.held[3] = {"changes": 40, "results": 7, "access": 2}

    async def away(settings, topics):
        raise ConnectionError("broker away")

    monkeypatch.setattr(shards_module, "end_offsets", away)
    await keeper.release({3})
    assert 3 not in store.standby and not keeper.files.path(3).exists()


async def test_a_shard_given_up_whose_close_fails_is_wiped_and_the_take_goes_on(tmp_path):
    """Its files are deleted next, so a close that fails (a flush of the engine: seen in a
    3-worker chaos run) must not end the worker (it used to: exit 70)."""
    keeper, _, store = _keeper_with_standbys(tmp_path, set())
    (tmp_path / "store").mkdir()
    shard = make_store("edge", keeper.files.path(3), DIM)
    real_close = shard.close

    def failing() -> None:
        real_close()
        raise Exception  # what the engine raised: no message

    shard.close = failing  # type: ignore[method-assign]
    store.owned[3] = shard
    await keeper.release({3})
    assert 3 not in store.owned and not keeper.files.path(3).exists()


@pytest.mark.parametrize("broker", ["up", "away"])
async def test_the_shutdown_checkpoint_names_what_the_shard_holds_not_the_topics_ends(
        tmp_path, monkeypatch, broker):
    """A stop that outlasted the session: a new owner may have written past what this
    shard holds; the checkpoint must not claim its records (they would be skipped). Only
    the hits come from the topic's end; with the broker away no checkpoint is written."""
    keeper, _, store = _keeper_with_standbys(tmp_path, set())
    (tmp_path / "store").mkdir()
    store.owned[3] = make_store("edge", keeper.files.path(3), DIM)
    store.owned[5] = make_store("edge", keeper.files.path(5), DIM)
    keeper.held[3] = {"changes": 40, "results": 7, "access": 2}
    keeper.wrote(3, {"changes": 45})

    async def ends(settings, topics):
        if broker == "away":
            raise ConnectionError("broker away")
        # the topics' ends now (a new owner wrote): only the hits' may be taken
        every = {"changes": {3: 90, 5: 90}, "results": {3: 80, 5: 80}, "access": {3: 70, 5: 70}}
        return {t: every[t] for t in topics}

    monkeypatch.setattr(shards_module, "end_offsets", ends)
    await keeper.close()
    if broker == "up":
        assert keeper.files.checkpoint(3, keeper.clock(), keeper.topics) == {
            "changes": 45, "results": 7, "access": 70}
    else:
        # restored in full
        assert keeper.files.checkpoint(3, keeper.clock(), keeper.topics) is None
    # what it holds is unknown
    assert keeper.files.checkpoint(5, keeper.clock(), keeper.topics) is None
    assert not store.owned


async def test_a_hand_over_of_a_partition_without_a_copy_does_not_wait_for_others(tmp_path):
    """The standbys' lock is held through a whole restore of another partition: a take
    whose partition has no copy here goes on at once (it is marked busy: never opened)."""
    import asyncio

    _, standbys, _ = _keeper_with_standbys(tmp_path, {3, 4})
    async with standbys.lock:  # partition 4's standby restore, say
        standbys.opening = 4
        assert await asyncio.wait_for(standbys.hand_over(3), 1.0) is None
        waiting = asyncio.ensure_future(standbys.hand_over(4))  # the one being restored
        await asyncio.sleep(0.05)
        assert not waiting.done()  # waits for that restore to end
        standbys.opening = None
    assert await waiting is None


def _lone_keeper(tmp_path, open_shard):
    """A keeper of topics changes/results/access with no standbys, every user in
    partition 0's map, a full restore of 20 changes or more built by a builder."""
    from types import SimpleNamespace

    from memstream.memory.store.partitioned import PartitionedStore
    from memstream.streams.shards import ShardKeeper

    store = PartitionedStore(lambda tenant, user: 0)
    settings = SimpleNamespace(data_dir=tmp_path, erasure_bound_s=100.0,
                               restore_in_process_below=20)

    async def no_opener():
        return None

    keeper = ShardKeeper(settings, store, open_shard,  # type: ignore[arg-type]
                         ["changes", "results", "access"], no_opener)
    return keeper, store


@pytest.mark.parametrize("log_length, builder", [(50, "ok"), (10, "ok"), (50, "fails")])
async def test_a_long_full_restore_is_built_by_a_builder_then_caught_up_here(
        tmp_path, monkeypatch, log_length, builder):
    """No warm copy, no checkpoint: a change log of at least ``restore_in_process_below``
    records goes to a builder process, and the take catches the shard it built up from the
    offsets it holds; a shorter log, or a builder that fails (its leftovers wiped), is
    restored here from the beginning."""
    from types import SimpleNamespace

    from memstream.streams.shard_builders import BuilderFailed, Rebuilt

    topics = ["changes", "results", "access"]
    opened: list = []

    def open_shard(path):
        opened.append(path)
        # a failed builder's leftovers are wiped before the restore here
        assert (path / "left").exists() == (builder == "ok" and log_length >= 20)
        return make_store("edge", path, DIM)

    keeper, store = _lone_keeper(tmp_path, open_shard)
    built: list[int] = []

    class Builders:
        async def build(self, partition, root):
            built.append(partition)
            assert root == keeper.files.root
            make_store("edge", root / str(partition), DIM).close()  # what a builder leaves
            (root / str(partition) / "left").write_text("")
            if builder == "fails":
                raise BuilderFailed("the builder of partition 4 died")
            return Rebuilt(partition, root / str(partition),
                           {"changes": 50, "results": 6, "access": 3}, 48, None)

    keeper.builders = Builders()  # type: ignore[assignment]

    async def ends(settings_, wanted):
        assert wanted == ["changes"]
        return {"changes": {4: log_length}}

    restores: list = []

    async def fake_restore(settings_, topics_, partition, shard, opener, start, **kw):
        restores.append(start)
        return {"changes": 52, "results": 6, "access": 3}, SimpleNamespace(changes=2)

    monkeypatch.setattr(shards_module, "end_offsets", ends)
    monkeypatch.setattr(shards_module, "restore", fake_restore)
    (tmp_path / "store").mkdir()
    keeper.files.write_checkpoint(4, {"changes": 1}, now=-1000.0)  # past the bound: none
    await keeper.take({4})
    assert opened == [keeper.files.path(4)] and 4 in store.owned
    if log_length >= 20 and builder == "ok":
        assert built == [4] and restores == [{"changes": 50, "results": 6, "access": 3}]
        assert keeper.restores[-1][:2] == (4, 50)  # the builder's 48 and the tail's 2
    else:
        assert built == ([4] if log_length >= 20 else []) and restores == [None]
        assert keeper.restores[-1][:2] == (4, 2)
    assert keeper.held[4] == {"changes": 52, "results": 6, "access": 3}
    assert keeper.files.checkpoint(4, 0.0, topics) is None  # open: no clean copy
    store.owned.pop(4).close()


def test_a_wipe_takes_a_builders_unfinished_copy_too(tmp_path):
    """A worker killed while a builder built partition 3 leaves ``3.build``: the next take's
    wipe removes it with the shard (no copy of users' memories out of forget-me's reach)."""
    from memstream.streams.shard_builders import STAGING_SUFFIX

    files = ShardFiles(tmp_path, erasure_bound_s=100.0)
    for name in ("3", f"3{STAGING_SUFFIX}", "4", f"4{STAGING_SUFFIX}"):
        (tmp_path / name / "shard").mkdir(parents=True)
    files.wipe(3)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["4", f"4{STAGING_SUFFIX}"]


@pytest.mark.parametrize("warm", [False, True])
async def test_a_take_that_fails_half_way_leaves_nothing_behind(tmp_path, monkeypatch, warm):
    """The broker goes away during the restore: the shard the take opened (or was handed
    by its standby) is closed and wiped, the partition neither owned nor restoring; the
    next take restores it anew from the beginning."""
    from types import SimpleNamespace

    topics = ["changes", "results", "access"]
    opened: list = []

    def open_shard(path):
        opened.append(make_store("edge", path, DIM))
        return opened[-1]

    keeper, store = _lone_keeper(tmp_path, open_shard)
    (tmp_path / "store").mkdir()
    keeper.files.write_checkpoint(4, {"changes": 3, "results": 1, "access": 0},
                                  now=keeper.clock())

    class Standbys:
        async def hand_over(self, partition):
            if not warm:
                return None
            return open_shard(keeper.files.path(partition)), {"changes": 3}, {}

    keeper.standbys = Standbys()
    starts: list = []

    async def restore_once_away(settings_, topics_, partition, shard, opener, start, **kw):
        starts.append(start)
        if len(starts) == 1:
            raise ConnectionError("broker away")
        return {"changes": 5, "results": 1, "access": 0}, SimpleNamespace(changes=5)

    monkeypatch.setattr(shards_module, "restore", restore_once_away)
    with pytest.raises(ConnectionError):
        await keeper.take({4})
    assert 4 not in store.owned and not keeper.restoring and 4 not in keeper.held
    assert not keeper.files.path(4).exists()
    assert keeper.files.checkpoint(4, keeper.clock(), topics) is None
    keeper.standbys = None
    await keeper.take({4})  # the shard closed: it opens again, from the beginning
    assert starts == [{"changes": 3} if warm else
                      {"changes": 3, "results": 1, "access": 0}, None]
    assert store.owned[4] is opened[-1] and len(opened) == 2
    store.owned.pop(4).close()
