"""How a stage loop (:mod:`streams.owned_loop`) takes and gives up partitions: its map of
:class:`~streams.partition_task.PartitionTask` (Kafka Streams' ``TaskManager``).

The rebalance callbacks do only what is quick: a partition given up is let go (producer,
table slice, positions, the stage's state such as a store shard), a new one gets a task
in ``TAKING``, is **paused** and queued. aiokafka sends no heartbeat while a callback runs,
so a take that outlasted the session timeout (a shard restored from the change topic, a
table restored from its changelog) would cost the worker its membership, and the next
rebalance the same again.

One asyncio task, the **taker**, takes the queued partitions outside the callbacks (Kafka
Streams' restoration does the same), a few at a time, the quickest first (a warm standby,
then a checkpoint, then a full restore: the stage's ``take_order``): the producer first
(its ``init_transactions`` fences the previous owner and aborts its open transaction),
then ``RESTORING``: the tables read back from their changelogs and the stage's ``prepare``
(the apply stage's shard); then, under the loop's lock, the committed offsets read (after
the fence), the consumer positioned, the partition resumed and ``SERVING``. Each partition
serves as soon as it is taken, not when the whole assignment is. A take whose task is no
longer the map's (given up meanwhile, perhaps taken again) undoes what it restored.

Between a revoke and the next assignment (``rebalancing``) no task serves records.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from aiokafka.structs import TopicPartition

from memstream.core.errors import describe, trace
from memstream.core.retry import (
    RetriesExhausted,
    RetryPolicy,
    is_transient,
    next_delay,
    set_within,
)
from memstream.streams.loop_clients import LoopClients, quietly
from memstream.streams.partition_task import PartitionTask, TaskState
from memstream.streams.stage import Stage, TaskContext

if TYPE_CHECKING:
    from memstream.core.settings import Settings

log = logging.getLogger(__name__)
TAKES_AT_ONCE = 3  # a take waits on the broker (a consumer, fetches) as much as it folds
TAKE_RETRY = RetryPolicy(first_delay_s=0.5, max_delay_s=5.0)  # a take that failed, again
FENCE_WAIT_S = 10.0  # a rebalance waits this long at most for the fences this worker started


class TaskManager:
    """See the module docstring. ``consumer``: the loop's, set once it is made."""

    def __init__(self, settings: Settings, stage: Stage, clients: LoopClients, group: str,
                 lock: asyncio.Lock, stopping: asyncio.Event,
                 on_fatal: Callable[..., None]) -> None:
        self.settings = settings
        self.stage = stage
        self.clients = clients
        self.group = group
        self.lock = lock  # the loop's: a batch, or a rebalance step, never both
        self.stopping = stopping
        self.on_fatal = on_fatal
        self.consumer: Any = None
        self.by_partition: dict[int, PartitionTask] = {}
        self.epochs = 0  # tasks made
        self.rebalancing = False  # between the revoke and the assignment
        self.steady = asyncio.Event()  # set: no rebalance under way (a take may fence)
        self.steady.set()
        self.fencing: set[asyncio.Future[Any]] = set()  # producers being made (the fences)
        self.assignments = 0  # assignments seen (0: not joined yet: owns nothing known)
        self.fenced = 0  # partitions let go: another worker's producer fenced them
        self.taker: asyncio.Task[None] | None = None
        self.queued = asyncio.Event()  # partitions queued while the taker runs
        self.retry = TAKE_RETRY

    # --- what the loop reads -------------------------------------------------------------

    @property
    def owned(self) -> set[int]:
        return {n for n, t in self.by_partition.items() if not t.gone}

    @property
    def taking(self) -> set[int]:
        """Owned partitions still being taken (paused until they are)."""
        return {n for n, t in self.by_partition.items() if t.being_taken}

    @property
    def ready(self) -> set[int]:
        """Partitions whose records are handled now."""
        if self.rebalancing:
            return set()
        return {n for n, t in self.by_partition.items() if t.serving}

    def serving_task(self, partition: int) -> PartitionTask | None:
        task = self.by_partition.get(partition)
        return task if task is not None and task.serving and not self.rebalancing else None

    def producer(self, partition: int) -> Any:
        """The producer of a task being served (tests and metrics)."""
        task = self.by_partition.get(partition)
        return None if task is None else task.producer

    # --- the callbacks -------------------------------------------------------------------

    async def revoked(self) -> None:
        async with self.lock:  # waits for the batch in progress to commit
            self.rebalancing = True
            self.steady.clear()
        # A fence this worker started must land before it rejoins: made after the new
        # owner's, it would fence the owner (which then serves nothing for two session
        # timeouts) although this worker gives the partition up. No new one starts until
        # the assignment (_take_once waits for steady).
        if self.fencing:
            await asyncio.wait(set(self.fencing), timeout=FENCE_WAIT_S)

    async def assigned(self, assigned: set[TopicPartition]) -> None:
        try:
            async with self.lock:
                await self.assign(assigned)
        except Exception as exc:
            log.error("%s loop: taking partitions %s failed\n%s", self.stage.name,
                      sorted(assigned), trace(exc))
            self.on_fatal(f"partitions not taken: {describe(exc)}")

    async def assign(self, assigned: set[TopicPartition]) -> None:
        """The assignment's step (under the loop's lock)."""
        parts = {tp.partition for tp in assigned}
        beyond = sorted({tp.topic for tp in assigned if tp.partition >= self.settings.partitions})
        if beyond:  # partitions added while the worker ran: users would move (misrouted)
            self.on_fatal(f"{', '.join(beyond)} now has more than the "
                          f"{self.settings.partitions} partitions the worker started with: "
                          "users are placed by murmur2(key) % partitions, so a count cannot "
                          "change in place (docs/operations.md#growing-the-partition-count)")
            return
        for topic in self.stage.inputs:
            got = {tp.partition for tp in assigned if tp.topic == topic}
            if got != parts:
                raise RuntimeError(f"inputs not co-partitioned: {topic} {sorted(got)} "
                                   f"vs {sorted(parts)}")
        gone, new = self.owned - parts, parts - self.owned
        await self.give_up(gone)
        for n in [n for n, t in self.by_partition.items() if t.gone and n not in parts]:
            del self.by_partition[n]  # fenced, and not ours any more: nothing to take back
        for n in sorted(new):
            self.epochs += 1
            self.by_partition[n] = PartitionTask(n, self.epochs, self.stage.tables)
        for task in [self.by_partition[n] for n in sorted(parts) if self.by_partition[n].serving]:
            if all(tp in task.offsets for tp in assigned if tp.partition == task.partition):
                self.seek(task)  # (only what is held: a take-back runs outside a callback)
            else:  # taken during the rebalance: not positioned yet
                await self._position(task)
        held = self.consumer.assignment()
        waiting = [tp for tp in assigned if tp.partition in self.taking and tp in held]
        if waiting:
            self.consumer.pause(*waiting)
        self.rebalancing = False
        self.steady.set()
        self.assignments += 1
        self.stage.assigned(self.ready)
        log.info("%s loop: partitions %s (new %s, being taken %s)", self.stage.name,
                 sorted(parts), sorted(new), sorted(self.taking))
        if self.taking and (self.taker is None or self.taker.done()):
            self.taker = asyncio.create_task(self._take_all(), name=f"{self.stage.name}-take")
        elif self.taking:
            self.queued.set()  # a take in flight (retrying, say) must not hold these back

    async def give_up(self, gone: set[int], fenced_at: float | None = None) -> None:
        """Let ``gone`` go: revoked (out of the map) or fenced (kept, with the time)."""
        if not gone:
            return
        for n in gone:
            task = self.by_partition[n] if fenced_at is not None else self.by_partition.pop(n)
            producer = task.let_go(fenced_at)
            if producer is not None:
                await quietly(producer.stop())
        await self.stage.prepare(set(), gone)

    # --- the taker -----------------------------------------------------------------------

    async def _take_all(self) -> None:
        """Up to ``TAKES_AT_ONCE`` takes at a time, started quickest first (their waits on
        the broker overlap); a partition queued meanwhile joins as one ends."""
        slots = asyncio.Semaphore(TAKES_AT_ONCE)
        inflight: dict[int, asyncio.Task[None]] = {}

        async def take(task: PartitionTask) -> None:
            async with slots:
                await self._take(task)

        try:
            while True:  # stopping: no new take; those in flight end (or are cancelled)
                self.queued.clear()
                if not self.stopping.is_set():
                    for n in self.stage.take_order(self.taking - set(inflight)):
                        inflight[n] = asyncio.create_task(take(self.by_partition[n]),
                                                          name=f"take-{n}")
                if not inflight:
                    return
                queued = asyncio.ensure_future(self.queued.wait())
                try:
                    await asyncio.wait({*inflight.values(), queued},
                                       return_when=asyncio.FIRST_COMPLETED)
                finally:
                    queued.cancel()
                for n, running in list(inflight.items()):
                    if running.done():
                        del inflight[n]
                        running.result()  # a take that failed raises here
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.error("%s loop: taking a partition failed\n%s", self.stage.name, trace(exc))
            self.on_fatal(f"partition not taken: {describe(exc)}")
        finally:  # no take outlives the taker (one would install a producer after stop())
            for running in inflight.values():
                running.cancel()
            await asyncio.gather(*inflight.values(), return_exceptions=True)

    def _current(self, task: PartitionTask) -> bool:
        return (self.by_partition.get(task.partition) is task and not task.gone
                and not self.stopping.is_set())

    async def _take(self, task: PartitionTask) -> None:
        """Take ``task``'s partition. A take that fails for a reason that passes (the broker
        restarting, a leader moving: :func:`~memstream.core.retry.is_transient`) is undone
        and tried again while the partition is still this worker's, for up to
        ``broker_wait_s`` after its first failure (a worker started while the broker is away
        waits as long); any other failure, or one past that, ends the worker."""
        n = task.partition
        started = time.perf_counter()
        failures = 0
        give_up_at: float | None = None
        while True:
            try:
                taken = await self._take_once(task)
                break
            except Exception as exc:
                if not is_transient(exc):
                    raise
                if not self._current(task):  # given up meanwhile: the broker's loss is moot
                    log.info("%s partition %d: given up while being taken (%s)",
                             self.stage.name, n, describe(exc))
                    await self._undo(task)
                    return
                failures += 1
                now = time.monotonic()
                give_up_at = now + self.settings.broker_wait_s if give_up_at is None \
                    else give_up_at
                delay = next_delay(self.retry, failures)
                if now + delay > give_up_at:
                    raise RetriesExhausted(failures, exc, f"{self.settings.broker_wait_s:g} "
                                           "s of broker_wait_s") from exc
                log.warning("%s partition %d: take failed (%s); again in %.1f s",
                            self.stage.name, n, describe(exc), delay)
                await self._reset(task)
            if await set_within(self.stopping, delay) or not self._current(task):
                return  # stopping, or given up meanwhile (its state is let go already)
        if taken:
            log.info("%s partition %d taken in %.2fs", self.stage.name, n,
                     time.perf_counter() - started)

    async def _take_once(self, task: PartitionTask) -> bool:
        """One attempt: False if the partition was given up meanwhile (undone)."""
        n = task.partition
        await self._steady()
        if not self._current(task):
            log.info("%s partition %d: given up while being taken", self.stage.name, n)
            return False
        making = asyncio.ensure_future(self.clients.producer(f"{self.group}-{n}"))
        self.fencing.add(making)  # (it fences the last owner)
        try:
            producer = await making
        finally:
            self.fencing.discard(making)
        installed = False
        try:
            if not self._current(task):
                log.info("%s partition %d: given up while being taken", self.stage.name, n)
                return False
            if task.state is TaskState.TAKING:
                task.move(TaskState.RESTORING)
            await self.clients.restore(task.tables, {n})
            await self.stage.prepare({n}, set())
            async with self.lock:
                if not self._current(task):
                    log.info("%s partition %d: given up while being taken", self.stage.name, n)
                    await self._undo(task)
                    return False
                await self._position(task)
                task.producer = producer
                installed = True
                task.serve(self.stage.open(TaskContext(n, task.slices)))
                if not self.rebalancing:
                    self.stage.assigned(self.ready)
        finally:
            if not installed:
                await quietly(producer.stop())
        return True

    async def _steady(self) -> None:
        """Until no rebalance is under way (or the loop stops)."""
        if self.steady.is_set() or self.stopping.is_set():
            return
        waits = {asyncio.ensure_future(self.steady.wait()),
                 asyncio.ensure_future(self.stopping.wait())}
        try:
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for w in waits:
                w.cancel()

    async def _reset(self, task: PartitionTask) -> None:
        """What a failed attempt restored, dropped before the next (the partition paused
        again, its table slice and the stage's state of it let go)."""
        n = task.partition
        mine = [tp for tp in self.consumer.assignment() if tp.partition == n]
        if mine:
            self.consumer.pause(*mine)
        task.forget()
        await self.stage.prepare(set(), {n})

    async def _undo(self, task: PartitionTask) -> None:
        """What a take restored of a partition no longer its (table slice, the stage's
        state). A newer task of the partition waits for this take to end before its own
        begins (the taker keys takes by partition), so nothing of it is undone here."""
        task.let_go()
        await self.stage.prepare(set(), {task.partition})

    async def _position(self, task: PartitionTask) -> None:
        """The committed offsets (read after the fence) as the next ones, the consumer
        positioned there and the partition resumed."""
        mine = [tp for tp in self.consumer.assignment() if tp.partition == task.partition]
        for tp in sorted(mine):
            committed = await self.consumer.committed(tp)
            if committed is None:
                committed = await self.clients.first_offset(self.consumer, tp)
            task.offsets[tp] = committed
        # a rebalance that began meanwhile took the assignment away: its callback seeks
        # to these offsets (the partition is still ours) or drops them
        self.seek(task)
        held = self.consumer.assignment()
        self.consumer.resume(*(tp for tp in mine if tp in held))

    def seek(self, task: PartitionTask) -> None:
        """The consumer back to the task's next offsets (what it holds of them)."""
        assigned = self.consumer.assignment()
        for tp, offset in task.offsets.items():
            if tp in assigned:
                self.consumer.seek(tp, offset)

    async def settled(self) -> None:
        """Until the takes queued so far are done (a barrier for tests and the worker)."""
        while self.taker is not None and not self.taker.done():
            await asyncio.wait({self.taker})

    async def stop_taking(self, wait_s: float) -> None:
        """At shutdown: the take in progress finishes (a shard restore is not cut off
        half-way) within ``wait_s``, else it is cancelled."""
        if self.taker is None or self.taker.done():
            return
        done, _ = await asyncio.wait({self.taker}, timeout=wait_s)
        if not done:
            self.taker.cancel()
            await asyncio.gather(self.taker, return_exceptions=True)

    async def close(self) -> None:
        """Every producer closed (the worker stops)."""
        for task in list(self.by_partition.values()):
            producer, task.producer = task.producer, None
            if producer is not None:
                await producer.stop()

    # --- a fenced partition --------------------------------------------------------------

    async def let_go(self, partition: int) -> None:
        """Another worker fenced this partition: let go as if revoked (an assignment that
        gives it back takes it as new: fence, restore, committed offsets)."""
        self.fenced += 1
        await self.give_up({partition}, fenced_at=time.monotonic())

    def fenced_here(self) -> dict[int, float]:
        return {n: t.fenced_at for n, t in self.by_partition.items()
                if t.gone and t.fenced_at is not None}

    async def take_back(self) -> None:
        """A partition let go that no rebalance took from this worker within two session
        timeouts (a fence from a newer generation is followed by this worker's own
        rebalance well within that: its heartbeat fails, it rejoins; past it, the fence
        came from a worker whose assignment was the stale one): taken again, as a new
        partition (which fences that one in turn)."""
        wait = 2 * self.settings.session_timeout_s
        now = time.monotonic()
        assigned = self.consumer.assignment()
        mine = {tp.partition for tp in assigned}
        for n in [n for n in self.fenced_here() if n not in mine]:
            del self.by_partition[n]
        fenced = self.fenced_here()
        if any(now - t >= wait for t in fenced.values()):
            log.warning("%s: partitions %s still assigned here after being fenced; taking "
                        "them again", self.stage.name, sorted(fenced))
            async with self.lock:
                await self.assign(set(assigned))
