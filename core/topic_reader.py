"""The one way memstream reads its topics back: a range, to the end, or following.

- :func:`read_range` / :func:`read_ranges`: every record from a start (None: the beginning)
  up to given end offsets (:func:`end_offsets`, or the ends when the read starts), batch by
  batch, partition order kept. Rebuild, replay, store switch, forget verify, the key
  commands and the stages' table restore.
- :func:`follow`: from a start (None: the beginning) on, until cancelled, saying once when
  the ends seen at the start are reached. The API keys, the per-user data keys and the audit
  log in the worker.

The isolation level is a parameter: ``committed=True`` (``read_committed``) reads what the
pipeline's transactions committed; ``False`` also what they aborted (forget verify looks
at every byte in the log). Every consumer comes from :mod:`memstream.core.kafka`.
"""

from __future__ import annotations

import inspect
import time
from collections.abc import Awaitable, Callable, Collection, Iterable, Mapping
from typing import TypeAlias

from aiokafka import AIOKafkaConsumer
from aiokafka.structs import ConsumerRecord, TopicPartition

from memstream.core import kafka
from memstream.core.settings import Settings

Offsets = dict[int, int]  # partition -> offset
Record: TypeAlias = ConsumerRecord[bytes, bytes]
FETCH_BYTES = 8 * 1024 * 1024  # per partition and fetch; a fetch takes four times that


async def _call(result: object) -> None:
    if inspect.isawaitable(result):
        await result


async def topic_partitions(settings: Settings, topic: str) -> list[TopicPartition]:
    """The topic's partitions; [] while it does not exist (or has no leader yet).

    Asks for every topic's metadata, never for this one by name, which would auto-create it
    (without compaction) on a broker that has ``auto.create.topics.enable`` on.
    """
    admin = kafka.admin(settings)
    try:
        await admin.start()
        described = await admin.describe_topics()
    finally:
        await admin.close()
    for t in described:
        if t["topic"] == topic and t["error_code"] == 0:
            return sorted(TopicPartition(topic, p["partition"]) for p in t["partitions"])
    return []


def _consumer(settings: Settings, *, committed: bool, fetch_bytes: int) -> AIOKafkaConsumer:
    return kafka.consumer(
        settings, group_id=None, enable_auto_commit=False, auto_offset_reset="earliest",
        isolation_level="read_committed" if committed else "read_uncommitted",
        max_partition_fetch_bytes=fetch_bytes, fetch_max_bytes=4 * fetch_bytes)


async def end_offsets(settings: Settings, topics: Iterable[str]) -> dict[str, Offsets]:
    """Each partition's high watermark: every record below it is readable once its
    transaction is resolved (a ``read_committed`` reader past it has seen them all)."""
    consumer = await kafka.started(_consumer(settings, committed=False,
                                             fetch_bytes=FETCH_BYTES))
    try:
        found: dict[str, Offsets] = {}
        for topic in topics:
            tps = await topic_partitions(settings, topic)
            ends = await consumer.end_offsets(tps) if tps else {}
            found[topic] = {tp.partition: off for tp, off in ends.items()}
        return found
    finally:
        await kafka.stopped(consumer)


