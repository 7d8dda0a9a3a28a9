"""Producers that do not place keys by murmur2 (streams/placement.py), against the real
broker and a real worker: a librdkafka producer on its defaults (confluent-kafka:
``consistent_random``, CRC-32 of the key) and one that picks partitions at random. Every
session is processed for its user, each user's memories equal those of the same
conversation produced with the Java partitioner, and every record that landed off its
key's partition was re-routed exactly once (the repartition topic, the metric)."""

from __future__ import annotations

import asyncio
import random
import re
import urllib.request
from collections import defaultdict
from datetime import UTC, datetime, timedelta

import pytest
import pytest_asyncio
from confluent_kafka import Producer

from memstream.client import AsyncMemoryClient
from memstream.core.kafka_io import TopicReader
from memstream.memory.store.partitioned import partition_of
from memstream.topics.schemas import ChatMessage, SessionEvent
from tests.integration.conftest import free_port, running, wait_covered

pytestmark = pytest.mark.integration
PARTITIONS = 4
KEY = "k-placement-admin-0123456789abcdef01"
PORT = free_port()
USERS = [f"u{i}" for i in range(10)]
SESSIONS = [  # one fact a session, so the order in which a session's turns arrive is moot
    ["I live in Berlin", "we have 2 kids"],
    ["Big news: we moved from Berlin to Munich.", "Remember this: my passport expires in June"],
    ["I am allergic to penicillin", "thanks"],
]


def conversation(tenant: str, user: str, i: int) -> list[ChatMessage | SessionEvent]:
    t0 = datetime(2026, 3, 1, tzinfo=UTC) + timedelta(days=i)
    out: list[ChatMessage | SessionEvent] = []
    for n, text in enumerate(SESSIONS[i]):
        for role, content in (("user", text), ("assistant", "Noted.")):
            out.append(ChatMessage(tenant_id=tenant, user_id=user, session_id=f"s{i}",
                                   message_id=f"{user}-s{i}-{n}-{role}", role=role,
                                   content=content, ts=t0 + timedelta(seconds=len(out))))
    out.append(SessionEvent(tenant_id=tenant, user_id=user, session_id=f"s{i}",
                            ts=t0 + timedelta(minutes=5)))
    return out


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def shared(kafka_bootstrap, tmp_path_factory):
    async with running(kafka_bootstrap, tmp_path_factory.mktemp("placement"),
                       extract_enabled=True, web_enabled=True, web_port=PORT, admin_key=KEY,
                       partitions=PARTITIONS) as h:
        yield h


def topic_of(h, event) -> str:
    return (h.topics.messages if isinstance(event, ChatMessage) else h.topics.session_events).name


def librdkafka_send(h, events) -> list[tuple[str, int]]:
    """With librdkafka's default partitioner; returns (key, partition) of each delivery."""
    producer = Producer({"bootstrap.servers": h.settings.bootstrap_servers,
                         "enable.idempotence": True, "acks": "all"})
    delivered: list[tuple[str, int]] = []
    failed: list[str] = []

    def report(err, msg) -> None:
        if err is not None:
            failed.append(str(err))
        else:
            delivered.append((msg.key().decode(), msg.partition()))

    for event in events:  # one at a time: a session's order as a chat service sends it
        producer.produce(topic_of(h, event), key=event.key().encode(), value=event.dumps(),
                         on_delivery=report)
        producer.flush(30)
    assert not failed and len(delivered) == len(events)
    return delivered


async def random_send(h, events, rng: random.Random) -> list[tuple[str, int]]:
    delivered = []
    for event in events:
        meta = await (await h.producer.send(topic_of(h, event), key=event.key().encode(),
                                            value=event.dumps(),
                                            partition=rng.randrange(PARTITIONS)))
        delivered.append((event.key(), meta.partition))
    return delivered


async def memories(tenant: str) -> dict[str, list[str]]:
    async with AsyncMemoryClient(f"http://127.0.0.1:{PORT}", KEY, tenant_id=tenant) as client:
        return {u: sorted(m.content for m in await client.get_all(user_id=u)) for u in USERS}


def misplaced_metric() -> float:
    req = urllib.request.Request(f"http://127.0.0.1:{PORT}/metrics", headers={"X-API-Key": KEY})
    with urllib.request.urlopen(req, timeout=10) as resp:
        text = resp.read().decode()
    found = re.search(r"^memstream_misplaced_records_total (\S+)$", text, re.M)
    assert found is not None, text[:500]
    return float(found.group(1))


async def produce_all(h, tenant: str, how) -> int:
    """Every user's sessions, one session of every user at a time, each covered before the
    next; returns how many records landed off their key's partition."""
    off = 0
    for i in range(len(SESSIONS)):
        events = [e for u in USERS for e in conversation(tenant, u, i)]
        delivered = await how(events)
        off += sum(p != partition_of(*key.split("/"), PARTITIONS) for key, p in delivered)
        per_session = defaultdict(int)
        for e in events:
            if isinstance(e, ChatMessage):
                per_session[(e.user_id, e.session_id)] += 1
        await wait_covered(h, dict(per_session), timeout=90, tenant=tenant)
    return off


async def java_send(h, events) -> list[tuple[str, int]]:
    """aiokafka's default partitioner: murmur2, the Java client's."""
    delivered = []
    for event in events:
        meta = await (await h.producer.send(topic_of(h, event), key=event.key().encode(),
                                            value=event.dumps()))
        delivered.append((event.key(), meta.partition))
    return delivered


async def test_other_producers_placements_lose_and_mix_nothing(shared, tenant):
    h = shared
    control = f"{tenant}-java"
    assert await produce_all(h, control, lambda events: java_send(h, events)) == 0
    expected = await memories(control)
    assert all(len(found) >= 3 for found in expected.values()), expected
    assert all("Lives in Munich" in found for found in expected.values()), expected

    reader = await TopicReader(h.settings, h.topics.repartition.name).start()
    try:
        crc = f"{tenant}-crc"
        off_crc = await produce_all(h, crc, lambda events: asyncio.to_thread(
            librdkafka_send, h, events))
        rng = random.Random(7)
        rnd = f"{tenant}-rnd"
        off_rnd = await produce_all(h, rnd, lambda events: random_send(h, events, rng))
        assert off_crc > 0 and off_rnd > 0  # the test means something: records were off
        for name in (crc, rnd):
            assert await memories(name) == expected, name  # every user, nothing mixed
        await reader.wait_for(lambda rs: len(rs) >= off_crc + off_rnd, 30)
        await reader.settle(1.0)
        assert len(reader.records) == off_crc + off_rnd  # each re-routed exactly once
        assert misplaced_metric() == off_crc + off_rnd
        assert h.dlq.records == []
    finally:
        await reader.stop()
