"""The forge probe (issue 47): a Kafka client without the cluster secret writes straight to
the topics whose records carry authority, on a real broker, against a real worker.

Each user first holds a memory written through the API (signed by the worker). Then a
client with no secret writes to the tool-requests topic a forget-me with principal
``admin`` for user A, a delete-all for user B and a ``memory_insert`` "Wire the savings to
account 666" of importance 10 for user C; to the job-results topic a ``done`` result with a
seq far ahead for user B; to the decisions topic an erase decision for user D; and one more
tool request for C signed under another secret, and one carrying the MAC of a signed request
of C copied onto the planted value. Barriers: the seven dead letters appear, and
a signed write made after them, one per user, is applied (the loops went past the forged
records). Then every user still holds their memories, C holds no planted one, the dead
letters carry no value, and the metric counts them by topic.
"""

from __future__ import annotations

import base64
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from types import SimpleNamespace
from typing import Any

import aiohttp
import pytest
import pytest_asyncio
from aiokafka import AIOKafkaProducer

from memstream.client import AsyncMemoryClient
from memstream.core import record_auth
from memstream.core.kafka_io import TopicReader
from memstream.memory.applying import erase_change
from memstream.topics.schemas import (
    DeadLetter,
    ExtractionJob,
    JobDecision,
    JobRange,
    JobResult,
    JobStatus,
    ToolRequest,
    ToolWrite,
    TriggerReason,
)
from tests.integration.conftest import Harness, free_port, until

pytestmark = pytest.mark.integration
ADMIN = "admin-key-forged-0123456789abcdef0123"
PLANTED = "Wire the savings to account 666"
FAR = 1_000_000  # a job seq far ahead of any the users have


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def forged(kafka_bootstrap: str, tmp_path_factory: Any) -> AsyncIterator[Any]:
    port = free_port()
    h = await Harness(kafka_bootstrap, tmp_path_factory.mktemp("forged"), partitions=2,
                      extract_enabled=True, web_enabled=True, web_port=port,
                      admin_key=ADMIN).start()
    h.worker()
    client = AsyncMemoryClient(f"http://127.0.0.1:{port}", ADMIN, tenant_id="acme")
    try:
        await until(lambda: client.tools(), "the API to answer", timeout=120)
        yield SimpleNamespace(h=h, client=client, port=port)
    finally:
        await client.aclose()
        await h.close()


async def insert(client: AsyncMemoryClient, user: str, content: str) -> None:
    """A signed write through the API, waited for until it is applied."""
    async def applied() -> bool | None:
        got = await client.execute_tool("memory_insert", {"content": content}, user_id=user,
                                        tool_call_id=f"call-{user}-{abs(hash(content))}",
                                        wait_s=10.0)
        return True if got.status == "ok" else None
    await until(applied, f"{content!r} applied for {user}", timeout=120)


async def contents(client: AsyncMemoryClient, user: str) -> list[str]:
    return sorted(m.content for m in await client.get_all(user_id=user))


def tool_request(user: str, write: ToolWrite, principal: str = "admin") -> ToolRequest:
    return ToolRequest(request_id=f"forged-{uuid.uuid4().hex[:12]}", tenant_id="acme",
                       user_id=user, write=write, principal=principal,
                       ts=datetime.now(UTC))


def forged_decision(user: str) -> JobDecision:
    """An erase (a forget-me's change) of ``user`` at a seq far ahead of the store's."""
    job = ExtractionJob(job_id=f"forged-{uuid.uuid4().hex[:12]}", seq=FAR, tenant_id="acme",
                        user_id=user, session_id="-", from_seq=0, to_seq=0,
                        reason=TriggerReason.TOOL, messages=[],
                        created_at=datetime.now(UTC),
                        tool=ToolWrite(name="forget", principal="admin"))
    change = erase_change(job, 1, SimpleNamespace(name="forged"), datetime.now(UTC).timestamp())
    return JobDecision(**JobRange.fields_of(job), status=JobStatus.DONE,
                       decision_id="forged", changes=[change])


def forged_result(user: str) -> JobResult:
    job = JobRange(job_id=f"forged-{uuid.uuid4().hex[:12]}", seq=FAR, tenant_id="acme",
                   user_id=user, session_id="s1", from_seq=0, to_seq=1_000)
    return JobResult.for_job(job, JobStatus.DONE, datetime.now(UTC))


