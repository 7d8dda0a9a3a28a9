"""Why the stage loops keep one transactional producer per partition (docs/benchmarks.md,
"Transactions per partition or per loop"): one producer per loop (exactly-once v2,
KIP-447) is safe only when the transaction's offset commit carries the consumer's
generation and member id (TxnOffsetCommit v3+, so the group coordinator refuses a zombie's
commit) and a new owner's offset fetch waits for pending transactional offsets
(OffsetFetch v7+, ``require_stable``). aiokafka sends neither; these fail when an aiokafka
upgrade brings them, which is the moment to measure ``benchmarks/transactions.py`` again
and reconsider."""

from __future__ import annotations

import asyncio
import inspect
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.protocol.commit import OffsetFetchRequest
from aiokafka.protocol.transaction import TxnOffsetCommitRequest
from aiokafka.structs import TopicPartition

from memstream.core.settings import Settings
from memstream.streams.owned_loop import OwnedLoop
from memstream.streams.stage import StageBase, Work
from tests.unit.builders import FakeClients, FakeConsumer

pytestmark = pytest.mark.unit
REVISIT = "aiokafka now has KIP-447's part: see docs/benchmarks.md and reconsider per-loop"


def _newest(request: Any) -> int:
    return max(struct.API_VERSION for struct in request._CLASSES)  # (the versions it sends)


def test_aiokafka_sends_no_consumer_generation_with_the_transactions_offsets():
    assert _newest(TxnOffsetCommitRequest) < 3, REVISIT
    assert list(inspect.signature(AIOKafkaProducer.send_offsets_to_transaction).parameters) \
        == ["self", "offsets", "group_id"], REVISIT


def test_aiokafka_fetches_no_stable_offsets():
    assert _newest(OffsetFetchRequest) < 7, REVISIT
    assert "require_stable" not in inspect.signature(AIOKafkaConsumer.committed).parameters, \
        REVISIT


async def test_each_partition_is_taken_with_a_producer_of_its_own_transactional_id(tmp_path):
    """The fence the loops rely on: taking *p* starts the producer ``{group}-{p}``, whose
    ``init_transactions`` aborts what the previous owner of *p* left open; one shared by
    the loop's partitions would fence nothing when a partition moves."""
    stage = _Stage()
    consumer = FakeConsumer(set(), {tp: 0 for tp in _tps(0, 1)})
    clients = FakeClients(consumer)
    loop = OwnedLoop(Settings(data_dir=tmp_path, embedder="hashing"), stage,
                     clients=clients)
    loop.on_fatal = lambda reason, code=70: pytest.fail(reason)
    loop.connect()
    consumer.assigned = _tps(0, 1)
    await loop.task_manager.assigned(_tps(0, 1))
    await asyncio.wait_for(loop.task_manager.settled(), 5.0)
    assert sorted(tid for tid, _ in clients.made) == ["memstream-apply-0", "memstream-apply-1"]
    tasks = loop.task_manager
    assert {tasks.producer(0), tasks.producer(1)} == {p for _, p in clients.made}


TOPICS = ["in-a", "in-b"]


class _Stage(StageBase):
    name = "apply"
    inputs = TOPICS
    tables = ()
    max_records = 10

    async def handle(self, records: list[Any]) -> Work:
        return Work()


def _tps(*parts: int) -> set[TopicPartition]:
    return {TopicPartition(t, n) for t in TOPICS for n in parts}
