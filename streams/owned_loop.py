"""A stage's own consume-process-produce loop: exactly once by Kafka transactions.

Every stage of the pipeline that turns records into records runs in one of these loops:
ingest (:mod:`streams.ingest`: messages, session events, results, tool writes -> jobs),
extract (:mod:`streams.extract`: jobs -> decisions) and apply (:mod:`streams.apply`:
decisions -> store, memory changes, results, tool requests). Run as
Faust agents, their effects depended on Faust delivering every record: it can drop fetched
records around a recovery (faust-streaming #596), commit past a record still in progress
(#606), and it groups the offsets of partition *p* of every input topic into one
transaction. The chaos benchmark found each of those as lost, stale or re-sent work. A loop
owns what those depend on:

- **One consumer per stage** (group ``{app_id}-{stage}``, static member,
  ``read_committed``, no auto commit, the range assignor: partition *p* of every input
  topic of the stage comes to one worker).
- **One transactional producer per owned partition** (``{app_id}-{stage}-{p}``). A new
  owner's ``init_transactions`` fences the previous one and aborts its open transaction
  before anything of *p* is read (exactly once as Kafka Streams' first design did it).
- **Batches.** The records of *p* from every input topic are merged by timestamp without
  reordering any topic and handed to the stage, which returns what they produce; the
  batch's outputs, its table writes and its input offsets go in one transaction. The
  tables take the writes only once it is committed (:mod:`streams.ingest_tables`), and the
  stage's after-commit work (waking API callers, counting) runs only then.
- **A failed transaction** drops the batch's writes, renews the producer and reads the
  partition again from its committed offsets. Fenced (another worker's producer took the
  partition: this worker's generation is stale, a rebalance is under way): the partition
  is let go (producer, tables, the stage's state such as a store shard) and nothing of the
  batch is committed; the next assignment takes it again from scratch if it comes back.
- **A new partition** is paused and taken outside the rebalance callback
  (:mod:`streams.owned_rebalance`): producer first (the fence), then the tables restored
  from their changelogs up to their ends and the stage's state (a store shard), then the
  consumer seeks to the committed offsets, fetched again after the fence, and resumes it.
  Records fetched before that are dropped (read again).
- **Timers** (:meth:`Stage.punctuate`, every ``tick_interval_s``, between batches, under
  the loop's lock): what a partition's due timers emit and write is one transaction of that
  partition, like a batch without input offsets.
- **No record is skipped**: a record is handled only at or after the partition's next
  offset, and only handled records' offsets are committed. Anything the loop cannot
  handle ends the worker (exit 70; 75 for a transaction the broker refuses for good, such
  as a dead letter its topic does not take): the restart reads again from the committed
  state.
"""

from __future__ import annotations

import asyncio
import heapq
import logging
import os
import sys
import time
from collections.abc import Callable
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, ConsumerRebalanceListener
from aiokafka.coordinator.assignors.range import RangePartitionAssignor
from aiokafka.errors import (
    MessageSizeTooLargeError,
    ProducerFenced,
    RecordTooLargeError,
    TopicAuthorizationFailedError,
)
from aiokafka.structs import OffsetAndMetadata, TopicPartition

from memstream.core import kafka
from memstream.core.errors import describe, trace
from memstream.core.retry import RetryPolicy, next_delay
from memstream.core.settings import Settings
from memstream.memory.store.partitioned import ShardNotHere
from memstream.streams import lifecycle
from memstream.streams.cluster import assignor_for
from memstream.streams.dead_letters import EXIT_UNDELIVERABLE
from memstream.streams.ingest_tables import restore
from memstream.streams.owned_rebalance import Rebalancing, quietly
from memstream.streams.pipeline import Pipeline
from memstream.streams.stage import Stage, Work

log = logging.getLogger(__name__)
EXIT_LOOP_FAILED = 70  # EX_SOFTWARE
RETRY = RetryPolicy(first_delay_s=0.2, max_delay_s=5.0)
MAX_BYTES = 16 * 1024 * 1024
# A transaction the broker refuses for good: the worker stops rather than pass the records.
REFUSED = (MessageSizeTooLargeError, RecordTooLargeError, TopicAuthorizationFailedError)
# Transactions of one partition failing in a row (a broker away for ~30 s with the backoff)
# end the worker: its restart starts from a clean client and the committed state.
MAX_FAILED_IN_ROW = 10
TRANSACTION_TIMEOUT_S = 60.0
STOP_WAIT_S = 10.0  # one batch's transaction; past it, renewed and read again
SHARD_WAIT_S = 0.5  # a batch whose shard is not here is read again after this

