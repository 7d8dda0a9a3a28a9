"""The key hierarchy on a real broker (issue 29): user keys written under master version 1,
a malformed record on the topic, ``rotate-master`` to version 2 while a follower runs, then
a fresh follower with version 2 alone opens everything; a tenant read key opens its
tenant's events and not another's; a forget after the rotation still shreds. Forget markers
(issue 47): one written under version 1 is signed again by the rotation and still holds
under version 2 alone; one a reader forged with its read key (the tenant KEK) shreds
nothing on a worker.
"""

from __future__ import annotations

import uuid

import pytest
from aiokafka import AIOKafkaProducer

from memstream.consumer.opening import Opener
from memstream.contract.events import EventLineage, MemoryEvent, MemoryState
from memstream.core.settings import Settings
from memstream.memory.crypto.user_keys import UserKeys
from memstream.ops.keys_rotate import read_key, rotate_master
from memstream.sealing import envelope as crypto
from memstream.sealing import key_records as rec
from memstream.topics.layout import create_topics
from memstream.topics.registry import registry
from tests.integration.conftest import until

pytestmark = pytest.mark.integration
V1 = "master key one for the rotation test"
V2 = "master key two for the rotation test"


def event(tenant: str, user: str, cid: str) -> MemoryEvent:
    from datetime import UTC, datetime

    t0 = datetime(2026, 1, 1, tzinfo=UTC)
    after = MemoryState(version=1, content=f"secret {cid}", type="episodic", importance=5,
                        status="active", created_at=t0, updated_at=t0, valid_from=t0)
    return MemoryEvent(change_id=cid, op="add", tenant_id=tenant, user_id=user,
                       memory_id="m1", version=1, before=None, after=after, reason="r",
                       model="rules", prompt_version="v1",
                       lineage=EventLineage(kind="extraction", session_id="s1", from_seq=0,
                                            to_seq=1, job_id="j1"), decided_at=t0)


async def follower(settings: Settings, topic: str, *, write: bool = False) -> UserKeys:
    keys = UserKeys(settings, topic)
    await keys.start(write=write)
    assert await keys.wait_ready(60)
    return keys


def opened(keys: UserKeys, e: MemoryEvent) -> bool:
    got = keys.opener()(e)
    return got is not None and got.after is not None and got.after.content.startswith("secret")


async def test_rotation_read_keys_and_forget_on_the_broker(kafka_bootstrap):
    prefix = f"rot-{uuid.uuid4().hex[:8]}"

    def settings(**kw: object) -> Settings:
        return Settings(bootstrap_servers=kafka_bootstrap, topic_prefix=prefix, **kw)

    base = settings()
    v1 = settings(master_key=V1)
    both = settings(master_key=V2, master_key_version=2, master_key_previous=f"1:{V1}")
    v2 = settings(master_key=V2, master_key_version=2)
    spec = registry(base).user_keys
    await create_topics(base, [spec])
    topic = spec.name

    w1 = await follower(v1, topic, write=True)  # a worker before the rotation
    try:
        ka = await w1.key_for_write("ta", "u1")
        kb = await w1.key_for_write("tb", "u2")
        await w1.key_for_write("tb", "u3")
        k4 = await w1.key_for_write("ta", "u4")
        assert await w1.forget("tb", "u3", 1e9, "req", "admin") == 1  # under version 1
        kek_id, kek = min(w1.keks_of("ta").items())
    finally:
        await w1.stop()
    forged = rec.signed_marker(kek, kek_id, "ta", "u4", at=3e9, request_id="x", actor="x",
                               keys=[k4[0]])  # what a reader of ta can sign
    producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap)
    await producer.start()
    try:  # one bad record: the followers set it aside and go on
        await producer.send_and_wait(topic, key=b"ta/u9/kbad", value=b"not json")
        await producer.send_and_wait(topic, key=b"ta/u4/!forgotten", value=rec.dumps(forged))
        await producer.send_and_wait(topic, key=f"ta/u4/{k4[0]}".encode(), value=None)
    finally:
        await producer.stop()
    ea = crypto.seal_event(event("ta", "u1", "a1"), *ka)
    eb = crypto.seal_event(event("tb", "u2", "b1"), *kb)

    running = await follower(both, topic)  # a worker with both versions, during it
    try:
        assert opened(running, ea) and opened(running, eb) and running.rejected == 2
        assert running.forgotten_at("ta", "u4") is None and running.keys_of("ta", "u4")
        report = await rotate_master(both)
        assert (report.keks, report.markers, report.unopened) == (2, 1, 0), report
        await until(lambda: _took(running, topic), "the follower to take the rewraps")
        assert opened(running, ea) and opened(running, eb)
    finally:
        await running.stop()

    fresh = await follower(v2, topic)  # version 1 dropped: everything still opens
    try:
        assert opened(fresh, ea) and opened(fresh, eb)
        assert fresh.forgotten_at("tb", "u3") == 1e9  # its marker signed again under 2
        assert fresh.forgotten_at("ta", "u4") is None
        assert fresh.keys_of("ta", "u4") == {k4[0]: k4[1]}  # the tombstone not honoured
    finally:
        await fresh.stop()

    key, _ = await read_key(v2, "ta")
    reader = Opener(settings(read_keys=key), topic, require_content=True)
    await reader.start()
    try:
        assert (await reader.open(ea))[1] == "opened"
        assert (await reader.open(eb)) == (eb, "sealed")  # another tenant's: no error
    finally:
        await reader.stop()

    w2 = await follower(v2, topic, write=True)  # a worker after the rotation forgets
    try:
        assert await w2.forget("ta", "u1", 2e9, "req", "admin") == 1
    finally:
        await w2.stop()
    after = await follower(v2, topic)
    try:
        assert not opened(after, ea) and opened(after, eb)
        assert after.forgotten_at("ta", "u1") == 2e9
    finally:
        await after.stop()
    reader = Opener(settings(read_keys=key), topic, require_content=True)
    await reader.start()
    try:
        assert (await reader.open(ea))[1] == "shredded"
    finally:
        await reader.stop()


async def _took(keys: UserKeys, topic: str) -> bool | None:
    """The running follower holds every tenant KEK under version 2 (the rewraps)."""
    versions = {v for t in keys._tenants.values() for v in t.versions.values()}
    return True if versions == {2} else None
