"""Partitions taken outside the rebalance callback (streams/task_manager.py): the callback
returns at once with the new partitions paused; the taker fences, restores and positions
each one, quickest first, and each serves as soon as it is taken; one given up while being
taken is undone; a take that fails while the broker is away is undone and taken again,
within ``broker_wait_s``; any other failure ends the worker."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from aiokafka.errors import KafkaConnectionError, KafkaError
from aiokafka.structs import TopicPartition

from memstream.core.retry import RetryPolicy
from memstream.core.settings import Settings
from memstream.streams.owned_loop import OwnedLoop
from memstream.streams.partition_task import PartitionTask
from memstream.streams.stage import ProcessorBase, StageBase, Work
from tests.unit.builders import FakeClients, FakeConsumer

pytestmark = pytest.mark.unit
TOPICS = ["in-a", "in-b"]


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
        self.away = 0  # the next takes that fail as if the broker were away
        self.fail_only: int | None = None  # ... of this partition only (None: any)
        self.order = order

    def gate(self, n: int) -> asyncio.Event:
        return self.gates.setdefault(n, asyncio.Event())

    async def prepare(self, new: set[int], gone: set[int]) -> None:
        self.prepared.append((set(new), set(gone)))
        for n in new:
            if n == self.fail:
                raise RuntimeError("restore failed")
            if self.away and self.fail_only in (None, n):
                self.away -= 1
                raise KafkaConnectionError("Unable to bootstrap from [('127.0.0.1', 9092)]")
            await self.gate(n).wait()

    def take_order(self, partitions: set[int]) -> list[int]:
        if self.order is None:
            return sorted(partitions)
        return [n for n in self.order if n in partitions]

    def assigned(self, partitions: set[int]) -> None:
        self.seen_assigned.append(set(partitions))

    async def handle(self, records: list[Any]) -> Work:
        return Work()


def tps(*parts: int) -> set[TopicPartition]:
    return {TopicPartition(t, n) for t in TOPICS for n in parts}


def make(tmp_path, stage: SlowStage, **settings: Any,
         ) -> tuple[OwnedLoop, FakeConsumer, list[Any], list[Any]]:
    consumer = FakeConsumer(set(), {tp: 10 + tp.partition for tp in tps(0, 1, 2)})
    clients = FakeClients(consumer)
    loop = OwnedLoop(Settings(data_dir=tmp_path, embedder="hashing", **settings),
                     stage, clients=clients)  # type: ignore[arg-type]
    loop.task_manager.retry = RetryPolicy(first_delay_s=0.01, max_delay_s=0.01)
    fatal: list[Any] = []
    loop.on_fatal = lambda reason, code=70: fatal.append(reason)
    loop.connect()
    return loop, consumer, fatal, clients.made


def taken(loop: OwnedLoop) -> set[int]:
    """The partitions whose take is done (serving, or waiting for the assignment)."""
    return {n for n, task in loop.task_manager.by_partition.items() if task.serving}


def offsets(loop: OwnedLoop, n: int) -> dict[TopicPartition, int]:
    task = loop.task_manager.by_partition.get(n)
    return {} if task is None else dict(task.offsets)


async def assign(loop: OwnedLoop, consumer: FakeConsumer, *parts: int) -> None:
    await loop.task_manager.revoked()
    consumer.assigned = tps(*parts)
    await loop.task_manager.assigned(tps(*parts))


async def until(check, timeout: float = 5.0) -> None:
    async def wait() -> None:
        while not check():
            await asyncio.sleep(0.005)
    await asyncio.wait_for(wait(), timeout)


async def test_the_callback_returns_while_the_take_waits_with_the_partition_paused(tmp_path):
    stage = SlowStage()
    loop, consumer, fatal, made = make(tmp_path, stage)
    await asyncio.wait_for(assign(loop, consumer, 0), 1.0)  # the gate is shut: no waiting
    assert loop.owned == {0} and loop.task_manager.ready == set() and loop.taking == {0}
    assert consumer.paused_tps == tps(0)
    await until(lambda: made)  # the producer (the fence) comes first
    assert loop.task_manager.producer(0) is None  # not installed before the take is done
    stage.gate(0).set()
    await until(lambda: loop.task_manager.ready == {0})
    assert consumer.paused_tps == set() and loop.task_manager.producer(0) is made[0][1]
    assert offsets(loop, 0) == {tp: 10 for tp in tps(0)}  # committed
    assert dict(consumer.seeks) == {tp: 10 for tp in tps(0)}
    assert stage.seen_assigned[-1] == {0} and not fatal


async def test_each_partition_serves_as_soon_as_it_is_taken_quickest_first(tmp_path):
    stage = SlowStage(order=[2, 0, 1])  # e.g. 2 a warm standby, 0 a checkpoint
    loop, consumer, fatal, _ = make(tmp_path, stage)
    await assign(loop, consumer, 0, 1, 2)
    stage.gate(2).set()
    await until(lambda: loop.task_manager.ready == {2})
    assert consumer.paused_tps == tps(0, 1)
    stage.gate(0).set()
    await until(lambda: loop.task_manager.ready == {0, 2})
    stage.gate(1).set()
    await until(lambda: loop.task_manager.ready == {0, 1, 2})
    assert [new for new, _ in stage.prepared] == [{2}, {0}, {1}] and not fatal


async def test_a_partition_given_up_while_being_taken_is_undone(tmp_path):
    stage = SlowStage()
    loop, consumer, fatal, made = make(tmp_path, stage)
    await assign(loop, consumer, 0, 1)
    await until(lambda: made)
    await assign(loop, consumer, 1)  # 0 goes to another worker mid-take
    stage.gate(0).set()
    stage.gate(1).set()
    await until(lambda: loop.task_manager.ready == {1})
    assert loop.task_manager.producer(0) is None and 0 not in taken(loop)
    assert (set(), {0}) in stage.prepared[-2:]  # its shard (say) closed again
    assert not offsets(loop, 0) and not fatal


async def test_a_partition_taken_during_a_rebalance_is_positioned_by_the_assignment(tmp_path):
    stage = SlowStage()
    loop, consumer, fatal, made = make(tmp_path, stage)
    await assign(loop, consumer, 0)
    await until(lambda: made)
    await loop.task_manager.revoked()  # a rebalance begins; the consumer holds nothing meanwhile
    consumer.assigned = set()
    stage.gate(0).set()
    await until(lambda: 0 in taken(loop))
    assert loop.task_manager.ready == set()  # not before the assignment
    consumer.assigned = tps(0)
    consumer.seeks.clear()
    await loop.task_manager.assigned(tps(0))
    assert loop.task_manager.ready == {0} and not fatal
    assert dict(consumer.seeks) == {tp: 10 for tp in tps(0)}


async def test_a_take_that_fails_ends_the_worker(tmp_path):
    stage = SlowStage()
    stage.fail = 0
    loop, consumer, fatal, made = make(tmp_path, stage)
    await assign(loop, consumer, 0)
    await until(lambda: fatal)
    assert "restore failed" in fatal[0] and loop.task_manager.ready == set()
    assert made and loop.task_manager.producer(0) is None  # fenced, then not installed


def bare_kafka_error() -> KafkaError:
    """What aiokafka's producer raises when the coordinator lookup loses the broker: a bare
    KafkaError whose cause says what happened."""
    try:
        try:
            raise KafkaConnectionError("Connection at 127.0.0.1:9092 closed")
        except KafkaConnectionError as err:
            raise KafkaError(repr(err)) from err
    except KafkaError as wrapped:
        return wrapped


@pytest.mark.parametrize("where", ["fence", "restore"])
async def test_a_take_that_fails_while_the_broker_is_away_is_undone_and_taken_again(
        tmp_path, where):
    """The broker restarting during a take: the producer's fence, or the stage's restore,
    fails twice. Each failed attempt is undone (its producer stopped, the stage's state of
    the partition let go, the partition paused) and the partition taken on the third."""
    stage = SlowStage()
    loop, consumer, fatal, made = make(tmp_path, stage)
    if where == "fence":
        loop.clients.renewals = [bare_kafka_error(), bare_kafka_error()]  # type: ignore[attr-defined]
    else:
        stage.away = 2
    stage.gate(0).set()
    await assign(loop, consumer, 0)
    await until(lambda: loop.task_manager.ready == {0})
    assert not fatal and loop.taking == set()
    if where == "restore":
        assert stage.prepared == [({0}, set()), (set(), {0})] * 2 + [({0}, set())]
        assert [producer.stopped for _, producer in made] == [True, True, False]
    else:
        assert stage.prepared == [(set(), {0})] * 2 + [({0}, set())] and len(made) == 1
    assert loop.task_manager.producer(0) is made[-1][1]
    assert dict(consumer.seeks) == {tp: 10 for tp in tps(0)}


async def test_a_take_that_fails_past_broker_wait_ends_the_worker(tmp_path):
    stage = SlowStage()
    stage.away = 10**6  # the broker never comes back
    loop, consumer, fatal, made = make(tmp_path, stage, broker_wait_s=0.1)
    await assign(loop, consumer, 0)
    await until(lambda: fatal)
    assert "gave up after" in fatal[0] and "broker_wait_s" in fatal[0]
    assert loop.task_manager.ready == set() and all(producer.stopped for _, producer in made)
    assert len(made) > 1  # tried again before giving up


async def waiting_to_try_again(tmp_path):
    """Partition 0's take failed once (the broker away) and waits 0.3 s to try again."""
    stage = SlowStage()
    stage.away = 1
    loop, consumer, fatal, made = make(tmp_path, stage)
    loop.task_manager.retry = RetryPolicy(first_delay_s=0.3, max_delay_s=0.3)
    await assign(loop, consumer, 0)
    await until(lambda: stage.prepared == [({0}, set()), (set(), {0})])
    return stage, loop, consumer, fatal, made


