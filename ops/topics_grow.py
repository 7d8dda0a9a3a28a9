"""``memstream topics grow``: a topic set with another partition count, built from the
durable topics of the current one (docs/operations.md, "Growing the partition count").

A user lives on partition ``murmur2(key) % partitions`` of every co-partitioned topic and
store shard, so the count of a running topic set cannot change. The move goes to a new
set (another ``topic_prefix`` and ``app_id``): the topics that hold what memstream must
keep are copied into it, each record with its key, value, headers and timestamp, placed by
its key on the new count; what is in flight is not copied, so the old set must be drained
and its workers stopped first. The new workers restore their shards from the copied
memory-change topic, as after any partition move.

- **Copied**: memory-changes, memory-access (the store's sources of truth), memory-events
  (downstream's), global-changes, user-keys (forget-me markers and data keys), api-keys,
  dead-letters. Read ``read_committed`` up to the ends they had when the copy began (the
  old workers are stopped: nothing is written after), in partition order, so each user's
  records keep their order on their new partition.
- **Not copied**: the inputs (messages, session-events: already read into the old set's
  state, and re-reading them would extract them again), the stages' topics (jobs,
  decisions, results, tool requests, re-routed records: nothing in flight once
  drained) and the loops' changelogs. A user's next job in the new set starts at seq 1:
  the store, whose cursor is higher, fences it and the ingest stage re-issues it above the
  cursor (memory.fencing), so nothing is lost but one round trip.
- **Refused**, one line each: the new prefix or app id equal to the old ones; an old
  consumer group with members once a session timeout has passed (a worker still runs;
  a stopped one leaves its groups at once with ``leave_group_on_stop``, else when its
  session times out); a user with unscanned messages, a job
  in flight or a queued tool write in the old ingest state (not drained); a copied topic of
  the new set that already holds records.

What it decides is pure (:func:`pending`, :func:`place`); :func:`grow` does the Kafka work.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from memstream.core import kafka
from memstream.core.settings import Settings
from memstream.core.topic_reader import Record, end_offsets, read_range
from memstream.memory.store.partitioned import partition_of_key
from memstream.topics.layout import LayoutError, prepare
from memstream.topics.registry import Topics, TopicSpec, changelog_name, registry


def durable(topics: Topics) -> list[TopicSpec]:
    """The topics whose records the new set must hold (the module doc says why)."""
    return [topics.memory_changes, topics.memory_access, topics.memory_events,
            topics.global_changes, topics.user_keys, topics.api_keys, topics.dead_letters]


@dataclass
class Pending:
    """What the old ingest state still holds, over its users (0 everywhere: drained)."""

    users: int = 0
    unscanned: int = 0  # messages not yet in a job
    in_flight: int = 0  # jobs sent, their result not yet read
    tools: int = 0  # agent tool writes waiting for their turn
    examples: list[str] = field(default_factory=list)  # a few tenant/user, for the line

    @property
    def drained(self) -> bool:
        return not (self.unscanned or self.in_flight or self.tools)


def pending(snapshots: Mapping[bytes, dict[str, Any]]) -> Pending:
    """:class:`Pending` of the ingest-state table's last snapshot per key."""
    found = Pending()
    for snap in snapshots.values():
        sessions = snap.get("sessions") or {}
        unscanned = sum(max(0, int(s["count"]) - int(s["watermark"]))
                        for s in sessions.values())
        flight = snap.get("in_flight") is not None
        tools = len(snap.get("tools") or ())
        if unscanned or flight or tools:
            found.users += 1
            found.unscanned += unscanned
            found.in_flight += int(flight)
            found.tools += tools
            if len(found.examples) < 3:
                found.examples.append(f"{snap.get('tenant_id')}/{snap.get('user_id')}")
    return found


def place(key: bytes | None, partitions: int) -> int:
    """A copied record's partition in the new set: its key's, as memstream places a user
    (a topic of one partition: 0)."""
    if partitions == 1:
        return 0
    if key is None:
        raise ValueError("a record without a key on a co-partitioned topic")
    return partition_of_key(key, partitions)


def target_settings(old: Settings, prefix: str, app_id: str, partitions: int) -> Settings:
    return old.model_copy(update={"topic_prefix": prefix, "app_id": app_id,
                                  "partitions": partitions})


