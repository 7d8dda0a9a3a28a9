"""Per-user envelope encryption for what memstream keeps long (SPEC §7 crypto-shredding).

Every user has data keys (AES-256-GCM), kept on a compacted topic wrapped by a random
per-tenant key-encryption key (KEK), itself wrapped by a key derived from a version of the
master key (``MEMSTREAM_MASTER_KEY``, ``MEMSTREAM_MASTER_KEY_VERSION``). Rotating the master
rewraps the tenant KEKs only; a tenant's KEK is also its downstream readers' read key. The
content of a change event (before / after / records / vector / reason: texts and
embeddings alike) travels sealed with the user's data key; its ids, versions, op and
lineage stay readable, so the log can still be ordered, counted and audited. Forget-me
deletes the user's data keys: every sealed record of the user, in every copy of the
topic, becomes unreadable at once, and a replay skips it.

The associated data binds a sealed blob to its tenant, user and change id: a blob copied
into another user's record does not open. Pure: no I/O, no clock (nonces are random).
"""

from __future__ import annotations

import base64
import os
from collections.abc import Mapping
from typing import Any, Protocol, TypeVar

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from pydantic import BaseModel, ValidationError

from memstream.contract.events import MemoryEvent, MemoryState
from memstream.contract.exceptions import ConfigError, InvalidRecord
from memstream.contract.records import WIRE

_C = TypeVar("_C", bound=BaseModel)
VERSION = "v1"
NONCE_BYTES = 12
# what sealing moves into the blob, and the values those fields are left with (a change
# event's: memstream.memory.crypto.change_sealing)
EVENT_SEALED_FIELDS: dict[str, Any] = {"before": None, "after": None, "reason": ""}  # public


def new_data_key() -> bytes:
    return AESGCM.generate_key(bit_length=256)


def new_key_id() -> str:
    return base64.urlsafe_b64encode(os.urandom(9)).decode()


def kek_from(master_key: str) -> bytes:
    """The legacy key-encryption key, derived from the master key (never used on data):
    data keys written before tenant keys (records without ``kek``) are wrapped by it."""
    _check_master(master_key)
    return HKDF(algorithm=hashes.SHA256(), length=32, salt=b"memstream-kek-v1",
                info=b"wrap user data keys").derive(master_key.encode())


def _check_master(master_key: str) -> None:
    if len(master_key) < 16:
        raise ConfigError("the master key must be at least 16 characters")


# --- the key hierarchy: master key (version v) -> tenant KEK -> user data keys ----------
# A tenant KEK is random (never derived), so it survives a rotation of the master key and
# can be handed to a downstream reader of that tenant alone (a read key).


def master_wrapping_key(master_key: str, version: int) -> bytes:
    """The key that wraps tenant KEKs under master key ``version`` (never used on data)."""
    _check_master(master_key)
    return HKDF(algorithm=hashes.SHA256(), length=32, salt=b"memstream-tenant-kek-v2",
                info=f"wrap tenant keks\x1f{version}".encode()).derive(master_key.encode())


def new_kek() -> bytes:
    return AESGCM.generate_key(bit_length=256)


def _kek_aad(tenant: str, kek_id: str, version: int) -> str:
    return f"kek\x1f{tenant}\x1f{kek_id}\x1f{version}"


def wrap_kek(wrapping: bytes, kek: bytes, tenant: str, kek_id: str, version: int) -> str:
    """A tenant KEK wrapped under a master version's key (the AAD binds tenant, id, version:
    a record relabelled with another tenant, id or version does not open)."""
    return _enc(wrapping, kek, _kek_aad(tenant, kek_id, version))


def unwrap_kek(wrapping: bytes, wrapped: str, tenant: str, kek_id: str, version: int) -> bytes:
    return _dec(wrapping, wrapped, _kek_aad(tenant, kek_id, version))


def _key_aad(tenant: str, user: str, key_id: str, kek_id: str) -> str:
    return f"key\x1f{tenant}\x1f{user}\x1f{key_id}\x1f{kek_id}"


def wrap_under(kek: bytes, kek_id: str, data_key: bytes, tenant: str, user: str,
               key_id: str) -> str:
    """A user's data key wrapped under its tenant's KEK ``kek_id``."""
    return _enc(kek, data_key, _key_aad(tenant, user, key_id, kek_id))


def unwrap_under(kek: bytes, kek_id: str, wrapped: str, tenant: str, user: str,
                 key_id: str) -> bytes:
    return _dec(kek, wrapped, _key_aad(tenant, user, key_id, kek_id))


def marker_signing_key(master_key: str, version: int) -> bytes:
    """The HMAC key workers sign forget markers with (``msig``): derived from master key
    ``version``, which no downstream reader holds (a read key is a tenant KEK), so a reader
    that can produce to the user-keys topic cannot make a worker shred a user."""
    _check_master(master_key)
    return HKDF(algorithm=hashes.SHA256(), length=32, salt=b"memstream-forget-marker-v2",
                info=f"sign forget markers\x1f{version}".encode()).derive(master_key.encode())