async def test_a_take_given_up_while_it_waits_to_try_again_is_not_taken(tmp_path):
    stage, loop, consumer, fatal, made = await waiting_to_try_again(tmp_path)
    await assign(loop, consumer, 1)  # 0 revoked during the wait
    stage.gate(1).set()
    await loop.task_manager.settled()
    assert loop.task_manager.ready == {1} and not fatal
    assert ({0}, set()) not in stage.prepared[2:]  # never taken again
    assert loop.task_manager.producer(0) is None
    # no second fence: it would fence the partition's new owner
    assert [tid for tid, _ in made].count(f"{loop.group}-0") == 1


async def test_a_partition_revoked_and_assigned_again_while_its_take_waits(tmp_path):
    """The old take, waiting to try again, ends without touching the new task of its
    partition; the new one is taken once the old take returns; no failure."""
    stage, loop, consumer, fatal, made = await waiting_to_try_again(tmp_path)
    old = loop.task_manager.by_partition[0]
    await assign(loop, consumer, 1)  # revoked ...
    await assign(loop, consumer, 0, 1)  # ... and assigned again, while the old take waits
    assert loop.task_manager.by_partition[0] is not old and old.gone
    stage.gate(0).set()
    stage.gate(1).set()
    await until(lambda: loop.task_manager.ready == {0, 1})
    assert not fatal and old.gone
    assert loop.task_manager.producer(0) in (made[-1][1], made[-2][1])
    assert all(producer.stopped for tid, producer in made
               if producer not in (loop.task_manager.producer(0), loop.task_manager.producer(1)))


