"""Records that a producer placed on a partition other than their key's, re-routed.

memstream keeps a user's state, jobs, results and store shard on partition
``murmur2(key) % partitions`` of every co-partitioned topic (the Java client's rule, also
aiokafka's). Producers in other languages place a keyed record by another rule: librdkafka
(Go, Node, C#, confluent-kafka-python) by CRC-32 of the key, Sarama by FNV-1a,
segmentio/kafka-go round robin. Such a record is still processed for its user: the ingest
stage that reads it sends it, in the transaction that commits its offset, to its key's
partition of the repartition topic (what Kafka Streams' ``repartition`` does), and the
ingest stage that owns that partition handles it there with the user's state. The original
topic travels in a header; nothing else reads the repartition topic.
"""

from __future__ import annotations

from typing import Any

from memstream.memory.store.partitioned import partition_of_key
from memstream.streams.stage import Placed
from memstream.topics.registry import Topics

SOURCE = "memstream-source"  # the topic a re-routed record was produced to
ORIGIN = "memstream-origin"  # where it was: topic/partition/offset


def misplaced(topics: Topics, partitions: int, record: Any) -> Placed | None:
    """The re-routed copy of ``record`` (decoded: its key is its ``tenant/user``) when a
    producer placed it off its key's partition; None when it is where it belongs (or is
    ours)."""
    if record.key is None or record.topic not in {t.name for t in topics.placed_by_producers()}:
        return None
    right = partition_of_key(record.key, partitions)
    if right == record.partition:
        return None
    where = f"{record.topic}/{record.partition}/{record.offset}".encode()
    return Placed(topics.repartition.name, right, record.key, record.value, record.timestamp,
                  (*tuple(record.headers or ()), (SOURCE, record.topic.encode()),
                   (ORIGIN, where)))


def source_topic(topics: Topics, record: Any) -> str:
    """The topic whose schema a record is read with: its own, or for a re-routed one the
    topic it was produced to (only a producers' topic: anything else is not taken, so a
    record written to the repartition topic by hand cannot pose as a job result)."""
    if record.topic != topics.repartition.name:
        return record.topic
    named = [v for k, v in (record.headers or ()) if k == SOURCE]
    source = named[-1].decode("utf-8", "replace") if named else ""
    allowed = {t.name for t in topics.placed_by_producers()}
    return source if source in allowed else record.topic
