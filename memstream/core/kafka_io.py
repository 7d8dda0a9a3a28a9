"""Small aiokafka helpers for the producer side and for reading topics back.

Used by the demo, the integration tests and the benchmarks; a chat service would do the
same: key every record ``tenant/user``, value the event's JSON.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Callable, Iterable
from typing import Any, Protocol, TypeAlias

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.structs import ConsumerRecord, TopicPartition

from memstream.core import kafka
from memstream.core.settings import Settings


async def start_producer(settings: Settings, **kwargs: Any) -> AIOKafkaProducer:
    producer = kafka.producer(settings, enable_idempotence=True, linger_ms=5, **kwargs)
    await producer.start()
    return producer


class Event(Protocol):
    """A record of the contract (:class:`memstream.topics.schemas.Event`): its JSON and key."""

    def dumps(self) -> bytes: ...
    def key(self) -> str: ...


async def send_events(producer: AIOKafkaProducer, topic: str, events: Iterable[Event]) -> int:
    """Send events keyed by tenant/user; returns how many were sent."""
    futures = [
        await producer.send(topic, value=e.dumps(), key=e.key().encode()) for e in events
    ]
    await asyncio.gather(*futures)
    return len(futures)


async def send_raw(producer: AIOKafkaProducer, topic: str, value: bytes | None,
                   key: bytes | None) -> None:
    await producer.send_and_wait(topic, value=value, key=key)


class TopicReader:
    """Reads one or more topics from the beginning, keeping every record seen."""

    def __init__(self, settings: Settings, *topics: str) -> None:
        self.consumer = kafka.consumer(
            settings, *topics, auto_offset_reset="earliest",
            enable_auto_commit=False, isolation_level="read_committed", group_id=None,
        )
        self.records: list[ConsumerRecord[bytes, bytes]] = []

    async def start(self) -> TopicReader:
        await kafka.started(self.consumer)
        return self

    async def stop(self) -> None:
        await self.consumer.stop()

    async def poll(self, timeout: float = 0.2) -> list[ConsumerRecord[bytes, bytes]]:
        batch = await self.consumer.getmany(timeout_ms=int(timeout * 1000))
        new = [r for records in batch.values() for r in records]
        self.records.extend(new)
        return new

    async def wait_for(
        self, done: Callable[[list[ConsumerRecord[bytes, bytes]]], bool], timeout: float = 30.0
    ) -> list[ConsumerRecord[bytes, bytes]]:
        """Poll until ``done(all records so far)`` holds; raises TimeoutError otherwise."""
        deadline = time.monotonic() + timeout
        while not done(self.records):
            if time.monotonic() > deadline:
                raise TimeoutError(f"condition not met after {timeout}s "
                                   f"({len(self.records)} records seen)")
            await self.poll()
        return self.records

    async def settle(self, quiet: float = 1.5) -> list[ConsumerRecord[bytes, bytes]]:
        """Poll until nothing new arrives for ``quiet`` seconds."""
        last = time.monotonic()
        while time.monotonic() - last < quiet:
            if await self.poll(0.2):
                last = time.monotonic()
        return self.records


Offsets = dict[int, int]  # partition -> offset
Record: TypeAlias = ConsumerRecord[bytes, bytes]


async def topic_partitions(settings: Settings, topic: str) -> list[TopicPartition]:
    """The topic's partitions; [] while it does not exist (or has no leader yet).

    Asks for every topic's metadata, never for this one by name, which would auto-create it
    (without compaction) on a broker that has ``auto.create.topics.enable`` on.
    """
    admin = kafka.admin(settings)
    try:
        await admin.start()
        described = await admin.describe_topics()
    finally:
        await admin.close()
    for t in described:
        if t["topic"] == topic and t["error_code"] == 0:
            return sorted(TopicPartition(topic, p["partition"]) for p in t["partitions"])
    return []


def _range_consumer(settings: Settings, *, committed: bool) -> AIOKafkaConsumer:
    return kafka.consumer(
        settings, group_id=None,
        enable_auto_commit=False, auto_offset_reset="earliest",
        isolation_level="read_committed" if committed else "read_uncommitted",
        max_partition_fetch_bytes=8 * 1024 * 1024, fetch_max_bytes=64 * 1024 * 1024)


async def end_offsets(settings: Settings, topics: Iterable[str]) -> dict[str, Offsets]:
    """Each partition's high watermark: every record below it is readable once its
    transaction is resolved (a ``read_committed`` reader past it has seen them all)."""
    consumer = await kafka.started(_range_consumer(settings, committed=False))
    try:
        found: dict[str, Offsets] = {}
        for topic in topics:
            tps = await topic_partitions(settings, topic)
            ends = await consumer.end_offsets(tps) if tps else {}
            found[topic] = {tp.partition: off for tp, off in ends.items()}
        return found
    finally:
        await consumer.stop()


async def read_range(settings: Settings, topic: str, end: Offsets,
                     handle: Callable[[list[Record]], object], *,
                     start: Offsets | None = None, idle_timeout_s: float | None = None,
                     committed: bool = True) -> int:
    """Hand every committed record of ``topic`` from ``start`` (None: the beginning) up to
    ``end`` to ``handle`` (which may be async), batch by batch, partition order kept;
    returns how many. ``idle_timeout_s``: give up after that long without a record.
    ``committed=False``: every record physically in the log, aborted transactions' too."""
    todo = {p: e for p, e in end.items() if e > (start or {}).get(p, 0)}
    if not todo:
        return 0
    consumer = await kafka.started(_range_consumer(settings, committed=committed))
    read = 0
    try:
        tps = {p: TopicPartition(topic, p) for p in todo}
        consumer.assign(list(tps.values()))
        for p, tp in tps.items():
            if start and p in start:
                consumer.seek(tp, start[p])
            else:
                await consumer.seek_to_beginning(tp)
        deadline = None if idle_timeout_s is None else time.monotonic() + idle_timeout_s
        while todo:
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"could not read {topic} to its end: no record for "
                                   f"{idle_timeout_s:.0f} s")
            batch = await consumer.getmany(*[tps[p] for p in todo], timeout_ms=500,
                                           max_records=20_000)
            if batch and idle_timeout_s is not None:
                deadline = time.monotonic() + idle_timeout_s
            for tp, records in batch.items():
                wanted = [r for r in records if r.offset < todo.get(tp.partition, 0)]
                if wanted:
                    handled = handle(wanted)
                    if inspect.isawaitable(handled):
                        await handled
                    read += len(wanted)
            for p in list(todo):
                if await consumer.position(tps[p]) >= todo[p]:
                    del todo[p]
        return read
    finally:
        await consumer.stop()
