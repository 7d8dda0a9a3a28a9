"""The contract between a stage and the loop that runs it (:mod:`streams.owned_loop`).

A stage (ingest, extract, apply, access) names its co-partitioned input topics and the
tables it owns, and opens a :class:`Processor` for each partition task the loop takes
(Kafka Streams' ``Processor``: ``open(context)``, ``process``, ``punctuate``, ``close``).
The processor holds that partition's state: its table slices (:class:`TaskContext`), its
timers, its store shard's presence; it turns one batch of the partition's records into
:class:`Work`: the records to send in the batch's transaction and what to do once it is
committed. Its timers run the same way (:meth:`Processor.punctuate`): what they emit is a
transaction of the partition. A batch whose store shard is not served here is
:class:`NotHere`, a value (nothing of it is committed; the loop reads it again). It never
raises for one bad record: :func:`until_handled` retries a transient failure in place and
turns anything else into the :class:`InvalidRecord` to set the record aside with.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from memstream.core.errors import InvalidRecord, describe, trace
from memstream.core.retry import RetryPolicy, is_transient, next_delay
from memstream.memory.store.partitioned import ShardNotHere
from memstream.streams.ingest_tables import LoopTable, TableSlice

log = logging.getLogger(__name__)
HANDLER_RETRY = RetryPolicy(first_delay_s=0.5, max_delay_s=30.0)

Record = tuple[str, bytes | None, bytes | None]  # topic, key, value
# with the trace headers that continue a span (core.tracing.traced; tracing on only)
Traced = tuple[str, bytes | None, bytes | None, tuple[tuple[str, bytes], ...]]


@dataclass(frozen=True)
class Placed:
    """A record sent to a given partition with its own time and headers (a re-routed
    input keeps the time it was produced with: the loops merge inputs by time)."""

    topic: str
    partition: int
    key: bytes | None
    value: bytes | None
    timestamp_ms: int | None
    headers: tuple[tuple[str, bytes], ...] = ()


@dataclass
class Work:
    """What one batch of one partition produced: the records to send in its transaction,
    and what to do once that transaction is committed (never before: a caller woken
    early could read what an aborted transaction then takes back)."""

    out: list[Record | Traced] = field(default_factory=list)
    placed: list[Placed] = field(default_factory=list)
    after: list[Callable[[], Awaitable[None]]] = field(default_factory=list)
    # how many of the records it was given the stage took (None: all); the rest go into
    # the next transaction
    handled: int | None = None
    # the spans of the batch (core.tracing), ended by the loop once its transaction settled
    spans: list[Any] = field(default_factory=list)


@dataclass(frozen=True)
class NotHere:
    """A batch not handled: the partition's store shard is not served here (yet: the apply
    stage's group has not given it to this worker, or it is being restored). Nothing of the
    batch is committed; the loop reads it again after a pause (or the next owner does)."""

    partition: int
    why: str


@dataclass(frozen=True)
class TaskContext:
    """What a processor is opened with: its task's partition and table slices (in the
    order of the stage's ``tables``)."""

    partition: int
    tables: tuple[TableSlice, ...] = ()


class Processor(Protocol):
    """One partition task's processor (see the module docstring)."""

    async def process(self, records: list[Any]) -> Work | NotHere:
        """The batch's outputs; a record it cannot handle is a dead letter in them."""
        ...

    async def punctuate(self, now: float) -> Work | None:
        """The partition's timers at ``now`` (Kafka Streams' punctuator: idle flushes, job
        re-sends, due windowed jobs, segment rolls). What it returns is committed in a
        transaction of the partition like a batch's outputs, table writes included; None:
        nothing is due."""
        ...

    def committed(self, offsets: dict[str, int]) -> None:
        """A transaction of the partition committed: per topic, the offset after the last
        record it wrote to that partition."""
        ...

    def close(self) -> None:
        """The task is let go (revoked, fenced, the worker stopping)."""
        ...