async def read_ranges(settings: Settings, tps: Iterable[TopicPartition],
                      handle: Callable[[TopicPartition, list[Record]], object], *,
                      start: Mapping[TopicPartition, int] | None = None,
                      end: Mapping[TopicPartition, int] | None = None,
                      idle_timeout_s: float | None = None, committed: bool = True,
                      fetch_bytes: int = FETCH_BYTES) -> int:
    """Hand every record of ``tps`` from ``start`` (None: the beginning) up to ``end``
    (None: the ends when the read starts) to ``handle(tp, records)`` (which may be async),
    batch by batch, partition order kept; returns how many. ``idle_timeout_s``: give up
    after that long without a record."""
    wanted = list(tps)
    if not wanted or (end is not None and not any(end.get(tp, 0) for tp in wanted)):
        return 0
    consumer = await kafka.started(_consumer(settings, committed=committed,
                                             fetch_bytes=fetch_bytes))
    read = 0
    try:
        consumer.assign(wanted)
        ends = dict(end) if end is not None else await consumer.end_offsets(wanted)
        for tp in wanted:
            if start and tp in start:
                consumer.seek(tp, start[tp])
            else:
                await consumer.seek_to_beginning(tp)
        todo = {tp for tp in wanted if ends.get(tp, 0) > (start or {}).get(tp, 0)}
        deadline = None if idle_timeout_s is None else time.monotonic() + idle_timeout_s
        while True:
            for tp in list(todo):  # also before the first poll: a log emptied by retention
                if await consumer.position(tp) >= ends[tp]:
                    todo.discard(tp)
            if not todo:
                return read
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"could not read {sorted(todo)} to the end: no record for "
                                   f"{idle_timeout_s:.0f} s")
            batch = await consumer.getmany(*todo, timeout_ms=500, max_records=20_000)
            if batch and idle_timeout_s is not None:
                deadline = time.monotonic() + idle_timeout_s
            for tp, records in batch.items():
                inside = [r for r in records if r.offset < ends[tp]]
                if inside:
                    await _call(handle(tp, inside))
                    read += len(inside)
    finally:
        await kafka.stopped(consumer)


async def read_range(settings: Settings, topic: str, end: Offsets,
                     handle: Callable[[list[Record]], object], *,
                     start: Offsets | None = None, idle_timeout_s: float | None = None,
                     committed: bool = True) -> int:
    """:func:`read_ranges` over one topic, with offsets per partition number.
    ``committed=False``: every record physically in the log, aborted transactions' too."""
    tps = {p: TopicPartition(topic, p) for p in end}
    return await read_ranges(
        settings, tps.values(), lambda _, records: handle(records),
        start={tps[p]: o for p, o in (start or {}).items() if p in tps},
        end={tps[p]: o for p, o in end.items()}, idle_timeout_s=idle_timeout_s,
        committed=committed)


async def follow(settings: Settings, topic: str, handle: Callable[[list[Record]], object], *,
                 positions: dict[TopicPartition, int] | None = None,
                 caught_up: Callable[[], object] | None = None,
                 each_poll: Callable[[], Awaitable[None] | None] | None = None,
                 poll_s: float = 0.5, committed: bool = True,
                 partitions: Collection[int] | None = None) -> None:
    """Hand every record of ``topic`` (of ``partitions``, None: all) on to ``handle`` until
    cancelled, from ``positions``
    (a partition it lacks: from the beginning), which is kept at the offset after each
    handled batch, so a caller that follows again after an error resumes there;
    ``caught_up()`` once, when the ends seen at the start are reached; ``each_poll()``
    before every poll. Returns at once while the topic does not exist."""
    tps = [tp for tp in await topic_partitions(settings, topic)
           if partitions is None or tp.partition in partitions]
    if not tps:
        return
    consumer = await kafka.started(_consumer(settings, committed=committed,
                                             fetch_bytes=FETCH_BYTES))
    try:
        consumer.assign(tps)
        for tp in tps:
            if positions and tp in positions:
                consumer.seek(tp, positions[tp])
            else:
                await consumer.seek_to_beginning(tp)
        ends = await consumer.end_offsets(tps) if caught_up is not None else {}
        behind = set(ends)
        while True:
            if behind:
                behind = {tp for tp in behind if await consumer.position(tp) < ends[tp]}
            if not behind and caught_up is not None:
                await _call(caught_up())
                caught_up = None
            if each_poll is not None:
                await _call(each_poll())
            batch = await consumer.getmany(timeout_ms=int(poll_s * 1000))
            for tp, records in batch.items():
                if records:
                    await _call(handle(records))
                    if positions is not None:
                        positions[tp] = records[-1].offset + 1
    finally:
        await kafka.stopped(consumer)
