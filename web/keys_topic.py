"""The Kafka side of API keys: the compacted ``<prefix>.api-keys`` topic, whose records are
:class:`~memstream.web.keys.KeyRecord` values keyed by their key id.

Compaction keeps the last record per key id, so revoking writes a new record with
``revoked_at`` set (kept for audit), never a tombstone. Every worker follows the topic into a
:class:`~memstream.web.keys.KeyRing` (:class:`KeyFollower`); the admin helpers
(:func:`create_key`, :func:`list_keys`, :func:`revoke_key`) back ``memstream keys``. Neither
plaintext keys nor hashes are ever logged.

Records are signed with a key derived from the admin key (:mod:`memstream.web.keys`): creating
and revoking need ``MEMSTREAM_ADMIN_KEY``, and the follower's ring takes only records that
verify, so a service that can produce to the topic cannot mint itself a key. A tombstone
(:func:`delete_key`) is signed too, in a record header, because it has no value to sign::

    header "memstream-sig" = lowercase hex of HMAC-SHA256(signing_key(admin key),
                                                 UTF-8("api-keys\x1ftombstone\x1f" + key id))

(``signing_key`` as in :mod:`memstream.web.keys`; the topic role ``api-keys`` makes the MAC
mean nothing on another topic). A record or tombstone that does not verify changes nothing:
the follower counts it (``rejected``), logs its key id and offset and dead-letters it
without its value. The derivation stays on the admin key, not the cluster secret: the
operator's CLI mints, revokes and deletes keys with the admin key and needs no cluster
secret, and every worker holds the admin key already.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import logging
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from typing import Any

from aiokafka import AIOKafkaProducer
from aiokafka.errors import KafkaError
from aiokafka.structs import TopicPartition

from memstream.core import kafka
from memstream.core.errors import (
    BrokerError,
    ConfigError,
    InvalidRecord,
    MemstreamError,
    describe,
)
from memstream.core.retry import set_within
from memstream.core.settings import Settings
from memstream.core.topic_reader import Record, follow, read_ranges, topic_partitions
from memstream.topics.codec import dead_letter
from memstream.topics.layout import create_topics
from memstream.topics.registry import KEYS_TOPIC, TopicSpec, registry
from memstream.web.keys import KeyRecord, KeyRing, decode, new_key, revoke, signing_key, verify

# The logger keeps the name it had before this module was split from keys.py, so that
# logging configuration and filters that name "memstream.web.keys" still apply.
log = logging.getLogger("memstream.web.keys")

SIG_HEADER = "memstream-sig"
_TOMBSTONE_CONTEXT = b"api-keys\x1ftombstone\x1f"  # (topic role, key)
_MAX_DEAD = 1000  # dead letters waiting for the producer: beyond, counted only


class UnknownKeyError(MemstreamError, LookupError):
    """No API key with this id on the keys topic."""


def tombstone_mac(admin_key: str, key_id: str) -> str:
    """The signature of the tombstone of ``key_id`` (layout in the module docstring)."""
    return hmac.new(signing_key(admin_key), _TOMBSTONE_CONTEXT + key_id.encode(),
                    hashlib.sha256).hexdigest()


def tombstone_verifies(admin_key: str | None, key_id: str, headers: Any) -> bool:
    """True when ``headers`` (a record's: (name, bytes) pairs) carry the tombstone's
    signature under ``admin_key``; False without an admin key."""
    if not admin_key:
        return False
    want = tombstone_mac(admin_key, key_id).encode()
    return any(name == SIG_HEADER and isinstance(value, bytes)
               and hmac.compare_digest(value, want) for name, value in headers or ())


def _take(record: Any, into: dict[str, KeyRecord | None],
          keep: Callable[[str, KeyRecord | None], bool] | None = None, *,
          admin_key: str | None = None,
          refused: Callable[[Any, InvalidRecord], None] | None = None) -> None:
    """Decode a consumed record into ``into`` (later ones win); a bad one is logged, skipped
    (and handed to ``refused``).

    ``keep`` (e.g. :meth:`KeyRing.admit`) filters before a record enters ``into``, so one it
    refuses leaves the key id's earlier record in place instead of replacing it. A tombstone
    counts only when signed with ``admin_key`` (:func:`tombstone_verifies`).
    """
    logged = False  # keep() logs a record it refuses
    try:
        key_id, found = decode(record.key, record.value)
        if found is None and not tombstone_verifies(admin_key, key_id, record.headers):
            raise InvalidRecord("unsigned", "tombstone without a valid signature (forged, "
                                "or signed with another admin key): ignored")
        if keep is not None and not keep(key_id, found):
            logged = True
            raise InvalidRecord("unsigned", "record signature does not verify (forged, or "
                                "signed with another admin key): ignored")
    except InvalidRecord as exc:
        if not logged:
            log.warning("api keys: skipped record %s[%d]@%d (%s)", record.topic,
                        record.partition, record.offset, describe(exc))
        if refused is not None:
            refused(record, exc)
        return
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
                 retry_s: float = 1.0, poll_s: float = 1.0,
                 dead_letters: str | None = None) -> None:
        self.ring = ring
        admin = settings.admin_key
        self._admin = admin.get_secret_value() if admin is not None else None
        self.dead_letters = dead_letters  # None: set-aside records are only counted, logged
        self.rejected: dict[str, int] = {}  # records and tombstones set aside, by kind
        self._dead: list[tuple[bytes | None, bytes]] = []  # dead letters not yet sent
        self._producer: AIOKafkaProducer | None = None
        self._sender: asyncio.Task[None] | None = None  # sends dead letters: never blocks
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
                   settings, settings.topic(KEYS_TOPIC),
                   dead_letters=registry(settings).dead_letters.name)

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
        sender, self._sender = self._sender, None
        if sender is not None:
            sender.cancel()
            await asyncio.wait({sender})
        producer, self._producer = self._producer, None
        if producer is not None:
            await producer.stop()

    async def wait_ready(self, timeout: float) -> bool:
        """True once the topic has been read to its end at start, False after ``timeout``."""
        return await set_within(self._ready, timeout)

    async def _run(self) -> None:
        while True:
            try:
                await self._follow()  # returns only while the topic does not exist
                problem, text = "missing", f"waiting for topic {self.topic}"
            except Exception as exc:
                problem = type(exc).__name__
                text = f"following {self.topic} failed: {describe(exc)}"
            # One line per kind of trouble, until following works again; then debug.
            level = (logging.DEBUG if problem == self._problem
                     else logging.INFO if problem == "missing" else logging.WARNING)
            log.log(level, "api keys: %s (retrying every %.1f s)", text, self.retry_s)
            self._problem = problem
            await asyncio.sleep(self.retry_s)

    def _take(self, record: Any, into: dict[str, KeyRecord | None]) -> None:
        _take(record, into, self.ring.admit, admin_key=self._admin, refused=self._refused)

    def _refused(self, record: Any, exc: InvalidRecord) -> None:
        """A record set aside: counted, and its dead letter (without its value) queued."""
        self.rejected[exc.kind] = self.rejected.get(exc.kind, 0) + 1
        if self.dead_letters is None or len(self._dead) >= _MAX_DEAD:
            return
        letter = dead_letter(exc, topic=record.topic, partition=record.partition,
                             offset=record.offset, key=record.key, value=record.value,
                             now=datetime.now(UTC))
        letter = letter.model_copy(update={"value_b64": "", "truncated": True})
        self._dead.append((record.key, letter.dumps()))

    def _kick_dead(self) -> None:
        """Send the queued dead letters in a task of their own: following never waits on
        the dead-letter topic (a broker error there only delays them to the next batch)."""
        if self._dead and (self._sender is None or self._sender.done()):
            self._sender = asyncio.create_task(self._send_dead(), name="api-keys dead letters")

    async def _send_dead(self) -> None:
        if not self._dead or self.dead_letters is None:
            return
        try:
            if self._producer is None:
                producer = kafka.producer(self.settings, acks="all", enable_idempotence=True)
                await producer.start()
                self._producer = producer
            while self._dead:
                key, letter = self._dead[0]
                await self._producer.send_and_wait(self.dead_letters, key=key, value=letter)
                self._dead.pop(0)
        except Exception as exc:
            log.warning("api keys: %d dead letter(s) not sent yet (%s)", len(self._dead),
                        describe(exc))

    async def _follow(self) -> None:
        def take(records: list[Record]) -> None:
            if not self._ready.is_set():  # the initial read: applied at once when done
                for record in records:
                    self._take(record, self._staged)
            else:
                changes: dict[str, KeyRecord | None] = {}
                for record in records:
                    self._take(record, changes)
                if changes:
                    self.ring.update(changes)
            self._kick_dead()

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
    admin = settings.admin_key.get_secret_value() if settings.admin_key is not None else None
    with _broker_errors(topic):
        tps = await topic_partitions(settings, topic)
        if not tps:
            return found

        def take(_: TopicPartition, records: list[Record]) -> None:
            for r in records:
                _take(r, found, keep, admin_key=admin)

        try:
            await read_ranges(settings, tps, take, idle_timeout_s=timeout)
        except TimeoutError as exc:
            raise BrokerError(f"api keys topic not read to its end in time: {exc}") from exc
    return found


async def _send(settings: Settings, record: KeyRecord | str) -> None:
    """Write ``record``, or (a key id) the key's signed tombstone."""
    topic = settings.topic(KEYS_TOPIC)
    if isinstance(record, str):
        key_id, value = record, None
        headers = [(SIG_HEADER, tombstone_mac(_admin_key(settings), key_id).encode())]
    else:
        key_id, value, headers = record.key_id, record.dumps(), []
    with _broker_errors(topic):
        producer = kafka.producer(settings, enable_idempotence=True, acks="all")
        await producer.start()
        try:
            await producer.send_and_wait(topic, key=key_id.encode(), value=value,
                                         headers=headers)
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


async def delete_key(settings: Settings, key_id: str, *, timeout: float = 30.0) -> None:
    """Write the signed tombstone of a key: compaction then drops its records (the
    revocation's audit record with them). Only a revoked key is deleted (revoke first, so
    that a worker that missed the tombstone still refuses it). Raises ConfigError without
    ``settings.admin_key`` and :class:`UnknownKeyError` when the topic holds no such key,
    or ConfigError when it is not revoked."""
    admin = _admin_key(settings)
    found = await _read_all(settings, timeout, lambda _, r: r is None or verify(r, admin))
    current = found.get(key_id)
    if current is None:
        raise UnknownKeyError(f"no API key with id {key_id!r}")
    if current.revoked_at is None:
        raise ConfigError(f"API key {key_id} is not revoked: revoke it first")
    await _send(settings, key_id)