class Stage(Protocol):
    """What a loop runs: its name (the group ``{app_id}-{name}``), its co-partitioned input
    topics, the tables it owns, and a processor per partition task."""

    name: str
    inputs: list[str]
    tables: tuple[LoopTable, ...]
    max_records: int

    def open(self, context: TaskContext) -> Processor:
        """The processor of a task taken (restored, positioned: it serves from now)."""
        ...

    def assigned(self, partitions: set[int]) -> None:
        """The serving partitions changed (their tables are restored)."""
        ...

    def take_order(self, partitions: set[int]) -> list[int]:
        """The order in which new partitions are taken (quickest first)."""
        ...

    async def prepare(self, new: set[int], gone: set[int]) -> None:
        """The stage's own state of partitions taken (before any record of them is
        handled, after the fence) and given up (the apply stage's store shards)."""
        ...


class ProcessorBase:
    """What a processor without timers, shard or state to close does: nothing."""

    async def punctuate(self, now: float) -> Work | None:
        return None

    def committed(self, offsets: dict[str, int]) -> None:
        return None

    def close(self) -> None:
        return None


class Stateless(ProcessorBase):
    """The processor of a stage that keeps nothing per partition: its ``handle``."""

    def __init__(self, handle: Callable[[list[Any]], Awaitable[Work]], partition: int) -> None:
        self.handle = handle
        self.partition = partition

    async def process(self, records: list[Any]) -> Work | NotHere:
        return await here(self.handle(records))


class StageBase:
    """What a stage without state of its own, timers or a take order does: nothing (the
    hooks of :class:`Stage` a stage does not need); a stateless stage's processor calls
    its ``handle(records)``."""

    def open(self, context: TaskContext) -> Processor:
        return Stateless(self.handle, context.partition)

    async def handle(self, records: list[Any]) -> Work:
        raise NotImplementedError

    def assigned(self, partitions: set[int]) -> None:
        return None

    def take_order(self, partitions: set[int]) -> list[int]:
        return sorted(partitions)

    async def prepare(self, new: set[int], gone: set[int]) -> None:
        return None


async def here(batch: Awaitable[Work]) -> Work | NotHere:
    """The batch's work, or :class:`NotHere` when the store said its shard is not served
    here (a store call deep in a stage, as in any of its threads, raises
    :class:`ShardNotHere`; the processor answers with the value)."""
    try:
        return await batch
    except ShardNotHere as exc:
        return NotHere(exc.partition, describe(exc))


async def until_handled(record: Any, handle: Callable[[], Awaitable[Any]], *,
                        counters: Any = None, fatal: tuple[type[Exception], ...] = (),
                        sleep: Callable[[float], Awaitable[Any]] = asyncio.sleep) -> Any:
    """``handle()`` for one record, a transient failure (broker, store, LLM outage) tried
    again in place with capped backoff (the partition waits, so a user's records keep their
    order). A ``fatal`` error is raised (the loop ends the worker: nothing of the batch is
    committed). Anything else is returned as the :class:`InvalidRecord` to set the record
    aside with."""
    attempt = 0
    while True:
        try:
            return await handle()
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            if isinstance(exc, (*fatal, ShardNotHere)):
                raise  # ShardNotHere: the loop reads the batch again (streams.owned_loop)
            attempt += 1
            where = f"{record.topic}[{record.partition}]@{record.offset}"
            if is_transient(exc):
                delay = next_delay(HANDLER_RETRY, attempt)
                if counters is not None:
                    counters.handler_retries += 1
                log.warning("%s: %s (transient, attempt %d); retrying in %.1fs",
                            where, type(exc).__name__, attempt, delay)
                await sleep(delay)
                continue
            log.error("%s: cannot be handled; set aside on the dead-letter topic\n%s", where,
                      trace(exc))
            if counters is not None:
                counters.handler_failures += 1
            return InvalidRecord("internal", describe(exc, 1000))


def processor_of(stage: Stage, partition: int) -> Processor:
    """A processor of ``stage`` for ``partition`` with slices of its own (outside a loop:
    the benchmarks' and tests' direct calls)."""
    return stage.open(TaskContext(partition, tuple(t.slice(partition) for t in stage.tables)))
