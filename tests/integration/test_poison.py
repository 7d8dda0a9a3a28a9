"""Poison input on a real broker: every hostile record is dead-lettered with its kind, the
valid messages around it are processed, and a dead letter that cannot be delivered stops the
worker before the input offset passes the record."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from aiokafka import AIOKafkaProducer
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType
from aiokafka.structs import RecordMetadata, TopicPartition

from memstream.core import kafka
from memstream.core.kafka_io import start_producer
from memstream.core.settings import Settings
from memstream.dev.process import WorkerProcess
from memstream.streams.dead_letters import EXIT_UNDELIVERABLE
from memstream.topics.schemas import DeadLetter, ExtractionJob
from tests.integration.conftest import Harness, chat, end

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="module")]

FACTS = ["I live in Berlin", "I have two kids", "I work at Siemens", "I am vegetarian",
         "My budget is 50k this month", "I prefer short answers", "I drive a Volvo",
         "My wife is called Anna"]
POISON_JOB = "j-poison"


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def world(kafka_bootstrap: str, tmp_path_factory: pytest.TempPathFactory
                ) -> AsyncIterator[Harness]:
    """One worker for the module's shared tests: ingest, extract and apply (rules model,
    hashing embedder), so that the internal topics are read too."""
    h = await Harness(kafka_bootstrap, tmp_path_factory.mktemp("poison"), extract_enabled=True,
                      embedder="hashing", max_content_chars=1000).start()
    try:
        h.worker()
        yield h
    finally:
        await h.close()


def enc(obj: object) -> bytes:
    return json.dumps(obj).encode()


def verbatim(obj: dict[str, Any], name: str, literal: str) -> bytes:
    """``obj`` plus one field whose JSON text is given as is (NaN, 5,000 digits...)."""
    return enc(obj)[:-1] + f', "{name}": {literal}}}'.encode()


def poison_records(topics: Any, tenant: str, user: str) -> list[tuple[str, bytes | None,
                                                                      bytes | None, str]]:
    """(topic, value, key, expected kind) for every poison class, on every topic read."""
    key = f"{tenant}/{user}".encode()

    def good(i: int) -> dict[str, Any]:
        return chat(f"poison {i}", tenant=tenant, user=user, mid=f"bad-{i}").model_dump(
            mode="json")

    job_range = {"job_id": POISON_JOB, "tenant_id": tenant, "user_id": user,
                 "session_id": "s1", "from_seq": 0, "to_seq": 1}
    job = {**job_range, "reason": "threshold", "created_at": "2026-03-01T10:00:00Z",
           "messages": [{"seq": 0, "message_id": "m", "role": "user", "content": "hi",
                         "ts": "0001-01-01T00:00:00+01:00"}]}
    m, s = topics.messages.name, topics.session_events.name
    return [
        (m, b"{not json", key, "not_json"),
        (m, b"[" * 100_000 + b"]" * 100_000, key, "depth"),
        (m, verbatim(good(1), "n", "9" * 5000), key, "number"),
        (m, enc({**good(2), "ts": "0001-01-01T00:00:00+01:00"}), key, "date"),
        (m, enc({**good(3), "content": "lone \ud800 surrogate"}), key, "unicode"),
        (m, verbatim(good(4), "x", "NaN"), key, "number"),
        (m, verbatim(good(5), "x", "-Infinity"), key, "number"),
        (m, enc({**good(6), "schema_version": True}), key, "version"),
        (m, enc({**good(7), "schema_version": 1.0}), key, "version"),
        (m, enc(good(8)), None, "key"),
        (m, enc(good(9)), f"{tenant}/someone-else".encode(), "key"),
        (m, None, key, "empty"),
        (m, enc({k: v for k, v in good(10).items() if k != "role"}), key, "schema"),
        (m, enc({**good(11), "metadata": {f"k{i}": i for i in range(30_000)}}), key,
         "too_large"),
        (s, enc({"tenant_id": tenant, "user_id": user, "session_id": "s1",
                 "ts": "9999-12-31T23:30:00-01:00"}), key, "date"),
        (s, enc({"tenant_id": tenant, "user_id": user, "session_id": "s1",
                 "ts": "2026-03-01T10:00:00Z"}), None, "key"),
        (topics.job_results.name, verbatim({**job_range, "status": "done",
                                            "finished_at": "2026-03-01T10:00:00Z"},
                                           "llm_calls", "Infinity"), key, "number"),
        (topics.tool_requests.name, enc({"request_id": "r1", "tenant_id": tenant,
                                         "user_id": user, "principal": "agent",
                                         "write": {"name": "memory_insert", "content": "x"},
                                         "ts": "2026-03-01T10:00:00Z", "x": "\udfff"}), key,
         "unicode"),
        (topics.jobs.name, enc(job), key, "date"),
        (topics.jobs.name, enc({**job, "messages": []}), None, "key"),
        (topics.jobs.name, b'{"a":' * 100_000 + b"1" + b"}" * 100_000, key, "depth"),
        (topics.decisions.name, verbatim({**job_range, "status": "done"}, "llm_calls", "1" * 5000),
         key, "number"),
    ]


async def produce(producer: AIOKafkaProducer, topic: str, value: bytes | None,
                  key: bytes | None) -> RecordMetadata:
    return await producer.send_and_wait(topic, value=value, key=key)


def letters(h: Harness) -> dict[tuple[str, int, int], DeadLetter]:
    assert h.dlq is not None
    found = (DeadLetter.model_validate_json(r.value) for r in h.dlq.records)
    return {(d.source_topic, d.partition, d.offset): d for d in found}


def covered_ids(h: Harness, tenant: str) -> set[str]:
    """Message ids inside the worker's jobs for ``tenant`` (the poison we put on the jobs
    topic ourselves is skipped)."""
    assert h.jobs is not None
    ids = set()
    for r in h.jobs.records:
        try:
            job = ExtractionJob.model_validate_json(r.value)
        except ValueError:
            continue
        if job.tenant_id == tenant and job.job_id != POISON_JOB:
            ids |= {m.message_id for m in job.messages}
    return ids


def crashes(worker: WorkerProcess) -> list[str]:
    text = worker.log_path.read_text(errors="replace")
    return [line for line in text.splitlines()
            if "Traceback" in line or "Crashed reason" in line or "crashed" in line.lower()]


async def test_every_poison_class_is_dead_lettered_and_valid_messages_go_on(world: Harness):
    h, tenant, user = world, f"t{uuid.uuid4().hex[:8]}", "pa"
    assert h.producer is not None
    gzip = await start_producer(h.settings, compression_type="gzip",
                                max_request_size=8 * 1024 * 1024)
    try:
        huge = chat("remember this " * 230_000, tenant=tenant, user=user, mid="huge").dumps()
        assert len(huge) > 3_000_000  # above the dead-letter topic's 1 MB; gzip: a few KB
        first = await produce(gzip, h.topics.messages.name, huge, f"{tenant}/{user}".encode())
    finally:
        await gzip.stop()
    sent = {first: ("too_large", huge)}
    valid = []
    for i, (topic, value, key, kind) in enumerate(poison_records(h.topics, tenant, user)):
        meta = await produce(h.producer, topic, value, key)
        sent[meta] = (kind, value or b"")
        if i % 3 == 0:  # valid messages interleaved with the poison
            msg = chat(FACTS[len(valid) % len(FACTS)], tenant=tenant, user=user,
                       mid=f"good-{len(valid)}")
            await h.send(msg)
            valid.append(msg.message_id)
    await h.send(end(tenant=tenant, user=user))

    where = {(m.topic, m.partition, m.offset): v for m, v in sent.items()}
    await h.dlq.wait_for(lambda rs: set(where) <= set(letters(h)), timeout=120)
    got = letters(h)
    for at, (kind, value) in where.items():
        d = got[at]
        assert d.kind == kind, (at, d.reason)
        assert d.reason and d.value_length == len(value)
        assert d.value_sha256 == hashlib.sha256(value).hexdigest()
        assert value.startswith(base64.b64decode(d.value_b64))
    big = next(d for d in got.values() if d.value_length == len(huge))
    assert big.truncated and len(big.model_dump_json()) < 1_000_000

    await h.jobs.wait_for(lambda rs: covered_ids(h, tenant) >= set(valid), timeout=120)
    assert covered_ids(h, tenant) == set(valid)
    assert crashes(h.workers[0]) == []


async def set_topic_config(settings: Settings, topic: str, config: dict[str, str]) -> None:
    """Alter, then barrier: the broker reports the new values (KRaft applies an altered
    config from its metadata log a moment after the controller accepted it; a record
    written meanwhile still meets the old limit)."""
    admin = kafka.admin(settings)
    await admin.start()
    try:
        await admin.alter_configs([ConfigResource(ConfigResourceType.TOPIC, topic, config)])
        deadline = time.monotonic() + 30
        while (found := await topic_config(admin, topic)) is None or any(
                found.get(k) != v for k, v in config.items()):
            assert time.monotonic() < deadline, f"{topic}: config not applied: {found}"
            await asyncio.sleep(0.1)
    finally:
        await admin.close()


async def topic_config(admin, topic: str) -> dict[str, str] | None:
    responses = await admin.describe_configs([ConfigResource(ConfigResourceType.TOPIC, topic)])
    for response in responses:
        for resource in response.to_object()["resources"]:
            if resource["error_code"] == 0 and resource["resource_name"] == topic:
                return {e["config_names"]: e["config_value"]
                        for e in resource["config_entries"]}
    return None


async def committed(settings: Settings, tp: TopicPartition) -> int | None:
    admin = kafka.admin(settings)
    await admin.start()
    try:
        # the ingest loop's group (streams.ingest_loop) reads the messages
        offsets = await admin.list_consumer_group_offsets(f"{settings.app_id}-ingest")
    finally:
        await admin.close()
    meta = offsets.get(tp)
    return None if meta is None or meta.offset < 0 else meta.offset


async def exited(worker: WorkerProcess, timeout: float) -> int:
    assert worker.proc is not None
    deadline = time.monotonic() + timeout
    while worker.proc.poll() is None:
        if time.monotonic() > deadline:
            raise TimeoutError(f"worker still running after {timeout}s")
        await asyncio.sleep(0.2)
    return worker.proc.returncode


async def test_undeliverable_dead_letter_stops_the_worker_before_the_offset_passes(
        kafka_bootstrap: str, tmp_path: Path):
    """The dead-letter topic starts refusing every record under a running worker: it exits
    at once without committing past the bad record; once the topic is fixed, a new worker
    dead-letters it and processes the valid messages after it. (A worker of its own: this
    one is killed.)"""
    h = await Harness(kafka_bootstrap, tmp_path).start()
    try:
        assert h.producer is not None
        dlq = h.topics.dead_letters
        first = h.worker()  # ready first: a worker refuses to start on such a topic (layout check)
        await set_topic_config(h.settings, dlq.name, {**dlq.config(), "max.message.bytes": "64"})
        tenant, key = "acme", b"acme/u1"
        bad = await produce(h.producer, h.topics.messages.name, b"{not json", key)
        await h.send(*[chat(t, mid=f"after-{i}") for i, t in enumerate(FACTS[:4])])

        assert await exited(first, timeout=60) == EXIT_UNDELIVERABLE
        assert "undeliverable" in first.log_path.read_text(errors="replace")
        tp = TopicPartition(bad.topic, bad.partition)
        done = await committed(h.settings, tp)
        assert done is None or done <= bad.offset, "the input offset passed the bad record"

        await set_topic_config(h.settings, dlq.name, dlq.config())
        h.worker()
        at = (bad.topic, bad.partition, bad.offset)
        await h.dlq.wait_for(lambda rs: at in letters(h), timeout=90)
        assert letters(h)[at].kind == "not_json"
        await h.jobs.wait_for(lambda rs: len(covered_ids(h, tenant)) >= 4, timeout=60)
        assert covered_ids(h, tenant) == {f"after-{i}" for i in range(4)}
    finally:
        await h.close()