async def test_a_partition_queued_while_a_take_retries_is_taken_meanwhile(tmp_path):
    """A take that keeps failing (the broker away for it) does not hold back a partition
    assigned while it waits to try again."""
    stage = SlowStage()
    stage.fail_only = 0
    stage.away = 10**6
    loop, consumer, fatal, _ = make(tmp_path, stage)
    loop.task_manager.retry = RetryPolicy(first_delay_s=0.05, max_delay_s=0.05)
    await assign(loop, consumer, 0)
    await until(lambda: len(stage.prepared) >= 2)
    consumer.assigned = tps(0, 1)
    await loop.task_manager.assigned(tps(0, 1))  # an assignment that adds 1 (0 kept)
    stage.gate(1).set()
    await until(lambda: loop.task_manager.ready == {1})
    assert loop.taking == {0} and not fatal
    stage.away = 0
    stage.gate(0).set()
    await until(lambda: loop.task_manager.ready == {0, 1})


async def test_stop_lets_the_take_in_progress_finish_or_cancels_it(tmp_path):
    stage = SlowStage()
    loop, consumer, fatal, _ = make(tmp_path, stage)
    await assign(loop, consumer, 0)
    await loop.task_manager.stop_taking(0.05)  # the gate never opens: cancelled
    assert loop.task_manager.taker is not None and loop.task_manager.taker.cancelled()
    assert loop.task_manager.ready == set()
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
    await loop.task_manager.stop_taking(0.2)
    assert loop.task_manager.taker is not None and loop.task_manager.taker.done()
    assert not [t for t in asyncio.all_tasks() if t.get_name().startswith("take-")]
    assert loop.task_manager.producer(0) is loop.task_manager.producer(1) is None
    assert loop.task_manager.ready == set() and not fatal
    stage.gate(1).set()  # the cancelled take cannot come back
    await asyncio.sleep(0)
    assert loop.task_manager.producer(0) is loop.task_manager.producer(1) is None


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
    await until(lambda: 0 in taken(loop))
    assert not fatal and dict(consumer.seeks) == {}
    consumer.committed = real  # type: ignore[method-assign]
    await assign(loop, consumer, 0)
    assert loop.task_manager.ready == {0} and not fatal
    assert dict(consumer.seeks) == {tp: 10 for tp in tps(0)}


async def test_the_stage_learns_the_offsets_its_committed_transaction_wrote(tmp_path):
    """What the apply stage's shard holds of its own writes (kept as a standby later)."""
    from types import SimpleNamespace

    stage = SlowStage()
    seen: list[tuple[int, dict[str, int]]] = []
    outs = [("changes", b"k", b"1"), ("changes", b"k", b"2"), ("results", b"k", b"3")]

    class Noting(ProcessorBase):
        def __init__(self, partition: int) -> None:
            self.partition = partition

        async def process(self, records: list[Any]) -> Work:
            return Work(out=list(outs))

        def committed(self, offsets: dict[str, int]) -> None:
            seen.append((self.partition, offsets))

    stage.open = lambda context: Noting(context.partition)  # type: ignore[method-assign]
    loop, consumer, fatal, _ = make(tmp_path, stage)
    await assign(loop, consumer, 0)
    stage.gate(0).set()
    await until(lambda: loop.task_manager.ready == {0})
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
    await until(lambda: loop.task_manager.ready == {1})
    assert loop.taking == {0} and not fatal
    stage.gate(0).set()
    await until(lambda: loop.task_manager.ready == {0, 1})


