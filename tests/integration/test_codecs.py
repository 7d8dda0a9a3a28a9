"""Every codec a producer may compress with (issue 47): a librdkafka producer (what
confluent-kafka, kafkajs's native client and most non-Java services use) sends chat turns
compressed with gzip, snappy, lz4 and zstd, several to a batch, to the real broker; one
worker reads them all: every session is covered, every user's fact is a memory, nothing is
dead-lettered and the worker never restarts."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

import pytest
import pytest_asyncio
from confluent_kafka import Producer

from memstream.client import AsyncMemoryClient
from memstream.topics.schemas import ChatMessage, SessionEvent
from tests.integration.conftest import free_port, running, wait_covered

pytestmark = pytest.mark.integration
KEY = "k-codecs-admin-0123456789abcdef0123"
PORT = free_port()
CODECS = ("gzip", "snappy", "lz4", "zstd")
CITIES = {"gzip": "Lisbon", "snappy": "Porto", "lz4": "Oslo", "zstd": "Vienna"}


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def shared(kafka_bootstrap, tmp_path_factory):
    async with running(kafka_bootstrap, tmp_path_factory.mktemp("codecs"),
                       extract_enabled=True, web_enabled=True, web_port=PORT,
                       admin_key=KEY) as h:
        yield h


def session(tenant: str, user: str, city: str) -> list[ChatMessage | SessionEvent]:
    t0 = datetime(2026, 4, 1, tzinfo=UTC)
    texts = [f"I live in {city}", "Noted.", "we have 2 kids", "Noted.", "thanks", "Bye!"]
    out: list[ChatMessage | SessionEvent] = [
        ChatMessage(tenant_id=tenant, user_id=user, session_id="s1", message_id=f"{user}-{n}",
                    role="user" if n % 2 == 0 else "assistant", content=text,
                    ts=t0 + timedelta(seconds=n))
        for n, text in enumerate(texts)]
    out.append(SessionEvent(tenant_id=tenant, user_id=user, session_id="s1",
                            ts=t0 + timedelta(minutes=5)))
    return out


def send_compressed(h, codec: str, events) -> int:
    """All at once, lingering so that each partition's records share a compressed batch."""
    producer = Producer({"bootstrap.servers": h.settings.bootstrap_servers,
                         "compression.type": codec, "linger.ms": 200,
                         "enable.idempotence": True, "acks": "all"})
    failed: list[str] = []
    for event in events:
        topic = (h.topics.messages if isinstance(event, ChatMessage)
                 else h.topics.session_events).name
        producer.produce(topic, key=event.key().encode(), value=event.dumps(),
                         on_delivery=lambda err, _msg: failed.append(str(err)) if err else None)
    assert producer.flush(30) == 0 and not failed, failed
    return len(events)


@pytest.mark.parametrize("codec", CODECS)
async def test_a_compressed_batch_is_read_like_any(shared, tenant, codec):
    h = shared
    users = [f"{codec}-u{i}" for i in range(6)]
    events = [e for u in users for e in session(tenant, u, CITIES[codec])]
    await asyncio.to_thread(send_compressed, h, codec, events)
    await wait_covered(h, {(u, "s1"): 6 for u in users}, timeout=90, tenant=tenant)
    async with AsyncMemoryClient(f"http://127.0.0.1:{PORT}", KEY, tenant_id=tenant) as client:
        for u in users:
            found = {m.content for m in await client.get_all(user_id=u)}
            assert f"Lives in {CITIES[codec]}" in found, (u, found)
    assert h.dlq.records == []
    assert all(w.alive() for w in h.workers)  # no exit (a codec error used to end it)
