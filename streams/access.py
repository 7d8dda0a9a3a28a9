"""Hit recording: the API's batched publisher and the agent that folds hits into the store.

Reads never wait on Kafka: :class:`AccessRecorder.record` only appends to a bounded
in-memory queue; a background task sends what waits every ``access_flush_s`` (or at
``access_batch`` events) with a plain idempotent producer. If the broker is away, events wait
(up to ``MAX_PENDING``, then the oldest are dropped and counted: hit statistics are a
ranking signal, not a ledger, and reads must not fail for them).

The access loop (:class:`AccessStage`) consumes the memory-access topic and folds each event
into the
statistics records of :mod:`memory.access_stats` (idempotent by event id), so the store's hit
counts are a function of the topic: a rebuild folds it again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from datetime import UTC, datetime
from typing import Any

from aiokafka import AIOKafkaProducer

from memstream.core import kafka
from memstream.core.errors import InvalidRecord, describe
from memstream.core.retry import set_within
from memstream.core.settings import Settings
from memstream.memory.store.rebuild_fold import fold_access
from memstream.streams.dead_letters import INTERNAL_MAX_BYTES, set_aside
from memstream.streams.ingest_tables import LoopTable
from memstream.streams.pipeline import Pipeline
from memstream.streams.stage import StageBase, Work, until_handled
from memstream.topics.codec import decode
from memstream.topics.schemas import AccessEvent

log = logging.getLogger(__name__)
MAX_PENDING = 100_000


class AccessRecorder:
    """Queue access events without waiting; send them in batches in the background."""

    def __init__(self, settings: Settings, topic: str, flush_s: float, batch: int) -> None:
        self.settings = settings
        self.topic = topic
        self.flush_s = flush_s
        self.batch = batch
        self.pending: deque[AccessEvent] = deque()
        self.sent = 0
        self.dropped = 0
        self._wake = asyncio.Event()
        self._producer: AIOKafkaProducer | None = None
        self._task: asyncio.Task[None] | None = None

    def record(self, event: AccessEvent) -> None:
        if len(self.pending) >= MAX_PENDING:
            self.pending.popleft()
            self.dropped += 1
        self.pending.append(event)
        if len(self.pending) >= self.batch:
            self._wake.set()

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="access-recorder")

    async def _run(self) -> None:
        while True:
            await set_within(self._wake, self.flush_s)
            self._wake.clear()
            try:
                await self.flush()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # the broker is away: keep the events, try again
                log.warning("access events not sent yet (%s: %s); %d waiting",
                            type(exc).__name__, describe(exc)[:200], len(self.pending))
                await asyncio.sleep(min(5.0, self.flush_s * 10))

    async def flush(self) -> int:
        if not self.pending:
            return 0
        if self._producer is None:
            producer = kafka.producer(self.settings, enable_idempotence=True, linger_ms=5)
            try:
                await producer.start()
            except BaseException:
                await producer.stop()  # a failed start leaves connections to close
                raise
            self._producer = producer
        batch, self.pending = self.pending, deque()  # record() goes on filling a new queue
        try:
            futures = [await self._producer.send(self.topic, key=e.key().encode(),
                                                 value=e.dumps()) for e in batch]
            await asyncio.gather(*futures)
        except BaseException:
            # Not (surely) sent: back in front, in order; a resend is counted once by id.
            batch.extend(self.pending)
            self.pending = batch
            while len(self.pending) > MAX_PENDING:
                self.pending.popleft()
                self.dropped += 1
            raise
        self.sent += len(batch)
        return len(batch)

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
            self._task = None
        try:
            await asyncio.wait_for(self.flush(), 10.0)
        except Exception as exc:
            log.warning("%d access events not sent at shutdown (%s)", len(self.pending),
                        type(exc).__name__)
        if self._producer is not None:
            await self._producer.stop()
            self._producer = None


def access_event(tenant: str, user: str, kind: str, memory_ids: list[str], query_id: str,
                 event_id: str, now: float) -> AccessEvent:
    return AccessEvent(event_id=event_id, tenant_id=tenant, user_id=user, kind=kind,
                       memory_ids=memory_ids, query_id=query_id,
                       ts=datetime.fromtimestamp(now, UTC))


class AccessStage(StageBase):
    """The fold of the memory-access topic into the store, in its own loop (group
    ``{app_id}-access``): a batch's events are folded in one store call (idempotent by
    event id: a batch read again after a failed transaction changes nothing twice)."""

    name = "access"

    def __init__(self, p: Pipeline) -> None:
        self.p = p
        self.inputs = [p.topics.memory_access.name]
        self.tables: tuple[LoopTable, ...] = ()
        self.max_records = p.settings.ingest_batch_records

    async def handle(self, records: list[Any]) -> Work:
        p, work = self.p, Work()
        decoded: list[Any] = []  # the records that decoded (the rest are dead letters now)
        events = []
        for record in records:
            try:
                events.append(decode(AccessEvent, record.value, record.key,
                                     max_bytes=INTERNAL_MAX_BYTES))
                decoded.append(record)
            except InvalidRecord as exc:
                set_aside(p, work, exc, record)
        if events:
            got = await until_handled(
                records[-1], lambda: asyncio.to_thread(fold_access, p.services.store, events),
                counters=p.counters)
            if isinstance(got, InvalidRecord):  # a bug: the batch's events set aside
                for record in decoded:
                    set_aside(p, work, got, record)
                return work
            p.counters.access_events_folded += len(events)
        return work
