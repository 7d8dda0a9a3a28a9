"""A record batch the worker cannot decode (issue 47): the worker runs without the snappy,
lz4 and zstd library (``cramjam`` made unimportable in its process), a librdkafka producer
sends one user's session compressed with snappy, then plain batches of other users on the
same partition and the other one. The worker never exits (it used to exit 70 and read the
same batch again after every restart), the API answers meanwhile, the other sessions are
processed, and the dead-letter topic names the set-aside batches by topic, partition and
offset range. Then the ranges are re-driven (``memstream redrive``, from this process,
which has the library) and the session is processed too."""

from __future__ import annotations

import asyncio
import json
import os
import urllib.request
from pathlib import Path

import pytest
import pytest_asyncio
from confluent_kafka import Producer

from memstream.core.topic_reader import end_offsets, read_range
from memstream.memory.store.partitioned import partition_of
from memstream.ops.redrive import redrive
from memstream.topics.batch_refs import Reference, parse_reference
from memstream.topics.schemas import ChatMessage
from tests.integration.conftest import Harness, free_port, until, wait_covered
from tests.integration.test_codecs import session

pytestmark = pytest.mark.integration
KEY = "k-undecodable-admin-0123456789abcdef"
PORT = free_port()
NO_CODECS = "import sys\nsys.modules['cramjam'] = None  # aiokafka: no snappy, lz4, zstd\n"


@pytest_asyncio.fixture
async def h(kafka_bootstrap: str, tmp_path: Path):
    site = tmp_path / "no-codecs"
    site.mkdir()
    (site / "sitecustomize.py").write_text(NO_CODECS)
    h = await Harness(kafka_bootstrap, tmp_path, extract_enabled=True, web_enabled=True,
                      web_port=PORT, admin_key=KEY).start()
    before = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(site), before) if p)
    try:
        h.worker()  # (the environment is the child's from its start)
    finally:
        if before is None:
            os.environ.pop("PYTHONPATH")
        else:
            os.environ["PYTHONPATH"] = before
    try:
        yield h
    finally:
        await h.close()


def produce(h: Harness, codec: str, events: list) -> None:
    """Each event to its user's partition (murmur2, as the worker places them)."""
    producer = Producer({"bootstrap.servers": h.settings.bootstrap_servers,
                         "compression.type": codec, "linger.ms": 200,
                         "enable.idempotence": True, "acks": "all"})
    failed: list[str] = []
    for e in events:
        topic = (h.topics.messages if isinstance(e, ChatMessage) else h.topics.session_events)
        producer.produce(topic.name, key=e.key().encode(), value=e.dumps(),
                         partition=partition_of(e.tenant_id, e.user_id, h.settings.partitions),
                         on_delivery=lambda err, _m: failed.append(str(err)) if err else None)
    assert producer.flush(30) == 0 and not failed, failed


def health() -> int:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{PORT}/v1/health", timeout=5) as r:
            return int(r.status)
    except OSError:
        return 0


async def dead_letters(h: Harness) -> list:
    """The dead-letter topic up to its end now."""
    name = h.topics.dead_letters.name
    found: list = []
    await read_range(h.settings, name, (await end_offsets(h.settings, [name]))[name],
                     found.extend)
    return found


def references(records: list) -> list[Reference]:
    found = []
    for r in records:
        letter = json.loads(r.value)
        if letter["kind"] == "undecodable":
            assert letter["value_length"] == 0 and letter["value_b64"] == ""
            ref = parse_reference(letter["reason"])
            assert ref is not None and letter["reason"].startswith("UnsupportedCodecError")
            found.append(ref)
    return found


async def test_a_batch_the_worker_cannot_decode_is_set_aside_and_redriven(h, tenant):
    n = h.settings.partitions
    snap = "snappy-user"
    p = partition_of(tenant, snap, n)
    others = [u for u in (f"plain-{i}" for i in range(40))]
    same = [u for u in others if partition_of(tenant, u, n) == p][:2]
    other = [u for u in others if partition_of(tenant, u, n) != p][:2]
    assert len(same) == 2 and len(other) == 2
    await until(lambda: asyncio.to_thread(lambda: health() == 200 or None), "API up", 90)

    await asyncio.to_thread(produce, h, "snappy", session(tenant, snap, "Porto"))
    await asyncio.to_thread(produce, h, "none",
                            [e for u in same + other for e in session(tenant, u, "Oslo")])

    # the snappy batch of the turns is set aside by reference
    await h.dlq.wait_for(lambda rs: any(r.topic == h.topics.messages.name
                                        for r in references(rs)), timeout=90)
    assert health() == 200  # the API answers meanwhile
    # every other session is processed, on the same partition too
    await wait_covered(h, {(u, "s1"): 6 for u in same + other}, timeout=120, tenant=tenant)
    # (the session end's too, if librdkafka compressed it: the other sessions' ends behind it
    # on the partition are read, so its dead letter is committed by now)
    refs = references(await dead_letters(h))
    assert {r.partition for r in refs} == {p}
    assert {r.topic for r in refs} <= {h.topics.messages.name, h.topics.session_events.name}
    messages = next(r for r in refs if r.topic == h.topics.messages.name)
    assert messages.last - messages.first + 1 == 6  # the session's six turns, one batch
    assert all(w.alive() for w in h.workers) and len(h.workers[0].incarnations) == 1
    assert "record batch not decoded" in h.workers[0].log_text()

    # re-driven from a client that decodes snappy: the session is processed
    for ref in refs:
        done = await redrive(h.settings, ref)
        assert done.read == done.produced == ref.last - ref.first + 1
    await wait_covered(h, {(snap, "s1"): 6}, timeout=120, tenant=tenant)
    assert all(w.alive() for w in h.workers) and health() == 200
    assert references(await dead_letters(h)) == refs  # nothing else set aside
