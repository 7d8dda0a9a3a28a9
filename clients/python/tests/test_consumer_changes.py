"""The downstream reader (memstream.consumer): commits only what the caller finished, drops
republished copies (also across a restart), filters, skips poison, lets go of revoked
partitions, opens sealed content. Against a fake aiokafka consumer: no broker."""

from __future__ import annotations

import asyncio
import logging
import time
from datetime import UTC, datetime
from types import SimpleNamespace

import pytest
from aiokafka.structs import TopicPartition

from memstream.consumer import (
    ConsumerSettings,
    ContentUnavailable,
    MemoryChanges,
    MemoryChangesSync,
    opening,
    placing,
    reading,
)
from memstream.consumer.changes import _Listener
from memstream.consumer.opening import Opener
from memstream.contract.events import (
    MEMORY_EVENTS_TOPIC,
    EventLineage,
    MemoryEvent,
    MemoryState,
    topic_name,
)
from memstream.sealing import envelope as crypto

pytestmark = pytest.mark.unit
TOPIC = topic_name("memstream", MEMORY_EVENTS_TOPIC)
TP0, TP1 = TopicPartition(TOPIC, 0), TopicPartition(TOPIC, 1)
T0 = datetime(2026, 1, 1, tzinfo=UTC)


def event(cid: str, tenant: str = "t1", user: str = "u1") -> MemoryEvent:
    after = MemoryState(version=1, content=f"fact {cid}", type="episodic", importance=5,
                        status="active", created_at=T0, updated_at=T0, valid_from=T0)
    return MemoryEvent(change_id=cid, op="add", tenant_id=tenant, user_id=user, memory_id="m1",
                       version=1, after=after, reason="new", model="rules",
                       lineage=EventLineage(kind="extraction", session_id="s", from_seq=0,
                                            to_seq=1, job_id="j"),
                       prompt_version="v1", decided_at=T0)


def ev(cid: str, **kw: str) -> bytes:
    return event(cid, **kw).dumps()


class FakeConsumer:
    """An aiokafka consumer over an in-memory log: positions, pauses, the group's offsets."""

    def __init__(self, log: dict[int, list[bytes | None]]) -> None:
        self.log = {TopicPartition(TOPIC, p): values for p, values in log.items()}
        self.assigned: set[TopicPartition] = set()
        self.paused: set[TopicPartition] = set()
        self.pos: dict[TopicPartition, int] = {}
        self.stored: dict[TopicPartition, int] = {}  # the group's committed offsets
        self.commits: list[dict[TopicPartition, int]] = []
        self.config: dict = {}
        self.listener: _Listener | None = None
        self.stopped = False
        self.read_backs: list[tuple[list, dict, dict]] = []

    def record(self, tp: TopicPartition, offset: int) -> SimpleNamespace:
        return SimpleNamespace(topic=tp.topic, partition=tp.partition, offset=offset,
                               value=self.log[tp][offset])

    async def start(self) -> None: ...
    async def stop(self) -> None: self.stopped = True
    def subscribe(self, topics, listener) -> None: self.listener = listener
    def assign(self, tps) -> None: self.assigned = set(tps)
    def assignment(self) -> set[TopicPartition]: return set(self.assigned)
    def pause(self, *tps) -> None: self.paused |= set(tps)
    def resume(self, *tps) -> None: self.paused -= set(tps)
    def seek(self, tp, offset) -> None: self.pos[tp] = offset
    def highwater(self, tp) -> int: return len(self.log[tp])
    async def committed(self, tp) -> int | None: return self.stored.get(tp)
    async def beginning_offsets(self, tps) -> dict: return {tp: 0 for tp in tps}
    async def end_offsets(self, tps) -> dict: return {tp: len(self.log[tp]) for tp in tps}

    async def commit(self, offsets) -> None:
        assert set(offsets) <= self.assigned, "committed a partition it does not hold"
        self.commits.append(dict(offsets))
        self.stored.update(offsets)

    async def getmany(self, timeout_ms: int = 0, max_records: int = 0) -> dict:
        out = {}
        for tp in sorted(self.assigned - self.paused):
            at = self.pos.get(tp, 0)
            if at < len(self.log[tp]):
                out[tp] = [self.record(tp, o) for o in range(at, len(self.log[tp]))]
                self.pos[tp] = len(self.log[tp])
        return out

    async def read_ranges(self, settings, tps, take, *, start, end, idle_timeout_s) -> None:
        """memstream.consumer.reading.read_ranges over this log."""
        self.read_backs.append((list(tps), start, end))
        for tp in tps:
            take(tp, [self.record(tp, o) for o in range(start[tp], end[tp])])

    async def partitions(self, settings, topic) -> list[TopicPartition]:
        return sorted(self.log)

    async def rebalance(self, revoked: set, assigned: set) -> None:
        assert self.listener is not None
        await self.listener.on_partitions_revoked(revoked)
        self.assigned = (self.assigned - revoked) | assigned
        await self.listener.on_partitions_assigned(assigned)


