"""Offsets are committed only after what their records produced is in Kafka.

Two gaps in faust-streaming 0.15, both closed here by patches applied once at app build:

1. Table changelog writes do not go to Kafka when the table is written: they wait in
   Faust's producer buffer (``send_soon``) until a background task hands them over.
   Under ``processing_guarantee="exactly_once"`` the commit (``TransactionManager.commit``:
   offsets into each partition's transaction, then commit it) does not flush that buffer
   first, so a write still in the buffer lands in the *next* transaction, which a kill
   aborts, while the offset of the record that made it is committed. (The at-least-once
   path flushes: ``Consumer._commit_offsets``.)
2. The flush itself is not a drain: ``ProducerBuffer.flush`` gives up after 0.1 s without
   progress (a slow or restarting broker), and does not count the record its sender task
   has taken off the queue but not yet handed to the Kafka client. A commit then passed
   changelog writes still in memory; after a kill, a message counted as processed was
   missing from the restored state (the chaos benchmark found such messages).

So every flush before a commit waits until the buffer is empty *and* its sender idle, then
flushes the Kafka client (which waits for the broker's acknowledgements).

3. Faust commits from a timer, concurrently with the agents: a commit could fall *inside*
   the handling of one record, after its table write and before the records it sends next.
   The transaction then held the new state (the ingest's "job in flight") while the job
   itself went into the next transaction, which a kill aborted; re-read after the restart,
   the message was a duplicate of the restored state, and the job was only re-sent by its
   timeout; a trivial result lost this way was never re-sent (the chaos test found such a
   session). :class:`CommitGate`: the agents whose one record writes several outputs
   handle each record inside ``gate.event()``, and every commit waits until none is in
   progress and lets none start until it is done, so a record's outputs are in one
   transaction. (The extract agent is not gated: it sends one decision per record, and its
   LLM calls would hold every commit.)
4. With an agent's ``concurrency`` > 1 (the extract agent), records of one partition are
   acked out of order. Faust's ``Consumer._new_offset`` commits the first consecutive run
   of acked offsets; its head-gap check (``min(acked) - committed > 1``) lets one
   unfinished record through (committed 22 is the next to read; 23 and 24 acked while 22
   is still being decided: it commits 25), and has no check at all before the first
   commit. A kill then skipped the job for good: it was only re-sent by the ingest's
   timeout, a minute later (the chaos runs showed those re-sends, all of them jobs whose
   record was committed and never decided). Known upstream: faust-streaming #606 (open),
   fix proposed in PR #707. :func:`_patch_new_offset`, the same idea: no commit passes a
   record of the partition that was delivered and is not yet acked.
5. A stream *skips* a record it takes while flow control is suspended or whose consumer
   generation is not the app's current one (around a restart's assignment and recovery)
   and then *acks* it, unprocessed ("otherwise the lag would increase"), so the next
   commit passes it. After a kill that was the first job result a new worker read: the
   ingest never saw it and the job was re-sent a minute later by its timeout.
   :func:`_patch_ack`: such a record is not acked; the seek to the committed offsets that
   follows every assignment delivers it again. Together with the
fencing of :mod:`memstream.memory.fencing`, which makes re-processing harmless, both
guarantees give the same result.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import asynccontextmanager
from typing import Any

from faust.transport.consumer import Consumer, TransactionManager
from faust.transport.drivers.aiokafka import Producer
from faust.transport.producer import ProducerBuffer

_PATCHED = "_memstream_commit_order"
_SENDING = "_memstream_sending"
_GATE = "_memstream_commit_gate"
log = logging.getLogger(__name__)


class CommitGate:
    """Commits between records, never inside one: ``event()`` around a record's handling,
    ``closed()`` around a commit (waits for the records in progress, holds new ones)."""

    def __init__(self, warn_after_s: float = 10.0) -> None:
        self._busy = 0
        self._idle = asyncio.Event()
        self._idle.set()
        self._open = asyncio.Event()
        self._open.set()
        self._closers = 0
        self.warn_after_s = warn_after_s

    @property
    def busy(self) -> int:
        return self._busy

    @asynccontextmanager
    async def event(self) -> AsyncIterator[None]:
        await self._open.wait()
        self._busy += 1
        self._idle.clear()
        try:
            yield
        finally:
            self._busy -= 1
            if self._busy == 0:
                self._idle.set()

    @asynccontextmanager
    async def closed(self) -> AsyncIterator[None]:
        self._closers += 1
        self._open.clear()
        try:
            try:
                await asyncio.wait_for(asyncio.shield(self._idle.wait()), self.warn_after_s)
            except TimeoutError:
                log.warning("commit waits for %d record(s) still being handled", self._busy)
                await self._idle.wait()
            yield
        finally:
            self._closers -= 1
            if self._closers == 0:
                self._open.set()


def gate_for(app: Any) -> CommitGate:
    """The app's gate (one per app, made on first use)."""
    gate = getattr(app, _GATE, None)
    if gate is None:
        gate = CommitGate()
        setattr(app, _GATE, gate)
    return gate