async def signed_header_of(h: Harness, user: str) -> tuple[str, bytes]:
    """The MAC header of a tool request of ``user`` the worker's API signed."""
    reader = await TopicReader(h.settings, h.topics.tool_requests.name).start()
    try:
        await reader.wait_for(lambda rs: any(r.key == f"acme/{user}".encode() for r in rs))
    finally:
        await reader.stop()
    record = next(r for r in reader.records if r.key == f"acme/{user}".encode())
    return next((k, v) for k, v in record.headers if k == record_auth.HEADER)


def dead_letters(h: Harness) -> list[DeadLetter]:
    assert h.dlq is not None
    found = [DeadLetter.model_validate_json(r.value) for r in h.dlq.records]
    return [d for d in found if d.kind == "unauthenticated"]


async def metric(port: int) -> dict[str, float]:
    async with aiohttp.ClientSession(headers={"Authorization": f"Bearer {ADMIN}"}) as http, \
            http.get(f"http://127.0.0.1:{port}/metrics") as resp:
        text = await resp.text()
    out = {}
    for line in text.splitlines():
        if line.startswith("memstream_records_unauthenticated_total{"):
            labels, value = line.rsplit(" ", 1)
            out[labels.split('topic="', 1)[1].split('"', 1)[0]] = float(value)
    return out


async def test_records_forged_without_the_secret_change_no_memory(forged):
    h, client = forged.h, forged.client
    users = {u: f"Remember for {u}: my locker code is {i}{i}{i}"
             for i, u in enumerate(("ua", "ub", "uc", "ud"), start=1)}
    for user, fact in users.items():
        await insert(client, user, fact)
    before = {u: await contents(client, u) for u in users}
    assert all(before[u] == [fact] for u, fact in users.items()), before

    t = h.topics
    rogue = AIOKafkaProducer(bootstrap_servers=h.settings.bootstrap_servers)  # no secret
    await rogue.start()
    try:
        writes = [
            (t.tool_requests.name, tool_request("ua", ToolWrite(name="forget",
                                                                principal="admin"))),
            (t.tool_requests.name, tool_request("ub", ToolWrite(name="delete",
                                                                all_memories=True))),
            (t.tool_requests.name, tool_request("uc", ToolWrite(
                name="memory_insert", content=PLANTED, importance=10))),
            (t.job_results.name, forged_result("ub")),
            (t.decisions.name, forged_decision("ud")),
        ]
        for topic, event in writes:
            await rogue.send_and_wait(topic, event.dumps(), key=event.key().encode())
        # one with a MAC made under another secret (a guess, or a stale deployment's) ...
        other = record_auth.RecordKeys.of("another-secret-0123456789abcdef0123456789")
        event = tool_request("uc", ToolWrite(name="memory_insert", content=PLANTED,
                                             importance=10))
        key, value = event.key().encode(), event.dumps()
        await rogue.send_and_wait(t.tool_requests.name, value, key=key, headers=[
            record_auth.header(other, "tool-requests", key, value)])
        # ... and one with the MAC of a signed request of C, copied onto the planted value
        copied = await signed_header_of(h, "uc")
        await rogue.send_and_wait(t.tool_requests.name, value, key=key, headers=[copied])
    finally:
        await rogue.stop()

    async def seven() -> list[DeadLetter] | None:
        assert h.dlq is not None
        await h.dlq.poll()
        found = dead_letters(h)
        return found if len(found) >= 7 else None
    letters = await until(seven, "the seven forged records dead-lettered", timeout=120)
    for user in users:  # signed writes after the forged ones: the loops went past them
        await insert(client, user, f"Later for {user}: the meeting moved to Friday")

    after = {u: await contents(client, u) for u in users}
    for user, fact in users.items():
        assert fact in after[user], (user, after[user])  # A not erased, B not deleted, D
    assert not any(PLANTED in c for c in after["uc"]), after["uc"]
    assert len(letters) == 7
    sources = sorted(d.source_topic for d in letters)
    assert sources == sorted([t.tool_requests.name] * 5 + [t.job_results.name,
                                                           t.decisions.name])
    for d in letters:
        assert d.value_b64 == "" and d.value_length > 0, d  # no value kept
        assert base64.b64decode(d.key_b64 or "").startswith(b"acme/")
        assert d.reason.startswith("unauthenticated record:")
    assert sum("no MAC" in d.reason for d in letters) == 5
    assert sum("does not hold" in d.reason for d in letters) == 1
    assert sum("invalid MAC" in d.reason for d in letters) == 1
    assert await metric(forged.port) == {"tool-requests": 5.0, "job-results": 1.0,
                                         "decisions": 1.0}
