"""The per-tenant layout in the ingest stage (streams/ingest.py): each tenant's input
topics are read with the others, a record of the topic's tenant is handled as on the shared
topic (re-routed the same way when a producer placed it off its key's partition), and a
record of another tenant is dead-lettered (kind ``tenant``), on the topic or re-routed;
no broker."""

from __future__ import annotations

import json
import zlib
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace

import pytest
from aiokafka.structs import TopicPartition
from pydantic import SecretStr

from memstream.core.settings import Settings
from memstream.memory.store.partitioned import partition_of
from memstream.streams import placement
from memstream.streams.app import build_app
from memstream.streams.ingest import ingest_loop
from memstream.topics.schemas import ChatMessage
from tests.unit.builders import serving

pytestmark = pytest.mark.unit
T0 = datetime(2026, 12, 1, tzinfo=UTC)
N = 4


async def _loop(tmp_path):
    settings = Settings(data_dir=tmp_path, embedder="hashing", extract_enabled=False,
                        web_enabled=False, jobs_enabled=False, min_new_messages=2,
                        admin_key=SecretStr("k-admin-0123456789abcdef0123456789"),
                        partitions=N, input_topics="per-tenant", tenants="acme,globex")
    p = build_app(settings)
    p.clock = lambda: T0.timestamp() + 10
    loop = ingest_loop(p, on_fatal=lambda reason, code=70: None)
    await serving(loop, set(range(N)))
    return p, loop


def _topic(p, tenant: str) -> str:
    return p.settings.topic(f"tenant.{tenant}.messages")


def _msg(tenant: str, user: str, n: int) -> ChatMessage:
    return ChatMessage(tenant_id=tenant, user_id=user, session_id="s1", message_id=f"m{n}",
                       role="user", content=f"I have {n} cats", ts=T0 + timedelta(seconds=n))


def _record(topic, partition, offset, event, headers=()):
    return SimpleNamespace(topic=topic, partition=partition, offset=offset,
                           key=event.key().encode(), value=event.dumps(), timestamp=1000,
                           headers=tuple(headers))


def _sent(producer, topic):
    return [r for txn in producer.committed for r in txn if r[0] == topic]


async def _process(loop, *records):
    batch: dict[TopicPartition, list] = {}
    for r in records:
        batch.setdefault(TopicPartition(r.topic, r.partition), []).append(r)
    await loop.process(batch)


async def test_the_tenants_topics_are_read_with_the_others(tmp_path):
    p, loop = await _loop(tmp_path)
    assert {_topic(p, "acme"), _topic(p, "globex"),
            p.settings.topic("tenant.acme.session-events")} <= set(loop.stage.inputs)
    assert p.topics.messages.name in loop.stage.inputs  # the worker's own way in stays


async def test_a_record_of_the_topics_tenant_is_handled(tmp_path):
    p, loop = await _loop(tmp_path)
    part = partition_of("acme", "ana", N)
    await _process(loop, *(_record(_topic(p, "acme"), part, i, _msg("acme", "ana", i))
                           for i in range(2)))
    producer = loop.task_manager.producer(part)
    assert len(_sent(producer, p.topics.jobs.name)) == 1  # the threshold (2)
    assert not _sent(producer, p.topics.dead_letters.name)


async def test_a_record_of_another_tenant_is_dead_lettered_not_handled(tmp_path):
    p, loop = await _loop(tmp_path)
    part = partition_of("globex", "bo", N)
    forged = [_record(_topic(p, "acme"), part, i, _msg("globex", "bo", i)) for i in range(2)]
    await _process(loop, *forged)
    producer = loop.task_manager.producer(part)
    letters = [json.loads(r[2]) for r in _sent(producer, p.topics.dead_letters.name)]
    assert [d["kind"] for d in letters] == ["tenant", "tenant"]
    assert "'globex'" in letters[0]["reason"] and "'acme'" in letters[0]["reason"]
    assert "cats" not in letters[0]["reason"]  # no content in the reason
    assert not _sent(producer, p.topics.jobs.name)
    assert p.state.get(b"globex/bo") is None
    assert producer.offsets == [{TopicPartition(_topic(p, "acme"), part): 2}]  # read, set aside
    # the same record on globex's own topic is globex's
    await _process(loop, *(_record(_topic(p, "globex"), part, i, _msg("globex", "bo", i))
                           for i in range(2)))
    assert len(_sent(producer, p.topics.jobs.name)) == 1


async def test_a_misplaced_record_is_re_routed_and_checked_against_its_source(tmp_path):
    p, loop = await _loop(tmp_path)
    user = next(f"u{i}" for i in range(100)
                if (zlib.crc32(f"acme/u{i}".encode()) & 0xFFFFFFFF) % N
                != partition_of("acme", f"u{i}", N))
    right = partition_of("acme", user, N)
    crc = (zlib.crc32(f"acme/{user}".encode()) & 0xFFFFFFFF) % N
    await _process(loop, _record(_topic(p, "acme"), crc, 0, _msg("acme", user, 0)))
    rerouted = _sent(loop.task_manager.producer(crc), p.topics.repartition.name)
    assert len(rerouted) == 1 and rerouted[0][3] == right
    # a re-routed record names its source topic: the tenant check applies there too
    forged = _msg("globex", user, 1)
    source = ((placement.SOURCE, _topic(p, "acme").encode()),)
    await _process(loop, _record(p.topics.repartition.name, partition_of("globex", user, N), 0,
                                 forged, headers=source))
    owner = loop.task_manager.producer(partition_of("globex", user, N))
    assert [json.loads(r[2])["kind"] for r in _sent(owner, p.topics.dead_letters.name)] == [
        "tenant"]
