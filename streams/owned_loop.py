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
- **A task per partition** (:mod:`streams.partition_task`) holds its producer, positions,
  table slices, the stage's processor of it (:class:`~streams.stage.Processor`), time and
  state (taking, restoring, serving, letting go); the loop's
  :class:`~streams.task_manager.TaskManager` holds the map of them. A new partition is
  paused and taken outside the rebalance callback: producer first (the fence), then the
  tables restored from their changelogs up to their ends and the stage's state (a store
  shard), then the consumer seeks to the committed offsets, fetched again after the fence,
  and resumes it. Records fetched before that are dropped (read again).
- **Clients** come from one small protocol (:mod:`streams.loop_clients`), injected.
- **Timers** (:meth:`Processor.punctuate`, every ``tick_interval_s``, between batches, under
  the loop's lock): what a partition's due timers emit and write is one transaction of that
  partition, like a batch without input offsets.
- **No record is skipped**: a record is handled only at or after the partition's next
  offset, and only handled records' offsets are committed. A poll that fails (a record
  batch no reader here can decode: a missing codec library, corruption) never ends the
  worker: the batch is set aside by reference, its dead letter committed with the offset
  past it, or the loop waits and polls again (:mod:`streams.undecodable`). Anything else
  the loop cannot handle ends the worker (exit 70; 75 for a transaction the broker refuses
  for good, such as a dead letter its topic does not take): the restart reads again from
  the committed state.
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

from aiokafka import ConsumerRebalanceListener
from aiokafka.coordinator.assignors.range import RangePartitionAssignor
from aiokafka.errors import (
    MessageSizeTooLargeError,
    ProducerFenced,
    RecordTooLargeError,
    TopicAuthorizationFailedError,
)
from aiokafka.structs import OffsetAndMetadata, TopicPartition

from memstream.core import kafka, tracing
from memstream.core.errors import describe, trace
from memstream.core.retry import RetryPolicy, next_delay
from memstream.core.settings import Settings
from memstream.streams import lifecycle, undecodable
from memstream.streams.cluster import assignor_for
from memstream.streams.counters import Counters
from memstream.streams.dead_letters import EXIT_UNDELIVERABLE
from memstream.streams.loop_clients import KafkaClients, LoopClients, quietly
from memstream.streams.partition_task import PartitionTask
from memstream.streams.pipeline import Pipeline
from memstream.streams.stage import NotHere, Stage, Work
from memstream.streams.task_manager import TaskManager
from memstream.topics.registry import registry

log = logging.getLogger(__name__)
EXIT_LOOP_FAILED = 70  # EX_SOFTWARE
RETRY = RetryPolicy(first_delay_s=0.2, max_delay_s=5.0)
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
    loop = OwnedLoop(p.settings, stage, assignor=assignor, clock=p.clock, counters=p.counters)
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
    def __init__(self, task_manager: TaskManager) -> None:
        self.task_manager = task_manager

    async def on_partitions_revoked(self, revoked: set[TopicPartition]) -> None:
        await self.task_manager.revoked()

    async def on_partitions_assigned(self, assigned: set[TopicPartition]) -> None:
        await self.task_manager.assigned(assigned)


