"""The Python client in the per-tenant layout (docs/tenancy.md): with Kafka settings of
that layout it writes the tenant's own input topics, which a chat service's ACLs allow;
otherwise the shared ones. No broker: the records it would produce."""

from __future__ import annotations

import asyncio

import pytest

from memstream.client import AsyncMemoryClient, KafkaConnection

pytestmark = pytest.mark.unit


def _topics(kafka: KafkaConnection | None, **extra: object) -> list[str]:
    client = AsyncMemoryClient("http://w:6066", "k", tenant_id="acme", kafka=kafka,
                               topic_prefix="ms", **extra)  # type: ignore[arg-type]
    try:
        events = client._chat("hello", "ana", "s1", "user")
        records = client._message_records(events)
        return [r.topic for r in records + client._session_end_records("ana", "s1")]
    finally:
        asyncio.run(client.aclose())


def test_the_client_writes_its_tenants_topics_in_the_per_tenant_layout():
    per_tenant = KafkaConnection(input_topics="per-tenant")
    assert _topics(per_tenant) == ["ms.tenant.acme.messages", "ms.tenant.acme.session-events"]


def test_the_client_writes_the_shared_topics_otherwise():
    assert _topics(KafkaConnection()) == ["ms.messages", "ms.session-events"]
    assert _topics(None, bootstrap_servers="b:9092") == ["ms.messages", "ms.session-events"]
