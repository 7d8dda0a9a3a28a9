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
5. Records fetched around a start-up can also vanish between the fetcher and the agents
   (Faust clears its queues when recovery ends; faust-streaming #596), and the head-gap
   tolerance of 4. then commits past one. The chaos runs showed such jobs (re-sent by
   the ingest's timeout) and chat messages never extracted (a session never covered, a
   memory missing). :func:`_patch_fetched`: every record handed to the agents is kept
   until it is acked; no commit passes one; one that no agent holds while a later record
   of its partition was taken (agents take records in order: it was dropped, not queued),
   ``DROPPED_AFTER_S`` after it was handed over, is handed to the agents again, as it is
   (a seek back raced Faust's fetcher, which drops records below its read offset). A
   record taken twice is harmless: the fencing (memory.fencing) makes a late job, decision
   or change a no-op. The order-sensitive inputs (a user's messages, session events, tool
   writes) are not read by Faust at all: the ingest loop (streams.ingest_loop) owns them.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import asynccontextmanager
from typing import Any

from faust.transport.conductor import Conductor
from faust.transport.consumer import Consumer, TransactionManager
from faust.transport.drivers.aiokafka import Producer
from faust.transport.producer import ProducerBuffer

_PATCHED = "_memstream_commit_order"
_SENDING = "_memstream_sending"
_GATE = "_memstream_commit_gate"
_FETCHED = "_memstream_fetched"  # app -> tp -> offset -> (when, record, re-handed), till acked
DROPPED_AFTER_S = 10.0
_BACKGROUND: set[asyncio.Future[Any]] = set()
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
    """The lowest offset of ``tp`` handed to the agents (fetched, or taken by an agent)
    and not yet acked; a fetched one that was dropped on the way is fetched again."""
    committed = consumer._committed_offset[tp]
    fetched = _fetched_for(consumer.app).get(tp, {})
    acked = consumer._acked_index[tp]
    # taken by an agent and not acked: but not a stale copy, one a stream took before the
    # end of a recovery whose offset was fetched again since (another object) or acked
    # through that newer copy; counted, it passed for a later record taken and made every
    # record queued below it look dropped (thousands handed over twice after a restart
    # with a backlog, in the chaos runs)
    held = [m.offset for m in list(consumer._unacked_messages)
            if m.tp == tp and not m.acked and (committed is None or m.offset >= committed)
            and m.offset not in acked and fetched.get(m.offset, (0.0, m))[1] is m]
    now = time.monotonic()
    # Agents take a partition's records in order: one still waiting while a later one was
    # taken (held or acked) was dropped on the way, not queued.
    taken = max([*held, *consumer._acked[tp]], default=-1)
    waiting = []
    generation = consumer.app.consumer_generation_id
    for offset, (at, message, times) in sorted(fetched.items()):
        if (committed is not None and offset < committed) or getattr(
                message, "generation_id", generation) != generation:
            # committed: done with it; or fetched before the last assignment, after which
            # Faust reads again from the committed offset
            del fetched[offset]
            continue
        waiting.append(offset)
        # a record handed over again waits behind the queue: give it longer each time
        if offset not in held and offset < taken and now - at > DROPPED_AFTER_S * 6 ** times:
            _redeliver(consumer, tp, offset, fetched)
    offsets = held + waiting
    return min(offsets) if offsets else None


def _redeliver(consumer: Any, tp: Any, offset: int,
               fetched: dict[int, tuple[float, Any, int]]) -> None:
    app = consumer.app
    _at, message, times = fetched[offset]
    if tp not in consumer.assignment():
        del fetched[offset]  # not ours any more: the next owner reads it from the commit
        return
    log.warning("%s[%s]@%s never reached an agent in %.0fs: handing it over again",
                tp.topic, tp.partition, offset, DROPPED_AFTER_S)
    # As if fetched now: the conductor counts one reference per hand-over (the dropped
    # one is still counted: left alone, the agent's ack would never be the final one)
    # and the stream tracks it again.
    message.generation_id = app.consumer_generation_id
    message.refcount, message.tracked, message.acked = 0, False, False
    fetched[offset] = (time.monotonic(), message, times + 1)
    task = asyncio.ensure_future(app.topics.on_message(message))
    _BACKGROUND.add(task)
    task.add_done_callback(_BACKGROUND.discard)


def _fetched_for(app: Any) -> dict[Any, dict[int, tuple[float, Any, int]]]:
    fetched = getattr(app, _FETCHED, None)
    if fetched is None:
        fetched = {}
        setattr(app, _FETCHED, fetched)
    return fetched


def _patch_fetched() -> None:
    """Note every record the consumer hands to the conductor (the agents' queues)."""
    original = Conductor._compile_message_handler

    def compile_handler(self: Any) -> Any:
        handler = original(self)
        fetched = _fetched_for(self.app)

        acks_enabled_for = self.acks_enabled_for

        async def on_message(message: Any) -> Any:
            if not acks_enabled_for(message.topic):  # changelogs: Faust's recovery reads
                return await handler(message)
            entry = fetched.setdefault(message.tp, {}).get(message.offset)
            times = entry[2] if entry else 0  # handed over again: keep the count
            fetched[message.tp][message.offset] = (time.monotonic(), message, times)
            return await handler(message)

        return on_message

    Conductor._compile_message_handler = compile_handler  # type: ignore[method-assign]


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


def _patch_ack() -> None:
    original = Consumer.ack

    def ack(self: Any, message: Any) -> bool:
        result: bool = original(self, message)
        _fetched_for(self.app).get(message.tp, {}).pop(message.offset, None)
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
    _patch_fetched()
    setattr(TransactionManager, _PATCHED, True)