async def drain(buffer: Any, sleep: Callable[[float], Awaitable[Any]] = asyncio.sleep) -> None:
    """Wait until ``buffer`` holds no message and is handing none to the Kafka client."""
    while buffer.size or getattr(buffer, _SENDING, 0):
        if buffer.size:
            await buffer.flush()  # returns after 0.1 s without progress: loop on
        else:
            await sleep(0.005)  # the last record is being handed over


def _patch_buffer() -> None:
    original = ProducerBuffer._send_pending

    async def send_pending(self: Any, fut: Any) -> None:
        setattr(self, _SENDING, getattr(self, _SENDING, 0) + 1)
        try:
            await original(self, fut)
        finally:
            setattr(self, _SENDING, getattr(self, _SENDING) - 1)

    ProducerBuffer._send_pending = send_pending  # type: ignore[method-assign]


def _patch_flush() -> None:
    original = Producer.flush

    async def flush(self: Any) -> None:
        await drain(self.buffer)
        await original(self)

    Producer.flush = flush  # type: ignore[method-assign]


def _patch_commit() -> None:
    original = TransactionManager.commit

    async def commit(self: Any, offsets: Mapping[Any, int],
                     start_new_transaction: bool = True) -> bool:
        async with gate_for(self.app).closed():
            await self.app.producer.flush()
            result: bool = await original(self, offsets,
                                          start_new_transaction=start_new_transaction)
        return result

    TransactionManager.commit = commit  # type: ignore[method-assign]


def _pending_below(consumer: Any, tp: Any) -> int | None:
    """The lowest offset of ``tp`` delivered to the agents and not yet acked."""
    committed = consumer._committed_offset[tp]
    offsets = [m.offset for m in list(consumer._unacked_messages)
               if m.tp == tp and not m.acked and (committed is None or m.offset >= committed)]
    return min(offsets) if offsets else None


def _patch_new_offset() -> None:
    original = Consumer._new_offset

    def new_offset(self: Any, tp: Any) -> int | None:
        pending = _pending_below(self, tp)
        acked = self._acked[tp]
        if pending is not None and acked and min(acked) > pending:
            return None  # a record before the acked ones is still being handled
        result: int | None = original(self, tp)
        return result

    Consumer._new_offset = new_offset  # type: ignore[method-assign]


def _stale(consumer: Any, message: Any) -> bool:
    """A record Faust's stream skips without processing (see 5. above)."""
    app = consumer.app
    return (not app.flow_control.is_active()
            or getattr(message, "generation_id", app.consumer_generation_id)
            != app.consumer_generation_id)


def _patch_ack() -> None:
    original = Consumer.ack

    def ack(self: Any, message: Any) -> bool:
        if not message.acked and _stale(self, message):
            self._unacked_messages.discard(message)
            log.info("not acking %s[%s]@%s: skipped by the stream (flow control or an old "
                     "generation); it is read again", message.topic, message.partition,
                     message.offset)
            return False
        result: bool = original(self, message)
        return result

    Consumer.ack = ack  # type: ignore[method-assign]


def commit_after_outputs() -> None:
    """Apply the patches once (idempotent): drain the buffer in every flush, and flush
    before every transactional commit."""
    if getattr(TransactionManager, _PATCHED, False):
        return
    _patch_buffer()
    _patch_flush()
    _patch_commit()
    _patch_new_offset()
    _patch_ack()
    setattr(TransactionManager, _PATCHED, True)
