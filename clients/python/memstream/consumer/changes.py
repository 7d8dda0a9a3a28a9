"""``MemoryChanges``: the typed reader of the public memory events (``docs/consuming.md``).

    async with MemoryChanges(Settings(), group_id="crm-sync") as changes:
        async for change in changes:
            await handle(change)          # committed once the next one is asked for

- Reads ``read_committed``: only changes whose transaction committed, in order per user.
- Delivers at least once: a partition's offset is committed only after the caller came
  back for the next event (every ``commit_interval_s``, on a rebalance and on close), so a
  crash re-delivers what was handled but not committed. A handler must therefore be
  idempotent; keep ``(memory_id, version)`` or the change ids it applied, or keep
  ``event.offset`` with your own state and pass ``start_at`` (the example does).
- Drops republished copies (the same ``change_id`` within ``dedup_window`` records of its
  partition, also across a restart: the window is read back before the start).
- Opens sealed content with ``MEMSTREAM_MASTER_KEY`` (:mod:`memstream.consumer.opening`);
  ``event.content`` says what became of it.
- ``group_id=None``: no group, no commits, every partition (or the user's one); the
  operators' ``memstream changes tail``.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from types import TracebackType
from typing import Any

from aiokafka import AIOKafkaConsumer, ConsumerRebalanceListener
from aiokafka.errors import KafkaError
from aiokafka.structs import TopicPartition
from pydantic import ValidationError

from memstream.consumer import placing, reading
from memstream.consumer.dedup import RecentIds
from memstream.consumer.opening import Content, Opener
from memstream.consumer.reading import Record
from memstream.contract.events import (
    MEMORY_EVENTS_TOPIC,
    USER_KEYS_TOPIC,
    MemoryEvent,
    topic_name,
)
from memstream.contract.exceptions import InvalidRecord

log = logging.getLogger(__name__)
COMMIT_TIMEOUT_S = 10.0


class Received(MemoryEvent):
    """A public event as the reader delivers it: where it was, what became of its content."""

    partition: int
    offset: int
    content: Content  # plain | opened (was sealed) | sealed (no master key) | shredded

    @property
    def readable(self) -> bool:
        """``before`` / ``after`` / ``reason`` are there (or the event never had any)."""
        return self.content in ("plain", "opened")


@dataclass
class Stats:
    delivered: int = 0
    duplicates: int = 0  # republished copies dropped
    filtered: int = 0  # another tenant or user than asked for
    invalid: int = 0  # not a memory event: logged and skipped
    shredded: int = 0  # a forgotten user's content: delivered with ids only


class MemoryChanges:
    """Async iterator of :class:`Received` events (see the module docstring).

    ``settings``: the server's ``Settings``, a :class:`memstream.client.KafkaConnection`
    or any object with the Kafka connection's fields, ``topic_prefix`` (default
    ``memstream``) and, for sealed content, ``master_key`` or ``read_keys``
    (:class:`memstream.consumer.ConsumerSettings` reads them from ``MEMSTREAM_*``)."""

    def __init__(self, settings: Any, *, group_id: str | None,
                 tenant: str | None = None, user: str | None = None,
                 from_beginning: bool = True, dedup_window: int = 20_000,
                 commit_interval_s: float = 1.0, require_content: bool = False,
                 start_at: Callable[[int], int | None] | None = None,
                 idle_timeout_s: float | None = None) -> None:
        if user is not None and tenant is None:
            raise ValueError("a user filter needs its tenant")
        prefix = getattr(settings, "topic_prefix", "memstream")
        self.settings = settings
        self.topic = topic_name(prefix, MEMORY_EVENTS_TOPIC)
        self.group_id = group_id
        self.tenant, self.user = tenant, user
        self.from_beginning = from_beginning
        self.commit_interval_s = commit_interval_s
        self.start_at = start_at
        self.idle_timeout_s = idle_timeout_s
        self.stats = Stats()
        self._recent = RecentIds(dedup_window)
        self._opener = Opener(settings, topic_name(prefix, USER_KEYS_TOPIC),
                              require_content=require_content)
        self._consumer: AIOKafkaConsumer | None = None
        self._buffer: collections.deque[Record] = collections.deque()
        self._warm: set[TopicPartition] = set()  # assigned, not read back and placed yet
        self._seen_to: dict[TopicPartition, int] = {}  # ids known of every offset below
        self._in_flight: Record | None = None
        self._done: dict[TopicPartition, int] = {}  # next offset to commit
        self._committed: dict[TopicPartition, int] = {}
        self._last_commit = time.monotonic()

    # --- lifecycle -------------------------------------------------------------------

    async def start(self) -> MemoryChanges:
        try:
            await self._opener.start()
            self._consumer = reading.consumer(
                self.settings, group_id=self.group_id, enable_auto_commit=False,
                isolation_level="read_committed",
                auto_offset_reset="earliest" if self.from_beginning else "latest")
            await reading.started(self._consumer)
            if self.group_id is not None:
                self._consumer.subscribe([self.topic], listener=_Listener(self))
            else:
                tps = await placing.wanted(self.settings, self.topic, self.tenant, self.user)
                self._consumer.assign(tps)
                self._placing(set(tps))
        except BaseException:
            await self._close()  # nothing left running behind a failed start
            raise
        return self

    async def stop(self, *, handled: bool = True) -> None:
        """Commit and close. ``handled`` False (the caller's handler raised): the event in
        flight is not committed, the next reader gets it again."""
        try:
            if self._consumer is not None:
                if handled:
                    self._finish_in_flight()
                self._in_flight = None
                if self.group_id is not None:
                    await self.commit()
        finally:
            await self._close()

    async def _close(self) -> None:
        try:
            if self._consumer is not None:
                await reading.stopped(self._consumer)
        finally:
            self._consumer = None
            await self._opener.stop()

    async def __aenter__(self) -> MemoryChanges:
        return await self.start()

    async def __aexit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.stop(handled=exc is None)

    # --- iteration -------------------------------------------------------------------

    def __aiter__(self) -> MemoryChanges:
        return self

    async def __anext__(self) -> Received:
        assert self._consumer is not None, "MemoryChanges.start() (or async with) first"
        self._finish_in_flight()  # the caller is back: its handler returned
        idle_since = time.monotonic()
        while True:
            if time.monotonic() - self._last_commit >= self.commit_interval_s:
                await self.commit()  # also while idle: the group's lag reaches 0
            await placing.place_new(self)
            while self._buffer:
                record = self._buffer.popleft()
                tp = TopicPartition(record.topic, record.partition)
                try:
                    event = await self._deliverable(record)
                except BaseException:
                    if self._ours(tp):
                        self._buffer.appendleft(record)  # not lost: the next call tries it
                    raise
                if not self._ours(tp):
                    continue  # moved (or moving) while it was opened: its reader has it
                self._seen_to[tp] = record.offset + 1
                if event is None:
                    self._mark(record)
                    continue
                self._recent.add(record.partition, event.change_id)
                self._in_flight = record
                self.stats.delivered += 1
                return event
            if self._warm:
                continue  # a partition came (back) meanwhile: placed before the next read
            batch = await self._consumer.getmany(timeout_ms=500, max_records=500)
            for records in batch.values():
                self._buffer.extend(records)
            if batch:
                idle_since = time.monotonic()
            elif self.idle_timeout_s is not None and \
                    time.monotonic() - idle_since >= self.idle_timeout_s:
                raise StopAsyncIteration

    def _ours(self, tp: TopicPartition) -> bool:
        """Held, and placed: its records in the buffer come after where it starts."""
        assert self._consumer is not None
        return tp in self._consumer.assignment() and tp not in self._warm

    async def commit(self) -> bool:
        """Commit the offsets of every event the caller has finished with; False when the
        broker did not take them within ``COMMIT_TIMEOUT_S`` (logged; tried again at the
        next commit: what is not committed is read again, never lost)."""
        self._last_commit = time.monotonic()
        todo = {tp: off for tp, off in self._done.items() if self._committed.get(tp) != off}
        if not todo or self.group_id is None or self._consumer is None:
            return True
        held = self._consumer.assignment()
        todo = {tp: off for tp, off in todo.items() if tp in held}
        if not todo:
            return True
        try:  # aiokafka retries some errors forever (a deleted topic): bounded here
            await asyncio.wait_for(self._consumer.commit(todo), COMMIT_TIMEOUT_S)
        except (KafkaError, TimeoutError) as exc:
            log.warning("offsets of %d partition(s) not committed (%s): read again later",
                        len(todo), type(exc).__name__)
            return False
        self._committed.update(todo)
        return True

    # --- per record ------------------------------------------------------------------

    async def _deliverable(self, record: Record) -> Received | None:
        try:
            event = MemoryEvent.model_validate_json(record.value or b"")
        except ValidationError as exc:
            self._invalid(record, f"not a memory event ({exc.error_count()} errors)")
            return None
        if self._recent.has(record.partition, event.change_id):
            self.stats.duplicates += 1
            return None
        if (self.tenant is not None and event.tenant_id != self.tenant) or \
                (self.user is not None and event.user_id != self.user):
            self.stats.filtered += 1
            return None
        try:
            opened, content = await self._opener.open(event)
        except InvalidRecord as exc:  # a blob that does not open with the user's own key
            self._invalid(record, str(exc))
            return None
        self.stats.shredded += content == "shredded"
        return Received(**opened.__dict__, partition=record.partition, offset=record.offset,
                        content=content)

    def _invalid(self, record: Record, why: str) -> None:
        self.stats.invalid += 1
        log.error("skipped record %s/%d@%d: %s", record.topic, record.partition,
                  record.offset, why)

    def _mark(self, record: Record) -> None:
        self._done[TopicPartition(record.topic, record.partition)] = record.offset + 1

    def _finish_in_flight(self) -> None:
        if self._in_flight is not None:
            self._mark(self._in_flight)
            self._in_flight = None

    # --- partitions -----------------------------------------------------------------

    def _placing(self, tps: set[TopicPartition]) -> None:
        """New partitions wait (paused) until placed (:func:`placing.place_new`): outside
        the rebalance callback, so a long read-back never delays the group's heartbeat."""
        assert self._consumer is not None
        self._warm |= tps
        self._consumer.pause(*tps)

    def _revoked(self, tps: set[TopicPartition]) -> None:
        """The partitions went: their buffered records with them. Their change ids stay (a
        change id is one change whoever read it): handed back, they read back nothing."""
        self._warm -= tps
        self._buffer = collections.deque(r for r in self._buffer
                                         if TopicPartition(r.topic, r.partition) not in tps)
        for tp in tps:
            self._done.pop(tp, None)
            self._committed.pop(tp, None)


class _Listener(ConsumerRebalanceListener):
    def __init__(self, reader: MemoryChanges) -> None:
        self.reader = reader

    async def on_partitions_revoked(self, revoked: Any) -> None:
        gone = set(revoked)
        r = self.reader
        if r._in_flight is not None and \
                TopicPartition(r._in_flight.topic, r._in_flight.partition) in gone:
            r._in_flight = None  # its handler may not finish before the new owner reads it
        try:
            await r.commit()
        finally:
            r._revoked(gone)

    async def on_partitions_assigned(self, assigned: Any) -> None:
        self.reader._placing(set(assigned))