def patched(monkeypatch, log, stored=None) -> FakeConsumer:
    """reading.consumer, read_ranges and topic_partitions on the fake's log."""
    fake = FakeConsumer(log)
    fake.stored = dict(stored or {})
    monkeypatch.setattr(reading, "consumer", lambda _s, **c: fake.config.update(c) or fake)
    monkeypatch.setattr(placing, "read_ranges", fake.read_ranges)
    monkeypatch.setattr(placing, "topic_partitions", fake.partitions)
    return fake


async def started(monkeypatch, log, stored=None, **kw) -> tuple[MemoryChanges, FakeConsumer]:
    fake = patched(monkeypatch, log, stored)
    kw = {"group_id": "g", "commit_interval_s": 0.0, "idle_timeout_s": 0.0, **kw}
    reader = await MemoryChanges(ConsumerSettings(), **kw).start()
    if reader.group_id is not None:
        await fake.rebalance(set(), set(fake.log))
    return reader, fake


async def ids(reader: MemoryChanges) -> list[tuple[int, int, str]]:
    return [(e.partition, e.offset, e.change_id) async for e in reader]


async def test_an_event_is_committed_once_the_caller_comes_back_for_the_next(monkeypatch):
    reader, fake = await started(monkeypatch, {0: [ev("a"), ev("b")], 1: [ev("c")]})
    assert fake.config["isolation_level"] == "read_committed"
    assert fake.config["enable_auto_commit"] is False
    a = await anext(reader)
    assert (a.partition, a.offset, a.content, a.readable) == (0, 0, "plain", True)
    await reader.commit()  # a timer or a rebalance while the handler runs
    assert fake.commits == []
    assert (await anext(reader)).change_id == "b"
    assert fake.commits == [{TP0: 1}]
    assert (await anext(reader)).change_id == "c"
    assert fake.stored == {TP0: 2}  # c is in the caller's hands: partition 1 not yet
    with pytest.raises(StopAsyncIteration):
        await anext(reader)
    assert fake.stored == {TP0: 2, TP1: 1}
    await reader.stop()
    assert fake.stopped and len(fake.commits) == 3  # nothing new to commit on close


async def test_stop_commits_the_event_the_caller_finished_last(monkeypatch):
    reader, fake = await started(monkeypatch, {0: [ev("a"), ev("b")]})
    await anext(reader)
    await reader.stop()
    assert fake.stored == {TP0: 1}


async def test_a_handler_that_raises_leaves_its_event_uncommitted(monkeypatch):
    fake = patched(monkeypatch, {0: [ev("a"), ev("b"), ev("c")]})
    with pytest.raises(RuntimeError):
        async with MemoryChanges(ConsumerSettings(), group_id="g", commit_interval_s=60) as reader:
            await fake.rebalance(set(), {TP0})
            async for e in reader:
                if e.change_id == "b":
                    raise RuntimeError("handler failed")
    assert fake.stored == {TP0: 1} and fake.stopped  # a done, b delivered again


async def test_republished_copies_are_dropped_per_partition(monkeypatch):
    log = {0: [ev("c1"), ev("c2"), ev("c1")], 1: [ev("c1")]}
    reader, fake = await started(monkeypatch, log)
    assert await ids(reader) == [(0, 0, "c1"), (0, 1, "c2"), (1, 0, "c1")]
    assert (reader.stats.duplicates, reader.stats.delivered) == (1, 3)
    assert fake.stored == {TP0: 3, TP1: 1}  # the dropped copy is behind the offset too


