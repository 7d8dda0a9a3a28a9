"""Schema-registry framing (issue 47): librdkafka producing JSON turns in Confluent's wire
format (magic byte 0, 4-byte schema id, JSON) with the producer guide's own snippet
(docs/producing.md, run as it stands): the session is processed and its fact remembered;
an Avro-framed record is dead-lettered with a reason that names it, and the worker runs on."""

from __future__ import annotations

import asyncio
import base64
import json
import re
import struct
from pathlib import Path

import pytest
import pytest_asyncio

from memstream.client import AsyncMemoryClient
from memstream.topics.schemas import DeadLetter
from tests.integration.conftest import free_port, running, wait_covered

pytestmark = pytest.mark.integration
GUIDE = Path(__file__).resolve().parents[2] / "docs" / "producing.md"
KEY = "k-framing-admin-0123456789abcdef0123"
PORT = free_port()


def guide_snippet() -> str:
    """The librdkafka block of the producer guide, exactly as a reader copies it."""
    text = GUIDE.read_text(encoding="utf-8")
    found = re.search(r"<!-- snippet: librdkafka[^>]*-->\n```python\n(.*?)\n```", text, re.S)
    assert found, "docs/producing.md lost its librdkafka snippet"
    return found.group(1)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def shared(kafka_bootstrap, tmp_path_factory):
    async with running(kafka_bootstrap, tmp_path_factory.mktemp("framing"),
                       extract_enabled=True, web_enabled=True, web_port=PORT,
                       admin_key=KEY) as h:
        yield h


def run_snippet(h, tenant: str, user: str) -> dict:
    scope = {"BOOTSTRAP": h.settings.bootstrap_servers, "TENANT": tenant, "USER": user,
             "MESSAGES_TOPIC": h.topics.messages.name,
             "SESSION_EVENTS_TOPIC": h.topics.session_events.name}
    exec(compile(guide_snippet(), str(GUIDE), "exec"), scope)  # our own doc, as it stands
    return scope


async def test_framed_json_is_processed_and_avro_is_dead_lettered_by_name(shared, tenant):
    h = shared
    scope = await asyncio.to_thread(run_snippet, h, tenant, "ana")
    await wait_covered(h, {("ana", "s1"): 2}, timeout=90, tenant=tenant)
    async with AsyncMemoryClient(f"http://127.0.0.1:{PORT}", KEY, tenant_id=tenant) as client:
        found = {m.content for m in await client.get_all(user_id="ana")}
    assert "Lives in Lisbon" in found, found

    # An Avro-framed turn (what KafkaAvroSerializer writes: zigzag-length strings, no JSON)
    avro = b"\x00" + struct.pack(">I", 42) + b"\x06ana\x04s1\x08m-99"
    producer = scope["producer"]
    producer.produce(h.topics.messages.name, key=f"{tenant}/ana".encode(), value=avro)
    assert await asyncio.to_thread(producer.flush, 30) == 0

    def avro_dead_letter(records):
        for r in records:
            dl = DeadLetter.model_validate_json(r.value)
            if base64.b64decode(dl.value_b64) == avro:
                return dl
        return None

    await h.dlq.wait_for(lambda records: avro_dead_letter(records) is not None, 60)
    dl = avro_dead_letter(h.dlq.records)
    assert dl is not None and dl.kind == "not_json" and dl.source_topic == h.topics.messages.name
    assert "schema-registry framed non-JSON (Avro or Protobuf) (schema id 42)" in dl.reason
    assert "ana" not in dl.reason and dl.value_length == len(avro)
    # only the Avro record was set aside: the framed JSON turns and end were all read
    framed = [json.loads(r.value) for r in h.dlq.records]
    assert len(framed) == 1, [d["reason"] for d in framed]

    # the worker runs on: the next user's session, after the dead letter, is processed too
    scope2 = await asyncio.to_thread(run_snippet, h, tenant, "bo")
    assert scope2["failed"] == []
    await wait_covered(h, {("bo", "s1"): 2}, timeout=90, tenant=tenant)
    assert all(w.alive() for w in h.workers)
