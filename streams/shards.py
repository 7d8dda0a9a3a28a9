"""The store shards' life in a worker (``store_partitioned``): the memory-change topic is
their changelog, as Kafka Streams and Faust tables keep their state.

- **Take** (the apply loop, after its producer fenced the partition's previous owner, before
  any record of it is handled): a standby copy is caught up and promoted; a shard this worker
  left cleanly is caught up from its checkpoint (the topics' offsets it holds, written when
  it was closed); anything else is wiped and restored from the beginning. A restore folds,
  for the partition, the memory-change topic (:class:`memory.store.rebuild_fold.Fold` into an empty
  shard, :func:`memory.applying.apply_change` onto a caught-up one), then the job results (the
  user's cursor: a job that changed nothing leaves no change event, yet fences its seq), then
  the hit statistics of the memory-access topic, all ``read_committed`` to the ends as they
  are after the fence.
- **Release** (revoked): a partition the new map names this worker a standby of keeps its
  shard as the standby, followed from the offsets it holds (a join's moved partitions are
  then read from the old owner while the new one restores them); any other is closed and
  deleted — a shard nobody follows must not keep what a forget-me erases. On shutdown
  every owned shard is closed with a checkpoint instead, so a restart replays only the
  tail.
- **Standby**: the partitions the cluster map names this worker a standby of are followed
  (:class:`Standbys`); their shards serve reads only when the owner is unreachable.
- **Global**: the tenant-wide memories, from the global-changes topic, in every worker.
"""

from __future__ import annotations

import asyncio
import json
import logging
import shutil
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, TypeVar

from aiokafka.structs import TopicPartition
from pydantic import BaseModel

from memstream.core.errors import describe
from memstream.core.topic_reader import Record, end_offsets, read_ranges
from memstream.memory.applying import apply_change
from memstream.memory.fencing import Cursor
from memstream.memory.store import MemoryStore, Scope
from memstream.memory.store.partitioned import SHARDS_DIR, PartitionedStore
from memstream.memory.store.rebuild_fold import Fold, Opener, fold_access
from memstream.topics.schemas import AccessEvent, JobResult, JobStatus, MemoryChange

log = logging.getLogger(__name__)
_Parsed = TypeVar("_Parsed", bound=BaseModel)


def _parsed(model: type[_Parsed], record: Record) -> _Parsed | None:
    """``record``'s value as ``model``, or None (a tombstone, or a record that does not
    validate: logged by where it is, never by what it holds)."""
    if record.value is None:
        return None
    try:
        return model.model_validate_json(record.value)
    except ValueError as exc:
        log.warning("%s[%d]@%d is no %s (%s); skipped in the restore", record.topic,
                    record.partition, record.offset, model.__name__, describe(exc))
        return None
ENDS_S = 5.0  # reading the access topic's ends as a shard becomes a standby
CLOSE_ENDS_S = 10.0  # ... at shutdown, for the checkpoints
OpenShard = Callable[[Path], MemoryStore]
Offsets = dict[str, int]  # topic -> the next offset to fold, of one partition


UserKey = tuple[str, str]


class Restore:
    """One partition's shard brought up to the topics' ends (see the module doc).

    Changes are folded as they come; job results and hit statistics are gathered and
    folded by :meth:`finish`, after every change: a result's cursor must never run ahead
    of its job's changes, whatever order the three topics are read in. ``cursors``: the
    cursors gathered so far (a standby's, handed over with its shard).
    """

    def __init__(self, shard: MemoryStore, opener: Opener | None, *, empty: bool,
                 cursors: dict[UserKey, Cursor] | None = None) -> None:
        self.shard = shard
        self.opener = opener
        self.fold = Fold(shard, opener) if empty else None
        self.erased: dict[UserKey, float] = {}
        self.accesses: list[AccessEvent] = []
        self.cursors: dict[UserKey, Cursor] = dict(cursors or {})
        self.changes = 0

    def on_changes(self, records: list[Record]) -> None:
        for r in records:
            if r.value is None:
                continue
            change = MemoryChange.model_validate_json(r.value)
            self.changes += 1
            if self.fold is not None:
                self.fold.add(change)
                continue
            opened = self.opener(change) if self.opener is not None else change
            if opened is not None and not opened.sealed:
                apply_change(self.shard, opened)
                if opened.op == "erase":
                    self.erased[(opened.tenant_id, opened.user_id)] = \
                        opened.decided_at.timestamp()

    def on_results(self, records: list[Record]) -> None:
        """A job the apply stage reported done holds the user's cursor at its seq. A record
        that is no job result (anyone who may write the topic can write one; the ingest
        stage sets it aside) holds nothing: skipped."""
        for r in records:
            result = _parsed(JobResult, r)
            if result is None:
                continue
            if result.status != JobStatus.DONE or not result.seq:
                continue
            key = (result.tenant_id, result.user_id)
            held = self.cursors.get(key)
            if held is None or held.seq < result.seq:
                self.cursors[key] = Cursor(result.seq, result.job_id)

    def on_access(self, records: list[Record]) -> None:
        """Hits, to fold; a record that is no access event is skipped (the access stage sets
        it aside)."""
        self.accesses.extend(e for e in (_parsed(AccessEvent, r) for r in records)
                             if e is not None)

    def finish(self, *, cursors: bool = True) -> None:
        """What is gathered, folded: the changes held, then (``cursors``) the results'
        cursors, then the hits. A standby keeps its cursors gathered (``cursors=False``)
        until it is handed over: its changes may lag its results."""
        if self.fold is not None:
            self.fold.finish()
            self.erased.update(self.fold.erased)
            self.fold = None
        if cursors:
            for (tenant, user), cursor in self.cursors.items():
                scope = Scope(tenant, user)
                held = self.shard.cursor(scope)
                if held is None or held.seq < cursor.seq:
                    self.shard.set_cursor(scope, cursor)
        fold_access(self.shard, self.accesses, None, self.erased)
        self.accesses.clear()


