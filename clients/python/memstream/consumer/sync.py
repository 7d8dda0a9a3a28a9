"""``MemoryChangesSync``: :class:`MemoryChanges` for code without an event loop.

    with MemoryChangesSync(Settings(), group_id="crm-sync") as changes:
        for change in changes:
            handle(change)

The reader runs on an event loop in a thread of its own, so the group's heartbeats go on
while the caller's handler runs (a handler slower than the session timeout would otherwise
cost the consumer its partitions; one slower than ``max_poll_interval_ms``, 300 s, still
does). Close it (``with``): the last offsets are committed on close.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine, Iterator
from types import TracebackType
from typing import Any, TypeVar

from memstream.consumer.changes import MemoryChanges, Received

T = TypeVar("T")


class MemoryChangesSync:
    """Blocking iterator of :class:`Received` events; takes :class:`MemoryChanges`'s
    arguments."""

    def __init__(self, settings: Any, **kwargs: Any) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever,
                                        name="memstream-changes", daemon=True)
        self._thread.start()
        self.reader: MemoryChanges = self._run(_make(settings, kwargs))

    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        future = asyncio.run_coroutine_threadsafe(coro, self._loop)
        try:
            return future.result()
        except BaseException:
            future.cancel()  # Ctrl-C while waiting: the read stops too, before close()
            raise

    def __enter__(self) -> MemoryChangesSync:
        self._run(self.reader.start())
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close(handled=exc is None)

    def close(self, *, handled: bool = True) -> None:
        try:
            self._run(self.reader.stop(handled=handled))
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=10)
            if not self._thread.is_alive():
                self._loop.close()

    def __iter__(self) -> Iterator[Received]:
        return self

    def __next__(self) -> Received:
        try:
            return self._run(self.reader.__anext__())
        except StopAsyncIteration:
            raise StopIteration from None

    def commit(self) -> None:
        self._run(self.reader.commit())

    @property
    def stats(self) -> Any:
        return self.reader.stats


async def _make(settings: Any, kwargs: dict[str, Any]) -> MemoryChanges:
    return MemoryChanges(settings, **kwargs)  # built on the reader's loop
