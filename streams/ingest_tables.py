"""The ingest loop's tables: the per-user ingest state and the short-term window.

Each is a plain dict of the partitions this worker owns, backed by a compacted changelog
topic (``{app}-ingest-state-changelog``, ``{app}-session-window-changelog``: the names and
the record format of the Faust tables they replace, raw key, JSON value, ``None`` a
tombstone). A write made while a batch of partition *p* is handled is *pending*: readers
see it at once, but it reaches the changelog only inside *p*'s transaction, together with
the batch's outputs and input offsets. :meth:`LoopTable.commit` makes a partition's pending
writes the table's own once that transaction is committed; :meth:`LoopTable.discard` drops
them when it is not (the batch is read and handled again). So the table never holds a
state that the changelog does not, and a restart restores exactly the committed one.

Changelog records go to the partition being handled (as Faust's tables do), not to the
hash of their key: a window key ``tenant/user/session#n`` lives with its user.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from aiokafka.structs import TopicPartition

from memstream.core.settings import Settings
from memstream.core.topic_reader import Record, read_ranges

_GONE = object()  # a pending deletion


class LoopTable:
    """A changelog-backed mapping of the owned partitions (see the module docstring)."""

    def __init__(self, topic: str) -> None:
        self.topic = topic
        self._data: dict[bytes, Any] = {}
        self._owner: dict[bytes, int] = {}  # key -> the partition whose changelog holds it
        self._keys: dict[int, set[bytes]] = {}  # partition -> the keys its changelog holds
        self._pending: dict[int, dict[bytes, Any]] = {}  # partition -> key -> value | _GONE
        self.partition: int | None = None  # the partition being handled (writes go there)

    # --- reading (the stages' code and the HTTP API) ---------------------------------

    def get(self, key: bytes, default: Any = None) -> Any:
        for pending in self._pending.values():  # a key is pending in one partition at most
            if key in pending:
                value = pending[key]
                return default if value is _GONE else value
        return self._data.get(key, default)

    def __getitem__(self, key: bytes) -> Any:
        value = self.get(key, _GONE)
        if value is _GONE:
            raise KeyError(key)
        return value

    def __contains__(self, key: object) -> bool:
        return isinstance(key, bytes) and self.get(key, _GONE) is not _GONE

    def items(self) -> Iterator[tuple[bytes, Any]]:
        """Committed entries (a snapshot: safe to hold across awaits)."""
        return iter(list(self._data.items()))

    def items_of(self, partition: int) -> list[tuple[bytes, Any]]:
        """Committed entries of one partition (a snapshot)."""
        data = self._data
        return [(k, data[k]) for k in self._keys.get(partition, ())]

    def __len__(self) -> int:
        return len(self._data)

    # --- writing (inside a batch of ``self.partition``) -------------------------------

    @contextmanager
    def writing(self, partition: int) -> Iterator[None]:
        """Writes in the block are pending in ``partition`` (keep the block free of awaits:
        another partition's batch may run meanwhile)."""
        self.partition = partition
        try:
            yield
        finally:
            self.partition = None

    def _write(self, key: bytes, value: Any) -> None:
        if self.partition is None:
            raise RuntimeError(f"{self.topic}: written outside a batch")
        self._pending.setdefault(self.partition, {})[key] = value

    def __setitem__(self, key: bytes, value: Any) -> None:
        self._write(key, value)

    def __delitem__(self, key: bytes) -> None:
        self._write(key, _GONE)

    # --- the batch's transaction -------------------------------------------------------

    def changelog(self, partition: int) -> list[tuple[bytes, bytes | None]]:
        """The pending writes of ``partition`` as changelog records (key, JSON or None)."""
        return [(k, None if v is _GONE else json.dumps(v, separators=(",", ":")).encode())
                for k, v in self._pending.get(partition, {}).items()]

    def commit(self, partition: int) -> None:
        for key, value in self._pending.pop(partition, {}).items():
            self._put(partition, key, None if value is _GONE else value)

    def discard(self, partition: int) -> None:
        self._pending.pop(partition, None)

    def dirty(self, partition: int) -> bool:
        """Whether ``partition`` has writes waiting for its transaction."""
        return bool(self._pending.get(partition))

    # --- ownership ---------------------------------------------------------------------

    def restore(self, partition: int, key: bytes, raw: bytes | None) -> None:
        """One changelog record of ``partition``, read back in order."""
        self._put(partition, key, None if raw is None else json.loads(raw))

    def drop(self, partitions: set[int]) -> None:
        """Forget what ``partitions`` hold (they moved to another worker)."""
        for p in partitions:
            for key in self._keys.pop(p, ()):
                del self._data[key], self._owner[key]
            self._pending.pop(p, None)

    def _put(self, partition: int, key: bytes, value: Any) -> None:
        was = self._owner.pop(key, None)
        if was is not None:
            self._keys[was].discard(key)
        if value is None:
            self._data.pop(key, None)
        else:
            self._data[key] = value
            self._owner[key] = partition
            self._keys.setdefault(partition, set()).add(key)


async def restore(tables: Sequence[LoopTable], partitions: set[int], max_bytes: int,
                  settings: Settings) -> None:
    """Read the tables' changelogs of ``partitions`` from the beginning to their ends (the
    caller's producer for them has fenced every earlier writer: no transaction is open)."""
    if not partitions or not tables:
        return
    by_topic = {t.topic: t for t in tables}
    tps = [TopicPartition(t, n) for t in by_topic for n in sorted(partitions)]

    def take(tp: TopicPartition, records: list[Record]) -> None:
        for r in records:
            by_topic[tp.topic].restore(tp.partition, r.key, r.value)

    await read_ranges(settings, tps, take, fetch_bytes=max_bytes)
