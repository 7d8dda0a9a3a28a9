"""Per-tenant API keys of the HTTP API: minted, revoked and checked here, without Kafka.

A key is ``msk_<key_id>_<secret>``; only the SHA-256 of the whole string is stored, in a
:class:`KeyRecord` keyed by the key id. Revoking makes a new record with ``revoked_at`` set
(kept for audit), never a tombstone. A :class:`KeyRing` holds the last record of each key id
and is what the HTTP layer asks to :meth:`KeyRing.authorise` a key. The keys topic, the
worker's follower and the admin helpers are :mod:`memstream.keys_topic`. Neither plaintext
keys nor hashes are ever logged.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
import threading
import unicodedata
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError

from memstream.errors import InvalidRecord
from memstream.settings import Settings
from memstream.topics.api import Principal
from memstream.topics.schemas import Ident, Timestamp

KEY_PREFIX = "msk_"
_KEY_ID = re.compile(r"[0-9a-f]{16}")
# The secret part is checked by its hash; the pattern only turns garbage away cheaply.
_PRESENTED = re.compile(r"msk_([0-9a-f]{16})_[A-Za-z0-9_-]{16,256}")
_MAX_PRESENTED = 4096  # longer: rejected before any hashing or comparing


def _no_controls(value: str) -> str:
    # Labels are printed by `memstream keys list`: no terminal control sequences.
    if any(unicodedata.category(c) == "Cc" for c in value):
        raise ValueError("must not contain control characters")
    return value


class KeyRecord(BaseModel):
    """One API key as stored: the tenant it opens and the SHA-256 of the whole key."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    schema_version: Literal[1] = 1
    key_id: str = Field(pattern=r"^[0-9a-f]{16}$")
    tenant_id: Ident
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$", repr=False)  # repr: kept out of logs
    label: Annotated[str, Field(max_length=200), AfterValidator(_no_controls)] = ""
    created_at: Timestamp
    revoked_at: Timestamp | None = None

    def dumps(self) -> bytes:
        return self.model_dump_json().encode()


def _digest(presented: bytes) -> str:
    return hashlib.sha256(presented).hexdigest()


def new_key(tenant_id: str, label: str, now: float) -> tuple[str, KeyRecord]:
    """A fresh key for one tenant: ``(plaintext, record)``; show the plaintext once, store
    the record.

    One SHA-256 suffices, no slow KDF: the secret is 256 random bits (not a password a
    person chose), so a leaked hash has nothing guessable to brute-force.
    """
    key_id = secrets.token_hex(8)
    plaintext = f"{KEY_PREFIX}{key_id}_{secrets.token_urlsafe(32)}"
    record = KeyRecord(key_id=key_id, tenant_id=tenant_id, sha256=_digest(plaintext.encode()),
                       label=label, created_at=datetime.fromtimestamp(now, UTC))
    return plaintext, record


def revoke(record: KeyRecord, now: float) -> KeyRecord:
    """The record that revokes ``record``; an already revoked one keeps its first time."""
    if record.revoked_at is not None:
        return record
    return record.model_copy(update={"revoked_at": datetime.fromtimestamp(now, UTC)})


class KeyRing:
    """Key id -> last record seen, and the admin key: answers "whose key is this?".

    The last record of a key id wins, also one without ``revoked_at`` after a revocation:
    that is what compaction keeps, so a worker that replays the compacted topic reaches the
    same state as one that saw every record. Nothing memstream writes un-revokes a key.
    A lock makes each change atomic for callers on other threads.
    """

    def __init__(self, admin_key: str | None = None) -> None:
        self._admin = admin_key.encode() if admin_key else None  # "": no admin key
        self._records: dict[str, KeyRecord] = {}
        self._lock = threading.Lock()

    @classmethod
    def for_settings(cls, settings: Settings) -> KeyRing:
        admin = settings.admin_key
        return cls(admin.get_secret_value() if admin is not None else None)

    def apply(self, record: KeyRecord) -> None:
        self.update({record.key_id: record})

    def update(self, changes: Mapping[str, KeyRecord | None]) -> None:
        """Apply several records at once (None: a tombstone, the key is gone)."""
        with self._lock:
            for key_id, record in changes.items():
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

