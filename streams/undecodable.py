"""A poll that fails: find the batch no reader here can decode and set it aside, or wait.

aiokafka decompresses (and CRC-checks) a record batch inside ``getmany``; a batch it cannot
decode (a codec whose library is missing, a future codec, corruption) raises there
(``UnsupportedCodecError``, ``CorruptRecordException``) without naming its partition, and
raises again on every read of it: before this module, the owned loop ended the worker (exit
70), whose restart read the same batch, a crash loop that took the API down with it.

Now a failed poll (:meth:`OwnedLoop._poll`) comes here:

1. Every serving partition goes back to its committed offsets: the failed ``getmany`` may
   have moved the position of another partition past records it then did not return.
2. Each input partition of the loop that is not at its highwater is fetched raw from its
   position (one Fetch request, read_committed, the headers of each batch read without
   decompressing, then each batch decoded on its own: :func:`fetch_batches`), and
   :func:`memstream.topics.batch_refs.decide` says what to do.
3. Decodable records before the bad batch are read and handled first, through the loop's
   own batch path, so none is skipped.
4. The bad batch is set aside by reference: a dead letter (reason: the error class, then
   ``topic=… partition=… offsets=first..last``; no value bytes) goes out in a transaction of
   the partition that also commits its input offset past the batch: the skip and its
   reference are committed together, or neither is (a crash in between reads the batch
   again and sets it aside again). Counted (``memstream_batches_set_aside_total``), logged
   once, alerted on (``deploy/alerts.yml``); the consumer seeks past it and goes on.

When no partition holds such a batch (another failure of the poll), the loop waits with
backoff and polls again: never an exit, so the API keeps answering; each failed poll is
logged in one line (``describe``) and counted (``memstream_fetch_failures_total``).
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime
from typing import Any

from aiokafka.errors import for_code
from aiokafka.protocol.fetch import FetchRequest
from aiokafka.record.memory_records import MemoryRecords
from aiokafka.structs import TopicPartition

from memstream.core.errors import InvalidRecord, describe
from memstream.streams.counters import add
from memstream.streams.stage import Work
from memstream.topics.batch_refs import (
    KIND,
    Batch,
    SetAside,
    decide,
    error_label,
    reference_reason,
)
from memstream.topics.codec import dead_letter

log = logging.getLogger(__name__)
READ_COMMITTED = 1
FETCH_BYTES = 1024 * 1024  # aiokafka's max_partition_fetch_bytes default
READ_TIMEOUT_MS = 2000  # a read of the records before a bad batch
MAX_STEPS = 50  # reads before a bad batch per recovery (the next failed poll goes on)


async def fetch_batches(consumer: Any, tp: TopicPartition, offset: int,
                        max_bytes: int = FETCH_BYTES) -> list[Batch]:
    """The batches of ``tp`` from ``offset`` as one read_committed fetch returns them: each
    one's offsets, and the error class decoding it raised (None: it decodes). Uses the
    consumer's own connection (its client: the same brokers, credentials and TLS)."""
    client = consumer._client  # aiokafka has no public raw fetch
    node = client.cluster.leader_for_partition(tp)
    if node is None or node < 0:
        await client.force_metadata_update()
        node = client.cluster.leader_for_partition(tp)
        if node is None or node < 0:
            return []
    request = FetchRequest(0, 1, max_bytes, READ_COMMITTED,
                           [(tp.topic, [(tp.partition, offset, max_bytes)])])
    response = await client.send(node, request)
    found: list[Batch] = []
    for _topic, partitions in response.topics:
        for _partition, error_code, _high, *data in partitions:
            if error_code:
                raise for_code(error_code)(f"fetch of {tp.topic}[{tp.partition}]")
            found += read_batches(data[-1])
    return found


