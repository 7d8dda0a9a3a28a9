"""Per-user data keys on the compacted ``<prefix>.user-keys`` topic (forget-me, SPEC §7).

Records, keyed ``tenant/user/<key id>``: the user's data key wrapped by the master key
(:mod:`memory.crypto`); keyed ``tenant/user/!forgotten``: the forget-me marker (when, which
request, who; no content). Forgetting writes a tombstone for every data key of the user
and the marker: compaction then removes the wrapped keys from the log
(``max.compaction.lag.ms`` bounds when), and every sealed record of the user, wherever
it is copied, no longer opens. Each key id is its own record, so two workers that create
a first key for a user at the same moment both keep theirs readable.

Every worker follows the topic (:class:`UserKeys`): the apply stage seals change events
with the user's key (creating one on first use), readers open them, and the marker fences
the user's older memories out of every read until the erasure job has run.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from dataclasses import dataclass, field
from typing import Any

from aiokafka import AIOKafkaProducer

from memstream.core import kafka
from memstream.core.settings import Settings
from memstream.core.topic_reader import Record, follow
from memstream.memory import crypto
from memstream.topics.events import MemoryEvent

log = logging.getLogger(__name__)
FORGOTTEN = "!forgotten"
ROLL = "~roll"  # a tombstone appended every half bound, so the open segment rolls


@dataclass
class _User:
    wrapped: dict[str, str] = field(default_factory=dict)  # key id -> wrapped data key
    forgotten_at: float | None = None


class UserKeys:
    """This worker's view of the user-keys topic, kept current by a follower task."""

    def __init__(self, settings: Settings, topic: str) -> None:
        assert settings.master_key is not None, "sealing needs MEMSTREAM_MASTER_KEY"
        self._kek = crypto.kek_from(settings.master_key.get_secret_value())
        self._settings = settings
        self.topic = topic
        self._users: dict[tuple[str, str], _User] = {}
        self._plain: dict[str, bytes] = {}  # key id -> unwrapped (dropped on forget)
        self._producer: AIOKafkaProducer | None = None
        self._task: asyncio.Task[None] | None = None
        self._caught_up = asyncio.Event()
        self._lock = asyncio.Lock()
        self._roll_every = settings.erasure_bound_s / 2
        self._rolled = 0.0

    # --- the follower ------------------------------------------------------------------

    async def start(self, *, write: bool = True) -> None:
        """Follow the topic; ``write`` False: a reader's view (it can open, never create a
        key, forget a user or roll the topic)."""
        if write:
            self._producer = kafka.producer(self._settings, acks="all",
                                            enable_idempotence=True)
            await self._producer.start()
        self._task = asyncio.create_task(self._follow())

    @property
    def ready(self) -> bool:
        """The topic was read to its end once (markers and keys are all known)."""
        return self._caught_up.is_set()

    async def wait_ready(self, timeout: float) -> bool:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._caught_up.wait(), timeout)
        return self._caught_up.is_set()

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

        while True:  # the worker creates the topic at start: wait for it
            try:
                await follow(self._settings, self.topic, self._take_all,
                             caught_up=self._caught_up.set, each_poll=roll, committed=False)
            except Exception as exc:  # the broker away: read it again (a dead follower
                # would leave every later key unknown)
                log.warning("user keys: following %s failed (%s); again in 1s", self.topic,
                            type(exc).__name__)
            await asyncio.sleep(1.0)

    def _take_all(self, records: list[Record]) -> None:
        for r in records:
            self.take(r.key, r.value)

    def take(self, key: bytes | None, value: bytes | None) -> None:
        """One record of the topic into the view (later ones win)."""
        if key == ROLL.encode():
            return
        try:
            tenant, user, name = (key or b"").decode().split("/", 2)
        except ValueError:
            log.warning("user keys: skipped a record with a malformed key")
            return
        u = self._users.setdefault((tenant, user), _User())
        if name == FORGOTTEN:
            u.forgotten_at = float(json.loads(value)["at"]) if value else None
        elif value is None:  # a shredded key
            u.wrapped.pop(name, None)
            self._plain.pop(name, None)
        else:
            u.wrapped.setdefault(name, json.loads(value)["wrapped"])

    # --- use ---------------------------------------------------------------------------

    def forgotten_at(self, tenant: str, user: str) -> float | None:
        u = self._users.get((tenant, user))
        return u.forgotten_at if u else None

    def keys_of(self, tenant: str, user: str) -> dict[str, bytes]:
        """The user's data keys this worker knows (unwrapped on first use)."""
        u = self._users.get((tenant, user))
        if u is None:
            return {}
        out = {}
        for key_id, wrapped in u.wrapped.items():
            if key_id not in self._plain:
                self._plain[key_id] = crypto.unwrap(self._kek, wrapped, tenant, user, key_id)
            out[key_id] = self._plain[key_id]
        return out

    def opener(self) -> Any:
        """For readers: change (or public event) -> opened, or None when its key is gone."""
        def open_one(change: Any) -> Any:
            keys = self.keys_of(change.tenant_id, change.user_id)
            if isinstance(change, MemoryEvent):
                return crypto.open_event(change, keys)
            return crypto.open_change(change, keys)
        return open_one

    async def key_for_write(self, tenant: str, user: str) -> tuple[str, bytes]:
        """The key new records of the user are sealed with: the lowest key id it has, or a
        new key, written to the topic before anything is sealed with it."""
        async with self._lock:
            keys = self.keys_of(tenant, user)
            if keys:
                key_id = min(keys)
                return key_id, keys[key_id]
            key_id, data_key = crypto.new_key_id(), crypto.new_data_key()
            wrapped = crypto.wrap(self._kek, data_key, tenant, user, key_id)
            value = json.dumps({"wrapped": wrapped, "created_at": time.time()}).encode()
            await self._send(f"{tenant}/{user}/{key_id}", value)
            self.take(f"{tenant}/{user}/{key_id}".encode(), value)
            return key_id, data_key

    async def forget(self, tenant: str, user: str, at: float, request_id: str,
                     actor: str) -> int:
        """Shred every data key of the user and set the marker; how many keys."""
        async with self._lock:
            u = self._users.setdefault((tenant, user), _User())
            ids = sorted(u.wrapped)
            for key_id in ids:
                await self._send(f"{tenant}/{user}/{key_id}", None)
                self.take(f"{tenant}/{user}/{key_id}".encode(), None)
            marker = json.dumps({"at": at, "request_id": request_id, "actor": actor}).encode()
            await self._send(f"{tenant}/{user}/{FORGOTTEN}", marker)
            self.take(f"{tenant}/{user}/{FORGOTTEN}".encode(), marker)
            return len(ids)

    async def _send(self, key: str, value: bytes | None) -> None:
        assert self._producer is not None, "UserKeys.start() first"
        await self._producer.send_and_wait(self.topic, key=key.encode(), value=value)
