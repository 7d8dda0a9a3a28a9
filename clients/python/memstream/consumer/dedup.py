"""Which change ids a partition delivered lately: republished events are dropped.

A change event can be published twice (the apply stage republishes a job's kept events when
it reads the job's decision again: ``memory.fencing``), byte-identical apart from a sealed
blob's nonce, on the same partition and a little later. :class:`RecentIds` keeps the last
``window`` change ids of each partition; the reader fills it from the records just before
where it starts, so a consumer restarted between the two copies still drops the second.
Pure: no I/O.
"""

from __future__ import annotations

from collections import OrderedDict


class RecentIds:
    """The last ``window`` change ids seen on each partition."""

    def __init__(self, window: int) -> None:
        if window < 1:
            raise ValueError("the deduplication window must hold at least one id")
        self.window = window
        self._seen: dict[int, OrderedDict[str, None]] = {}

    def add(self, partition: int, change_id: str) -> bool:
        """Remember ``change_id``; False when the partition delivered it within the window
        (a duplicate: skip it)."""
        seen = self._seen.setdefault(partition, OrderedDict())
        if change_id in seen:
            seen.move_to_end(change_id)
            return False
        seen[change_id] = None
        if len(seen) > self.window:
            seen.popitem(last=False)
        return True

    def has(self, partition: int, change_id: str) -> bool:
        return change_id in self._seen.get(partition, ())

    def forget(self, partition: int) -> None:
        """The partition moved to another consumer: its ids go with it."""
        self._seen.pop(partition, None)

    def size(self, partition: int) -> int:
        return len(self._seen.get(partition, ()))
