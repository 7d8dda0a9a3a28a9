"""Under exactly-once, Faust commits offsets only after the producer flushed what the
records produced (memstream.streams.commit_order)."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest
from faust.transport.consumer import TransactionManager
from faust.types import TP

from memstream.streams.commit_order import commit_after_outputs, drain

pytestmark = pytest.mark.unit


async def test_the_producer_is_flushed_before_offsets_commit():
    calls: list[str] = []

    async def flush() -> None:
        calls.append("flush")

    async def commit_transactions(by_tid, group_id, start_new_transaction=True) -> None:
        calls.append(f"commit {sorted(by_tid)}")

    tp = TP("memstream.decisions", 3)
    app = SimpleNamespace(producer=SimpleNamespace(flush=flush), conf=SimpleNamespace(id="app"),
                          assignor=SimpleNamespace(group_for_topic=lambda topic: 0))
    manager = SimpleNamespace(app=app, producer=SimpleNamespace(
        commit_transactions=commit_transactions))
    commit_after_outputs()
    commit_after_outputs()  # idempotent: flushes once, not twice
    assert await TransactionManager.commit(manager, {tp: 10}) is True
    assert calls == ["flush", "commit ['app-0-3']"]


class SlowBuffer:
    """A producer buffer whose flush gives up early, like Faust's after 0.1 s."""

    def __init__(self, pending: int, sending: int) -> None:
        self.pending, self._memstream_sending, self.flushes = pending, sending, 0

    @property
    def size(self) -> int:
        return self.pending

    async def flush(self) -> None:
        self.flushes += 1
        self.pending = max(0, self.pending - 1)  # one message per try, then gives up


async def test_a_flush_drains_the_buffer_and_waits_for_the_record_being_handed_over():
    buffer = SlowBuffer(pending=3, sending=1)
    naps: list[float] = []

    async def sleep(s: float) -> None:
        naps.append(s)
        buffer._memstream_sending = 0  # the sender hands its record to the client

    await drain(buffer, sleep)
    assert buffer.size == 0 and buffer.flushes == 3 and len(naps) == 1


async def test_a_commit_never_falls_inside_the_handling_of_a_record():
    """The ingest writes its state, then sends the job: a commit in between would put the
    state in one transaction and the job in the next (a kill then loses the job)."""
    import asyncio

    from memstream.streams.commit_order import CommitGate

    gate = CommitGate()
    log: list[str] = []
    state_written, commit_started = asyncio.Event(), asyncio.Event()

    async def handle(name: str) -> None:
        async with gate.event():
            log.append(f"{name}: state")
            state_written.set()
            await commit_started.wait()
            await asyncio.sleep(0.01)
            log.append(f"{name}: job")

    async def commit() -> None:
        await state_written.wait()
        commit_started.set()
        async with gate.closed():
            log.append("commit")
            await asyncio.sleep(0.01)  # a record arriving now waits for the commit
            log.append("committed")

    async def late_record() -> None:
        await commit_started.wait()
        await asyncio.sleep(0.001)
        await handle("second")

    await asyncio.gather(handle("first"), commit(), late_record())
    assert log == ["first: state", "first: job", "commit", "committed",
                   "second: state", "second: job"]
    assert gate.busy == 0


async def test_overlapping_commits_reopen_the_gate_only_when_both_are_done():
    import asyncio

    from memstream.streams.commit_order import CommitGate

    gate = CommitGate()
    order: list[str] = []
    first_done = asyncio.Event()

    async def commit(name: str, hold: float) -> None:
        async with gate.closed():
            await asyncio.sleep(hold)
            order.append(f"{name} done")
            if name == "a":
                first_done.set()

    async def record() -> None:
        await first_done.wait()
        async with gate.event():
            order.append("record")

    await asyncio.gather(commit("a", 0.01), commit("b", 0.05), record())
    assert order == ["a done", "b done", "record"]


def _consumer(committed: int | None, acked: list[int], pending: list[int]):
    """Faust's bookkeeping of one partition: committed offset, acked offsets, and records
    delivered to the agents but not yet acked."""
    from collections import defaultdict

    from faust.transport.consumer import Consumer

    tp = TP("memstream.extraction-jobs", 1)
    consumer = SimpleNamespace(
        app=SimpleNamespace(consumer_generation_id=0),
        _committed_offset=defaultdict(lambda: None, {tp: committed}),
        _acked=defaultdict(list, {tp: list(acked)}),
        _acked_index=defaultdict(set, {tp: set(acked)}),
        _gap=defaultdict(lambda: None),
        _unacked_messages=[SimpleNamespace(tp=tp, offset=o, acked=False) for o in pending])
    return consumer, tp, Consumer._new_offset


@pytest.mark.parametrize(("committed", "acked", "pending", "expected"), [
    (22, [23, 24], [22], None),   # Faust alone: 25, and job 22 is skipped for good
    (None, [1, 2], [0], None),    # before the first commit Faust checks nothing
    (22, [22, 23, 24], [25], 25),  # in order: commits up to the unfinished record
    (22, [23, 24], [], 25),       # 22 was a transaction marker (never delivered)
])
def test_no_commit_passes_a_record_still_being_handled(committed, acked, pending, expected):
    commit_after_outputs()
    consumer, tp, new_offset = _consumer(committed, acked, pending)
    assert new_offset(consumer, tp) == expected