def read_batches(raw: bytes) -> list[Batch]:
    """The batches of a fetched record set: headers, then an attempt to decode each."""
    records = MemoryRecords(raw)
    found: list[Batch] = []
    while records.has_next():
        try:
            batch = records.next_batch()
        except Exception:  # a truncated tail: the next fetch starts there
            break
        if batch is None:
            break
        base = batch.base_offset
        last = batch.next_offset - 1
        control = bool(getattr(batch, "is_control_batch", False))
        error = None
        try:
            if not batch.validate_crc():
                error = "CorruptRecordException"
            elif not control:
                for _ in batch:
                    pass
        except Exception as exc:
            error = type(exc).__name__
        found.append(Batch(base, last, control, error))
    return found


async def recover(loop: Any, exc: BaseException, fetch: Any = None) -> bool:
    """After ``getmany`` raised ``exc``: every serving partition back to its committed
    offsets, then each one's undecodable batch set aside. True when something moved (the
    loop polls again at once), False when nothing here explains the failure."""
    fetch = fetch or fetch_batches
    manager = loop.task_manager
    tasks = [t for n in sorted(manager.ready) if (t := manager.serving_task(n)) is not None]
    for task in tasks:
        loop.task_manager.seek(task)
    moved = False
    for task in tasks:
        for tp in sorted(task.inputs()):
            if loop.task_manager.serving_task(task.partition) is not task:
                break  # let go meanwhile (a rebalance)
            if tp not in loop.consumer.assignment() or await loop._read_to(tp) is not None:
                continue  # read to its highwater: nothing there fails
            try:
                moved |= await _settle(loop, task, tp, fetch)
            except Exception as err:  # the broker away: the next failed poll tries again
                log.warning("%s: %s[%d] not examined (%s)", loop.stage.name, tp.topic,
                            tp.partition, describe(err))
    return moved


async def _settle(loop: Any, task: Any, tp: TopicPartition, fetch: Any) -> bool:
    moved = stuck = False
    one = False  # read one record at a time (a read of all before the batch failed)
    for _ in range(MAX_STEPS):
        position = await loop.consumer.position(tp)
        decision = decide(position, await fetch(loop.consumer, tp, position), stuck=stuck)
        if decision is None:
            return moved
        if isinstance(decision, SetAside):
            return await set_aside(loop, task, tp, decision) or moved
        # the offsets up to the batch: as many records at most (fewer with markers between)
        want = 1 if one else max(1, decision.base - position)
        try:
            got = await loop.consumer.getmany(tp, timeout_ms=READ_TIMEOUT_MS,
                                              max_records=want)
        except Exception:
            # one at a time; failing at once: nothing before the batch is handed over
            # (transaction markers, aborted records)
            stuck, one = one and await loop.consumer.position(tp) == position, True
            loop.task_manager.seek(task)
            continue
        if got:
            async with loop.lock:
                await loop.process(got)
            moved = True
    return moved


async def set_aside(loop: Any, task: Any, tp: TopicPartition, d: SetAside) -> bool:
    """The dead letter of the batch and the input offset past it, in one transaction."""
    reason = reference_reason(d.error, tp.topic, tp.partition, d.first, d.last)
    letter = dead_letter(InvalidRecord(KIND, reason), topic=tp.topic, partition=tp.partition,
                         offset=d.first, key=None, value=None,
                         now=datetime.fromtimestamp(loop.clock(), UTC))
    work = Work(out=[(loop.dead_letter_topic, None, letter.dumps())])
    async with loop.lock:
        if loop.task_manager.serving_task(task.partition) is not task:
            return False
        if not await loop._commit(task, work, {tp: d.last + 1}, None):
            return False
    loop.consumer.seek(tp, d.last + 1)
    loop.batches_set_aside += 1
    if loop.counters is not None:
        add(loop.counters.batches_set_aside, (tp.topic, error_label(d.error)))
        add(loop.counters.dead_letters_by_class, KIND)
    log.error("%s: %s", loop.stage.name, reason)
    return True


def count_failure(loop: Any, exc: BaseException) -> None:
    """A poll failed and nothing here explained it: counted and logged in one line."""
    loop.fetch_failures += 1
    if loop.counters is not None:
        add(loop.counters.fetch_failures, (loop.stage.name, type(exc).__name__[:60]))
    log.warning("%s loop: poll failed and no undecodable batch found (%s); polling again",
                loop.stage.name, describe(exc))
