"""The Kafka side of API keys: the compacted ``<prefix>.api-keys`` topic, whose records are
:class:`~memstream.web.keys.KeyRecord` values keyed by their key id.

Compaction keeps the last record per key id, so revoking writes a new record with
``revoked_at`` set (kept for audit), never a tombstone. Every worker follows the topic into a
:class:`~memstream.web.keys.KeyRing` (:class:`KeyFollower`); the admin helpers
(:func:`create_key`, :func:`list_keys`, :func:`revoke_key`) back ``memstream keys``. Neither
plaintext keys nor hashes are ever logged.

Records are signed with a key derived from the admin key (:mod:`memstream.web.keys`): creating
and revoking need ``MEMSTREAM_ADMIN_KEY``, and the follower's ring takes only records that
verify, so a service that can produce to the topic cannot mint itself a key.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Iterator
from typing import Any

from aiokafka.errors import KafkaError
from aiokafka.structs import TopicPartition

from memstream.core import kafka
from memstream.core.errors import BrokerError, ConfigError, InvalidRecord, MemstreamError
from memstream.core.retry import set_within
from memstream.core.settings import Settings
from memstream.core.topic_reader import Record, follow, read_ranges, topic_partitions
from memstream.topics.layout import create_topics
from memstream.topics.registry import KEYS_TOPIC, TopicSpec, registry
from memstream.web.keys import KeyRecord, KeyRing, decode, new_key, revoke, verify

# The logger keeps the name it had before this module was split from keys.py, so that
# logging configuration and filters that name "memstream.web.keys" still apply.
log = logging.getLogger("memstream.web.keys")



class UnknownKeyError(MemstreamError, LookupError):
    """No API key with this id on the keys topic."""


def _take(record: Any, into: dict[str, KeyRecord | None],
          keep: Callable[[str, KeyRecord | None], bool] | None = None) -> None:
    """Decode a consumed record into ``into`` (later ones win); a bad one is logged, skipped.

    ``keep`` (e.g. :meth:`KeyRing.admit`) filters before a record enters ``into``, so one it
    refuses leaves the key id's earlier record in place instead of replacing it.
    """
    try:
        key_id, found = decode(record.key, record.value)
    except InvalidRecord as exc:
        log.warning("api keys: skipped record %s[%d]@%d (%s: %s)", record.topic,
                    record.partition, record.offset, exc.kind, exc)
        return
    if keep is None or keep(key_id, found):
        into[key_id] = found


class KeyFollower:
    """Follows the keys topic into a :class:`KeyRing` inside the worker.

    Reads the topic from the beginning up to the end offsets seen at start and applies that
    state at once (a key revoked later in the topic is never briefly live), then sets
    ``ready`` and keeps applying new records. Broker errors and a topic that does not exist
    yet (the caller creates topics) are waited out quietly until :meth:`stop`; after an
    error it resumes where it was, never replaying from the start.
    """

    def __init__(self, ring: KeyRing, settings: Settings, topic: str, *,
                 retry_s: float = 1.0, poll_s: float = 1.0) -> None:
        self.ring = ring
        self.settings = settings
        self.topic = topic
        self.retry_s = retry_s
        self.poll_s = poll_s
        self._ready = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._positions: dict[TopicPartition, int] = {}
        self._staged: dict[str, KeyRecord | None] = {}  # the initial read, applied at once
        self._problem = ""  # the trouble last logged ("": none since following worked)

    @classmethod
    def for_settings(cls, settings: Settings, ring: KeyRing | None = None) -> KeyFollower:
        return cls(ring if ring is not None else KeyRing.for_settings(settings),
                   settings, settings.topic(KEYS_TOPIC))

    @property
    def ready(self) -> bool:
        return self._ready.is_set()

    async def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name=f"key-follower {self.topic}")

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            await asyncio.wait({task})  # the caller's own cancellation still propagates

    async def wait_ready(self, timeout: float) -> bool:
        """True once the topic has been read to its end at start, False after ``timeout``."""
        return await set_within(self._ready, timeout)

    async def _run(self) -> None:
        while True:
            try:
                await self._follow()  # returns only while the topic does not exist
                problem, text = "missing", f"waiting for topic {self.topic}"
            except Exception as exc:
                problem, text = type(exc).__name__, f"following {self.topic} failed: {exc}"
            # One line per kind of trouble, until following works again; then debug.
            level = (logging.DEBUG if problem == self._problem
                     else logging.INFO if problem == "missing" else logging.WARNING)
            log.log(level, "api keys: %s (retrying every %.1f s)", text, self.retry_s)
            self._problem = problem
            await asyncio.sleep(self.retry_s)

    def _take(self, record: Any, into: dict[str, KeyRecord | None]) -> None:
        _take(record, into, self.ring.admit)

    async def _follow(self) -> None:
        def take(records: list[Record]) -> None:
            if not self._ready.is_set():  # the initial read: applied at once when done
                for record in records:
                    self._take(record, self._staged)
                return
            changes: dict[str, KeyRecord | None] = {}
            for record in records:
                self._take(record, changes)
            if changes:
                self.ring.update(changes)

        def caught_up() -> None:
            self._problem = ""
            if self._ready.is_set():
                return
            self.ring.update(self._staged)
            self._staged = {}
            self._ready.set()
            log.info("api keys: %d key(s) read from %s (%d record(s) ignored: "
                     "signature does not verify)", len(self.ring), self.topic,
                     self.ring.rejected)

        await follow(self.settings, self.topic, take, positions=self._positions,
                     caught_up=caught_up, poll_s=self.poll_s)


# --- admin helpers (`memstream keys ...`) ----------------------------------------------


def keys_topic_spec(settings: Settings) -> TopicSpec:
    """The keys topic: one partition, compacted, kept forever (revocations are audit)."""
    return registry(settings).api_keys


@contextlib.contextmanager
def _broker_errors(topic: str) -> Iterator[None]:
    try:
        yield
    except KafkaError as exc:
        raise BrokerError(f"api keys topic {topic}: {exc or type(exc).__name__}") from exc


def _admin_key(settings: Settings) -> str:
    """The admin key that signs key records; ConfigError (before any broker call) without."""
    admin = settings.admin_key.get_secret_value() if settings.admin_key is not None else ""
    if not admin:
        raise ConfigError("creating or revoking an API key needs the operator's admin key: "
                          "set MEMSTREAM_ADMIN_KEY (the one the workers have); key records "
                          "are signed with it and workers ignore records that do not verify")
    return admin


async def _read_all(settings: Settings, timeout: float,
                    keep: Callable[[str, KeyRecord | None], bool] | None = None,
                    ) -> dict[str, KeyRecord | None]:
    topic = settings.topic(KEYS_TOPIC)
    found: dict[str, KeyRecord | None] = {}
    with _broker_errors(topic):
        tps = await topic_partitions(settings, topic)
        if not tps:
            return found

        def take(_: TopicPartition, records: list[Record]) -> None:
            for r in records:
                _take(r, found, keep)

        try:
            await read_ranges(settings, tps, take, idle_timeout_s=timeout)
        except TimeoutError as exc:
            raise BrokerError(f"api keys topic not read to its end in time: {exc}") from exc
    return found


async def _send(settings: Settings, record: KeyRecord) -> None:
    topic = settings.topic(KEYS_TOPIC)
    with _broker_errors(topic):
        producer = kafka.producer(settings, enable_idempotence=True, acks="all")
        await producer.start()
        try:
            await producer.send_and_wait(topic, key=record.key_id.encode(), value=record.dumps())
        finally:
            await producer.stop()


async def create_key(settings: Settings, tenant_id: str, label: str = "", *,
                     clock: Callable[[], float] = time.time) -> tuple[str, KeyRecord]:
    """Mint a key for a tenant and store its record (the topic is created if missing);
    returns ``(plaintext, record)``, the record signed with the admin key. Raises ConfigError
    without ``settings.admin_key`` and pydantic's ValidationError for a bad tenant id or
    label, both before touching the broker; BrokerError when the broker fails."""

    plaintext, record = new_key(tenant_id, label, clock(), _admin_key(settings))
    spec = keys_topic_spec(settings)
    with _broker_errors(spec.name):
        await create_topics(settings, [spec])
    await _send(settings, record)
    return plaintext, record


async def list_keys(settings: Settings, *, timeout: float = 30.0) -> list[KeyRecord]:
    """Every key's last record (revoked ones too), oldest first; [] without a topic.

    Unfiltered, forged records included, so that an operator sees them:
    :func:`memstream.web.keys.verify` tells which ones a worker would take."""
    found = await _read_all(settings, timeout)
    return sorted((r for r in found.values() if r is not None),
                  key=lambda r: (r.created_at, r.key_id))


async def revoke_key(settings: Settings, key_id: str, *, timeout: float = 30.0,
                     clock: Callable[[], float] = time.time) -> KeyRecord:
    """Write the signed revoking record of a key (idempotent: a revoked key is returned as
    is). Only records that verify count, so a forged "revoked" record cannot make this a
    no-op. Raises ConfigError without ``settings.admin_key`` (before any broker call) and
    :class:`UnknownKeyError` when the topic holds no such key."""
    admin = _admin_key(settings)
    found = await _read_all(settings, timeout,
                            lambda _, r: r is None or verify(r, admin))
    current = found.get(key_id)
    if current is None:
        raise UnknownKeyError(f"no API key with id {key_id!r}")
    revoked = revoke(current, clock(), admin)
    if revoked is not current:
        await _send(settings, revoked)
    return revoked