async def test_a_batch_whose_shard_is_not_here_is_a_value_and_read_again(tmp_path, monkeypatch):
    """Shard ownership is a value: the store's ShardNotHere, raised by a store call of the
    batch, comes back from the task's processor as NotHere; the loop commits nothing of the
    batch and seeks the partition back to its next offset (read again after a pause)."""
    from types import SimpleNamespace

    from memstream.memory.store.partitioned import ShardNotHere
    from memstream.streams import owned_loop
    from memstream.streams.stage import NotHere, processor_of

    monkeypatch.setattr(owned_loop, "SHARD_WAIT_S", 0.0)
    stage = SlowStage()

    async def handle(records: list[Any]) -> Work:
        raise ShardNotHere(0)

    stage.handle = handle  # type: ignore[method-assign]
    got = await processor_of(stage, 0).process([])
    assert isinstance(got, NotHere) and got.partition == 0 and "not owned here" in got.why
    loop, consumer, fatal, _ = make(tmp_path, stage)
    await assign(loop, consumer, 0)
    stage.gate(0).set()
    await until(lambda: loop.task_manager.ready == {0})
    consumer.seeks.clear()
    tp = TopicPartition(TOPICS[0], 0)
    await loop.process({tp: [SimpleNamespace(topic=tp.topic, partition=0, offset=10,
                                             key=b"k", value=b"v", timestamp=1)]})
    assert loop.shard_waits == 1 and loop.task_manager.producer(0).committed == []
    assert (tp, 10) in consumer.seeks and offsets(loop, 0)[tp] == 10 and not fatal


class GatedClients(FakeClients):
    """Producers (the fences) made only when their gate opens."""

    def __init__(self, consumer: FakeConsumer) -> None:
        super().__init__(consumer)
        self.asked: list[str] = []
        self.open = asyncio.Event()

    async def producer(self, transactional_id: str) -> Any:
        self.asked.append(transactional_id)
        await self.open.wait()
        return await super().producer(transactional_id)


def gated(tmp_path, stage: SlowStage) -> tuple[OwnedLoop, FakeConsumer, GatedClients]:
    consumer = FakeConsumer(set(), {tp: 10 + tp.partition for tp in tps(0, 1, 2)})
    clients = GatedClients(consumer)
    loop = OwnedLoop(Settings(data_dir=tmp_path, embedder="hashing"), stage,
                     clients=clients)  # type: ignore[arg-type]
    loop.on_fatal = lambda reason, code=70: pytest.fail(reason)
    loop.connect()
    return loop, consumer, clients


async def test_a_rebalance_waits_for_the_fence_in_flight_before_it_rejoins(tmp_path):
    """A fence (a producer's init) that lands after this worker rejoined could land after
    the new owner's and fence it: the revoke waits for the one in flight."""
    loop, consumer, clients = gated(tmp_path, SlowStage())
    await assign(loop, consumer, 0)
    await until(lambda: clients.asked)
    revoking = asyncio.create_task(loop.task_manager.revoked())
    await asyncio.sleep(0.05)
    assert not revoking.done(), "the revoke returned while a fence was in flight"
    clients.open.set()
    await asyncio.wait_for(revoking, 2.0)
    assert clients.made  # the fence landed before the revoke returned


async def test_no_fence_starts_while_a_rebalance_is_under_way(tmp_path):
    """A take that begins after the revoke makes its producer only once the assignment
    says the partition is still this worker's (and none if it is not)."""
    stage = SlowStage()
    loop, consumer, clients = gated(tmp_path, stage)
    clients.open.set()
    stage.gate(0).set()
    await assign(loop, consumer, 0)
    await until(lambda: loop.task_manager.ready == {0})
    manager = loop.task_manager
    await manager.revoked()  # a rebalance begins while a take of 2 is about to start
    late = PartitionTask(2, 99, ())
    manager.by_partition[2] = late
    asked = len(clients.asked)
    taking = asyncio.create_task(manager._take_once(late))
    await asyncio.sleep(0.05)
    assert len(clients.asked) == asked, "a fence started during the rebalance"
    consumer.assigned = tps(0)
    await manager.assigned(tps(0))  # 2 is not this worker's after all
    assert await asyncio.wait_for(taking, 2.0) is False
    assert len(clients.asked) == asked
