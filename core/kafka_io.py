"""Small aiokafka helpers for the producer side and for reading topics back.

Used by the demo, the integration tests and the benchmarks; a chat service would do the
same: key every record ``tenant/user``, value the event's JSON.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable
from typing import Any, Protocol

from aiokafka import AIOKafkaProducer
from aiokafka.structs import ConsumerRecord

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
        await kafka.stopped(self.consumer)

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
