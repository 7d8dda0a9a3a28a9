"""The Kafka side of a stage loop, one small protocol (:class:`LoopClients`) injected into
it: its consumer, a partition's transactional producer, its tables restored from their
changelogs, and where an input this group never committed starts. :class:`KafkaClients`
is the real one (every client from :mod:`core.kafka`, the one client factory); the loops'
unit tests pass one that keeps what it is told (``tests/unit/builders.py``)."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any, Protocol

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.structs import TopicPartition

from memstream.core import kafka
from memstream.core.errors import describe
from memstream.core.settings import Settings
from memstream.streams.ingest_tables import LoopTable, restore

log = logging.getLogger(__name__)
MAX_BYTES = 16 * 1024 * 1024


class LoopClients(Protocol):
    def consumer(self, group: str, member: str | None, assignor: Any) -> Any:
        """The stage's consumer (not started)."""
        ...

    async def producer(self, transactional_id: str) -> Any:
        """A started transactional producer (its start fences the id's previous owner)."""
        ...

    async def restore(self, tables: Sequence[LoopTable], partitions: set[int]) -> None:
        """``tables`` of ``partitions`` read back from their changelogs to their ends."""
        ...

    async def first_offset(self, consumer: Any, tp: TopicPartition) -> int:
        """Where ``tp`` starts for a group that never committed it."""
        ...


def rebalance_timeout_s(s: Settings) -> float:
    """How long a loop's consumer may take a batch, and a rebalance may wait for it."""
    return max(300.0, 3 * s.job_timeout_s)


class KafkaClients:
    """The loop's clients on a real cluster (see the module docstring)."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self._legacy: dict[TopicPartition, int] | None = None  # the Faust group's offsets

    def consumer(self, group: str, member: str | None, assignor: Any) -> AIOKafkaConsumer:
        s = self.settings
        poll_ms = int(rebalance_timeout_s(s) * 1000)
        consumer = kafka.consumer(
            s, group_id=group, group_instance_id=member, enable_auto_commit=False,
            isolation_level="read_committed", auto_offset_reset="earliest",
            partition_assignment_strategy=(assignor,),
            session_timeout_ms=int(s.session_timeout_s * 1000),
            heartbeat_interval_ms=int(s.heartbeat_interval_s * 1000),
            # a batch may wait for LLM calls up to a job's deadline, and a rebalance for the
            # batch in progress: neither may cost the partitions
            max_poll_interval_ms=poll_ms, rebalance_timeout_ms=poll_ms,
            max_partition_fetch_bytes=MAX_BYTES, fetch_max_bytes=4 * MAX_BYTES)
        bind = getattr(assignor, "bind", None)  # streams.cluster: maps bound to its joins
        if bind is not None:
            bind(consumer)
        return consumer

    async def producer(self, transactional_id: str) -> AIOKafkaProducer:
        producer = kafka.producer(self.settings, transactional_id=transactional_id,
                                  enable_idempotence=True, linger_ms=2,
                                  max_request_size=MAX_BYTES)
        try:
            await producer.start()  # init_transactions: fences and aborts the previous owner
        except BaseException:
            await quietly(producer.stop())
            raise
        return producer

    async def restore(self, tables: Sequence[LoopTable], partitions: set[int]) -> None:
        await restore(tables, partitions, MAX_BYTES, self.settings)

    async def first_offset(self, consumer: Any, tp: TopicPartition) -> int:
        """Where the Faust agents of an earlier version had got (their group ``{app_id}``:
        an upgrade neither reads everything again nor skips anything), else the
        beginning."""
        if self._legacy is None:
            self._legacy = {}
            admin = kafka.admin(self.settings)
            try:
                await admin.start()
                found = await admin.list_consumer_group_offsets(self.settings.app_id)
                self._legacy = {t: o.offset for t, o in found.items() if o.offset >= 0}
            except Exception as exc:  # no such group: a new deployment
                log.debug("no offsets of group %s (%s)", self.settings.app_id, describe(exc))
            finally:
                await quietly(admin.close())
        if tp in self._legacy:
            log.info("%s starts where the Faust agents were (%d)", tp, self._legacy[tp])
            return self._legacy[tp]
        return int((await consumer.beginning_offsets([tp]))[tp])


async def quietly(coro: Any) -> None:
    """Await ``coro`` (closing a client), its failure only logged."""
    try:
        await coro
    except Exception as exc:  # closing a client that already failed
        log.debug("closing: %s", describe(exc))
