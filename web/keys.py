"""Per-tenant API keys of the HTTP API: minted, revoked and checked here, without Kafka.

A key is ``msk_<key_id>_<secret>``; only the SHA-256 of the whole string is stored, in a
:class:`KeyRecord` keyed by the key id. Revoking makes a new record with ``revoked_at`` set
(kept for audit), never a tombstone. A :class:`KeyRing` holds the last record of each key id
and is what the HTTP layer asks to :meth:`KeyRing.authorise` a key. The keys topic, the
worker's follower and the admin helpers are :mod:`memstream.web.keys_topic`. Neither plaintext
keys nor hashes are ever logged.

Records are signed (:func:`sign`, :func:`verify`): every service that talks to the broker
can produce to the keys topic, so an unsigned record naming another tenant with the hash of
the producer's own key would be a working key for that tenant. The signing key is derived
from the operator's admin key, so minting or revoking needs it, and a worker checks with the
admin key it already holds; a ring without one accepts no tenant key at all.

Signature layout (for other implementations)::

    signing_key = SHA-256(b"memstream api-keys v1" + b"\x1f" + UTF-8(admin key))   # 32 bytes
    message     = UTF-8("\x1f".join([key_id, tenant_id, sha256, created_at, revoked_at,
                                      label]))
    signature   = lowercase hex of HMAC-SHA256(signing_key, message)

where ``created_at`` / ``revoked_at`` are the times in UTC as
``YYYY-MM-DDTHH:MM:SS.ffffffZ`` (always six fractional digits; ``revoked_at`` is ``""``
when not revoked) and ``sha256`` the lowercase hex of the record. No field can contain
``\x1f``: ids and hashes are restricted to printable characters and labels refuse control
characters, so the joined message is unambiguous.

A signature stops forged records, not replayed ones: a producer that kept an older record
the operator signed (the key before its revocation) can write it again, and the last record
of a key id wins. Broker ACLs that let only memstream write the keys topic close that.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import re
import secrets
import threading
from collections.abc import Mapping
from datetime import UTC, datetime

from pydantic import ValidationError

from memstream.contract.http_api.api import Principal
from memstream.core.errors import ConfigError, InvalidRecord
from memstream.core.settings import Settings
from memstream.topics.schemas import KeyRecord

KEY_PREFIX = "msk_"
_KEY_ID = re.compile(r"[0-9a-f]{16}")
# The secret part is checked by its hash; the pattern only turns garbage away cheaply.
_PRESENTED = re.compile(r"msk_([0-9a-f]{16})_[A-Za-z0-9_-]{16,256}")
_MAX_PRESENTED = 4096  # longer: rejected before any hashing or comparing
_SIGNING_CONTEXT = b"memstream api-keys v1\x1f"
_SEP = "\x1f"
_MAX_WARNED = 1024  # key ids warned about per ring: a flood of forgeries cannot grow it

log = logging.getLogger(__name__)


def _digest(presented: bytes) -> str:
    return hashlib.sha256(presented).hexdigest()


def _utc(value: datetime) -> str:
    return value.astimezone(UTC).replace(tzinfo=None).isoformat(timespec="microseconds") + "Z"


def canonical(record: KeyRecord) -> bytes:
    """The bytes a record's signature covers (layout in the module docstring)."""
    revoked = _utc(record.revoked_at) if record.revoked_at is not None else ""
    return _SEP.join([record.key_id, record.tenant_id, record.sha256, _utc(record.created_at),
                      revoked, record.label]).encode()


def signing_key(admin_key: str) -> bytes:
    """The HMAC key of key records, derived from the admin key (never the admin key itself,
    so a signature reveals nothing usable against the HTTP API)."""
    if not admin_key:
        raise ConfigError("signing API key records needs the admin key (MEMSTREAM_ADMIN_KEY)")
    return hashlib.sha256(_SIGNING_CONTEXT + admin_key.encode()).digest()


def _mac(record: KeyRecord, key: bytes) -> str:
    return hmac.new(key, canonical(record), hashlib.sha256).hexdigest()


def sign(record: KeyRecord, admin_key: str) -> KeyRecord:
    """``record`` with its signature (a new record; the fields are unchanged)."""
    return record.model_copy(update={"signature": _mac(record, signing_key(admin_key))})


def verify(record: KeyRecord, admin_key: str | None) -> bool:
    """True when ``record`` was signed with ``admin_key``; False without an admin key."""
    return bool(admin_key) and _verify(record, signing_key(admin_key or ""))


def _verify(record: KeyRecord, key: bytes) -> bool:
    return hmac.compare_digest(record.signature, _mac(record, key))


def new_key(tenant_id: str, label: str, now: float, admin_key: str) -> tuple[str, KeyRecord]:
    """A fresh key for one tenant: ``(plaintext, record)``; show the plaintext once, store
    the record (signed with ``admin_key``: raises ConfigError without one).

    One SHA-256 suffices, no slow KDF: the secret is 256 random bits (not a password a
    person chose), so a leaked hash has nothing guessable to brute-force.
    """
    key = signing_key(admin_key)
    key_id = secrets.token_hex(8)
    plaintext = f"{KEY_PREFIX}{key_id}_{secrets.token_urlsafe(32)}"
    record = KeyRecord(key_id=key_id, tenant_id=tenant_id, sha256=_digest(plaintext.encode()),
                       label=label, created_at=datetime.fromtimestamp(now, UTC))
    return plaintext, record.model_copy(update={"signature": _mac(record, key)})