def same_names(old: Settings, new: Settings) -> list[str]:
    lines = []
    if new.topic_prefix == old.topic_prefix:
        lines.append(f"the new topic prefix is the old one ({old.topic_prefix}): give the new "
                     "set its own (--prefix)")
    if new.app_id == old.app_id:
        lines.append(f"the new app id is the old one ({old.app_id}): its groups and "
                     "changelogs belong to the old set (--app-id)")
    return lines


async def _running_groups(settings: Settings) -> list[str]:
    """The old app's consumer groups that have members: ``group (n members)``."""
    admin = kafka.admin(settings)
    await admin.start()
    try:
        ours = [g[0] for g in await admin.list_consumer_groups()
                if g[0] == settings.app_id or g[0].startswith(f"{settings.app_id}-")]
        found = []
        for group_id in ours:
            # one group per request: aiokafka 0.14 decodes a v3 answer with the v2 schema,
            # which reads only the first of several groups right
            for response in await admin.describe_consumer_groups([group_id]):
                members = response.groups[0][5]
                if members:
                    found.append(f"{group_id} ({len(members)} members)")
        return sorted(found)
    finally:
        await admin.close()


async def _ingest_state(settings: Settings) -> dict[bytes, dict[str, Any]]:
    """The old ingest state: the last snapshot of every key still held."""
    topic = changelog_name(settings, "ingest-state")
    ends = (await end_offsets(settings, [topic]))[topic]
    state: dict[bytes, dict[str, Any]] = {}

    def fold(records: list[Record]) -> None:
        for r in records:
            if r.key is None:
                continue
            if r.value is None:
                state.pop(r.key, None)
            else:
                state[r.key] = json.loads(r.value)

    await read_range(settings, topic, ends, fold)
    return state


async def _copy(old: Settings, new: Settings, pairs: Iterable[tuple[TopicSpec, TopicSpec]],
                ) -> dict[str, tuple[int, int]]:
    """Every record of each old topic into its new one; per new topic (read, written). A
    record keeps its headers, its MAC among them (core.record_auth: the MAC names the
    topic's role, not its name): copied as it was, never signed anew."""
    producer = kafka.producer(new, sign=False, enable_idempotence=True)
    await producer.start()
    counts: dict[str, tuple[int, int]] = {}
    pairs = list(pairs)
    ends = await end_offsets(old, [src.name for src, _ in pairs])
    try:
        for src, dst in pairs:
            written = [0]

            async def send(records: list[Record], dst: TopicSpec = dst,
                           written: list[int] = written) -> None:
                sent = [await producer.send(
                    dst.name, r.value, key=r.key, partition=place(r.key, dst.partitions),
                    timestamp_ms=r.timestamp, headers=list(r.headers or ())) for r in records]
                await asyncio.gather(*sent)  # acknowledged by min.insync.replicas (acks=all)
                written[0] += len(sent)

            read = await read_range(old, src.name, ends[src.name], send)
            counts[dst.name] = (read, written[0])
    finally:
        await producer.stop()
    return counts


async def grow(old: Settings, new: Settings) -> dict[str, tuple[int, int]]:
    """Check, create the new set, copy; per new topic (records read, written). Raises
    :class:`LayoutError` before writing anything when the move is not safe."""
    refusals = same_names(old, new)
    if refusals:
        raise LayoutError(refusals)
    # a worker stopped without leaving its groups (static membership, the default) stays a
    # member for its session: wait that long before calling it running
    deadline = time.monotonic() + old.session_timeout_s + 5.0
    while (running := await _running_groups(old)) and time.monotonic() < deadline:
        await asyncio.sleep(1.0)
    if running:
        raise LayoutError([f"workers of app {old.app_id} still run ({', '.join(running)}): "
                           "stop every worker of the old set first"])
    left = pending(await _ingest_state(old))
    if not left.drained:
        raise LayoutError([
            f"the old set is not drained: {left.users} users hold {left.unscanned} unscanned "
            f"messages, {left.in_flight} jobs in flight, {left.tools} tool writes (e.g. "
            f"{', '.join(left.examples)}); with the producers stopped, run the workers until "
            f"every session is ended or idle for idle_timeout_s and every job is done, stop "
            f"them, run this again"])
    olds, news = registry(old), registry(new)
    pairs = list(zip(durable(olds), durable(news), strict=True))
    await prepare(new)  # every topic of the new set, created and checked
    ends = await end_offsets(new, [dst.name for _, dst in pairs])
    full = [f"{name} already holds {sum(e.values())} records: delete the new set's topics "
            f"and run this again" for name, e in ends.items() if sum(e.values())]
    if full:
        raise LayoutError(full)
    return await _copy(old, new, pairs)