class ShardFiles:
    """Where a partition's shard and its checkpoint live: ``data_dir/store/<p>`` and
    ``data_dir/store/<p>.checkpoint.json`` (present only while the shard is closed)."""

    def __init__(self, root: Path, erasure_bound_s: float) -> None:
        self.root = root
        self.erasure_bound_s = erasure_bound_s

    def path(self, partition: int | str) -> Path:
        return self.root / str(partition)

    def _checkpoint(self, partition: int | str) -> Path:
        return self.root / f"{partition}.checkpoint.json"

    def checkpoint(self, partition: int | str, now: float,
                   topics: Iterable[str]) -> Offsets | None:
        """The offsets a closed shard holds, if it was closed cleanly within the erasure
        bound (an older copy may hold users forgotten since: it is restored anew) from
        exactly ``topics`` (a shard of another topic set, as after ``memstream topics
        grow``, holds other users: restored anew too)."""
        try:
            raw = json.loads(self._checkpoint(partition).read_text())
            if now - float(raw["at"]) > self.erasure_bound_s:
                return None
            offsets = {str(t): int(o) for t, o in raw["offsets"].items()}
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            return None  # unreadable: restored anew
        return offsets if set(offsets) == set(topics) else None

    def write_checkpoint(self, partition: int | str, offsets: Offsets, now: float) -> None:
        tmp = self._checkpoint(partition).with_suffix(".tmp")
        tmp.write_text(json.dumps({"offsets": offsets, "at": now}))
        tmp.replace(self._checkpoint(partition))

    def drop_checkpoint(self, partition: int | str) -> None:
        self._checkpoint(partition).unlink(missing_ok=True)

    def wipe(self, partition: int | str) -> None:
        self.drop_checkpoint(partition)
        shutil.rmtree(self.path(partition), ignore_errors=True)


async def restore(settings: Any, topics: list[str], partition: int, shard: MemoryStore,
                  opener: Opener | None, start: Offsets | None, *,
                  cursors: dict[UserKey, Cursor] | None = None, fold_cursors: bool = True,
                  ) -> tuple[Offsets, Restore]:
    """Fold ``topics`` (changes, results, access) of ``partition`` from ``start`` (None: an
    empty shard, from the beginning) to their ends now, with one reader; returns the ends
    and the fold (its ``changes`` counted, its ``cursors`` gathered)."""
    job = Restore(shard, opener, empty=start is None, cursors=cursors)
    handlers = dict(zip(topics, (job.on_changes, job.on_results, job.on_access), strict=True))
    tps = [TopicPartition(t, partition) for t in topics]
    ends: dict[TopicPartition, int] = {}

    async def handle(tp: TopicPartition, records: list[Record]) -> None:
        await asyncio.to_thread(handlers[tp.topic], records)
        ends[tp] = records[-1].offset + 1

    await read_ranges(settings, tps, handle, start={
        tp: start[tp.topic] for tp in tps if start and tp.topic in start})
    await asyncio.to_thread(job.finish, cursors=fold_cursors)
    done = {tp.topic: ends.get(tp, (start or {}).get(tp.topic, 0)) for tp in tps}
    return done, job