def revoke(record: KeyRecord, now: float, admin_key: str) -> KeyRecord:
    """The signed record that revokes ``record``.

    A revoked record that verifies is returned as is (it keeps its first time); one that
    does not (a forged "already revoked" record) is revoked afresh, so an operator's revoke
    can never be turned into a no-op by a record someone else wrote.
    """
    key = signing_key(admin_key)
    if record.revoked_at is not None and _verify(record, key):
        return record
    revoked = record.model_copy(update={"revoked_at": datetime.fromtimestamp(now, UTC)})
    return revoked.model_copy(update={"signature": _mac(revoked, key)})


class KeyRing:
    """Key id -> last record seen, and the admin key: answers "whose key is this?".

    Only records whose signature verifies with this ring's admin key are taken; others are
    skipped, counted in ``rejected`` and logged once per key id (its id only). A ring
    without an admin key therefore accepts no tenant key: tenant keys need
    MEMSTREAM_ADMIN_KEY on every worker. A tombstone given here removes its key: the
    topic's follower (:mod:`memstream.web.keys_topic`) passes only signed ones.

    The last record of a key id wins, also one without ``revoked_at`` after a revocation:
    that is what compaction keeps, so a worker that replays the compacted topic reaches the
    same state as one that saw every record. Nothing memstream writes un-revokes a key.
    A lock makes each change atomic for callers on other threads.
    """

    def __init__(self, admin_key: str | None = None) -> None:
        self._admin = admin_key.encode() if admin_key else None  # "": no admin key
        self._signing = signing_key(admin_key) if admin_key else None
        self._records: dict[str, KeyRecord] = {}
        self._lock = threading.Lock()
        self._warned: set[str] = set()
        self.rejected = 0  # records skipped because their signature did not verify

    @classmethod
    def for_settings(cls, settings: Settings) -> KeyRing:
        admin = settings.admin_key
        return cls(admin.get_secret_value() if admin is not None else None)

    def verifies(self, record: KeyRecord) -> bool:
        """True when this ring would take ``record`` (its signature verifies)."""
        return self._signing is not None and _verify(record, self._signing)

    def admit(self, key_id: str, record: KeyRecord | None) -> bool:
        """True for a tombstone or a record that verifies; otherwise count, log, False.

        The follower asks this before a record enters a batch, so a forged record can never
        displace a real one (a revocation) of the same key id in that batch.
        """
        if record is None or self.verifies(record):
            return True
        with self._lock:
            self.rejected += 1
            first = key_id not in self._warned and len(self._warned) < _MAX_WARNED
            if first:
                self._warned.add(key_id)
            first_of_all = first and len(self._warned) == 1
        if self._signing is None:  # one line says it all: nothing can verify here
            if first_of_all:
                log.warning("api keys: no admin key (MEMSTREAM_ADMIN_KEY) here, so no "
                            "tenant key record can be verified and none is accepted")
        elif first:
            log.warning("api keys: ignored a record of key id %s: its signature does not "
                        "verify (forged, or signed with another admin key)", key_id)
        return False

    def apply(self, record: KeyRecord) -> None:
        self.update({record.key_id: record})

    def update(self, changes: Mapping[str, KeyRecord | None]) -> None:
        """Apply several records at once (None: a tombstone, the key is gone); records
        whose signature does not verify are skipped (:meth:`admit`)."""
        admitted = {k: r for k, r in changes.items() if self.admit(k, r)}
        with self._lock:
            for key_id, record in admitted.items():
                if record is None:
                    self._records.pop(key_id, None)
                else:
                    self._records[key_id] = record

    def get(self, key_id: str) -> KeyRecord | None:
        with self._lock:
            return self._records.get(key_id)

    def records(self) -> list[KeyRecord]:
        with self._lock:
            found = list(self._records.values())
        return sorted(found, key=lambda r: (r.created_at, r.key_id))

    def __len__(self) -> int:
        return len(self._records)

    def authorise(self, presented: str) -> Principal | None:
        """The principal of a presented key; None for anything else (never raises)."""
        if not isinstance(presented, str) or not 0 < len(presented) <= _MAX_PRESENTED:
            return None
        raw = presented.encode("utf-8", "surrogatepass")
        if self._admin is not None and hmac.compare_digest(raw, self._admin):
            return Principal(key_id="admin", admin=True)
        match = _PRESENTED.fullmatch(presented)
        record = self.get(match.group(1)) if match else None
        if record is None or not hmac.compare_digest(_digest(raw), record.sha256):
            return None
        if record.revoked_at is not None:
            return None
        return Principal(key_id=record.key_id, tenant_id=record.tenant_id)


def decode(key: bytes | None, value: bytes | None) -> tuple[str, KeyRecord | None]:
    """One record of the keys topic as ``(key id, record)``; record None: a tombstone.

    Raises :class:`InvalidRecord` whose message names fields, never values (a value holds
    a hash).
    """
    key_id = key.decode("ascii", "replace") if key else ""
    if not _KEY_ID.fullmatch(key_id):
        raise InvalidRecord("key", "record key is not a key id")
    if value is None:
        return key_id, None
    try:
        record = KeyRecord.model_validate_json(value)
    except ValidationError as exc:
        errors = exc.errors(include_input=False, include_url=False)
        if any(e["type"] == "json_invalid" for e in errors):
            raise InvalidRecord("not_json", "value is not JSON") from None
        fields = sorted({".".join(map(str, e["loc"])) or "(root)" for e in errors})
        raise InvalidRecord("schema", f"not a KeyRecord: {', '.join(fields)}") from None
    if record.key_id != key_id:
        raise InvalidRecord("key", "record key differs from key_id")
    return key_id, record

