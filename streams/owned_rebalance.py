"""How an owned loop (:mod:`streams.owned_loop`) takes and gives up partitions.

The rebalance callbacks do only what is quick: a partition given up is dropped (producer,
tables, positions, the stage's state such as a store shard), a new one is **paused** and
queued. aiokafka sends no heartbeat while a callback runs, so a take that outlasted the
session timeout (a shard restored from the change topic, a table restored from its
changelog) would cost the worker its membership, and the next rebalance the same again.

One task, the **taker**, takes the queued partitions outside the callbacks (Kafka
Streams' restoration does the same), a few at a time, the quickest first (a warm standby,
then a checkpoint, then a full restore: the stage's ``take_order``): the producer first (its
``init_transactions`` fences the previous owner and aborts its open transaction), the
tables restored from their changelogs, the stage's ``prepare`` (the apply stage's shard),
then, under the loop's lock, the committed offsets read (after the fence), the consumer
positioned and the partition resumed and ready. Each partition serves as soon as it is
taken, not when the whole assignment is. A partition given up while it was being taken
(its epoch moved on) is given up again at the end of its take.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.structs import TopicPartition

from memstream.core import kafka
from memstream.core.errors import describe, trace

if TYPE_CHECKING:
    from memstream.core.settings import Settings
    from memstream.streams.stage import Stage

log = logging.getLogger(__name__)
TAKES_AT_ONCE = 3  # a take waits on the broker (a consumer, fetches) as much as it folds


class Rebalancing:
    """The rebalance half of :class:`~streams.owned_loop.OwnedLoop` (see the module doc)."""

    settings: Settings
    stage: Stage
    inputs: list[str]
    tables: Sequence[Any]
    on_fatal: Callable[..., None]
    consumer: AIOKafkaConsumer | None
    producers: dict[int, AIOKafkaProducer]
    owned: set[int]
    ready: set[int]
    next: dict[TopicPartition, int]
    lock: asyncio.Lock
    stopping: asyncio.Event
    let_go: dict[int, float]
    fenced: int

    def _init_rebalancing(self) -> None:
        self.taken: set[int] = set()  # owned partitions whose take is done
        self.epochs: dict[int, int] = {}  # partition -> times it was given up
        self.rebalancing = False  # between the revoke and the assignment
        self.assignments = 0  # assignments seen (0: not joined yet: owns nothing known)
        self.taker: asyncio.Task[None] | None = None
        self._legacy: dict[TopicPartition, int] | None = None  # the Faust group's offsets

    async def _producer(self, partition: int) -> AIOKafkaProducer:
        raise NotImplementedError

    async def _restore(self, partitions: set[int]) -> None:
        raise NotImplementedError

    async def _drop(self, gone: set[int]) -> None:
        raise NotImplementedError

    def _seek(self, partition: int) -> None:
        raise NotImplementedError

    @property
    def taking(self) -> set[int]:
        """Owned partitions still being taken (paused until they are)."""
        return self.owned - self.taken

    # --- the callbacks -------------------------------------------------------------------

    async def revoked(self) -> None:
        async with self.lock:  # waits for the batch in progress to commit
            self.rebalancing = True
            self.ready.clear()

    async def assigned(self, assigned: set[TopicPartition]) -> None:
        try:
            async with self.lock:
                await self._assign(assigned)
        except Exception as exc:
            log.error("%s loop: taking partitions %s failed\n%s", self.stage.name,
                      sorted(assigned), trace(exc))
            self.on_fatal(f"partitions not taken: {describe(exc)}")

    async def _assign(self, assigned: set[TopicPartition]) -> None:
        assert self.consumer is not None
        parts = {tp.partition for tp in assigned}
        beyond = sorted({tp.topic for tp in assigned if tp.partition >= self.settings.partitions})
        if beyond:  # partitions added while the worker ran: users would move (misrouted)
            self.on_fatal(f"{', '.join(beyond)} now has more than the "
                          f"{self.settings.partitions} partitions the worker started with: "
                          "users are placed by murmur2(key) % partitions, so a count cannot "
                          "change in place (docs/operations.md#growing-the-partition-count)")
            return
        for topic in self.inputs:
            got = {tp.partition for tp in assigned if tp.topic == topic}
            if got != parts:
                raise RuntimeError(f"inputs not co-partitioned: {topic} {sorted(got)} "
                                   f"vs {sorted(parts)}")
        gone, new = self.owned - parts, parts - self.owned
        await self._give_up(gone)
        self.owned = parts
        for n in sorted(parts & self.taken):
            if all(tp in self.next for tp in assigned if tp.partition == n):
                self._seek(n)  # (only what is held: a take-back runs outside a callback)
            else:  # taken during the rebalance: not positioned yet
                await self._position(n)
        held = self.consumer.assignment()
        waiting = [tp for tp in assigned if tp.partition in self.taking and tp in held]
        if waiting:
            self.consumer.pause(*waiting)
        self.rebalancing = False
        self.ready = parts & self.taken
        self.assignments += 1
        self.stage.assigned(set(self.ready))
        log.info("%s loop: partitions %s (new %s, being taken %s)", self.stage.name,
                 sorted(parts), sorted(new), sorted(self.taking))
        if self.taking and (self.taker is None or self.taker.done()):
            self.taker = asyncio.create_task(self._take_all(), name=f"{self.stage.name}-take")

    async def _give_up(self, gone: set[int]) -> None:
        if not gone:
            return
        for n in gone:
            self.epochs[n] = self.epochs.get(n, 0) + 1
        self.taken -= gone
        self.ready -= gone
        await self._drop(gone)
        await self._prepare(set(), gone)

    # --- the taker -----------------------------------------------------------------------

    async def _take_all(self) -> None:
        """Up to ``TAKES_AT_ONCE`` takes at a time, started quickest first (their waits on
        the broker overlap); a partition queued meanwhile joins as one ends."""
        slots = asyncio.Semaphore(TAKES_AT_ONCE)
        inflight: dict[int, asyncio.Task[None]] = {}

        async def take(n: int) -> None:
            async with slots:
                await self._take(n)

        try:
            while True:  # stopping: no new take; those in flight end (or are cancelled)
                if not self.stopping.is_set():
                    for n in self._order(self.taking - set(inflight)):
                        inflight[n] = asyncio.create_task(take(n), name=f"take-{n}")
                if not inflight:
                    return
                await asyncio.wait(set(inflight.values()), return_when=asyncio.FIRST_COMPLETED)
                for n, task in list(inflight.items()):
                    if task.done():
                        del inflight[n]
                        task.result()  # a take that failed raises here
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.error("%s loop: taking a partition failed\n%s", self.stage.name, trace(exc))
            self.on_fatal(f"partition not taken: {describe(exc)}")
        finally:  # no take outlives the taker (one would install a producer after stop())
            for task in inflight.values():
                task.cancel()
            await asyncio.gather(*inflight.values(), return_exceptions=True)

    def _order(self, partitions: set[int]) -> list[int]:
        return list(self.stage.take_order(partitions))

    async def _take(self, n: int) -> None:
        epoch = self.epochs.get(n, 0)
        started = time.perf_counter()
        producer = await self._producer(n)  # fences the previous owner
        installed = False
        try:
            await self._restore({n})
            await self._prepare({n}, set())
            async with self.lock:
                if (self.epochs.get(n, 0) != epoch or n not in self.owned
                        or self.stopping.is_set()):
                    log.info("%s partition %d: given up while being taken", self.stage.name, n)
                    await self._undo(n)
                    return
                self.producers[n] = producer
                installed = True
                await self._position(n)
                self.taken.add(n)
                if not self.rebalancing:
                    self.ready.add(n)
                    self.stage.assigned(set(self.ready))
        finally:
            if not installed:
                await quietly(producer.stop())
        log.info("%s partition %d taken in %.2fs", self.stage.name, n,
                 time.perf_counter() - started)

    async def _undo(self, n: int) -> None:
        """What a take left of a partition no longer ours (tables, the stage's state)."""
        await self._drop({n})
        await self._prepare(set(), {n})

    async def _position(self, n: int) -> None:
        """The committed offsets (read after the fence) as the next ones, the consumer
        positioned there and the partition resumed."""
        assert self.consumer is not None
        mine = [tp for tp in self.consumer.assignment() if tp.partition == n]
        for tp in sorted(mine):
            committed = await self.consumer.committed(tp)
            if committed is None:
                committed = await self._first_offset(tp)
            self.next[tp] = committed
        # a rebalance that began meanwhile took the assignment away: its callback seeks
        # to these offsets (the partition is still ours) or drops them
        self._seek(n)
        held = self.consumer.assignment()
        self.consumer.resume(*(tp for tp in mine if tp in held))

    async def _prepare(self, new: set[int], gone: set[int]) -> None:
        """The stage's own state of partitions taken and given up (the apply stage's
        store shards: streams.shards)."""
        await self.stage.prepare(new, gone)

    async def stop_taking(self, wait_s: float) -> None:
        """At shutdown: the take in progress finishes (a shard restore is not cut off
        half-way) within ``wait_s``, else it is cancelled."""
        if self.taker is None or self.taker.done():
            return
        done, _ = await asyncio.wait({self.taker}, timeout=wait_s)
        if not done:
            self.taker.cancel()
            await asyncio.gather(self.taker, return_exceptions=True)

    # --- a fenced partition --------------------------------------------------------------

    async def _let_go(self, partition: int) -> None:
        """Another worker fenced this partition: forget it as if revoked (an assignment
        that gives it back treats it as new: fence, restore, committed offsets)."""
        self.fenced += 1
        self.let_go[partition] = time.monotonic()
        self.owned.discard(partition)
        for table in self.tables:
            table.discard(partition)
        await self._give_up({partition})

    async def _take_back(self) -> None:
        """A partition let go that no rebalance took from this worker within two session
        timeouts (a fence from a newer generation is followed by this worker's own
        rebalance well within that: its heartbeat fails, it rejoins; past it, the fence
        came from a worker whose assignment was the stale one): taken again, as a new
        partition (which fences that one in turn)."""
        assert self.consumer is not None
        wait = 2 * self.settings.session_timeout_s
        now = time.monotonic()
        assigned = self.consumer.assignment()
        mine = {tp.partition for tp in assigned}
        self.let_go = {n: t for n, t in self.let_go.items() if n in mine and n not in self.owned}
        if any(now - t >= wait for t in self.let_go.values()):
            log.warning("%s: partitions %s still assigned here after being fenced; taking "
                        "them again", self.stage.name, sorted(self.let_go))
            async with self.lock:
                await self._assign(set(assigned))
            self.let_go.clear()

    async def _first_offset(self, tp: TopicPartition) -> int:
        """Where a partition this group never committed starts: where the Faust agents of
        an earlier version had got (its group ``{app_id}``: an upgrade neither reads
        everything again nor skips anything), else the beginning."""
        if self._legacy is None:
            self._legacy = {}
            admin = kafka.admin(self.settings)
            try:
                await admin.start()
                found = await admin.list_consumer_group_offsets(self.settings.app_id)
                self._legacy = {t: o.offset for t, o in found.items() if o.offset >= 0}
            except Exception as exc:  # no such group: a new deployment
                log.debug("no offsets of group %s (%s)", self.settings.app_id, exc)
            finally:
                await quietly(admin.close())
        if tp in self._legacy:
            log.info("%s: %s starts where the Faust agents were (%d)", self.stage.name,
                     tp, self._legacy[tp])
            return self._legacy[tp]
        assert self.consumer is not None
        return int((await self.consumer.beginning_offsets([tp]))[tp])


async def quietly(coro: Any) -> None:
    """Await ``coro`` (closing a client), its failure only logged."""
    try:
        await coro
    except Exception as exc:  # closing a client that already failed
        log.debug("closing: %s", exc)
