"""``memstream redrive``: a record batch set aside as undecodable, read again, once fixed.

A batch no worker could decode (a codec library missing, a future codec: see
:mod:`memstream.streams.undecodable`) stays in its topic; its dead letter names it by
reference (``topic=… partition=… offsets=first..last``). Once this client can decode it (the
codec library installed: ``aiokafka[snappy,lz4,zstd]``), this reads that range
(read_committed) and produces its records again, uncompressed, to the same topic and
partition with their keys, headers and timestamps: the worker reads them as new records,
after what it has read since (message ids make a second re-drive a duplicate, dropped).
Run it before the range leaves the topic (its retention).
"""

from __future__ import annotations

from dataclasses import dataclass

from memstream.core.kafka_io import start_producer
from memstream.core.settings import Settings
from memstream.core.topic_reader import read_range
from memstream.topics.batch_refs import Reference

READ_TIMEOUT_S = 60.0


@dataclass
class Redriven:
    read: int = 0
    produced: int = 0


async def redrive(settings: Settings, ref: Reference, *, dry_run: bool = False) -> Redriven:
    """The records of ``ref``'s range produced again to its topic and partition."""
    records: list = []
    done = Redriven()
    done.read = await read_range(settings, ref.topic, {ref.partition: ref.last + 1},
                                 records.extend, start={ref.partition: ref.first},
                                 idle_timeout_s=READ_TIMEOUT_S)
    if dry_run or not records:
        return done
    producer = await start_producer(settings, acks="all")
    try:
        for r in records:
            await producer.send_and_wait(ref.topic, key=r.key, value=r.value,
                                         partition=ref.partition, timestamp_ms=r.timestamp,
                                         headers=list(r.headers or ()))
            done.produced += 1
    finally:
        await producer.stop()
    return done
