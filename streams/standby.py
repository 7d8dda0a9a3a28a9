"""Standby shards: warm copies of partitions other workers own (``store_standby_replicas``).

The cluster map (:mod:`streams.cluster`) names, per partition, the workers that keep a
standby. This worker restores each of its standby partitions (from its checkpoint when it
has one, else from the beginning) and then follows the partition's memory-change, job-result
and memory-access records (``read_committed``: a standby only ever holds committed data, so
its checkpoint, written every few seconds, is always a clean one). When the partition comes
to this worker, :meth:`Standbys.hand_over` gives the shard and its offsets to the
:class:`~streams.shards.ShardKeeper`, which folds the tail and serves it: a failover costs
the tail, not a full restore. Standby shards answer reads only when the owner is
unreachable (:func:`memory.shards.standby_reads`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from typing import Any

from aiokafka.structs import TopicPartition

from memstream.core.topic_reader import Record, follow
from memstream.memory.shards import PartitionedStore
from memstream.memory.store import MemoryStore
from memstream.streams.shards import Offsets, OpenShard, Restore, ShardFiles, restore

log = logging.getLogger(__name__)
CHECKPOINT_S = 5.0


class Standbys:
    """Follows the standby partitions into their shards (see the module doc)."""

    def __init__(self, settings: Any, store: PartitionedStore, open_shard: OpenShard,
                 topics: list[str], opener: Callable[[], Any], files: ShardFiles,
                 clock: Callable[[], float] = time.time) -> None:
        self.settings = settings
        self.store = store
        self.open_shard = open_shard
        self.topics = topics
        self.opener = opener
        self.files = files
        self.clock = clock
        self.requested: set[int] = set()  # the map's standby partitions of this worker
        self.wanted: set[int] = set()  # of those, the ones not owned here: followed
        self.busy: Callable[[], set[int]] = set  # partitions being taken (not to open)
        self.offsets: dict[int, Offsets] = {}
        self.lock = asyncio.Lock()  # a batch being applied, or a hand-over: never both
        self.task: asyncio.Task[None] | None = None
        self.behind: dict[int, bool] = {}

    def want(self, partitions: set[int]) -> None:
        """The map changed: follow these partitions (the owned ones are never standbys)."""
        self.requested = set(partitions)
        self.refresh()

    def refresh(self) -> None:
        """Owned partitions changed: follow what is requested and not owned or being taken."""
        wanted = self.requested - set(self.store.owned) - self.busy()
        if wanted == self.wanted and self.task is not None and not self.task.done():
            return
        self.wanted = wanted
        self._restart()

    def _restart(self) -> None:
        if self.task is not None:
            self.task.cancel()
        self.task = asyncio.create_task(self._run(self.task), name="standby-shards")

    async def hand_over(self, partition: int) -> tuple[MemoryStore, Offsets] | None:
        """The warm shard of ``partition`` and the offsets it holds, no longer followed."""
        async with self.lock:
            shard = self.store.standby.pop(partition, None)
            offsets = self.offsets.pop(partition, None)
            self.wanted.discard(partition)
            self.requested.discard(partition)
            self.behind.pop(partition, None)
            if self.task is not None:
                self.task.cancel()
        self._restart()
        if shard is None or offsets is None:
            return None
        return shard, offsets

    async def stop(self) -> None:
        if self.task is not None:
            self.task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self.task
        async with self.lock:
            for partition in list(self.store.standby):
                shard = self.store.standby.pop(partition)
                await asyncio.to_thread(shard.close)
                if partition in self.offsets:
                    self.files.write_checkpoint(partition, self.offsets[partition], self.clock())

    async def _run(self, previous: asyncio.Task[None] | None) -> None:
        if previous is not None:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await previous
        while True:
            try:
                await self._follow()
                return
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning("standby shards: %s: %s; following again in 2 s",
                            type(exc).__name__, exc)
                await asyncio.sleep(2.0)

    async def _follow(self) -> None:
        for partition in sorted(set(self.store.standby) - self.wanted):  # no longer wanted
            async with self.lock:
                shard = self.store.standby.pop(partition)
                await asyncio.to_thread(shard.close)
                self.offsets.pop(partition, None)
                self.files.wipe(partition)
        opener = await self.opener()
        for partition in sorted(self.wanted - set(self.store.standby) - self.busy()):
            start = self.files.checkpoint(partition, self.clock())
            if start is None:
                self.files.wipe(partition)
            self.files.drop_checkpoint(partition)
            shard = await asyncio.to_thread(self.open_shard, self.files.path(partition))
            self.behind[partition] = True
            async with self.lock:
                ends, changes = await restore(self.settings, self.topics, partition, shard,
                                              opener, start)
                self.store.standby[partition] = shard
                self.offsets[partition] = ends
                self.behind[partition] = False
            log.info("standby shard %d: %s, %d change(s) folded", partition,
                     "caught up" if start else "restored", changes)
        if not self.store.standby:
            return
        positions = {TopicPartition(t, p): self.offsets[p][t]
                     for p in self.store.standby for t in self.topics}
        last = self.clock()

        async def handle(records: list[Record]) -> None:
            nonlocal last
            tp_partition = records[0].partition
            shard = self.store.standby.get(tp_partition)
            if shard is None:
                return
            async with self.lock:
                job = Restore(shard, opener, empty=False)
                step = dict(zip(self.topics, (job.on_changes, job.on_results, job.on_access),
                                strict=True))[records[0].topic]

                def apply() -> None:
                    step(records)
                    job.finish()

                await asyncio.to_thread(apply)
                self.offsets[tp_partition][records[0].topic] = records[-1].offset + 1
            if self.clock() - last >= CHECKPOINT_S:
                last = self.clock()
                for p, offsets in list(self.offsets.items()):
                    self.files.write_checkpoint(p, offsets, last)

        await asyncio.gather(*(follow(self.settings, topic, handle, positions={
            tp: o for tp, o in positions.items() if tp.topic == topic},
            partitions={tp.partition for tp in positions if tp.topic == topic})
            for topic in self.topics))
