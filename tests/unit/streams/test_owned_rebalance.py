"""Partitions taken outside the rebalance callback (streams/owned_rebalance.py): the callback
returns at once with the new partitions paused; the taker fences, restores and positions
each one, quickest first, and each serves as soon as it is taken; one given up while being
taken is undone; a take that fails ends the worker."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from aiokafka.errors import IllegalStateError
from aiokafka.structs import TopicPartition

from memstream.core.settings import Settings
from memstream.streams.owned_loop import OwnedLoop
from memstream.streams.stage import StageBase, Work
from tests.unit.builders import FakeProducer

pytestmark = pytest.mark.unit
TOPICS = ["in-a", "in-b"]


class Consumer:
    def __init__(self, committed: dict[TopicPartition, int]) -> None:
        self.assigned: set[TopicPartition] = set()
        self.committed_at = committed
        self.paused_tps: set[TopicPartition] = set()
        self.seeks: dict[TopicPartition, int] = {}

    def assignment(self) -> set[TopicPartition]:
        return set(self.assigned)

    def _held(self, tps: Any) -> None:
        if set(tps) - self.assigned:  # as aiokafka's subscription state
            raise IllegalStateError(f"No current assignment for {set(tps) - self.assigned}")

    def seek(self, tp: TopicPartition, offset: int) -> None:
        self._held([tp])
        self.seeks[tp] = offset

    def pause(self, *tps: TopicPartition) -> None:
        self._held(tps)
        self.paused_tps |= set(tps)

    def resume(self, *tps: TopicPartition) -> None:
        self._held(tps)
        self.paused_tps -= set(tps)

    async def committed(self, tp: TopicPartition) -> int | None:
        return self.committed_at.get(tp)

    async def beginning_offsets(self, tps: list[TopicPartition]) -> dict[TopicPartition, int]:
        return dict.fromkeys(tps, 0)


class SlowStage(StageBase):
    """A stage whose state of a partition takes until its gate opens."""

    name = "apply"
    inputs = TOPICS
    tables = ()
    max_records = 10

    def __init__(self, order: list[int] | None = None) -> None:
        self.gates: dict[int, asyncio.Event] = {}
        self.prepared: list[tuple[set[int], set[int]]] = []
        self.seen_assigned: list[set[int]] = []
        self.fail: int | None = None
        self.order = order

    def gate(self, n: int) -> asyncio.Event:
        return self.gates.setdefault(n, asyncio.Event())

    async def prepare(self, new: set[int], gone: set[int]) -> None:
        self.prepared.append((set(new), set(gone)))
        for n in new:
            if n == self.fail:
                raise RuntimeError("restore failed")
            await self.gate(n).wait()

    def take_order(self, partitions: set[int]) -> list[int]:
        if self.order is None:
            return sorted(partitions)
        return [n for n in self.order if n in partitions]

    def assigned(self, partitions: set[int]) -> None:
        self.seen_assigned.append(set(partitions))

    async def handle(self, partition: int, records: list[Any]) -> Work:
        return Work()


def tps(*parts: int) -> set[TopicPartition]:
    return {TopicPartition(t, n) for t in TOPICS for n in parts}


def make(tmp_path, stage: SlowStage) -> tuple[OwnedLoop, Consumer, list[Any], list[Any]]:
    loop = OwnedLoop(Settings(data_dir=tmp_path, embedder="hashing"), stage)  # type: ignore[arg-type]
    fatal: list[Any] = []
    loop.on_fatal = lambda reason, code=70: fatal.append(reason)
    consumer = Consumer({tp: 10 + tp.partition for tp in tps(0, 1, 2)})
    loop.consumer = consumer  # type: ignore[assignment]
    made: list[Any] = []

    async def producer(n: int) -> Any:
        made.append((n, FakeProducer()))
        return made[-1][1]

    async def no_tables(partitions: set[int]) -> None:
        return None

    loop._producer = producer  # type: ignore[method-assign]
    loop._restore = no_tables  # type: ignore[method-assign]
    return loop, consumer, fatal, made


async def assign(loop: OwnedLoop, consumer: Consumer, *parts: int) -> None:
    await loop.revoked()
    consumer.assigned = tps(*parts)
    await loop.assigned(tps(*parts))


async def until(check, timeout: float = 5.0) -> None:
    async def wait() -> None:
        while not check():
            await asyncio.sleep(0.005)
    await asyncio.wait_for(wait(), timeout)


async def test_the_callback_returns_while_the_take_waits_with_the_partition_paused(tmp_path):
    stage = SlowStage()
    loop, consumer, fatal, made = make(tmp_path, stage)
    await asyncio.wait_for(assign(loop, consumer, 0), 1.0)  # the gate is shut: no waiting
    assert loop.owned == {0} and loop.ready == set() and loop.taking == {0}
    assert consumer.paused_tps == tps(0)
    await until(lambda: made)  # the producer (the fence) comes first
    assert 0 not in loop.producers  # not installed before the take is done
    stage.gate(0).set()
    await until(lambda: loop.ready == {0})
    assert consumer.paused_tps == set() and loop.producers[0] is made[0][1]
    assert {tp: loop.next[tp] for tp in tps(0)} == {tp: 10 for tp in tps(0)}  # committed
    assert consumer.seeks == {tp: 10 for tp in tps(0)}
    assert stage.seen_assigned[-1] == {0} and not fatal


async def test_each_partition_serves_as_soon_as_it_is_taken_quickest_first(tmp_path):
    stage = SlowStage(order=[2, 0, 1])  # e.g. 2 a warm standby, 0 a checkpoint
    loop, consumer, fatal, _ = make(tmp_path, stage)
    await assign(loop, consumer, 0, 1, 2)
    stage.gate(2).set()
    await until(lambda: loop.ready == {2})
    assert consumer.paused_tps == tps(0, 1)
    stage.gate(0).set()
    await until(lambda: loop.ready == {0, 2})
    stage.gate(1).set()
    await until(lambda: loop.ready == {0, 1, 2})
    assert [new for new, _ in stage.prepared] == [{2}, {0}, {1}] and not fatal


async def test_a_partition_given_up_while_being_taken_is_undone(tmp_path):
    stage = SlowStage()
    loop, consumer, fatal, made = make(tmp_path, stage)
    await assign(loop, consumer, 0, 1)
    await until(lambda: made)
    await assign(loop, consumer, 1)  # 0 goes to another worker mid-take
    stage.gate(0).set()
    stage.gate(1).set()
    await until(lambda: loop.ready == {1})
    assert 0 not in loop.producers and 0 not in loop.taken
    assert (set(), {0}) in stage.prepared[-2:]  # its shard (say) closed again
    assert not [tp for tp in loop.next if tp.partition == 0] and not fatal


async def test_a_partition_taken_during_a_rebalance_is_positioned_by_the_assignment(tmp_path):
    stage = SlowStage()
    loop, consumer, fatal, made = make(tmp_path, stage)
    await assign(loop, consumer, 0)
    await until(lambda: made)
    await loop.revoked()  # a rebalance begins; the consumer holds nothing meanwhile
    consumer.assigned = set()
    stage.gate(0).set()
    await until(lambda: 0 in loop.taken)
    assert loop.ready == set()  # not before the assignment
    consumer.assigned = tps(0)
    consumer.seeks.clear()
    await loop.assigned(tps(0))
    assert loop.ready == {0} and consumer.seeks == {tp: 10 for tp in tps(0)} and not fatal


async def test_a_take_that_fails_ends_the_worker(tmp_path):
    stage = SlowStage()
    stage.fail = 0
    loop, consumer, fatal, made = make(tmp_path, stage)
    await assign(loop, consumer, 0)
    await until(lambda: fatal)
    assert "restore failed" in fatal[0] and loop.ready == set()
    assert made and 0 not in loop.producers  # fenced, then not installed


async def test_stop_lets_the_take_in_progress_finish_or_cancels_it(tmp_path):
    stage = SlowStage()
    loop, consumer, fatal, _ = make(tmp_path, stage)
    await assign(loop, consumer, 0)
    await loop.stop_taking(0.05)  # the gate never opens: cancelled
    assert loop.taker is not None and loop.taker.cancelled() and loop.ready == set()
    assert not fatal  # a shutdown, not a failure


async def test_no_take_outlives_a_stop_that_begins_while_several_are_in_flight(tmp_path):
    """A SIGTERM while two partitions are being taken: one take ends after the stop began,
    the other never does. The taker must not return while the other still runs (it would
    install a producer after stop() closed them all, and that producer would never stop)."""
    stage = SlowStage()
    loop, consumer, fatal, made = make(tmp_path, stage)
    await assign(loop, consumer, 0, 1)
    await until(lambda: len(made) == 2)
    loop.stopping.set()
    stage.gate(0).set()  # ends after the stop began: given up, not installed
    await loop.stop_taking(0.2)
    assert loop.taker is not None and loop.taker.done()
    assert not [t for t in asyncio.all_tasks() if t.get_name().startswith("take-")]
    assert loop.producers == {} and loop.ready == set() and not fatal
    stage.gate(1).set()  # the cancelled take cannot come back
    await asyncio.sleep(0)
    assert loop.producers == {}


async def test_a_rebalance_that_begins_while_offsets_are_read_leaves_the_seek_to_it(tmp_path):
    """aiokafka drops the assignment as a rebalance begins, before its revoke callback:
    a seek then would raise. The offsets are kept; the assignment's callback seeks."""
    stage = SlowStage()
    loop, consumer, fatal, _ = make(tmp_path, stage)
    await assign(loop, consumer, 0)
    real = consumer.committed

    async def committed_then_rebalance(tp: TopicPartition) -> int | None:
        consumer.assigned = set()  # the rebalance begins
        return await real(tp)

    consumer.committed = committed_then_rebalance  # type: ignore[method-assign]
    stage.gate(0).set()
    await until(lambda: 0 in loop.taken)
    assert not fatal and consumer.seeks == {}
    consumer.committed = real  # type: ignore[method-assign]
    await assign(loop, consumer, 0)
    assert loop.ready == {0} and consumer.seeks == {tp: 10 for tp in tps(0)} and not fatal