@pytest.mark.parametrize(("window", "expected"), [
    (20, [(0, 3, "c3"), (0, 5, "c4"), (1, 2, "c5")]),  # c1@4 is a copy of c1@0, read back
    (2, [(0, 3, "c3"), (0, 4, "c1"), (0, 5, "c4"), (1, 2, "c5")]),  # c1@0: out of the window
])
async def test_the_window_is_read_back_before_the_start(monkeypatch, window, expected):
    log = {0: [ev("c1"), ev("c2"), b"junk", ev("c3"), ev("c1"), ev("c4")],
           1: [ev("c1"), ev("c1"), ev("c5")]}  # c1@1: a copy of c1@0, read back
    reader, fake = await started(monkeypatch, log, start_at=lambda p: 3 if p == 0 else 1,
                                 dedup_window=window)
    assert await ids(reader) == expected
    [(tps, begin, end)] = fake.read_backs  # both partitions in one read
    assert sorted(tps) == [TP0, TP1] and end == {TP0: 3, TP1: 1}
    assert begin == {TP0: 3 - min(window, 3), TP1: 0}
    assert reader.stats.duplicates == (window > 3) + 1


@pytest.mark.parametrize(("given", "first"), [(3, 3), (None, 1)])
async def test_start_at_overrides_the_committed_offset(monkeypatch, given, first):
    log = {0: [ev(f"c{i}") for i in range(5)]}
    reader, fake = await started(monkeypatch, log, start_at=lambda p: given, stored={TP0: 1})
    assert (await anext(reader)).offset == first
    assert fake.read_backs == [([TP0], {TP0: 0}, {TP0: first})]


async def test_without_a_committed_offset_a_new_group_may_start_at_the_end(monkeypatch):
    reader, fake = await started(monkeypatch, {0: [ev("a")]}, from_beginning=False)
    assert await ids(reader) == [] and fake.pos == {TP0: 1}


async def test_other_tenants_and_users_are_skipped_but_passed(monkeypatch):
    log = {0: [ev("a"), ev("b", tenant="t2"), ev("c", user="u2"), ev("d")]}
    reader, fake = await started(monkeypatch, log, tenant="t1", user="u1")
    assert await ids(reader) == [(0, 0, "a"), (0, 3, "d")]
    assert reader.stats.filtered == 2 and fake.stored == {TP0: 4}
    with pytest.raises(ValueError):
        MemoryChanges(ConsumerSettings(), group_id="g", user="u1")


async def test_an_invalid_record_is_logged_counted_and_passed(monkeypatch, caplog):
    log = {0: [b"not json", b'{"change_id": "x"}', None, ev("a")]}
    reader, fake = await started(monkeypatch, log)
    with caplog.at_level(logging.ERROR, logger="memstream.consumer.changes"):
        assert await ids(reader) == [(0, 3, "a")]
    assert reader.stats.invalid == 3 and fake.stored == {TP0: 4}
    assert len(caplog.records) == 3
    for offset, r in enumerate(caplog.records):
        assert f"{TOPIC}/0@{offset}: not a memory event" in r.getMessage()


async def test_a_revoked_partition_takes_its_in_flight_and_buffered_events(monkeypatch):
    reader, fake = await started(monkeypatch, {0: [ev("a"), ev("b")], 1: [ev("c")]})
    assert (await anext(reader)).change_id == "a"
    await fake.rebalance({TP0}, {TP0})  # the group takes it and gives it back meanwhile
    # a was not finished when the partition went: not committed then; read again from the
    # group's offset, it is known here (its handler finishes as the caller comes back)
    assert await ids(reader) == [(1, 0, "c"), (0, 1, "b")]
    assert reader.stats.duplicates == 1 and fake.read_backs[1:] == []  # nothing re-read
    assert fake.commits[0] == {TP1: 1} and fake.stored == {TP0: 2, TP1: 1}


async def test_a_partition_revoked_for_good_is_read_again_by_its_next_owner(monkeypatch):
    reader, fake = await started(monkeypatch, {0: [ev("a"), ev("b")]})
    assert (await anext(reader)).change_id == "a"
    await fake.rebalance({TP0}, set())
    assert await ids(reader) == [] and fake.stored == {}  # a is not committed: the next
    other, _ = await started(monkeypatch, {0: fake.log[TP0]})  # reader gets it
    assert await ids(other) == [(0, 0, "a"), (0, 1, "b")]


async def test_a_revoked_partition_is_not_read_or_committed_any_more(monkeypatch):
    reader, fake = await started(monkeypatch, {0: [ev("a"), ev("b")], 1: [ev("c")]})
    assert (await anext(reader)).change_id == "a"
    await fake.rebalance({TP0}, set())
    assert await ids(reader) == [(1, 0, "c")]
    assert fake.stored == {TP1: 1}


