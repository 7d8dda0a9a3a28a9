"""A partition's shard brought up to its topics' ends: the memory-change topic folded (a
:class:`memory.store.rebuild_fold.Fold` into an empty shard, :func:`memory.applying.apply_change`
onto a caught-up one), then the job results (the users' cursors) and the hit statistics of
the memory-access topic, ``read_committed``. A worker's take (:mod:`streams.shards`), its
standbys (:mod:`streams.standby`) and the shard builders (:mod:`streams.shard_builders`)
all restore so.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any, TypeVar

from aiokafka.structs import TopicPartition
from pydantic import BaseModel

from memstream.core import record_auth, record_keys
from memstream.core.errors import describe
from memstream.core.settings import Settings
from memstream.core.topic_reader import Record, read_ranges
from memstream.memory.applying import apply_change
from memstream.memory.fencing import Cursor
from memstream.memory.store import MemoryStore, Scope
from memstream.memory.store.rebuild_fold import Fold, Opener, fold_access
from memstream.topics.schemas import AccessEvent, JobResult, JobStatus, MemoryChange

log = logging.getLogger(__name__)
_Parsed = TypeVar("_Parsed", bound=BaseModel)
Offsets = dict[str, int]  # topic -> the next offset to fold, of one partition
UserKey = tuple[str, str]


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
def results_check(settings: Settings) -> Callable[[Record], bool]:
    """Whether a job result read back carries a valid MAC (:mod:`core.record_auth`)."""
    keys, prefix = record_keys.keys_for(settings), settings.topic_prefix

    def authentic(r: Record) -> bool:
        role = record_auth.role_of(r.topic, prefix)
        return role is None or record_auth.refusal(keys, role, r.key, r.value,
                                                   r.headers) is None

    return authentic


class Restore:
    """One partition's shard brought up to the topics' ends (see the module doc).

    Changes are folded as they come; job results and hit statistics are gathered and
    folded by :meth:`finish`, after every change: a result's cursor must never run ahead
    of its job's changes, whatever order the three topics are read in. ``cursors``: the
    cursors gathered so far (a standby's, handed over with its shard).
    """

    def __init__(self, shard: MemoryStore, opener: Opener | None, *, empty: bool,
                 cursors: dict[UserKey, Cursor] | None = None,
                 authentic: Callable[[Record], bool] | None = None) -> None:
        self.shard = shard
        self.authentic = authentic
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
        stage sets it aside) holds nothing: skipped, and so is one without a valid MAC
        (``authentic``: a forged result must not move a cursor; a result signed under a
        secret no longer held only costs its cursor, which its job's changes also carry)."""
        skipped = 0
        for r in records:
            if self.authentic is not None and not self.authentic(r):
                skipped += 1
                continue
            result = _parsed(JobResult, r)
            if result is None:
                continue
            if result.status != JobStatus.DONE or not result.seq:
                continue
            key = (result.tenant_id, result.user_id)
            held = self.cursors.get(key)
            if held is None or held.seq < result.seq:
                self.cursors[key] = Cursor(result.seq, result.job_id)
        if skipped:
            log.warning("%d job result(s) of %s[%d] without a valid MAC skipped in the "
                        "restore", skipped, records[0].topic, records[0].partition)

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


async def restore(settings: Any, topics: list[str], partition: int, shard: MemoryStore,
                  opener: Opener | None, start: Offsets | None, *,
                  cursors: dict[UserKey, Cursor] | None = None, fold_cursors: bool = True,
                  ) -> tuple[Offsets, Restore]:
    """Fold ``topics`` (changes, results, access) of ``partition`` from ``start`` (None: an
    empty shard, from the beginning) to their ends now, with one reader; returns the ends
    and the fold (its ``changes`` counted, its ``cursors`` gathered). Job results are
    folded only with a valid MAC under ``settings``' keys (None: a test's reads, unchecked)."""
    job = Restore(shard, opener, empty=start is None, cursors=cursors,
                  authentic=None if settings is None else results_check(settings))
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
