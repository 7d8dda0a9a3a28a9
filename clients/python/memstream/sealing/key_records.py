"""The records of the ``<prefix>.user-keys`` topic, their signatures, and who opens them.

Pure: parsing, encoding, signing and verifying; no I/O, no clock. The follower that keeps a
worker's (or a downstream reader's) view is :mod:`memstream.sealing.user_keys`.

Record layout (keys are UTF-8, values JSON)::

    tenant/!kek/<kek id>      {"wrapped": AES-GCM(master_v key, tenant KEK), "master": v,
                               "created_at": t}         AAD kek|tenant|kek id|v
    tenant/user/<key id>      {"wrapped": AES-GCM(tenant KEK, data key), "kek": <kek id>,
                               "created_at": t}         AAD key|tenant|user|key id|kek id
                              legacy (no "kek"): wrapped by crypto.kek_from(master)
    tenant/user/!forgotten    {"at": t, "request_id", "actor", "kek": <kek id>,
                               "keys": [shredded key ids], "master": v,
                               "msig": hex HMAC-SHA256, "sig": hex HMAC-SHA256}

A marker carries two signatures. ``msig``, what a worker (a master key holder) verifies:
``HMAC-SHA256(crypto.marker_signing_key(master key v, v), ["forgotten/v2", tenant, user,
v, kek id, at, request_id, actor, sorted keys])``; a worker accepts versions it holds
(``MEMSTREAM_MASTER_KEY`` and ``_PREVIOUS``) and ``memstream keys rotate-master`` signs
every marker again under the current version. ``sig``, what a downstream reader (a read
key: tenant KEKs) verifies: ``HMAC-SHA256(crypto.reader_marker_key(tenant KEK, tenant),
["forgotten", tenant, user, kek id, at, request_id, actor, sorted keys])`` (compact JSON
arrays). Every reader of the tenant holds the KEK, so ``sig`` alone never makes a worker
shred: markers of before ``msig`` (``sig`` only) are accepted by a worker only with
``MEMSTREAM_FORGET_MARKERS_LEGACY`` (the upgrade, until rotate-master signed them again).

``keys`` lists every key id the user's forgets shredded (cumulative): a tombstone is
honoured only for a key id a verified marker lists, and such an id is never taken again.
Tenant ids and user ids never start with ``!`` (``topics.schemas.ID_PATTERN``), so ``!kek``
and ``!forgotten`` name no user or key.

A read key (``memstream keys create --tenant T --read-events``) is the tenant's KEKs:
``msr1.<b64url tenant>.<kek id>.<b64url kek>[.<kek id>.<b64url kek>...]``.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
from dataclasses import dataclass, field
from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from memstream.contract.exceptions import ConfigError, InvalidRecord
from memstream.contract.records import ID_PATTERN
from memstream.sealing import envelope as crypto

FORGOTTEN = "!forgotten"
KEK = "!kek"
ROLL = "~roll"  # a tombstone appended every half bound, so the open segment rolls
READ_KEY_PREFIX = "msr1"
_NAME_MAX = 128
_M = TypeVar("_M", bound=BaseModel)


class KekRecord(BaseModel):
    model_config = ConfigDict(extra="ignore")

    wrapped: str
    master: int = Field(ge=1)
    created_at: float | None = None


class DataKeyRecord(BaseModel):
    model_config = ConfigDict(extra="ignore")

    wrapped: str
    kek: str | None = None  # None: a legacy record, wrapped by crypto.kek_from(master)
    created_at: float | None = None


class Marker(BaseModel):
    model_config = ConfigDict(extra="ignore")

    at: float
    request_id: str = ""
    actor: str = ""
    kek: str | None = None
    keys: list[str] = Field(default_factory=list)
    master: int | None = None  # the master version msig is under
    msig: str | None = None  # None: signed before workers' keys (sig only): legacy
    sig: str | None = None  # None: a legacy (unsigned) marker, never honoured


def parse_key(key: bytes | None) -> tuple[str, str, str]:
    """``(tenant, user or "!kek", name)`` of a record key; InvalidRecord("key") otherwise."""
    try:
        tenant, user, name = (key or b"").decode("utf-8").split("/", 2)
    except (UnicodeDecodeError, ValueError):
        raise InvalidRecord("key", "record key is not tenant/user/name") from None
    if not ID_PATTERN.fullmatch(tenant) or not (user == KEK or ID_PATTERN.fullmatch(user)):
        raise InvalidRecord("key", "record key names no tenant/user")
    if not name or len(name) > _NAME_MAX or not name.isprintable() or "/" in name:
        raise InvalidRecord("key", "record key names no key id")
    return tenant, user, name


def _parsed(model: type[_M], value: bytes) -> _M:
    """The value as ``model``; InvalidRecord naming fields, never values."""
    try:
        return model.model_validate_json(value)
    except ValidationError as exc:
        errors = exc.errors(include_input=False, include_url=False)
        if any(e["type"] == "json_invalid" for e in errors):
            raise InvalidRecord("not_json", "value is not JSON") from None
        fields = sorted({".".join(map(str, e["loc"])) or "(root)" for e in errors})
        raise InvalidRecord("schema", f"not a {model.__name__}: "
                            f"{', '.join(fields)}") from None


def kek_record(value: bytes) -> KekRecord:
    return _parsed(KekRecord, value)


def data_key_record(value: bytes) -> DataKeyRecord:
    return _parsed(DataKeyRecord, value)


def marker(value: bytes) -> Marker:
    return _parsed(Marker, value)


def dumps(record: BaseModel) -> bytes:
    return record.model_dump_json(exclude_none=True).encode()


# --- forget markers ---------------------------------------------------------------------


def canonical(tenant: str, user: str, m: Marker) -> bytes:
    """The bytes a marker's ``sig`` covers (layout in the module docstring)."""
    return json.dumps(["forgotten", tenant, user, m.kek, m.at, m.request_id, m.actor,
                       sorted(m.keys)], separators=(",", ":")).encode()


