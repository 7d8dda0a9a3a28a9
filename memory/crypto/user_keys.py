"""Per-user data keys on the compacted ``<prefix>.user-keys`` topic (forget-me, SPEC §7).

Records (layout, signatures: :mod:`memstream.sealing.key_records`): tenant KEKs
(``tenant/!kek/<id>``, wrapped by a version of the master key), the users' data keys
(``tenant/user/<key id>``, wrapped by a tenant KEK) and forget markers
(``tenant/user/!forgotten``, signed with a key derived from the master key, which workers
verify, and one derived from the tenant KEK, which downstream readers verify). Forgetting
writes the signed marker listing the user's key ids, then a tombstone for each: compaction
then removes the wrapped keys from the log (``max.compaction.lag.ms`` bounds when), and
every sealed record of the user, wherever it is copied, no longer opens. Each key id is its
own record, so two workers that create a first key for a user at the same moment both keep
theirs readable (the same for two first KEKs of a tenant).

Every worker follows the topic (:class:`UserKeys`, a :class:`KeyView` kept current): the
apply stage seals change events with the user's key (creating one on first use), readers
open them, and the marker fences the user's older memories out of every read until the
erasure job has run. A downstream reader follows it with tenant read keys instead of the
master key (``write=False``): its tenants only. A record the view sets aside never stops
the follower, which resumes from its position after a broker error.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from aiokafka import AIOKafkaProducer
from aiokafka.structs import TopicPartition

from memstream.core import kafka
from memstream.core.errors import InvalidRecord
from memstream.core.retry import set_within
from memstream.core.settings import Settings
from memstream.core.topic_reader import Record, end_offsets, follow, read_range
from memstream.memory.crypto import change_sealing
from memstream.sealing import envelope as crypto
from memstream.sealing import key_records as rec
from memstream.sealing.key_records import FORGOTTEN, ROLL, Keyring
from memstream.sealing.key_view import KeyView, Rotation, Sent, data_key_record, kek_record
from memstream.topics.codec import dead_letter

__all__ = ["FORGOTTEN", "ROLL", "Rotation", "UserKeys"]
log = logging.getLogger(__name__)


class UserKeys(KeyView):
    """This process's view of the user-keys topic, kept current by a follower task."""

    def __init__(self, settings: Settings, topic: str, *, dead_letters: str | None = None,
                 on_reject: Callable[[InvalidRecord], object] | None = None) -> None:
        ring = Keyring.of(settings)
        assert ring.master or ring.read, \
            "user keys need MEMSTREAM_MASTER_KEY or MEMSTREAM_READ_KEYS"
        super().__init__(ring, topic, on_reject)
        self._settings = settings
        self._dead_topic = dead_letters
        self.dead_letters = False  # keep dead letters of set-aside records (a writer's)
        self.dead: list[tuple[bytes | None, bytes]] = []  # (key, dead letter) not yet sent
        self._producer: AIOKafkaProducer | None = None
        self._task: asyncio.Task[None] | None = None
        self._positions: dict[TopicPartition, int] = {}
        self._caught_up = asyncio.Event()
        self._lock = asyncio.Lock()
        self._roll_every = settings.erasure_bound_s / 2
        self._rolled = 0.0

    def set_aside(self, exc: InvalidRecord, key: bytes | None, value: bytes | None,
                  where: Any) -> None:
        if self.dead_letters:
            letter = dead_letter(exc, topic=self.topic, partition=getattr(where, "partition", 0),
                                 offset=getattr(where, "offset", -1), key=key, value=value,
                                 now=datetime.now(UTC))
            letter = letter.model_copy(update={"value_b64": "", "truncated": True})
            self.dead.append((key, letter.dumps()))  # no key material: its sha256 only

    def opener(self) -> Callable[[Any], Any]:
        """For readers: change (or public event) -> opened, or None when its key is gone."""
        return change_sealing.opener(self)

    # --- the follower ------------------------------------------------------------------

    async def start(self, *, write: bool = True) -> None:
        """Follow the topic; ``write`` False: a reader's view (it can open, never create a
        key, forget a user, repair or roll the topic)."""
        if write:
            await self._start_producer()
        self._task = asyncio.create_task(self._follow())

    async def _start_producer(self) -> None:
        self._producer = kafka.producer(self._settings, acks="all", enable_idempotence=True)
        await self._producer.start()
        self.dead_letters = self._dead_topic is not None

    async def load(self, *, write: bool = False) -> None:
        """Read the topic to its end once, without following (the key commands)."""
        if write:
            await self._start_producer()
        ends = await end_offsets(self._settings, [self.topic])
        await read_range(self._settings, self.topic, ends[self.topic], self._take_batch,
                         idle_timeout_s=30.0, committed=False)
        self.settle()
        self._caught_up.set()

    @property
    def ready(self) -> bool:
        """The topic was read to its end once (markers and keys are all known)."""
        return self._caught_up.is_set()

    async def wait_ready(self, timeout: float) -> bool:
        return await set_within(self._caught_up, timeout)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        if self._producer is not None:
            await self._producer.stop()
            self._producer = None

    async def _follow(self) -> None:
        async def roll() -> None:
            if self._producer is not None and time.monotonic() - self._rolled > \
                    self._roll_every:  # an append closes the segment: compaction runs
                self._rolled = time.monotonic()
                await self._send(ROLL, None)

        async def caught_up() -> None:
            self.settle()
            self._caught_up.set()
            await self.repair()

        async def batch(records: list[Record]) -> None:
            self._take_batch(records)
            await self.repair()

        while True:  # the worker creates the topic at start: wait for it
            try:  # from where it was (positions), never from offset 0 again
                await follow(self._settings, self.topic, batch, positions=self._positions,
                             caught_up=caught_up, each_poll=roll, committed=False)
            except Exception as exc:  # the broker away: follow again from where it was
                log.warning("user keys: following %s failed (%s); again in 1s", self.topic,
                            type(exc).__name__)
            await asyncio.sleep(1.0)

    def _take_batch(self, records: list[Record]) -> None:
        for r in records:
            self.take(r.key, r.value, r)

    async def repair(self) -> None:
        """A writer, once the topic is read: what :meth:`KeyView.repairs` says, and the
        dead letters of records set aside."""
        if self._producer is None or not self.ready:
            return
        out = self.repairs()
        if out:
            log.warning("user keys: %d record(s) written back or shredded anew (tombstones "
                        "or keys no verified forget explains)", len(out))
        for key, value in out:
            await self._send(key, value)
        dead, self.dead = self.dead, []
        for key_bytes, letter in dead:
            await self._producer.send_and_wait(self._dead_topic, key=key_bytes, value=letter)

    # --- writes ------------------------------------------------------------------------

    async def tenant_kek(self, tenant: str) -> tuple[str, bytes]:
        """The KEK new keys of the tenant are wrapped under: its lowest id, or a new one
        wrapped under the current master version, written before anything uses it."""
        keks = self.keks_of(tenant)
        if keks:
            return min(keks.items())
        kek_id, kek, record = kek_record(self._ring, tenant)
        await self._write(*record)
        return kek_id, kek

    async def key_for_write(self, tenant: str, user: str) -> tuple[str, bytes]:
        """The key new records of the user are sealed with: the lowest key id it has, or a
        new key, written to the topic before anything is sealed with it."""
        async with self._lock:
            keys = self.keys_of(tenant, user)
            if keys:
                key_id = min(keys)
                return key_id, keys[key_id]
            kek_id, kek = await self.tenant_kek(tenant)
            key_id, data_key = crypto.new_key_id(), crypto.new_data_key()
            await self._write(*data_key_record(kek_id, kek, data_key, tenant, user, key_id))
            return key_id, data_key

    async def forget(self, tenant: str, user: str, at: float, request_id: str,
                     actor: str) -> int:
        """The signed marker (listing every key id of the user, cumulative), then a
        tombstone for each of its keys; how many keys."""
        async with self._lock:
            kek_id, kek = await self.tenant_kek(tenant)
            ids = sorted(self.key_ids(tenant, user))
            m = rec.signed_marker(kek, kek_id, tenant, user, at=at, request_id=request_id,
                                  actor=actor, keys=self.shredded(tenant, user) | set(ids),
                                  master=self._ring.marker_key())
            await self._write(f"{tenant}/{user}/{FORGOTTEN}", rec.dumps(m))
            for key_id in ids:
                await self._write(f"{tenant}/{user}/{key_id}", None)
            return len(ids)

    async def write(self, records: list[Sent]) -> None:
        """Write ``records`` in order, each taken into this view (``rotate-master``)."""
        async with self._lock:
            for key, value in records:
                await self._write(key, value)

    async def _write(self, key: str, value: bytes | None) -> None:
        await self._send(key, value)
        if not self.take(key.encode(), value):
            raise InvalidRecord("internal", "a record this process wrote is not taken")

    async def _send(self, key: str, value: bytes | None) -> None:
        assert self._producer is not None, "UserKeys.start() first"
        await self._producer.send_and_wait(self.topic, key=key.encode(), value=value)
