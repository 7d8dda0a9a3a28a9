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
from typing import Any

from aiokafka.structs import TopicPartition

from memstream.core.settings import Settings
from memstream.core.topic_reader import Record, read_ranges

_GONE = object()  # a pending deletion


class LoopTable:
    """A changelog-backed mapping of the owned partitions: what their transactions
    committed (see the module docstring). Its reads never see a pending write: the HTTP
    API reads it; a task reads and writes through its :class:`TableSlice`."""

    def __init__(self, topic: str) -> None:
        self.topic = topic
        self._data: dict[bytes, Any] = {}
        self._owner: dict[bytes, int] = {}  # key -> the partition whose changelog holds it
        self._keys: dict[int, set[bytes]] = {}  # partition -> the keys its changelog holds

    # --- reading what is committed (the HTTP API, and a slice under its pending writes) --

    def get(self, key: bytes, default: Any = None) -> Any:
        """The committed value of ``key`` (a write of a batch whose transaction has not
        committed is not seen: it may yet be taken back)."""
        return self._data.get(key, default)

    committed = get  # (the name the readers outside the loops use)

    def __getitem__(self, key: bytes) -> Any:
        return self._data[key]

    def __contains__(self, key: object) -> bool:
        return key in self._data

    def items(self) -> Iterator[tuple[bytes, Any]]:
        """Committed entries (a snapshot: safe to hold across awaits)."""
        return iter(list(self._data.items()))

    def items_of(self, partition: int) -> list[tuple[bytes, Any]]:
        """Committed entries of one partition (a snapshot)."""
        data = self._data
        return [(k, data[k]) for k in self._keys.get(partition, ())]

    def __len__(self) -> int:
        return len(self._data)

    def slice(self, partition: int) -> TableSlice:
        """The part of one partition's task: its reads and its pending writes."""
        return TableSlice(self, partition)

    # --- ownership ---------------------------------------------------------------------

    def restore(self, partition: int, key: bytes, raw: bytes | None) -> None:
        """One changelog record of ``partition``, read back in order."""
        self._put(partition, key, None if raw is None else json.loads(raw))

    def drop(self, partitions: set[int]) -> None:
        """Forget what ``partitions`` hold (they moved to another worker)."""
        for p in partitions:
            for key in self._keys.pop(p, ()):
                del self._data[key], self._owner[key]

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


class TableSlice:
    """One partition's part of a :class:`LoopTable`, held by that partition's task: its
    writes are pending (read back by it at once) until the task's transaction commits
    (:meth:`commit`) or not (:meth:`discard`). Each task writes its own slice: no other
    partition's batch can see or take its pending writes, awaits or not."""

    def __init__(self, table: LoopTable, partition: int) -> None:
        self.table = table
        self.topic = table.topic
        self.partition = partition
        self._pending: dict[bytes, Any] = {}  # key -> value | _GONE

    def get(self, key: bytes, default: Any = None) -> Any:
        if key in self._pending:
            value = self._pending[key]
            return default if value is _GONE else value
        return self.table.get(key, default)

    def __getitem__(self, key: bytes) -> Any:
        value = self.get(key, _GONE)
        if value is _GONE:
            raise KeyError(key)
        return value

    def __contains__(self, key: object) -> bool:
        return isinstance(key, bytes) and self.get(key, _GONE) is not _GONE

    def items(self) -> list[tuple[bytes, Any]]:
        """The partition's committed entries (a snapshot)."""
        return self.table.items_of(self.partition)

    def __setitem__(self, key: bytes, value: Any) -> None:
        self._pending[key] = value

    def __delitem__(self, key: bytes) -> None:
        self._pending[key] = _GONE

    # --- the task's transaction --------------------------------------------------------

    def changelog(self) -> list[tuple[bytes, bytes | None]]:
        """The pending writes as changelog records (key, JSON or None)."""
        return [(k, None if v is _GONE else json.dumps(v, separators=(",", ":")).encode())
                for k, v in self._pending.items()]

    def commit(self) -> None:
        pending, self._pending = self._pending, {}
        for key, value in pending.items():
            self.table._put(self.partition, key, None if value is _GONE else value)

    def discard(self) -> None:
        self._pending = {}

    def dirty(self) -> bool:
        """Whether writes wait for the task's transaction."""
        return bool(self._pending)


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