def run_with_app(p: Pipeline, stage: Stage) -> OwnedLoop:
    """Run ``stage`` in its loop in the worker: a part the app starts and stops
    (:mod:`streams.lifecycle`), its lag reported."""
    assignor = None
    if p.cluster is not None:
        cluster = p.cluster
        assignor = assignor_for(cluster.me, p.settings.store_standby_replicas,
                                lambda the_map: cluster.update(stage.name, the_map),
                                cluster.trust)
    loop = OwnedLoop(p.settings, stage, assignor=assignor, clock=p.clock)
    p.loops.append(loop)
    lifecycle.run(p.app, f"{stage.name}-loop", loop.start, loop.stop)
    return loop


def halt(reason: str, code: int = EXIT_LOOP_FAILED) -> None:
    """End the worker now: nothing more is committed, the restart reads again."""
    log.critical("owned loop: %s; exiting (code %d)", reason, code)
    for handler in logging.getLogger().handlers:
        handler.flush()
    sys.stderr.flush()
    os._exit(code)


class _Listener(ConsumerRebalanceListener):
    def __init__(self, loop: OwnedLoop) -> None:
        self.loop = loop

    async def on_partitions_revoked(self, revoked: set[TopicPartition]) -> None:
        await self.loop.revoked()

    async def on_partitions_assigned(self, assigned: set[TopicPartition]) -> None:
        await self.loop.assigned(assigned)


