"""``memstream rebuild``: the store rebuilt from the memory-change and memory-access topics
into a new store (memory.store.rebuild_fold), with a manifest of what it read.

The topics are read up to the end offsets they had when the rebuild started (the
*snapshot*, kept in the manifest): a switch (streams.store_swap) catches the new store up
from there. Reads are ``read_committed`` (aborted transactions never reach a store).

Change events are validated as they are parsed (:func:`topics.codec.decode_own`: one
pydantic-core pass over the bytes, the vector packed or a float list); one that does not
validate stops the rebuild with its position and reason (:class:`UnreadableChange`), as a
stage stops rather than pass a record it cannot handle: a store missing a change is not
the store the topic describes.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from memstream.core.errors import InvalidRecord
from memstream.core.settings import Settings
from memstream.core.topic_reader import Offsets, Record, end_offsets, read_range
from memstream.memory.archive import cutoff
from memstream.memory.store import MemoryStore
from memstream.memory.store.rebuild_fold import Fold, Opener, Reembed, fold_access
from memstream.topics.codec import decode_own
from memstream.topics.registry import registry
from memstream.topics.schemas import AccessEvent, MemoryChange

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


class UnreadableChange(InvalidRecord):
    """A record of the memory-change topic that is not a change event: where, and why."""

    def __init__(self, record: Record, exc: InvalidRecord) -> None:
        super().__init__(exc.kind, f"{record.topic} partition {record.partition} offset "
                                   f"{record.offset}: {exc}")


def fold_records(fold: Fold, records: list[Record]) -> None:
    """Parse and fold a batch of the memory-change topic (tombstones skipped)."""
    add = fold.add
    for r in records:
        if r.value is None:
            continue
        try:
            change = decode_own(MemoryChange, r.value)
        except InvalidRecord as exc:
            raise UnreadableChange(r, exc) from None
        add(change)


def selector(tenant: str | None, user: str | None) -> Callable[[str, str], bool] | None:
    if tenant is None and user is None:
        return None
    return lambda t, u: (tenant is None or t == tenant) and (user is None or u == user)


async def opener_for(settings: Settings, topic: str) -> tuple[Opener | None, Any]:
    """Sealed change events need the user keys (MEMSTREAM_MASTER_KEY); returns the opener
    and the follower to stop afterwards."""
    if settings.master_key is None:
        return None, None
    from memstream.memory.crypto.user_keys import UserKeys

    keys = UserKeys(settings, topic)
    await keys.start(write=False)  # a reader: it never writes to the key topic
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
        def on_changes(records: list[Record]) -> None:
            fold_records(fold, records)
            if progress is not None:
                progress(len(records))

        def on_access(records: list[Record]) -> None:
            accesses.extend(AccessEvent.model_validate_json(r.value) for r in records
                            if r.value is not None)

        b = settings
        await read_range(b, changes_topic, snapshot[changes_topic], on_changes)
        await asyncio.to_thread(fold.finish)
        oldest = cutoff(time.time(), settings.archive_days)
        if oldest is not None:  # turns past archive_days: as the live store sweeps them
            await asyncio.to_thread(store.sweep_turns, oldest)
        await read_range(b, access_topic, snapshot[access_topic], on_access)
        written = fold_access(store, accesses, select, fold.erased)
    finally:
        if keys is not None:
            await keys.stop()
    return Manifest(snapshot, embedder, dim, tenant, user, fold.applied, fold.skipped,
                    fold.unreadable, written, time.perf_counter() - started)
