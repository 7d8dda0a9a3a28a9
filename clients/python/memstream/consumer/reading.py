"""The consumer's own Kafka reads, on the client's connection (:class:`KafkaConnection`:
bootstrap servers, security protocol, SASL, TLS files; the server's ``Settings`` is one as
it is): a consumer, a topic's partitions, a range read. The same keywords and the same
reads as the server's (``memstream.core.kafka``, ``memstream.core.topic_reader``), built
without it: this package is in the client distribution (``memstream-client[kafka]``).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any, TypeAlias

from aiokafka import AIOKafkaConsumer
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.structs import ConsumerRecord, TopicPartition

from memstream.client import KafkaConnection

Record: TypeAlias = ConsumerRecord[bytes, bytes]
FETCH_BYTES = 8 * 1024 * 1024  # per partition and fetch; a fetch takes four times that


def connection(source: object) -> KafkaConnection:
    """The Kafka connection of a :class:`KafkaConnection`, the server's ``Settings`` or any
    object with those fields (a field it lacks keeps its default)."""
    return KafkaConnection.of(source)


def consumer(source: object, *topics: str, **kwargs: Any) -> AIOKafkaConsumer:
    """A consumer (not started) on ``source``'s connection."""
    return AIOKafkaConsumer(*topics, **connection(source).aiokafka_options(), **kwargs)


async def started(client: AIOKafkaConsumer) -> AIOKafkaConsumer:
    """``client`` started; stopped again if it cannot start (a refused login, no broker)."""
    try:
        await client.start()
    except BaseException:
        await stopped(client)
        raise
    return client


async def stopped(client: AIOKafkaConsumer) -> None:
    """Stop a consumer, also one stopped right after its start (aiokafka 0.14 raises
    CancelledError from ``stop()`` when its own task has not run once yet); a caller
    cancelled meanwhile waits for the stop to end before it is cancelled."""
    async def stop() -> None:
        await asyncio.sleep(0)
        await client.stop()

    stopping = asyncio.ensure_future(stop())
    try:
        await asyncio.shield(stopping)
    except asyncio.CancelledError:
        if not stopping.done():
            await asyncio.wait([stopping])
        raise


async def topic_partitions(source: object, topic: str) -> list[TopicPartition]:
    """The topic's partitions; [] while it does not exist. Asks for every topic's metadata,
    never for this one by name (which would auto-create it on some brokers)."""
    admin = AIOKafkaAdminClient(**connection(source).aiokafka_options())
    try:
        await admin.start()
        described = await admin.describe_topics()
    finally:
        await admin.close()
    for t in described:
        if t["topic"] == topic and t["error_code"] == 0:
            return sorted(TopicPartition(topic, p["partition"]) for p in t["partitions"])
    return []


def _reader(source: object, *, committed: bool = True) -> AIOKafkaConsumer:
    return consumer(source, group_id=None, enable_auto_commit=False,
                    auto_offset_reset="earliest",
                    isolation_level="read_committed" if committed else "read_uncommitted",
                    max_partition_fetch_bytes=FETCH_BYTES, fetch_max_bytes=4 * FETCH_BYTES)


async def read_ranges(source: object, tps: Iterable[TopicPartition],
                      handle: Callable[[TopicPartition, list[Record]], object], *,
                      start: Mapping[TopicPartition, int],
                      end: Mapping[TopicPartition, int],
                      idle_timeout_s: float | None = None) -> int:
    """Hand every committed record of ``tps`` from ``start`` up to ``end`` to
    ``handle(tp, records)``, batch by batch, partition order kept; returns how many.
    ``idle_timeout_s``: give up after that long without a record."""
    wanted = list(tps)
    todo = {tp for tp in wanted if end.get(tp, 0) > start.get(tp, 0)}
    if not todo:
        return 0
    reader = await started(_reader(source))
    read = 0
    try:
        reader.assign(wanted)
        for tp in wanted:
            reader.seek(tp, start.get(tp, 0))
        deadline = None if idle_timeout_s is None else time.monotonic() + idle_timeout_s
        while True:
            for tp in list(todo):  # also before the first poll: a log emptied by retention
                if await reader.position(tp) >= end[tp]:
                    todo.discard(tp)
            if not todo:
                return read
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"could not read {sorted(todo)} to the end: no record for "
                                   f"{idle_timeout_s:.0f} s")
            batch = await reader.getmany(*todo, timeout_ms=500, max_records=20_000)
            if batch and idle_timeout_s is not None:
                deadline = time.monotonic() + idle_timeout_s
            for tp, records in batch.items():
                inside = [r for r in records if r.offset < end[tp]]
                if inside:
                    handle(tp, inside)
                    read += len(inside)
    finally:
        await stopped(reader)


async def follow(source: object, topic: str, handle: Callable[[list[Record]], object], *,
                 positions: dict[TopicPartition, int],
                 caught_up: Callable[[], object], poll_s: float = 0.5) -> None:
    """Hand every record of ``topic`` (read uncommitted: a compacted topic of plain writes)
    to ``handle`` until cancelled, from ``positions`` (a partition it lacks: from the
    beginning), kept at the offset after each handled batch so a caller that follows again
    after an error resumes there; ``caught_up()`` once, when the ends seen at the start are
    reached. Returns at once while the topic does not exist."""
    tps = await topic_partitions(source, topic)
    if not tps:
        return
    reader = await started(_reader(source, committed=False))
    try:
        reader.assign(tps)
        for tp in tps:
            if tp in positions:
                reader.seek(tp, positions[tp])
            else:
                await reader.seek_to_beginning(tp)
        ends = await reader.end_offsets(tps)
        behind: set[TopicPartition] | None = set(ends)
        while True:
            if behind is not None:
                behind = {tp for tp in behind if await reader.position(tp) < ends[tp]}
                if not behind:
                    caught_up()
                    behind = None
            batch = await reader.getmany(timeout_ms=int(poll_s * 1000))
            for tp, records in batch.items():
                if records:
                    handle(records)
                    positions[tp] = records[-1].offset + 1
    finally:
        await stopped(reader)