class OwnedLoop(Rebalancing):
    """See the module docstring. ``start()`` / ``stop()`` from the worker's lifecycle."""

    def __init__(self, settings: Settings, stage: Stage, *,
                 on_fatal: Callable[..., None] = halt, assignor: Any = None,
                 clock: Callable[[], float] = time.time) -> None:
        self.settings = settings
        self.clock = clock
        self.punctuated = 0.0  # time.monotonic() of the last timer round
        # partition -> the newest record time (s) it handled: its timers' clock while it
        # is behind (see punctuate)
        self.partition_time: dict[int, float] = {}
        self.stage = stage
        self.inputs = list(stage.inputs)
        self.group = f"{settings.app_id}-{stage.name}"
        self.tables = stage.tables
        self.on_fatal = on_fatal
        self.assignor = assignor or RangePartitionAssignor  # streams.cluster: the workers'
        self.shard_waits = 0  # batches read again: their partition's shard was not here
        self.fenced = 0  # partitions let go: another worker's producer fenced them
        self.let_go: dict[int, float] = {}  # partition -> when; taken again if still ours
        self.consumer: AIOKafkaConsumer | None = None
        self.producers: dict[int, AIOKafkaProducer] = {}
        self.owned: set[int] = set()
        self.ready: set[int] = set()  # owned, restored and positioned: records are handled
        self.next: dict[TopicPartition, int] = {}  # the next offset to handle (committed)
        self.lock = asyncio.Lock()  # a batch, or a rebalance step: never both
        self.stopping = asyncio.Event()
        self.task: asyncio.Task[None] | None = None
        self.failed_commits = 0
        self.failed_in_row: dict[int, int] = {}
        self.caught_up: dict[TopicPartition, int] = {}  # read to this highwater, when idle
        self._init_rebalancing()

    # --- lifecycle -----------------------------------------------------------------------

    async def start(self) -> None:
        s = self.settings  # its changelogs were created with the topics (memstream worker)
        instance = s.instance_id()
        poll_ms = int(max(300.0, 3 * s.job_timeout_s) * 1000)
        self.consumer = kafka.consumer(
            self.settings, group_id=self.group,
            group_instance_id=f"{instance}-{self.stage.name}" if instance else None,
            enable_auto_commit=False, isolation_level="read_committed",
            auto_offset_reset="earliest", partition_assignment_strategy=(self.assignor,),
            session_timeout_ms=int(s.session_timeout_s * 1000),
            heartbeat_interval_ms=int(s.heartbeat_interval_s * 1000),
            # a batch may wait for LLM calls up to a job's deadline, and a rebalance for the
            # batch in progress: neither may cost the partitions
            max_poll_interval_ms=poll_ms, rebalance_timeout_ms=poll_ms,
            max_partition_fetch_bytes=MAX_BYTES, fetch_max_bytes=4 * MAX_BYTES)
        self.consumer.subscribe(self.inputs, listener=_Listener(self))
        self.task = asyncio.create_task(self._connected_run(), name=f"{self.stage.name}-loop")

    async def _connected_run(self) -> None:
        """The consumer started (a broker that is away is waited for: a worker started
        during a broker restart must not exit), then the loop."""
        assert self.consumer is not None
        attempt = 0
        while not self.stopping.is_set():
            try:
                await self.consumer.start()
                break
            except Exception as exc:
                attempt += 1
                delay = next_delay(RETRY, attempt)
                log.warning("%s loop: consumer not started (%s); retrying in %.1fs",
                            self.stage.name, type(exc).__name__, delay)
                await asyncio.sleep(delay)
        await self._run()

    async def stop(self) -> None:
        """After the batch in progress (at most ``STOP_WAIT_S``: a partition waiting for
        the broker is abandoned, its open transaction aborted by the next owner)."""
        self.stopping.set()
        if self.task is not None:
            done, _ = await asyncio.wait({self.task}, timeout=STOP_WAIT_S)
            if not done:
                self.task.cancel()
                await asyncio.gather(self.task, return_exceptions=True)
        await self.stop_taking(STOP_WAIT_S)
        if self.consumer is not None:
            if self.settings.leave_group_on_stop:
                kafka.leave_on_stop(self.consumer)
            await self.consumer.stop()
        producers, self.producers = list(self.producers.values()), {}
        for producer in producers:
            await producer.stop()

    async def _run(self) -> None:
        assert self.consumer is not None
        try:
            while not self.stopping.is_set():
                batch = await self.consumer.getmany(
                    timeout_ms=100, max_records=self.stage.max_records)
                if batch:
                    async with self.lock:
                        await self.process(batch)
                else:
                    await self._note_caught_up()
                if time.monotonic() - self.punctuated >= self.settings.tick_interval_s:
                    self.punctuated = time.monotonic()
                    async with self.lock:
                        await self.punctuate()
                if self.let_go:
                    await self._take_back()
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.error("%s loop failed\n%s", self.stage.name, trace(exc))
            self.on_fatal(f"{self.stage.name}: {describe(exc)}")

    # --- a batch -------------------------------------------------------------------------

    async def process(self, batch: dict[TopicPartition, list[Any]]) -> None:
        """Handle one poll's records, one transaction per partition (partitions at once)."""
        parts: dict[int, list[list[Any]]] = {}
        for tp, records in batch.items():
            if tp.partition not in self.ready or tp not in self.next:
                continue  # fetched before the partition was ready: its seek reads them again
            fresh = [r for r in records if r.offset >= self.next[tp]]
            if fresh:
                parts.setdefault(tp.partition, []).append(fresh)
        await asyncio.gather(*(self._partition(n, list(heapq.merge(*lists, key=_timestamp)))
                               for n, lists in parts.items()))

    async def _partition(self, partition: int, records: list[Any]) -> None:
        while records:
            try:
                work = await self.stage.handle(partition, records)
            except ShardNotHere as exc:
                await self._not_here(partition, exc)
                return
            taken = len(records) if work.handled is None else max(1, work.handled)
            done, records = records[:taken], records[taken:]
            offsets = {TopicPartition(r.topic, r.partition): r.offset + 1 for r in done}
            if not await self._commit(partition, work, offsets):
                return  # read again from the committed offsets
            newest = max(_timestamp(r) for r in done) / 1000
            self.partition_time[partition] = max(self.partition_time.get(partition, 0.0),
                                                 newest)
            for step in work.after:
                await step()

    async def punctuate(self) -> None:
        """One timer round: each ready partition's due timers, each in a transaction of its
        own (no input offsets: nothing is read again if it fails; the next round finds the
        same timers due). A partition with records not yet read runs its timers on the time
        of the newest record it handled, not on the wall clock (a backlog after a restart
        holds the results of jobs in flight: their timeouts count once those are read)."""
        now = self.clock()
        for n in sorted(self.ready):
            at = await self._timer_time(n, now)
            if at is None:
                continue
            work = await self.stage.punctuate(n, at)
            if work is None or not (work.out or work.placed
                                    or any(t.dirty(n) for t in self.tables)):
                for table in self.tables:
                    table.discard(n)
                continue
            if await self._commit(n, work, {}):
                for step in work.after:
                    await step()

    async def _timer_time(self, partition: int, now: float) -> float | None:
        """``now`` if every input of ``partition`` is read to its highwater, else the time
        of the newest record the partition handled (None: none yet)."""
        for tp in [tp for tp in self.next if tp.partition == partition]:
            if await self._read_to(tp) is None:
                seen = self.partition_time.get(partition)
                return None if seen is None else min(now, seen)
        return now

    async def _commit(self, partition: int, work: Work,
                      offsets: dict[TopicPartition, int]) -> bool:
        producer = self.producers[partition]
        written: dict[str, int] = {}
        try:
            written = await asyncio.wait_for(
                self._transaction(producer, partition, work, offsets), TRANSACTION_TIMEOUT_S)
        except Exception as exc:
            if (not await self._recover(partition, exc) or not offsets
                    or not await self._landed(offsets)):
                for table in self.tables:
                    table.discard(partition)
                self._seek(partition)
                return False
            log.warning("%s partition %d: the transaction was committed after all",
                        self.stage.name, partition)
        for table in self.tables:
            table.commit(partition)
        if written:  # (the apply stage's shards follow what it wrote)
            self.stage.committed(partition, written)
        self.next.update(offsets)
        self.failed_in_row.pop(partition, None)
        return True

    async def _landed(self, offsets: dict[TopicPartition, int]) -> bool:
        """Whether a transaction that failed as far as we saw was committed all the same
        (a commit request the broker took before a timeout): the group's committed offsets,
        read after the new producer completed what the old one left, are the batch's."""
        assert self.consumer is not None
        try:
            for tp, offset in offsets.items():
                if await self.consumer.committed(tp) != offset:
                    return False
        except Exception as exc:
            log.warning("%s: committed offsets not read (%s); reading the batch again",
                        self.stage.name, type(exc).__name__)
            return False
        return True

    async def _transaction(self, producer: AIOKafkaProducer, partition: int,
                           work: Work, offsets: dict[TopicPartition, int]) -> dict[str, int]:
        """The batch's transaction; returns, per topic, the offset after the last record
        it wrote to ``partition``."""
        await producer.begin_transaction()
        sent = [await producer.send(topic, key=key, value=value)
                for topic, key, value in work.out]
        sent += [await producer.send(r.topic, key=r.key, value=r.value, partition=r.partition,
                                     timestamp_ms=r.timestamp_ms, headers=list(r.headers))
                 for r in work.placed]
        for table in self.tables:
            sent += [await producer.send(table.topic, key=key, value=value, partition=partition)
                     for key, value in table.changelog(partition)]
        delivered = await asyncio.gather(*sent)  # a record the broker refuses fails here
        if offsets:  # (a timer round's transaction reads nothing)
            await producer.send_offsets_to_transaction(
                {tp: OffsetAndMetadata(o, "") for tp, o in offsets.items()}, self.group)
        await producer.commit_transaction()
        written: dict[str, int] = {}
        for meta in delivered:
            if getattr(meta, "partition", None) == partition:
                written[meta.topic] = max(written.get(meta.topic, 0), meta.offset + 1)
        return written

    async def _recover(self, partition: int, exc: Exception) -> bool:
        """After a failed transaction: a new producer (its start completes or aborts what
        the old one left open). False when the worker must stop instead."""
        if isinstance(exc, ProducerFenced):
            log.warning("%s partition %d is owned by another worker now (%s); letting it go "
                        "until the next assignment", self.stage.name, partition, exc)
            await self._let_go(partition)
            return False
        if isinstance(exc, REFUSED):  # e.g. a dead letter its topic does not take
            self.on_fatal(f"partition {partition}: transaction undeliverable "
                          f"({describe(exc)})", EXIT_UNDELIVERABLE)
            return False
        self.failed_commits += 1
        self.failed_in_row[partition] = self.failed_in_row.get(partition, 0) + 1
        if self.failed_in_row[partition] > MAX_FAILED_IN_ROW:
            self.on_fatal(f"partition {partition}: more than {MAX_FAILED_IN_ROW} transactions "
                          f"failed in a row (last: {describe(exc)})")
            return False
        log.warning("%s partition %d: transaction failed (%s: %s); renewing its producer",
                    self.stage.name, partition, type(exc).__name__, exc)
        old = self.producers.pop(partition)
        await quietly(old.stop())
        attempt = 0
        while partition not in self.producers:
            attempt += 1
            await asyncio.sleep(next_delay(RETRY, attempt))
            try:
                self.producers[partition] = await self._producer(partition)
            except Exception as err:
                log.warning("%s partition %d: producer not started (%s)", self.stage.name,
                            partition, type(err).__name__)
        return True

    async def _not_here(self, partition: int, exc: ShardNotHere) -> None:
        """The partition's store shard is not served here (yet): the group of the apply
        stage has not given it to this worker, or is restoring it. Nothing of the batch is
        committed; it is read again after a pause (or by the next owner)."""
        self.shard_waits += 1
        log.info("%s partition %d: %s; reading the batch again", self.stage.name, partition,
                 exc)
        for table in self.tables:
            table.discard(partition)
        await asyncio.sleep(SHARD_WAIT_S)
        self._seek(partition)

    async def _drop(self, gone: set[int]) -> None:
        """The loop's hold on partitions no longer its: producers, tables, positions."""
        for n in gone:
            producer = self.producers.pop(n, None)
            if producer is not None:
                await quietly(producer.stop())
        for table in self.tables:
            table.drop(gone)
        self.next = {tp: o for tp, o in self.next.items() if tp.partition not in gone}
        for n in gone:
            self.partition_time.pop(n, None)

    def _seek(self, partition: int) -> None:
        assert self.consumer is not None
        assigned = self.consumer.assignment()
        for tp, offset in self.next.items():
            if tp.partition == partition and tp in assigned:
                self.consumer.seek(tp, offset)

    async def _producer(self, partition: int) -> AIOKafkaProducer:
        producer = kafka.producer(
            self.settings, transactional_id=f"{self.group}-{partition}",
            enable_idempotence=True, linger_ms=2, max_request_size=MAX_BYTES)
        try:
            await producer.start()  # init_transactions: fences and aborts the previous owner
        except BaseException:
            await quietly(producer.stop())
            raise
        return producer

    async def _restore(self, partitions: set[int]) -> None:
        await restore(self.tables, partitions, MAX_BYTES, self.settings)

    # --- metrics -------------------------------------------------------------------------

    async def _note_caught_up(self) -> None:
        """A poll found nothing: the partitions whose position reached their highwater are
        done up to it (what lies between the next offset and it are transaction markers)."""
        assert self.consumer is not None
        found = {}
        for tp in [tp for tp in self.next if tp in self.consumer.assignment()]:
            high = await self._read_to(tp)
            if high is not None:
                found[tp] = high
        self.caught_up = found

    async def _read_to(self, tp: TopicPartition) -> int | None:
        """``tp``'s highwater when the consumer's position has reached it, else None."""
        assert self.consumer is not None
        high = self._highwater(tp)
        try:
            if high is not None and await self.consumer.position(tp) >= high:
                return high
        except Exception:  # a partition leaving in a rebalance
            pass
        return None

    def _highwater(self, tp: TopicPartition) -> int | None:
        assert self.consumer is not None
        try:
            high = self.consumer.highwater(tp)
        except Exception:
            return None
        return high if isinstance(high, int) else None

    def lags(self) -> dict[tuple[str, int], int]:
        """(topic, partition) -> records not yet handled and committed, for the owned
        inputs (0 where the last idle poll found the position at the highwater and no
        record arrived since: a transaction's marker is not a record)."""
        found: dict[tuple[str, int], int] = {}
        if self.consumer is None:
            return found
        for tp, offset in list(self.next.items()):
            high = self._highwater(tp)
            if high is not None:
                idle = self.caught_up.get(tp) == high
                found[(tp.topic, tp.partition)] = 0 if idle else max(0, high - offset)
        return found


def _timestamp(record: Any) -> int:
    return int(record.timestamp)