async def test_the_idle_timeout_ends_the_iteration(monkeypatch):
    reader, _ = await started(monkeypatch, {0: [ev("a")]}, idle_timeout_s=0.2)
    began = time.monotonic()
    assert await ids(reader) == [(0, 0, "a")]
    assert 0.2 <= time.monotonic() - began < 5


async def test_sealed_events_without_a_master_key_arrive_with_ids_only(monkeypatch):
    sealed = crypto.seal_event(event("a"), "k1", crypto.new_data_key()).dumps()
    reader, _ = await started(monkeypatch, {0: [sealed]})
    e = await anext(reader)
    assert (e.change_id, e.content, e.readable, e.after) == ("a", "sealed", False, None)


def test_the_sync_reader_without_a_group_reads_every_partition(monkeypatch):
    fake = patched(monkeypatch, {0: [ev("a")], 1: [ev("b"), ev("a")]})
    with MemoryChangesSync(ConsumerSettings(), group_id=None, idle_timeout_s=0.0) as changes:
        got = [(e.partition, e.change_id) for e in changes]
        assert changes.stats.delivered == 3
    assert got == [(0, "a"), (1, "b"), (1, "a")] and fake.commits == [] and fake.stopped


# --- opening sealed content -------------------------------------------------------------

class FakeKeys:
    """The user-keys view: t1/u1's keys (from the ``late``-th look on), when forgotten."""

    ready = True
    rejected = 0

    def __init__(self, keys: dict[str, bytes], forgotten: float | None = None,
                 late: int = 0) -> None:
        self.keys, self.forgotten, self.late = keys, forgotten, late

    def keys_of(self, tenant: str, user: str) -> dict[str, bytes]:
        self.late -= 1
        return self.keys if (tenant, user) == ("t1", "u1") and self.late < 0 else {}

    def forgotten_at(self, tenant: str, user: str) -> float | None:
        return self.forgotten

    def opens(self, tenant: str) -> bool:
        return True

    def locked(self, tenant: str, user: str, key_id: str) -> bool:
        return False


def opener(keys: FakeKeys | None = None, require: bool = False) -> Opener:
    o = Opener(ConsumerSettings(), "keys", require_content=require)
    o._keys = keys  # type: ignore[assignment]
    return o


async def test_plain_and_sealed_without_a_key_warn_once(caplog):
    key = crypto.new_data_key()
    o = opener()
    assert await o.open(event("a")) == (event("a"), "plain")
    sealed = crypto.seal_event(event("b"), "k1", key)
    with caplog.at_level(logging.WARNING, logger="memstream.consumer.opening"):
        assert await o.open(sealed) == (sealed, "sealed")
        assert await o.open(sealed) == (sealed, "sealed")
    assert len(caplog.records) == 1 and "no master key" in caplog.records[0].getMessage()
    with pytest.raises(ContentUnavailable):
        await opener(require=True).open(sealed)


async def test_a_held_key_opens_and_a_forgotten_users_events_are_shredded(monkeypatch):
    key = crypto.new_data_key()
    sealed = crypto.seal_event(event("a"), "k1", key)
    assert await opener(FakeKeys({"k1": key})).open(sealed) == (event("a"), "opened")
    after_it = T0.timestamp() + 60  # forgotten after the event: its key is shredded
    forgotten = opener(FakeKeys({}, forgotten=after_it)).open(sealed)  # no wait for a key
    assert await asyncio.wait_for(forgotten, opening.KEY_WAIT_S / 4) == (sealed, "shredded")
    monkeypatch.setattr(opening, "KEY_WAIT_S", 0.3)
    with pytest.raises(ContentUnavailable, match="not forgotten"):  # never guessed shredded
        await opener(FakeKeys({})).open(sealed)
    late = FakeKeys({"k1": key}, forgotten=T0.timestamp() - 60, late=1)  # came back: new key
    assert await opener(late).open(sealed) == (event("a"), "opened")