def canonical_master(tenant: str, user: str, m: Marker) -> bytes:
    """The bytes a marker's ``msig`` covers (layout in the module docstring)."""
    return json.dumps(["forgotten/v2", tenant, user, m.master, m.kek, m.at, m.request_id,
                       m.actor, sorted(m.keys)], separators=(",", ":")).encode()


def _mac(kek: bytes, tenant: str, user: str, m: Marker) -> str:
    key = crypto.reader_marker_key(kek, tenant)
    return hmac.new(key, canonical(tenant, user, m), hashlib.sha256).hexdigest()


def _mmac(signing: bytes, tenant: str, user: str, m: Marker) -> str:
    return hmac.new(signing, canonical_master(tenant, user, m), hashlib.sha256).hexdigest()


def signed_marker(kek: bytes, kek_id: str, tenant: str, user: str, *, at: float,
                  request_id: str, actor: str, keys: set[str] | list[str],
                  master: tuple[int, bytes] | None = None) -> Marker:
    """A marker signed for readers (``sig``, the tenant KEK) and, with ``master`` (version,
    :meth:`Keyring.signing` key), for workers (``msig``)."""
    m = Marker(at=at, request_id=request_id, actor=actor, kek=kek_id, keys=sorted(set(keys)))
    return resigned(m, kek, tenant, user, master)


def resigned(m: Marker, kek: bytes, tenant: str, user: str,
             master: tuple[int, bytes] | None) -> Marker:
    """``m`` signed again (its fields unchanged): ``sig`` under ``kek``, ``msig`` under
    ``master`` (version, signing key) when given."""
    if master is not None:
        m = m.model_copy(update={"master": master[0]})
        m = m.model_copy(update={"msig": _mmac(master[1], tenant, user, m)})
    return m.model_copy(update={"sig": _mac(kek, tenant, user, m)})


def marker_verifies(kek: bytes, tenant: str, user: str, m: Marker) -> bool:
    """The reader's check: ``sig`` under the tenant KEK."""
    return m.sig is not None and hmac.compare_digest(m.sig, _mac(kek, tenant, user, m))


def marker_verifies_master(signing: bytes, tenant: str, user: str, m: Marker) -> bool:
    """The worker's check: ``msig`` under the master version's marker key."""
    return m.msig is not None and hmac.compare_digest(m.msig, _mmac(signing, tenant, user, m))


# --- read keys --------------------------------------------------------------------------


def _b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def encode_read_key(tenant: str, keks: dict[str, bytes]) -> str:
    parts = [READ_KEY_PREFIX, _b64(tenant.encode())]
    for kek_id in sorted(keks):
        parts += [kek_id, _b64(keks[kek_id])]
    return ".".join(parts)


def decode_read_keys(text: str) -> dict[str, dict[str, bytes]]:
    """Tenant -> KEK id -> KEK of comma-separated read keys; ConfigError (never the key
    itself in the message) for one that is not a read key."""
    out: dict[str, dict[str, bytes]] = {}
    for n, one in enumerate(p.strip() for p in text.split(",")):
        if not one:
            continue
        parts = one.split(".")
        try:
            if parts[0] != READ_KEY_PREFIX or len(parts) < 4 or len(parts) % 2:
                raise ValueError
            tenant = _unb64(parts[1]).decode()
            keks = {parts[i]: _unb64(parts[i + 1]) for i in range(2, len(parts), 2)}
        except (ValueError, UnicodeDecodeError, binascii.Error):
            raise ConfigError(f"MEMSTREAM_READ_KEYS: entry {n + 1} is not a read key "
                              f"({READ_KEY_PREFIX}.…)") from None
        if not ID_PATTERN.fullmatch(tenant) or any(len(k) != 32 for k in keks.values()):
            raise ConfigError(f"MEMSTREAM_READ_KEYS: entry {n + 1} is not a read key")
        out.setdefault(tenant, {}).update(keks)
    return out


# --- who opens what ---------------------------------------------------------------------