class ShardKeeper:
    """Opens, restores, checkpoints and closes the owned shards of a :class:`PartitionedStore`
    (see the module doc); the standbys and the global shard are :mod:`streams.standby`'s."""

    def __init__(self, settings: Any, store: PartitionedStore, open_shard: OpenShard,
                 topics: list[str], opener: Callable[[], Any],
                 clock: Callable[[], float] = time.time) -> None:
        self.settings = settings
        self.store = store
        self.open_shard = open_shard
        self.topics = topics
        self.opener = opener  # async: the opener of sealed events once the keys are read
        self.clock = clock
        self.files = ShardFiles(settings.data_dir / SHARDS_DIR, settings.erasure_bound_s)
        self.restoring: dict[int, float] = {}  # partition -> when its restore began
        self.restores: list[tuple[int, int, float]] = []  # partition, changes, seconds
        self.standbys: Any = None  # streams.standby.Standbys, which hands over warm copies
        self.held: dict[int, Offsets] = {}  # owned partition -> the topics' offsets in it

    async def take(self, partitions: set[int]) -> None:
        for partition in sorted(partitions - set(self.store.owned)):
            started = time.perf_counter()
            self.restoring[partition] = self.clock()
            try:
                warm = await self.standbys.hand_over(partition) if self.standbys else None
                gathered: dict[UserKey, Cursor] = {}
                if warm is not None:
                    shard, start, gathered = warm
                else:
                    start = self.files.checkpoint(partition, self.clock(), self.topics)
                    if start is None:
                        self.files.wipe(partition)
                    shard = await asyncio.to_thread(self.open_shard, self.files.path(partition))
                self.files.drop_checkpoint(partition)  # open: no longer a clean copy
                done, job = await restore(self.settings, self.topics, partition, shard,
                                          await self.opener(), start, cursors=gathered)
                changes = job.changes
                self.store.owned[partition] = shard
                self.held[partition] = done
            finally:
                self.restoring.pop(partition, None)
            seconds = time.perf_counter() - started
            self.restores.append((partition, changes, seconds))
            log.info("shard %d: %s, %d change(s) folded in %.2fs", partition,
                     "promoted" if warm else ("caught up" if start else "restored"), changes,
                     seconds)

    def order(self, partitions: set[int]) -> list[int]:
        """The quickest takes first: a warm standby (its tail), then a clean checkpoint
        (the tail since it), then full restores."""
        warm = set(self.store.standby)
        now = self.clock()

        def cost(n: int) -> tuple[int, int]:
            if n in warm:
                return 0, n
            return (1 if self.files.checkpoint(n, now, self.topics) is not None else 2), n

        return sorted(partitions, key=cost)

    def wrote(self, partition: int, offsets: Offsets) -> None:
        """The apply loop committed records of ``partition`` up to these offsets (the
        next after its own last one, per topic): the shard holds them."""
        held = self.held.get(partition)
        if held is not None:
            for topic, offset in offsets.items():
                if topic in self.topics:
                    held[topic] = max(held.get(topic, 0), offset)

    async def release(self, partitions: set[int]) -> None:
        """Given up: kept as a standby when the map names this worker one (from what it
        holds: the restore's ends and this worker's own committed writes since, exact
        even if another worker wrote meanwhile; the hits from the access topic's end now);
        else closed and deleted (a copy nobody follows must not keep what a forget-me
        erases; a standby of it is restored anew)."""
        ends: dict[str, dict[int, int]] | None = None
        for partition in sorted(partitions & set(self.store.owned)):
            shard = self.store.owned.pop(partition)
            held = self.held.pop(partition, None)
            if (held is not None and self.standbys is not None
                    and partition in self.standbys.requested):
                if ends is None:
                    ends = await self._access_ends(ENDS_S)
                if ends:
                    held[self.topics[2]] = ends[self.topics[2]].get(partition, 0)
                    await self.standbys.adopt(partition, shard, held)
                    log.info("shard %d: kept as a standby", partition)
                    continue
            await asyncio.to_thread(shard.close)
            self.files.wipe(partition)
        if self.standbys is not None:
            self.standbys.refresh()  # a partition it stands by for now

    async def _access_ends(self, timeout_s: float) -> dict[str, dict[int, int]]:
        """The memory-access topic's ends now ({}: the broker is away)."""
        try:
            return await asyncio.wait_for(end_offsets(self.settings, self.topics[2:]),
                                          timeout_s)
        except Exception as exc:  # the broker is away: the shard is restored anew
            log.warning("access ends not read (%s): no standby kept, no checkpoint written",
                        type(exc).__name__)
            return {}

    async def close(self) -> None:
        """Shutdown: every owned shard closed with a checkpoint, so a restart folds only
        the tail. The changes and results it holds are the restore's ends and its own
        committed writes since (the topics' ends could already hold a new owner's records
        if the stop outlasted the session); the hits are the access topic's ends now. With
        the broker away, no checkpoint: the next start restores in full."""
        ends = await self._access_ends(CLOSE_ENDS_S) if self.store.owned else {}
        for partition in sorted(self.store.owned):
            shard = self.store.owned.pop(partition)
            held = self.held.pop(partition, None)
            await asyncio.to_thread(shard.close)
            if ends and held is not None:
                offsets = {**{t: held[t] for t in self.topics[:2]},
                           self.topics[2]: ends[self.topics[2]].get(partition, 0)}
                self.files.write_checkpoint(partition, offsets, self.clock())
