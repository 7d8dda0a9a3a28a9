"""Where a partition the reader receives starts, and the change ids just before it.

A partition arrives paused (:meth:`MemoryChanges._placing`); at the reader's next call,
outside the rebalance callback, it is placed: its start (the caller's ``start_at``, else
the group's committed offset, else the beginning or the end), the change ids of the
``dedup_window`` offsets before that start that the reader does not know yet (one read for
all), then the seek and the resume. A partition whose placing failed stays to place: the
next call tries again.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from aiokafka import AIOKafkaConsumer
from aiokafka.partitioner import DefaultPartitioner
from aiokafka.structs import TopicPartition
from pydantic import BaseModel

from memstream.consumer.dedup import RecentIds
from memstream.consumer.reading import Record, read_ranges, topic_partitions
from memstream.contract.records import user_key

READ_BACK_IDLE_S = 60.0


class Reader(Protocol):
    """What placing uses of :class:`memstream.consumer.changes.MemoryChanges`."""

    settings: Any
    group_id: str | None
    from_beginning: bool
    start_at: Callable[[int], int | None] | None
    _consumer: AIOKafkaConsumer | None
    _warm: set[TopicPartition]
    _recent: RecentIds
    _seen_to: dict[TopicPartition, int]
    _done: dict[TopicPartition, int]
    _committed: dict[TopicPartition, int]


async def wanted(settings: Any, topic: str, tenant: str | None,
                 user: str | None) -> list[TopicPartition]:
    """Without a group: every partition, or only the user's."""
    tps = await topic_partitions(settings, topic)
    if not tps:
        raise LookupError(f"topic {topic} does not exist (has a worker run?)")
    if user is not None and tenant is not None:
        every = [tp.partition for tp in tps]
        mine = DefaultPartitioner()(user_key(tenant, user).encode(), every, every)
        tps = [tp for tp in tps if tp.partition == mine]
    return tps


async def place_new(r: Reader) -> None:
    c = r._consumer
    assert c is not None
    r._warm &= c.assignment()
    if not r._warm:
        return
    todo = set(r._warm)  # they stay to place until placed (an error: tried again)
    lows = await c.beginning_offsets(list(todo))
    highs = await c.end_offsets(list(todo))
    starts = {tp: await start_of(r, c, tp, lows[tp], highs[tp]) for tp in todo}
    await read_back(r, starts, lows, highs)
    for tp, start in starts.items():
        if tp in c.assignment():
            c.seek(tp, start)
            r._done[tp] = r._committed[tp] = start
            c.resume(tp)
    r._warm -= todo


async def start_of(r: Reader, c: AIOKafkaConsumer, tp: TopicPartition, low: int,
                   high: int) -> int:
    given = r.start_at(tp.partition) if r.start_at is not None else None
    if given is not None:
        return given
    if r.group_id is not None:
        committed = await c.committed(tp)
        if committed is not None:
            return int(committed)
    return low if r.from_beginning else high


async def read_back(r: Reader, starts: dict[TopicPartition, int],
                    lows: dict[TopicPartition, int], highs: dict[TopicPartition, int]) -> None:
    """The change ids of the ``dedup_window`` offsets before each start (those the reader
    has not seen already), in one read."""
    window = r._recent.window
    begin = {tp: max(lows[tp], start - window, r._seen_to.get(tp, 0))
             for tp, start in starts.items()}
    end = {tp: min(start, highs[tp]) for tp, start in starts.items()}  # never past the log
    todo = [tp for tp in starts if begin[tp] < end[tp]]

    def take(tp: TopicPartition, records: list[Record]) -> None:
        for rec in records:
            try:
                r._recent.add(tp.partition, _change_id(rec.value))
            except ValueError:
                continue

    if todo:
        await read_ranges(r.settings, todo, take, start=begin, end=end,
                          idle_timeout_s=READ_BACK_IDLE_S)
    for tp in starts:
        r._seen_to[tp] = max(r._seen_to.get(tp, 0), end[tp])


class _Id(BaseModel):
    change_id: str


def _change_id(value: bytes | None) -> str:
    return _Id.model_validate_json(value or b"").change_id
