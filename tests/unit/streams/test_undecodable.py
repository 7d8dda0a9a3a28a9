"""A poll that fails on a batch no reader here decodes (streams/undecodable.py): the batch is
set aside by reference in a transaction with the offset past it, records before it are
handled first, and a failure nothing explains is waited out, never an exit."""

from __future__ import annotations

import json
import struct
from typing import Any

import pytest
from aiokafka import codec
from aiokafka.errors import KafkaConnectionError, UnsupportedCodecError
from aiokafka.record.default_records import DefaultRecordBatchBuilder
from aiokafka.structs import TopicPartition

from memstream.core.retry import RetryPolicy
from memstream.streams import owned_loop, undecodable
from memstream.streams.undecodable import read_batches
from memstream.topics.batch_refs import Batch, parse_reference
from tests.unit.streams.test_stage_loops import batch, job_record, loop_of, p, sent

pytestmark = pytest.mark.unit
CODEC = "UnsupportedCodecError"
__all__ = ["p"]  # the fixture


def _raw(base: int, n: int, compression: int = 0) -> bytes:
    b = DefaultRecordBatchBuilder(magic=2, compression_type=compression, is_transactional=0,
                                  producer_id=-1, producer_epoch=-1, base_sequence=-1,
                                  batch_size=1 << 20)
    for i in range(n):
        b.append(i, timestamp=1000, key=b"k", value=b"v%d" % i, headers=[])
    raw = bytearray(b.build())
    struct.pack_into(">q", raw, 0, base)  # the base offset (outside the CRC)
    return bytes(raw)


def test_batch_headers_are_read_and_each_batch_decoded_on_its_own(monkeypatch):
    raw = _raw(0, 3) + _raw(3, 2, compression=2)  # plain, then snappy
    assert read_batches(raw) == [Batch(0, 2), Batch(3, 4)]
    monkeypatch.setattr(codec, "cramjam", None)  # no snappy library
    assert read_batches(raw) == [Batch(0, 2), Batch(3, 4, error=CODEC)]
    corrupt = bytearray(_raw(0, 3))
    corrupt[-1] ^= 0xFF
    assert read_batches(bytes(corrupt)) == [Batch(0, 2, error="CorruptRecordException")]


class Failing:
    """getmany raises ``exc`` on a poll of every partition, and hands ``ahead`` over on a
    read of one partition."""

    def __init__(self, consumer: Any, exc: BaseException, ahead: Any = None) -> None:
        self.consumer, self.exc, self.ahead = consumer, exc, ahead

    async def __call__(self, *partitions: Any, **kwargs: Any) -> dict:
        if partitions and self.ahead:
            got, self.ahead = self.ahead, None
            for tp, records in got.items():
                self.consumer.positions[tp] = records[-1].offset + 1
            return got
        raise self.exc


def _fetching(tp: TopicPartition, batches: list[Batch]) -> Any:
    async def fetch(consumer: Any, at: TopicPartition, offset: int) -> list[Batch]:
        return batches if at == tp else []
    return fetch


async def test_an_undecodable_batch_is_set_aside_with_the_offset_past_it(p, monkeypatch):
    loop, fatal = await loop_of(p, "extract")
    consumer = loop.consumer
    tp = TopicPartition(p.topics.jobs.name, 0)
    consumer.high[tp] = 10
    consumer.getmany = Failing(consumer, UnsupportedCodecError("snappy"))
    monkeypatch.setattr(undecodable, "fetch_batches",
                        _fetching(tp, [Batch(0, 4, error=CODEC), Batch(5, 9)]))
    assert await loop._poll() == {}
    producer = loop.task_manager.producer(0)
    (dead,) = sent(producer, p.topics.dead_letters.name)
    letter = json.loads(dead)
    assert letter["kind"] == "undecodable" and letter["value_length"] == 0
    assert letter["reason"].startswith(CODEC)
    ref = parse_reference(letter["reason"])
    assert ref is not None and (ref.topic, ref.partition, ref.first, ref.last) == (
        tp.topic, 0, 0, 4)
    assert producer.offsets == [{tp: 5}]  # the skip is committed with its reference
    # every partition back to its committed offsets first (the failed poll may have moved
    # another one past records it did not return), then past the batch
    assert consumer.seeks[0] == (tp, 0) and consumer.seeks[-1] == (tp, 5) and not fatal
    assert p.counters.batches_set_aside == {(tp.topic, CODEC): 1}


async def test_records_before_the_bad_batch_are_handled_first(p, monkeypatch):
    loop, fatal = await loop_of(p, "extract")
    consumer = loop.consumer
    tp = TopicPartition(p.topics.jobs.name, 0)
    consumer.high[tp] = 10
    good = job_record(p, 0, ["I live in Oslo"])
    consumer.getmany = Failing(consumer, UnsupportedCodecError("snappy"), batch(good))
    monkeypatch.setattr(undecodable, "fetch_batches",
                        _fetching(tp, [Batch(0, 0), Batch(1, 3, error=CODEC)]))
    await loop._poll()
    producer = loop.task_manager.producer(0)
    assert len(sent(producer, p.topics.decisions.name)) == 1  # the good job was decided
    (dead,) = sent(producer, p.topics.dead_letters.name)
    ref = parse_reference(json.loads(dead)["reason"])
    assert ref is not None and (ref.first, ref.last) == (1, 3)
    assert producer.offsets == [{tp: 1}, {tp: 4}] and not fatal


async def test_a_failure_nothing_explains_is_waited_out_not_an_exit(p, monkeypatch):
    monkeypatch.setattr(owned_loop, "RETRY", RetryPolicy(0.0, 0.0))
    loop, fatal = await loop_of(p, "extract")
    consumer = loop.consumer
    tp = TopicPartition(p.topics.jobs.name, 0)
    consumer.high[tp] = 10
    consumer.getmany = Failing(consumer, KafkaConnectionError("away"))
    monkeypatch.setattr(undecodable, "fetch_batches", _fetching(tp, [Batch(0, 9)]))
    assert await loop._poll() == {}
    assert await loop._poll() == {}
    assert not fatal and loop.failed_polls == 2
    assert p.counters.fetch_failures == {("extract", "KafkaConnectionError"): 2}
    assert not loop.task_manager.producer(0).committed