@dataclass
class Keyring:
    """The keys a process holds: master key versions (a worker: every tenant) and tenant
    read keys (a downstream reader: those tenants)."""

    version: int | None = None  # the current master version (new tenant KEKs: under it)
    wrapping: dict[int, bytes] = field(default_factory=dict)  # version -> wrapping key
    legacy: list[bytes] = field(default_factory=list)  # kek_from(each master): old records
    read: dict[str, dict[str, bytes]] = field(default_factory=dict)
    signing: dict[int, bytes] = field(default_factory=dict)  # version -> marker key (msig)
    legacy_markers: bool = False  # workers accept markers without msig (the upgrade)

    @classmethod
    def of(cls, settings: Any) -> Keyring:
        """From the server's ``Settings`` or any object with its key fields (``master_key``,
        ``master_key_version``, ``master_key_previous``, ``forget_markers_legacy``,
        ``read_keys``; one it lacks: unset)."""
        ring = cls()
        masters: dict[int, str] = {}
        master_key = getattr(settings, "master_key", None)
        previous = getattr(settings, "master_key_previous", None)
        read_keys = getattr(settings, "read_keys", None)
        if master_key is not None:
            ring.version = int(getattr(settings, "master_key_version", 1))
            masters[ring.version] = master_key.get_secret_value()
        if previous is not None:
            for n, entry in enumerate(previous.get_secret_value()
                                      .split(",")):
                version, sep, key = entry.strip().partition(":")
                if not sep or not version.isdigit() or int(version) < 1:
                    raise ConfigError(f"MEMSTREAM_MASTER_KEY_PREVIOUS: entry {n + 1} is not "
                                      "<version>:<key>")
                if int(version) == ring.version:
                    raise ConfigError("MEMSTREAM_MASTER_KEY_PREVIOUS names the current "
                                      "version (MEMSTREAM_MASTER_KEY_VERSION)")
                masters.setdefault(int(version), key)
        ring.wrapping = {v: crypto.master_wrapping_key(k, v) for v, k in masters.items()}
        ring.signing = {v: crypto.marker_signing_key(k, v) for v, k in masters.items()}
        ring.legacy_markers = bool(getattr(settings, "forget_markers_legacy", False))
        ring.legacy = [crypto.kek_from(k) for k in masters.values()]
        if read_keys is not None:
            ring.read = decode_read_keys(read_keys.get_secret_value())
        return ring

    @property
    def master(self) -> bool:
        return bool(self.wrapping)

    def covers(self, tenant: str) -> bool:
        """Records of ``tenant`` are this process's business (it can tell forged ones)."""
        return self.master or tenant in self.read

    def marker_key(self) -> tuple[int, bytes]:
        """(current version, its marker key): what new markers are signed with."""
        assert self.version is not None, "signing a marker needs MEMSTREAM_MASTER_KEY"
        return self.version, self.signing[self.version]

    def marker_ok(self, tenant: str, user: str, m: Marker, kek: bytes | None) -> None:
        """Raise InvalidRecord unless this process takes the marker: a worker (a master
        key) by ``msig`` (``sig`` only with ``legacy_markers``), a reader by ``sig``."""
        if m.sig is None and m.msig is None:  # never signed afterwards either
            raise InvalidRecord("unsigned", "forget marker without a signature (legacy, or "
                                "forged: never honoured)")
        if self.master and m.msig is not None:
            signing = self.signing.get(m.master or 0)
            if signing is None:
                raise InvalidRecord("undecryptable", f"forget marker signed under master "
                                    f"version {m.master}, not one this process holds")
            if not marker_verifies_master(signing, tenant, user, m):
                raise InvalidRecord("undecryptable", "forget marker signature does not "
                                    "verify")
            return
        if self.master and not self.legacy_markers:
            raise InvalidRecord("unsigned", "forget marker signed with the tenant key only "
                                "(before workers' marker keys, or forged by a reader): set "
                                "MEMSTREAM_FORGET_MARKERS_LEGACY=true until `memstream keys "
                                "rotate-master` signed it again")
        if kek is None or not marker_verifies(kek, tenant, user, m):
            raise InvalidRecord("undecryptable", "forget marker signature does not verify")

    def unwrap_kek(self, tenant: str, kek_id: str, rec: KekRecord) -> bytes | None:
        """The tenant KEK of a record; None without a master key (a reader has it from
        its read key); InvalidRecord when the version is unknown or it does not open."""
        if not self.master:
            return None
        wrapping = self.wrapping.get(rec.master)
        if wrapping is None:
            raise InvalidRecord("undecryptable", f"tenant key under master version "
                                f"{rec.master}, not one this process holds")
        return crypto.unwrap_kek(wrapping, rec.wrapped, tenant, kek_id, rec.master)

    def unwrap_legacy(self, wrapped: str, tenant: str, user: str, key_id: str) -> bytes:
        for kek in self.legacy:
            try:
                return crypto.unwrap(kek, wrapped, tenant, user, key_id)
            except InvalidRecord:
                continue
        raise InvalidRecord("undecryptable", "legacy data key: no master key here opens it")