async def test_the_stage_learns_the_offsets_its_committed_transaction_wrote(tmp_path):
    """What the apply stage's shard holds of its own writes (kept as a standby later)."""
    from types import SimpleNamespace

    stage = SlowStage()
    seen: list[tuple[int, dict[str, int]]] = []
    stage.committed = lambda partition, offsets: seen.append((partition, offsets))  # type: ignore[attr-defined]
    outs = [("changes", b"k", b"1"), ("changes", b"k", b"2"), ("results", b"k", b"3")]

    async def handle(partition: int, records: list[Any]) -> Work:
        return Work(out=list(outs))

    stage.handle = handle  # type: ignore[method-assign]
    loop, consumer, fatal, _ = make(tmp_path, stage)
    await assign(loop, consumer, 0)
    stage.gate(0).set()
    await until(lambda: loop.ready == {0})
    tp = TopicPartition(TOPICS[0], 0)
    await loop.process({tp: [SimpleNamespace(topic=tp.topic, partition=0, offset=10,
                                             key=b"k", value=b"v", timestamp=1)]})
    await loop.process({tp: [SimpleNamespace(topic=tp.topic, partition=0, offset=11,
                                             key=b"k", value=b"v", timestamp=2)]})
    assert seen == [(0, {"changes": 2, "results": 1}), (0, {"changes": 4, "results": 2})]
    assert not fatal


async def test_a_long_take_does_not_hold_back_the_others(tmp_path):
    """Takes overlap (a few at a time): a partition restored in full does not keep a
    quick one behind it waiting."""
    stage = SlowStage(order=[0, 1])
    loop, consumer, fatal, _ = make(tmp_path, stage)
    await assign(loop, consumer, 0, 1)
    stage.gate(1).set()  # 0, first in the order, still restoring
    await until(lambda: loop.ready == {1})
    assert loop.taking == {0} and not fatal
    stage.gate(0).set()
    await until(lambda: loop.ready == {0, 1})
