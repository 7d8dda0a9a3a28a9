"""Records a producer placed off their key's partition (librdkafka's CRC-32, round robin)
are re-routed by the ingest stage in the transaction that commits them, and handled with
the user's state on the partition that owns it (streams/placement.py); no broker."""

from __future__ import annotations

import zlib
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace

import pytest
from aiokafka.errors import KafkaConnectionError
from aiokafka.structs import TopicPartition
from pydantic import SecretStr

from memstream.core.settings import Settings
from memstream.memory.store.partitioned import partition_of, partition_of_key
from memstream.streams import placement
from memstream.streams.app import build_app
from memstream.streams.ingest import ingest_loop
from memstream.topics.registry import registry
from memstream.topics.schemas import ChatMessage, SessionEvent
from tests.unit.builders import FakeProducer, serving

pytestmark = pytest.mark.unit
T0 = datetime(2026, 12, 1, tzinfo=UTC)
N = 4


async def _loop(tmp_path):
    settings = Settings(data_dir=tmp_path, embedder="hashing", extract_enabled=False,
                        web_enabled=False, jobs_enabled=False, min_new_messages=2,
                        admin_key=SecretStr("k-admin-0123456789abcdef0123456789"), partitions=N)
    p = build_app(settings)
    p.clock = lambda: T0.timestamp() + 10
    loop = ingest_loop(p, on_fatal=lambda reason, code=70: None)
    await serving(loop, set(range(N)))
    return p, loop


def _user_off_its_partition() -> tuple[str, int, int]:
    """A user whose CRC-32 partition (librdkafka's default) is not its murmur2 one."""
    for i in range(100):
        user = f"u{i}"
        crc = (zlib.crc32(f"acme/{user}".encode()) & 0xFFFFFFFF) % N
        right = partition_of("acme", user, N)
        if crc != right:
            return user, crc, right
    raise AssertionError("no such user")


def _record(topic, partition, offset, event, *, ts=1000, headers=()):
    return SimpleNamespace(topic=topic, partition=partition, offset=offset,
                           key=event.key().encode(), value=event.dumps(), timestamp=ts,
                           headers=tuple(headers))


def _msg(user, n):
    return ChatMessage(tenant_id="acme", user_id=user, session_id="s1", message_id=f"m{n}",
                       role="user", content=f"I have {n} cats", ts=T0 + timedelta(seconds=n))


def _batch(*records):
    out: dict[TopicPartition, list] = {}
    for r in records:
        out.setdefault(TopicPartition(r.topic, r.partition), []).append(r)
    return out


def _sent(producer, topic):
    return [r for txn in producer.committed for r in txn if r[0] == topic]


async def test_a_message_off_its_partition_is_re_routed_not_handled_there(tmp_path):
    p, loop = await _loop(tmp_path)
    user, crc, right = _user_off_its_partition()
    records = [_record(p.topics.messages.name, crc, i, _msg(user, i), ts=1000 + i)
               for i in range(2)]
    await loop.process(_batch(*records))
    producer = loop.task_manager.producer(crc)
    rerouted = _sent(producer, p.topics.repartition.name)
    assert [(r[1], r[2], r[3]) for r in rerouted] == [
        (rec.key, rec.value, right) for rec in records]  # the bytes as produced, its partition
    stamps = [s for s in producer.stamped if s[0] == p.topics.repartition.name]
    assert [s[2] for s in stamps] == [1000, 1001]  # the producer's time is kept
    headers = dict(stamps[0][3])
    assert headers[placement.SOURCE] == p.topics.messages.name.encode()
    assert headers[placement.ORIGIN] == f"{p.topics.messages.name}/{crc}/0".encode()
    assert not _sent(producer, p.topics.jobs.name) and p.state.get(f"acme/{user}".encode()) is None
    assert producer.offsets == [{TopicPartition(p.topics.messages.name, crc): 2}]
    assert p.counters.misplaced_records == 2


async def test_a_re_routed_message_is_handled_with_the_users_state(tmp_path):
    p, loop = await _loop(tmp_path)
    user, crc, right = _user_off_its_partition()
    await loop.process(_batch(*(_record(p.topics.messages.name, crc, i, _msg(user, i))
                                for i in range(2))))
    rerouted = [
        SimpleNamespace(topic=p.topics.repartition.name, partition=right, offset=i, key=key,
                        value=value, timestamp=1000 + i, headers=tuple(stamp[3]))
        for i, ((_, key, value, _p), stamp) in enumerate(zip(
            _sent(loop.task_manager.producer(crc), p.topics.repartition.name),
            [s for s in loop.task_manager.producer(crc).stamped
             if s[0] == p.topics.repartition.name],
            strict=True))]
    await loop.process(_batch(*rerouted))
    owner = loop.task_manager.producer(right)
    assert len(_sent(owner, p.topics.jobs.name)) == 1  # the threshold (2) reached there
    assert p.state.get(f"acme/{user}".encode())["sessions"]["s1"]["count"] == 2
    assert not _sent(owner, p.topics.repartition.name)  # never re-routed again
    assert p.counters.misplaced_records == 2  # counted once, where it was misplaced


