"""``memstream rebuild``: the store rebuilt from the memory-change and memory-access topics
into a new store (memory.rebuild), with a manifest of what it read.

The topics are read up to the end offsets they had when the rebuild started (the
*snapshot*, kept in the manifest): a switch (streams.store_swap) catches the new store up
from there. Reads are ``read_committed`` (aborted transactions never reach a store).
"""

from __future__ import annotations

import asyncio
import inspect
import json
import os
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from aiokafka import AIOKafkaConsumer, TopicPartition

from memstream.memory.rebuild import Fold, Opener, Reembed, fold_access
from memstream.memory.store import MemoryStore
from memstream.settings import Settings
from memstream.topics.registry import registry
from memstream.topics.schemas import AccessEvent, MemoryChange

Offsets = dict[int, int]  # partition -> offset
Progress = Callable[[int], None]  # records read since the last call
MANIFEST = "rebuild.json"


@dataclass
class Manifest:
    """What a rebuilt store holds: the topics read up to ``offsets``, by whom, for whom."""

    offsets: dict[str, Offsets]  # topic -> partition -> end offset read
    embedder: str
    dim: int
    tenant: str | None = None
    user: str | None = None
    changes: int = 0
    skipped: int = 0
    unreadable: int = 0
    access_records: int = 0
    seconds: float = 0.0
    created_at: str = field(default_factory=lambda: datetime.now(UTC).isoformat())

    @property
    def per_second(self) -> float:
        read = self.changes + self.skipped + self.unreadable
        return read / self.seconds if self.seconds > 0 else 0.0

    def save(self, directory: Path) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        tmp = directory / f".{MANIFEST}.tmp"
        tmp.write_text(json.dumps(asdict(self), indent=2))
        os.replace(tmp, directory / MANIFEST)

    @classmethod
    def load(cls, directory: Path) -> Manifest:
        data = json.loads((directory / MANIFEST).read_text())
        data["offsets"] = {t: {int(p): o for p, o in parts.items()}
                           for t, parts in data["offsets"].items()}
        return cls(**data)


def selector(tenant: str | None, user: str | None) -> Callable[[str, str], bool] | None:
    if tenant is None and user is None:
        return None
    return lambda t, u: (tenant is None or t == tenant) and (user is None or u == user)


def _consumer(settings: Settings, *, committed: bool) -> AIOKafkaConsumer:
    return AIOKafkaConsumer(
        bootstrap_servers=settings.bootstrap_servers, group_id=None,
        enable_auto_commit=False, auto_offset_reset="earliest",
        isolation_level="read_committed" if committed else "read_uncommitted",
        max_partition_fetch_bytes=8 * 1024 * 1024, fetch_max_bytes=64 * 1024 * 1024)


async def end_offsets(settings: Settings, topics: list[str]) -> dict[str, Offsets]:
    """Each partition's high watermark: every record below it is readable once its
    transaction is resolved (a ``read_committed`` reader past it has seen them all)."""
    consumer = _consumer(settings, committed=False)
    await consumer.start()
    try:
        found: dict[str, Offsets] = {}
        for topic in topics:
            parts = consumer.partitions_for_topic(topic)
            if parts is None:
                await consumer._client.force_metadata_update()  # a topic just created
                parts = consumer.partitions_for_topic(topic) or set()
            tps = [TopicPartition(topic, p) for p in sorted(parts)]
            ends = await consumer.end_offsets(tps) if tps else {}
            found[topic] = {tp.partition: off for tp, off in ends.items()}
        return found
    finally:
        await consumer.stop()


async def read_range(settings: Settings, topic: str, start: Offsets | None, end: Offsets,
                     handle: Callable[[list[bytes]], object], progress: Progress | None = None,
                     ) -> int:
    """Hand every committed record value of ``topic`` from ``start`` (None: the beginning)
    up to ``end`` to ``handle``, batch by batch, partition order kept; returns how many."""
    todo = {p: e for p, e in end.items() if e > (start or {}).get(p, 0)}
    if not todo:
        return 0
    consumer = _consumer(settings, committed=True)
    await consumer.start()
    read = 0
    try:
        tps = {p: TopicPartition(topic, p) for p in todo}
        consumer.assign(list(tps.values()))
        for p, tp in tps.items():
            if start and p in start:
                consumer.seek(tp, start[p])
            else:
                await consumer.seek_to_beginning(tp)
        while todo:
            batch = await consumer.getmany(*[tps[p] for p in todo], timeout_ms=500,
                                           max_records=20_000)
            for tp, records in batch.items():
                values = [r.value for r in records if r.offset < todo.get(tp.partition, 0)
                          and r.value is not None]
                if values:
                    handled = handle(values)
                    if inspect.isawaitable(handled):
                        await handled
                    read += len(values)
                    if progress is not None:
                        progress(len(values))
            for p in list(todo):
                if await consumer.position(tps[p]) >= todo[p]:
                    del todo[p]
        return read
    finally:
        await consumer.stop()


async def opener_for(settings: Settings, topic: str) -> tuple[Opener | None, Any]:
    """Sealed change events need the user keys (MEMSTREAM_MASTER_KEY); returns the opener
    and the follower to stop afterwards."""
    if settings.master_key is None:
        return None, None
    from memstream.user_keys import UserKeys

    keys = UserKeys(settings, topic)
    await keys.start()
    if not await keys.wait_ready(60):
        await keys.stop()
        raise RuntimeError(f"the user keys ({topic}) could not be read within 60 s")
    return keys.opener(), keys


async def rebuild_into(settings: Settings, store: MemoryStore, *, embedder: str, dim: int,
                       tenant: str | None = None, user: str | None = None,
                       reembed: Reembed | None = None, batch: int = 4096,
                       progress: Progress | None = None,
                       total: Callable[[int], None] | None = None) -> Manifest:
    """Fold the topics (up to their ends now) into the empty ``store``."""
    topics = registry(settings)
    changes_topic, access_topic = topics.memory_changes.name, topics.memory_access.name
    started = time.perf_counter()
    snapshot = await end_offsets(settings, [changes_topic, access_topic])
    if total is not None:
        total(sum(snapshot[changes_topic].values()))
    select = selector(tenant, user)
    opener, keys = await opener_for(settings, topics.user_keys.name)
    fold = Fold(store, opener, reembed, batch, select)
    accesses: list[AccessEvent] = []
    try:
        def on_changes(values: list[bytes]) -> None:
            for v in values:
                fold.add(MemoryChange.model_validate_json(v))

        def on_access(values: list[bytes]) -> None:
            accesses.extend(AccessEvent.model_validate_json(v) for v in values)

        await read_range(settings, changes_topic, None, snapshot[changes_topic], on_changes,
                         progress)
        await asyncio.to_thread(fold.finish)
        await read_range(settings, access_topic, None, snapshot[access_topic], on_access)
        written = fold_access(store, accesses, select, fold.erased)
    finally:
        if keys is not None:
            await keys.stop()
    return Manifest(snapshot, embedder, dim, tenant, user, fold.applied, fold.skipped,
                    fold.unreadable, written, time.perf_counter() - started)