class OwnedLoop:
    """See the module docstring. ``start()`` / ``stop()`` from the worker's lifecycle."""

    def __init__(self, settings: Settings, stage: Stage, *,
                 on_fatal: Callable[..., None] = halt, assignor: Any = None,
                 clock: Callable[[], float] = time.time,
                 clients: LoopClients | None = None, counters: Counters | None = None) -> None:
        self.settings = settings
        self.counters = counters
        self.dead_letter_topic = registry(settings).dead_letters.name
        self.batches_set_aside = 0  # undecodable batches set aside by reference
        self.fetch_failures = 0  # failed polls nothing here explained
        self.failed_polls = 0  # in a row (the backoff)
        self.clock = clock
        self.punctuated = 0.0  # time.monotonic() of the last timer round
        self.stage = stage
        self.group = f"{settings.app_id}-{stage.name}"
        self.assignor = assignor or RangePartitionAssignor  # streams.cluster: the workers'
        self.shard_waits = 0  # batches read again: their partition's shard was not here
        self.failed_commits = 0
        self.consumer: Any = None
        self.lock = asyncio.Lock()  # a batch, or a rebalance step: never both
        self.stopping = asyncio.Event()
        self.runner: asyncio.Task[None] | None = None
        self.task_manager = TaskManager(settings, stage, clients or KafkaClients(settings),
                                 self.group, self.lock, self.stopping, self._fatal)
        self.on_fatal = on_fatal

    @property
    def clients(self) -> LoopClients:
        return self.task_manager.clients

    @clients.setter
    def clients(self, clients: LoopClients) -> None:
        """Other clients (before :meth:`connect`: the unit tests' fakes)."""
        self.task_manager.clients = clients

    def _fatal(self, reason: str, code: int = EXIT_LOOP_FAILED) -> None:
        self.on_fatal(reason, code)

    # --- what the worker reads -----------------------------------------------------------

    @property
    def owned(self) -> set[int]:
        return self.task_manager.owned

    @property
    def taking(self) -> set[int]:
        return self.task_manager.taking

    @property
    def assignments(self) -> int:
        return self.task_manager.assignments

    # --- lifecycle -----------------------------------------------------------------------

    def connect(self) -> Any:
        """The consumer (made once, not started), subscribed to the stage's inputs."""
        if self.consumer is None:
            instance = self.settings.instance_id()
            member = f"{instance}-{self.stage.name}" if instance else None
            self.consumer = self.clients.consumer(self.group, member, self.assignor)
            self.consumer.subscribe(list(self.stage.inputs), listener=_Listener(self.task_manager))
            self.task_manager.consumer = self.consumer
        return self.consumer

    async def start(self) -> None:
        self.connect()  # its changelogs were created with the topics (memstream worker)
        self.runner = asyncio.create_task(self._connected_run(), name=f"{self.stage.name}-loop")

    async def _connected_run(self) -> None:
        """The consumer started (a broker that is away is waited for: a worker started
        during a broker restart must not exit), then the loop."""
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
        if self.runner is not None:
            done, _ = await asyncio.wait({self.runner}, timeout=STOP_WAIT_S)
            if not done:
                self.runner.cancel()
                await asyncio.gather(self.runner, return_exceptions=True)
        await self.task_manager.stop_taking(STOP_WAIT_S)
        if self.consumer is not None:
            if self.settings.leave_group_on_stop:
                kafka.leave_on_stop(self.consumer)
            await self.consumer.stop()
        await self.task_manager.close()

    async def _run(self) -> None:
        try:
            while not self.stopping.is_set():
                batch = await self._poll()
                if batch:
                    async with self.lock:
                        await self.process(batch)
                else:
                    await self.note_caught_up()
                if time.monotonic() - self.punctuated >= self.settings.tick_interval_s:
                    self.punctuated = time.monotonic()
                    async with self.lock:
                        await self.punctuate()
                if self.task_manager.fenced_here():
                    await self.task_manager.take_back()
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.error("%s loop failed\n%s", self.stage.name, trace(exc))
            self.on_fatal(f"{self.stage.name}: {describe(exc)}")

    async def _poll(self) -> dict[TopicPartition, list[Any]]:
        """The next records; none after a failed poll (see :mod:`streams.undecodable`):
        an undecodable batch set aside, or a wait with backoff, never an exit."""
        try:
            batch: dict[TopicPartition, list[Any]] = await self.consumer.getmany(
                timeout_ms=100, max_records=self.stage.max_records)
        except Exception as exc:
            if await undecodable.recover(self, exc):
                self.failed_polls = 0
            else:
                self.failed_polls += 1
                undecodable.count_failure(self, exc)
                await asyncio.sleep(next_delay(RETRY, self.failed_polls))
            return {}
        self.failed_polls = 0
        return batch

    # --- a batch -------------------------------------------------------------------------

    async def process(self, batch: dict[TopicPartition, list[Any]]) -> None:
        """Handle one poll's records, one transaction per partition (partitions at once)."""
        parts: dict[int, tuple[PartitionTask, list[list[Any]]]] = {}
        for tp, records in batch.items():
            task = self.task_manager.serving_task(tp.partition)
            fresh = [] if task is None else task.fresh(tp, records)
            if task is not None and fresh:  # (else fetched before it served: read again)
                parts.setdefault(tp.partition, (task, []))[1].append(fresh)
        await asyncio.gather(*(self._partition(task, list(heapq.merge(*lists, key=_timestamp)))
                               for task, lists in parts.values()))

    async def _partition(self, task: PartitionTask, records: list[Any]) -> None:
        while records:
            work = await task.processor.process(records)
            if isinstance(work, NotHere):
                await self._not_here(task, work)
                return
            taken = len(records) if work.handled is None else max(1, work.handled)
            done, records = records[:taken], records[taken:]
            offsets = {TopicPartition(r.topic, r.partition): r.offset + 1 for r in done}
            newest = max(_timestamp(r) for r in done) / 1000
            if not await self._commit(task, work, offsets, newest):
                return  # read again from the committed offsets
            for step in work.after:
                await step()

    async def punctuate(self) -> None:
        """One timer round: each serving partition's due timers, each in a transaction of
        its own (no input offsets: nothing is read again if it fails; the next round finds
        the same timers due). A partition with records not yet read runs its timers on the
        time of the newest record it handled, not on the wall clock (a backlog after a
        restart holds the results of jobs in flight: their timeouts count once those are
        read)."""
        now = self.clock()
        for n in sorted(self.task_manager.ready):
            task = self.task_manager.serving_task(n)
            at = None if task is None else await self._timer_time(task, now)
            if task is None or at is None:
                continue
            work = await task.processor.punctuate(at)
            if work is None or not (work.out or work.placed or task.dirty()):
                task.discard()
                continue
            if await self._commit(task, work, {}, None):
                for step in work.after:
                    await step()

    async def _timer_time(self, task: PartitionTask, now: float) -> float | None:
        """``now`` if every input of the task is read to its highwater, else the time of
        the newest record it handled (None: none yet)."""
        for tp in task.inputs():
            if await self._read_to(tp) is None:
                seen = task.stream_time
                return None if seen is None else min(now, seen)
        return now

    async def _commit(self, task: PartitionTask, work: Work,
                      offsets: dict[TopicPartition, int], newest_s: float | None) -> bool:
        written: dict[str, int] = {}
        try:
            written = await asyncio.wait_for(
                self._transaction(task, work, offsets), TRANSACTION_TIMEOUT_S)
        except Exception as exc:
            if (not await self._recover(task, exc) or not offsets
                    or not await self._landed(offsets)):
                tracing.settle(work.spans, "aborted")  # read again: the same traces
                task.discard()
                self.task_manager.seek(task)
                return False
            log.warning("%s partition %d: the transaction was committed after all",
                        self.stage.name, task.partition)
        tracing.settle(work.spans, "committed")
        task.committed(offsets, newest_s)
        if written:  # (the apply stage's shards follow what it wrote)
            task.processor.committed(written)
        return True

    async def _landed(self, offsets: dict[TopicPartition, int]) -> bool:
        """Whether a transaction that failed as far as we saw was committed all the same
        (a commit request the broker took before a timeout): the group's committed offsets,
        read after the new producer completed what the old one left, are the batch's."""
        try:
            for tp, offset in offsets.items():
                if await self.consumer.committed(tp) != offset:
                    return False
        except Exception as exc:
            log.warning("%s: committed offsets not read (%s); reading the batch again",
                        self.stage.name, type(exc).__name__)
            return False
        return True

    async def _transaction(self, task: PartitionTask, work: Work,
                           offsets: dict[TopicPartition, int]) -> dict[str, int]:
        """The batch's transaction; returns, per topic, the offset after the last record
        it wrote to the task's partition."""
        producer, partition = task.producer, task.partition
        await producer.begin_transaction()
        sent = [await producer.send(r[0], key=r[1], value=r[2],
                                    headers=list(r[3]) if len(r) == 4 else None)
                for r in work.out]
        sent += [await producer.send(r.topic, key=r.key, value=r.value, partition=r.partition,
                                     timestamp_ms=r.timestamp_ms, headers=list(r.headers))
                 for r in work.placed]
        sent += [await producer.send(topic, key=key, value=value, partition=partition)
                 for topic, key, value in task.changelog()]
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

    async def _recover(self, task: PartitionTask, exc: Exception) -> bool:
        """After a failed transaction: a new producer (its start completes or aborts what
        the old one left open). False when the worker must stop instead."""
        n = task.partition
        if isinstance(exc, ProducerFenced):
            log.warning("%s partition %d is owned by another worker now (%s); letting it go "
                        "until the next assignment", self.stage.name, n, describe(exc))
            await self.task_manager.let_go(n)
            return False
        if isinstance(exc, REFUSED):  # e.g. a dead letter its topic does not take
            self.on_fatal(f"partition {n}: transaction undeliverable ({describe(exc)})",
                          EXIT_UNDELIVERABLE)
            return False
        self.failed_commits += 1
        if task.failed() > MAX_FAILED_IN_ROW:
            self.on_fatal(f"partition {n}: more than {MAX_FAILED_IN_ROW} transactions "
                          f"failed in a row (last: {describe(exc)})")
            return False
        log.warning("%s partition %d: transaction failed (%s); renewing its producer",
                    self.stage.name, n, describe(exc))
        old, task.producer = task.producer, None
        await quietly(old.stop())
        attempt = 0
        while task.producer is None:
            attempt += 1
            await asyncio.sleep(next_delay(RETRY, attempt))
            try:
                task.producer = await self.clients.producer(f"{self.group}-{n}")
            except Exception as err:
                log.warning("%s partition %d: producer not started (%s)", self.stage.name,
                            n, type(err).__name__)
        return True

    async def _not_here(self, task: PartitionTask, not_here: NotHere) -> None:
        """The partition's store shard is not served here (yet): the group of the apply
        stage has not given it to this worker, or is restoring it. Nothing of the batch is
        committed; it is read again after a pause (or by the next owner)."""
        self.shard_waits += 1
        log.info("%s partition %d: %s; reading the batch again", self.stage.name,
                 task.partition, not_here.why)
        task.discard()
        await asyncio.sleep(SHARD_WAIT_S)
        self.task_manager.seek(task)

    # --- metrics -------------------------------------------------------------------------

    async def note_caught_up(self) -> None:
        """A poll found nothing: the inputs whose position reached their highwater are
        done up to it (what lies between the next offset and it are transaction markers)."""
        assigned = self.consumer.assignment()
        for task in list(self.task_manager.by_partition.values()):
            found = {}
            for tp in [tp for tp in task.inputs() if tp in assigned]:
                high = await self._read_to(tp)
                if high is not None:
                    found[tp] = high
            task.caught_up = found

    async def _read_to(self, tp: TopicPartition) -> int | None:
        """``tp``'s highwater when the consumer's position has reached it, else None."""
        high = self._highwater(tp)
        try:
            if high is not None and await self.consumer.position(tp) >= high:
                return high
        except Exception:  # a partition leaving in a rebalance
            pass
        return None

    def _highwater(self, tp: TopicPartition) -> int | None:
        try:
            high = self.consumer.highwater(tp)
        except Exception:
            return None
        return high if isinstance(high, int) else None

    def lags(self) -> dict[tuple[str, int], int]:
        """(topic, partition) -> records not yet handled and committed, for the owned
        inputs (see :meth:`PartitionTask.lags`)."""
        found: dict[tuple[str, int], int] = {}
        if self.consumer is None:
            return found
        for task in list(self.task_manager.by_partition.values()):
            highs = {tp: h for tp in task.inputs()
                     if (h := self._highwater(tp)) is not None}
            found.update({(tp.topic, tp.partition): lag
                          for tp, lag in task.lags(highs).items()})
        return found


def _timestamp(record: Any) -> int:
    return int(record.timestamp)