async def test_a_session_end_off_its_partition_follows_the_same_way(tmp_path):
    p, loop = await _loop(tmp_path)
    user, crc, right = _user_off_its_partition()
    end = SessionEvent(tenant_id="acme", user_id=user, session_id="s1", kind="ended", ts=T0)
    await loop.process(_batch(_record(p.topics.session_events.name, crc, 0, end)))
    rerouted = _sent(loop.task_manager.producer(crc), p.topics.repartition.name)
    assert len(rerouted) == 1 and rerouted[0][3] == right


async def test_a_record_where_it_belongs_is_handled_in_place(tmp_path):
    p, loop = await _loop(tmp_path)
    user, _, right = _user_off_its_partition()
    await loop.process(_batch(*(_record(p.topics.messages.name, right, i, _msg(user, i))
                                for i in range(2))))
    producer = loop.task_manager.producer(right)
    assert not _sent(producer, p.topics.repartition.name)
    assert len(_sent(producer, p.topics.jobs.name)) == 1 and p.counters.misplaced_records == 0


async def test_an_invalid_record_off_its_partition_is_a_dead_letter_there(tmp_path):
    p, loop = await _loop(tmp_path)
    user, crc, _ = _user_off_its_partition()
    bad = _record(p.topics.messages.name, crc, 0, _msg(user, 1))
    bad.value = b"{not json"
    await loop.process(_batch(bad))
    producer = loop.task_manager.producer(crc)
    assert len(_sent(producer, p.topics.dead_letters.name)) == 1
    assert not _sent(producer, p.topics.repartition.name) and p.counters.misplaced_records == 0


async def test_a_failed_transaction_counts_nothing_and_reads_the_records_again(tmp_path):
    p, loop = await _loop(tmp_path)
    user, crc, _ = _user_off_its_partition()
    loop.task_manager.producer(crc).fail = KafkaConnectionError()
    renewed = FakeProducer()
    loop.clients.renewals.append(renewed)
    record = _record(p.topics.messages.name, crc, 0, _msg(user, 1))
    await loop.process(_batch(record))
    assert p.counters.misplaced_records == 0
    await loop.process(_batch(record))
    assert len(_sent(renewed, p.topics.repartition.name)) == 1
    assert p.counters.misplaced_records == 1


@pytest.mark.parametrize("source", [None, "job-results", "ticks", "tool-requests", "nope"])
async def test_the_repartition_topic_takes_only_what_names_a_producers_topic(tmp_path, source):
    """Only the ingest stage writes it; a record that names no producers' topic (none, or
    one of the worker's own, such as job results) is a dead letter, never obeyed."""
    p, loop = await _loop(tmp_path)
    user, _, right = _user_off_its_partition()
    headers = () if source is None else ((placement.SOURCE, p.settings.topic(source).encode()),)
    forged = _record(p.topics.repartition.name, right, 0, _msg(user, 1), headers=headers)
    await loop.process(_batch(forged))
    producer = loop.task_manager.producer(right)
    assert len(_sent(producer, p.topics.dead_letters.name)) == 1
    assert p.state.get(f"acme/{user}".encode()) is None


def test_only_producers_topics_are_checked_and_each_record_goes_to_its_keys_partition():
    topics = registry(Settings(partitions=N))
    user, crc, right = _user_off_its_partition()
    key = f"acme/{user}".encode()
    assert partition_of_key(key, N) == right

    def at(topic: str, partition: int):
        return SimpleNamespace(topic=topic, partition=partition, offset=7, key=key,
                               value=b"v", timestamp=5, headers=(("h", b"1"),))

    placed = placement.misplaced(topics, N, at(topics.messages.name, crc))
    assert placed is not None and (placed.topic, placed.partition) == (
        topics.repartition.name, right)
    assert placed.headers[0] == ("h", b"1")  # the producer's own headers travel along
    assert placement.misplaced(topics, N, at(topics.messages.name, right)) is None
    for ours in (topics.job_results, topics.tool_requests, topics.repartition):
        assert placement.misplaced(topics, N, at(ours.name, crc)) is None
