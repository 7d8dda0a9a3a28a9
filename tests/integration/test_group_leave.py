"""A static member that stops with ``leave_on_stop`` leaves its group at once (core/kafka.py):
the broker hands its partitions to the others without waiting for its session timeout (a
worker stopped for good, scaling in). Without it the partitions stay with the stopped
member until its session times out (what a restart within it relies on)."""

from __future__ import annotations

import asyncio
import time
import uuid

import pytest
from aiokafka.admin import NewTopic

from memstream.core import kafka
from memstream.core.settings import Settings
from tests.integration.conftest import until

pytestmark = pytest.mark.integration
SESSION_S = 30.0


async def member(settings: Settings, topic: str, group: str, instance: str):
    consumer = kafka.consumer(settings, topic, group_id=group, group_instance_id=instance,
                              session_timeout_ms=int(SESSION_S * 1000),
                              heartbeat_interval_ms=500, enable_auto_commit=False)
    await consumer.start()
    return consumer


async def polled(consumer, partitions: int):
    await consumer.getmany(timeout_ms=200)
    return True if len(consumer.assignment()) == partitions else None


async def test_a_member_that_leaves_on_stop_hands_its_partitions_over_at_once(
        kafka_bootstrap):
    settings = Settings(bootstrap_servers=kafka_bootstrap)
    topic, group = f"leave-{uuid.uuid4().hex[:8]}", f"leave-{uuid.uuid4().hex[:8]}"
    admin = kafka.admin(settings)
    await admin.start()
    members = []
    try:
        await admin.create_topics([NewTopic(topic, 4, 1)])
        a = await member(settings, topic, group, "a")
        b = await member(settings, topic, group, "b")
        members = [a, b]

        async def both() -> bool | None:
            await asyncio.gather(a.getmany(timeout_ms=200), b.getmany(timeout_ms=200))
            return True if len(a.assignment()) == len(b.assignment()) == 2 else None

        await until(both, "both members hold two partitions", timeout=60)
        assert kafka.leave_on_stop(a)
        stopped = time.monotonic()
        await a.stop()
        await until(lambda: polled(b, 4), "b holds all four", timeout=SESSION_S - 5)
        assert time.monotonic() - stopped < SESSION_S / 2  # not the session timeout
    finally:
        for consumer in members:
            await consumer.stop()  # a second stop is a no-op
        await admin.delete_topics([topic])
        await admin.close()