async def test_another_tenants_events_stay_sealed_with_read_keys_never_an_error(caplog):
    class OtherTenant(FakeKeys):  # read keys for t1 only
        def opens(self, tenant: str) -> bool:
            return tenant == "t1"

    key = crypto.new_data_key()
    mine = crypto.seal_event(event("a"), "k1", key)
    theirs = crypto.seal_event(event("b", tenant="t2"), "k9", crypto.new_data_key())
    o = opener(OtherTenant({"k1": key}), require=True)
    assert await o.open(mine) == (event("a"), "opened")
    with caplog.at_level(logging.WARNING, logger="memstream.consumer.opening"):
        assert await asyncio.wait_for(o.open(theirs), 1.0) == (theirs, "sealed")
        assert await o.open(theirs) == (theirs, "sealed")
    assert len(caplog.records) == 1 and "t2" in caplog.records[0].getMessage()


# --- faults while reading: nothing lost, nothing stuck ----------------------------------

async def test_a_sealed_event_that_does_not_open_is_skipped_as_invalid(monkeypatch):
    key, other = crypto.new_data_key(), crypto.new_data_key()
    bad = crypto.seal_event(event("a"), "k1", other).dumps()  # sealed with another key
    reader, fake = await started(monkeypatch, {0: [bad, ev("b")]})
    reader._opener = opener(FakeKeys({"k1": key}))
    assert await ids(reader) == [(0, 1, "b")]
    assert reader.stats.invalid == 1 and fake.stored == {TP0: 2}


async def test_an_opener_error_keeps_the_event_for_the_next_call(monkeypatch):
    reader, fake = await started(monkeypatch, {0: [ev("a"), ev("b")]})
    real, calls = reader._opener.open, []

    async def flaky(e):
        calls.append(e.change_id)
        if len(calls) == 1:
            raise TimeoutError("the user-keys topic could not be read")
        return await real(e)

    monkeypatch.setattr(reader._opener, "open", flaky)
    with pytest.raises(TimeoutError):
        await anext(reader)
    assert await ids(reader) == [(0, 0, "a"), (0, 1, "b")]  # a again, not a duplicate
    assert reader.stats.duplicates == 0 and fake.stored == {TP0: 2}


async def test_a_partition_whose_placing_failed_is_placed_at_the_next_call(monkeypatch):
    fake = patched(monkeypatch, {0: [ev("a")]})
    reader = await MemoryChanges(ConsumerSettings(), group_id="g", idle_timeout_s=0.0).start()
    real, failures = fake.committed, [ConnectionError("coordinator away")]

    async def committed(tp):
        if failures:
            raise failures.pop()
        return await real(tp)

    monkeypatch.setattr(fake, "committed", committed)
    await fake.rebalance(set(), {TP0})
    with pytest.raises(ConnectionError):
        await anext(reader)
    assert await ids(reader) == [(0, 0, "a")] and TP0 not in fake.paused


async def test_a_master_key_that_does_not_unwrap_stops_the_reader_and_loses_nothing(
        monkeypatch):
    class WrongKek(FakeKeys):  # every key record was set aside: none unwrapped here
        rejected = 3

    monkeypatch.setattr(opening, "KEY_WAIT_S", 0.3)
    sealed = crypto.seal_event(event("a"), "k1", crypto.new_data_key()).dumps()
    reader, fake = await started(monkeypatch, {0: [sealed]})
    reader._opener = opener(WrongKek({}))
    with pytest.raises(ContentUnavailable, match="the workers' own"):
        await anext(reader)
    await reader.commit()
    assert reader.stats.invalid == 0 and fake.stored == {}  # not skipped, not committed


async def test_an_idle_reader_commits_what_its_caller_finished(monkeypatch):
    reader, fake = await started(monkeypatch, {0: [ev("a")]}, idle_timeout_s=0.3)
    assert await ids(reader) == [(0, 0, "a")]  # ends idle, without stop()
    assert fake.stored == {TP0: 1}


async def test_a_record_whose_partition_moved_while_it_was_opened_is_left_to_its_reader(
        monkeypatch):
    reader, fake = await started(monkeypatch, {0: [ev("a"), ev("b")]})
    real, moved = reader._opener.open, []

    async def slow(e):  # a key that comes late: the group rebalances meanwhile
        if not moved:
            moved.append(e.change_id)
            await fake.rebalance({TP0}, {TP0})
        return await real(e)

    monkeypatch.setattr(reader._opener, "open", slow)
    assert await ids(reader) == [(0, 0, "a"), (0, 1, "b")]  # once each, in order
    assert moved == ["a"] and fake.stored == {TP0: 2}
