"""A downstream reader's view of the user-keys topic (``<prefix>.user-keys``), kept current
by following it read-only: the tenant KEKs its read keys (``MEMSTREAM_READ_KEYS``) or the
workers' master key (``MEMSTREAM_MASTER_KEY``) unwrap, the users' data keys under them and
the verified forget markers (:class:`memstream.sealing.key_view.KeyView`: the same rules
as the workers' view). It never writes: no key is created, no user forgotten, nothing
repaired. A broker error does not stop it: it follows again from where it was.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from aiokafka.structs import TopicPartition

from memstream.consumer import reading
from memstream.consumer.reading import Record
from memstream.sealing.key_records import Keyring
from memstream.sealing.key_view import KeyView

log = logging.getLogger(__name__)


class ReaderKeys(KeyView):
    """The keys a reader with ``settings`` (its master key or read keys) can open with."""

    def __init__(self, settings: object, topic: str) -> None:
        ring = Keyring.of(settings)
        assert ring.master or ring.read, "user keys need a master key or read keys"
        super().__init__(ring, topic)
        self._settings = settings
        self._task: asyncio.Task[None] | None = None
        self._positions: dict[TopicPartition, int] = {}
        self._caught_up = asyncio.Event()

    async def start(self) -> None:
        self._task = asyncio.create_task(self._follow())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    @property
    def ready(self) -> bool:
        """The topic was read to its end once (markers and keys are all known)."""
        return self._caught_up.is_set()

    async def wait_ready(self, timeout: float) -> bool:
        if self._caught_up.is_set():
            return True
        try:
            await asyncio.wait_for(self._caught_up.wait(), timeout)
        except TimeoutError:
            return self._caught_up.is_set()
        return True

    async def _follow(self) -> None:
        def caught_up() -> None:
            self.settle()
            self._caught_up.set()

        def batch(records: list[Record]) -> None:
            for r in records:
                self.take(r.key, r.value, r)

        while True:  # the workers create the topic: wait for it
            try:
                await reading.follow(self._settings, self.topic, batch,
                                     positions=self._positions, caught_up=caught_up)
            except Exception as exc:  # the broker away: follow again from where it was
                log.warning("user keys: following %s failed (%s); again in 1s", self.topic,
                            type(exc).__name__)
            await asyncio.sleep(1.0)