def reader_marker_key(kek: bytes, tenant: str) -> bytes:
    """The HMAC key of a marker's ``sig``, derived from the tenant KEK: what the tenant's
    readers (their read key) verify, and all that markers of before ``msig`` carry."""
    return HKDF(algorithm=hashes.SHA256(), length=32, salt=b"memstream-forget-marker-v1",
                info=tenant.encode()).derive(kek)


def _enc(key: bytes, plain: bytes, aad: str) -> str:
    nonce = os.urandom(NONCE_BYTES)
    return base64.b64encode(nonce + AESGCM(key).encrypt(nonce, plain, aad.encode())).decode()


def _dec(key: bytes, token: str, aad: str) -> bytes:
    try:
        raw = base64.b64decode(token, validate=True)
        return AESGCM(key).decrypt(raw[:NONCE_BYTES], raw[NONCE_BYTES:], aad.encode())
    except (InvalidTag, ValueError) as exc:
        raise InvalidRecord("undecryptable", "sealed data does not open with this key") from exc


def wrap(kek: bytes, data_key: bytes, tenant: str, user: str, key_id: str) -> str:
    return _enc(kek, data_key, f"key\x1f{tenant}\x1f{user}\x1f{key_id}")


def unwrap(kek: bytes, wrapped: str, tenant: str, user: str, key_id: str) -> bytes:
    return _dec(kek, wrapped, f"key\x1f{tenant}\x1f{user}\x1f{key_id}")


def _event_aad(event: MemoryEvent) -> str:
    return f"event\x1f{event.tenant_id}\x1f{event.user_id}\x1f{event.change_id}"


def seal_event(event: MemoryEvent, key_id: str, data_key: bytes) -> MemoryEvent:
    """The public event with its content sealed, with the key that seals its change event
    (a forget-me shreds both at once); the associated data differs, so a blob of one topic
    never opens as the other's."""
    return sealed(event, key_id, data_key, _event_aad(event), EVENT_SEALED_FIELDS)


def open_event(event: MemoryEvent, keys: Mapping[str, bytes]) -> MemoryEvent | None:
    """The public event with its content back; unsealed ones as they are; None when its
    data key is gone (the user was forgotten)."""
    return opened(event, keys, _event_aad(event), _EventContent)


class Sealable(Protocol):
    """A record whose content can travel sealed: a public event, or a change event."""

    @property
    def tenant_id(self) -> str: ...
    @property
    def user_id(self) -> str: ...
    @property
    def change_id(self) -> str: ...
    @property
    def sealed(self) -> str | None: ...


def sealed_key_id(change: Sealable) -> str | None:
    if not change.sealed:
        return None
    parts = change.sealed.split(":", 2)
    if len(parts) != 3:
        raise InvalidRecord("undecryptable", "sealed data is not version:key id:blob")
    version, key_id, _ = parts
    if version != VERSION:
        raise InvalidRecord("undecryptable", f"unknown sealing version {version!r}")
    return key_id


_E = TypeVar("_E", bound=BaseModel)


def sealed(plain: _E, key_id: str, data_key: bytes, aad: str,
            emptied: Mapping[str, Any]) -> _E:
    """``plain`` (a record with tenant, user and change ids) with the fields of ``emptied``
    sealed into ``sealed`` and set to those values. pydantic-core dumps them, a vector
    packed as on the wire (a float list is ~4x the bytes; the content models read both
    forms, so blobs sealed before 2026-12-02 still open)."""
    content = plain.model_dump_json(include=set(emptied), context=WIRE).encode()
    token = _enc(data_key, content, aad)
    return plain.model_copy(update={**emptied, "sealed": f"{VERSION}:{key_id}:{token}"})


def opened(closed: _E, keys: Mapping[str, bytes], aad: str,
           content: type[BaseModel]) -> _E | None:
    """``closed`` with the fields of ``content`` back from its ``sealed`` blob; as it is
    when plain; None when its key is not in ``keys``."""
    blob: str | None = getattr(closed, "sealed", None)
    key_id = sealed_key_id(closed)  # type: ignore[arg-type]
    if key_id is None or blob is None:
        return closed
    key = keys.get(key_id)
    if key is None:
        return None
    found = _parsed(content, _dec(key, blob.split(":", 2)[2], aad))
    return closed.model_copy(update={**found.__dict__, "sealed": None})


class _EventContent(BaseModel):
    """The sealed part of a public event."""

    before: MemoryState | None = None
    after: MemoryState | None = None
    reason: str = ""


def _parsed(model: type[_C], plain: bytes) -> _C:
    """Sealed content that opened yet is not what it must be (another producer's bug)."""
    try:
        return model.model_validate_json(plain)
    except ValidationError as exc:
        raise InvalidRecord("undecryptable", "sealed content is not a change's "
                            f"({exc.error_count()} errors)") from exc