async def test_a_record_that_never_reached_an_agent_blocks_and_is_handed_over_again():
    import time

    from memstream.streams import commit_order

    commit_after_outputs()
    consumer, tp, new_offset = _consumer(1, [2, 3], [])
    delivered: list[int] = []

    async def on_message(message) -> None:
        delivered.append(message.offset)

    consumer.app = SimpleNamespace(consumer_generation_id=5,
                                   topics=SimpleNamespace(on_message=on_message))
    consumer.assignment = lambda: {tp}
    record = SimpleNamespace(tp=tp, offset=1, generation_id=5, refcount=1, tracked=True,
                             acked=False)  # counted once by the hand-over that dropped it
    fetched = commit_order._fetched_for(consumer.app)
    fetched[tp] = {1: (time.monotonic(), record, 0)}  # 2 and 3 were taken and acked
    assert new_offset(consumer, tp) is None  # Faust alone: 4, and record 1 is lost
    await asyncio.sleep(0)
    assert delivered == []  # still queued for an agent, maybe: wait
    fetched[tp][1] = (time.monotonic() - commit_order.DROPPED_AFTER_S - 1, record, 0)
    assert new_offset(consumer, tp) is None
    await asyncio.sleep(0)
    assert delivered == [1]  # handed over again
    assert (record.refcount, record.tracked) == (0, False)  # so the agent's ack is final
    assert new_offset(consumer, tp) is None  # waits behind the queue now: not again yet
    await asyncio.sleep(0)
    assert delivered == [1]
    fetched[tp].pop(1)  # taken and acked this time
    consumer._acked[tp] = [1, 2, 3]
    assert new_offset(consumer, tp) == 4
    # a record fetched before the last assignment is Faust's to read again: let go
    fetched[tp][7] = (time.monotonic() - 99, SimpleNamespace(tp=tp, offset=7,
                                                             generation_id=4), 0)
    consumer._committed_offset[tp], consumer._acked[tp] = 4, [5, 6, 8]
    assert new_offset(consumer, tp) is not None and 7 not in fetched[tp]


async def test_a_real_record_handed_over_again_is_acked_by_its_agent():
    """Faust counts one reference per hand-over: without the reset the agent's ack of a
    re-handed record is never the final one, and its partition's commits stop for good."""
    import time

    from faust.types.tuples import Message

    from memstream.streams import commit_order

    tp = TP("memstream.messages", 2)
    record = Message(tp.topic, tp.partition, 7, 0.0, 0, None, b"k", b"v", None, tp=tp,
                     generation_id=3)
    record.incref()  # the first hand-over, whose event was dropped
    handed: list[Message] = []

    async def on_message(message) -> None:
        message.incref()  # what the conductor does per subscribed stream
        handed.append(message)

    consumer, _, _ = _consumer(7, [8], [])
    consumer.app = SimpleNamespace(consumer_generation_id=3,
                                   topics=SimpleNamespace(on_message=on_message))
    consumer.assignment = lambda: {tp}
    fetched = {7: (time.monotonic() - 60, record, 0)}
    commit_order._redeliver(consumer, tp, 7, fetched)
    await asyncio.sleep(0)
    assert handed == [record]
    assert record.ack(consumer) is True  # the final ack: Faust records the offset



async def test_a_stale_copy_taken_before_a_recovery_seek_neither_holds_nor_hands_over():
    """A stream took offset 5 before the end of a recovery, then Faust sought back and
    fetched 3..5 again (new objects). The stale copy of 5 is never acked: counted as taken
    it made 3 and 4, queued behind a busy agent, look dropped (handed over twice), and it
    held the partition's commits at 5 after the new 5 was acked."""
    import time

    from memstream.streams import commit_order

    commit_after_outputs()
    consumer, tp, new_offset = _consumer(3, [], [5])
    stale = consumer._unacked_messages[0]
    delivered: list[int] = []

    async def on_message(message) -> None:
        delivered.append(message.offset)

    consumer.app = SimpleNamespace(consumer_generation_id=0,
                                   topics=SimpleNamespace(on_message=on_message))
    consumer.assignment = lambda: {tp}
    old = time.monotonic() - commit_order.DROPPED_AFTER_S - 1
    fresh = {o: SimpleNamespace(tp=tp, offset=o, generation_id=0, acked=False)
             for o in (3, 4, 5)}
    commit_order._fetched_for(consumer.app)[tp] = {o: (old, m, 0) for o, m in fresh.items()}
    assert new_offset(consumer, tp) is None  # 3 is queued: nothing to commit yet
    await asyncio.sleep(0)
    assert delivered == []  # queued, not dropped: nothing handed over again
    # the agent takes and acks the new 3, 4 and 5; the stale 5 is still "unacked"
    commit_order._fetched_for(consumer.app)[tp].clear()
    consumer._acked[tp], consumer._acked_index[tp] = [3, 4, 5], {3, 4, 5}
    assert stale in consumer._unacked_messages and not stale.acked
    assert new_offset(consumer, tp) == 6
