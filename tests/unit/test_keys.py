"""API keys without a broker: minting, the ring's answers, record validation, decoding."""

from __future__ import annotations

import hashlib
import json
import re
from datetime import UTC, datetime

import pytest
from pydantic import ValidationError

from memstream.errors import InvalidRecord
from memstream.keys import KeyRecord, KeyRing, decode, new_key, revoke
from memstream.keys_topic import keys_topic_spec
from memstream.settings import Settings

pytestmark = pytest.mark.unit

NOW = 1_780_000_000.0
ADMIN = "admin-secret-of-the-operator"


def ring_with(*records: KeyRecord, admin: str | None = ADMIN) -> KeyRing:
    ring = KeyRing(admin_key=admin)
    for r in records:
        ring.apply(r)
    return ring


def test_new_key_format_and_record():
    plaintext, record = new_key("acme", "billing bot", NOW)
    m = re.fullmatch(r"msk_([0-9a-f]{16})_([A-Za-z0-9_-]+)", plaintext)
    assert m is not None, plaintext
    assert m.group(1) == record.key_id
    assert len(m.group(2)) >= 43  # token_urlsafe(32): 32 random bytes
    assert record.sha256 == hashlib.sha256(plaintext.encode()).hexdigest()
    assert plaintext not in record.dumps().decode()
    assert (record.tenant_id, record.label, record.revoked_at) == ("acme", "billing bot", None)
    assert record.created_at == datetime.fromtimestamp(NOW, UTC)


def test_new_keys_differ():
    a, ra = new_key("acme", "", NOW)
    b, rb = new_key("acme", "", NOW)
    assert a != b and ra.key_id != rb.key_id and ra.sha256 != rb.sha256


def test_sha256_is_not_in_repr():
    _, record = new_key("acme", "", NOW)
    assert record.sha256 not in repr(record) and record.sha256 not in str(record)


def test_authorise_ok_binds_tenant():
    key_a, rec_a = new_key("acme", "", NOW)
    key_b, rec_b = new_key("globex", "", NOW)
    ring = ring_with(rec_a, rec_b)
    pa, pb = ring.authorise(key_a), ring.authorise(key_b)
    assert pa is not None and pb is not None
    assert (pa.key_id, pa.tenant_id, pa.admin) == (rec_a.key_id, "acme", False)
    assert (pb.key_id, pb.tenant_id) == (rec_b.key_id, "globex")
    assert pa.may_open("acme") and not pa.may_open("globex")


def test_authorise_wrong_secret():
    key, rec = new_key("acme", "", NOW)
    other, _ = new_key("acme", "", NOW)
    forged = key.rsplit("_", 1)[0] + "_" + other.rsplit("_", 1)[1]
    assert forged != key
    assert ring_with(rec).authorise(forged) is None
    assert ring_with(rec).authorise(key[:-1] + ("A" if key[-1] != "A" else "B")) is None


def test_authorise_unknown_id():
    key, _ = new_key("acme", "", NOW)
    _, other = new_key("acme", "", NOW)
    assert ring_with(other).authorise(key) is None
    assert ring_with().authorise(key) is None


@pytest.mark.parametrize("presented", [
    "", "msk_", "msk__", "Bearer x", "msk_0123456789abcdef", "msk_0123456789ABCDEF_" + "a" * 43,
    "msk_0123456789abcdef_" + "a" * 43 + " ", "msk_0123456789abcdef_" + "é" * 43,
    "\ud800", "x" * 100_000, None, 42, b"msk_0123456789abcdef_" + b"a" * 43,
])
def test_authorise_malformed_is_none_never_raises(presented):
    _, rec = new_key("acme", "", NOW)
    assert ring_with(rec).authorise(presented) is None


def test_authorise_malformed_key_with_known_id():
    key, rec = new_key("acme", "", NOW)
    assert ring_with(rec).authorise(f"msk_{rec.key_id}_short") is None
    assert ring_with(rec).authorise(key.upper()) is None


def test_authorise_revoked():
    key, rec = new_key("acme", "", NOW)
    ring = ring_with(rec)
    assert ring.authorise(key) is not None
    ring.apply(revoke(rec, NOW + 60))
    assert ring.authorise(key) is None
    assert len(ring) == 1  # kept, for audit


def test_revoke_is_idempotent():
    _, rec = new_key("acme", "", NOW)
    first = revoke(rec, NOW + 1)
    assert first.revoked_at == datetime.fromtimestamp(NOW + 1, UTC)
    assert revoke(first, NOW + 99) is first
    assert rec.revoked_at is None  # frozen: a new record, the old one unchanged


def test_admin_key():
    p = ring_with().authorise(ADMIN)
    assert p is not None and p.admin and p.key_id == "admin" and p.tenant_id is None
    assert p.may_open("anyone")
    assert ring_with().authorise(ADMIN + "x") is None
    assert ring_with().authorise(ADMIN[:-1]) is None


@pytest.mark.parametrize("admin", [None, ""])
def test_no_admin_key_opens_nothing(admin):
    ring = ring_with(admin=admin)
    assert ring.authorise("") is None
    assert ring.authorise(ADMIN) is None
    assert ring.authorise("admin") is None


def test_admin_from_settings():
    ring = KeyRing.for_settings(Settings(admin_key=ADMIN))
    assert ring.authorise(ADMIN) is not None
    assert KeyRing.for_settings(Settings(admin_key=None)).authorise(ADMIN) is None


def test_last_record_wins_also_unrevoking():
    key, rec = new_key("acme", "first", NOW)
    ring = ring_with(rec)
    revoked = revoke(rec, NOW + 1)
    ring.apply(revoked)
    assert ring.authorise(key) is None
    relabelled = rec.model_copy(update={"label": "again"})
    ring.apply(relabelled)  # what compaction would keep: the last record
    assert ring.authorise(key) is not None
    assert [r.label for r in ring.records()] == ["again"]


def test_update_applies_tombstones_and_records():
    key_a, rec_a = new_key("acme", "", NOW)
    key_b, rec_b = new_key("acme", "", NOW + 1)
    ring = ring_with(rec_a)
    ring.update({rec_a.key_id: None, rec_b.key_id: rec_b})
    assert ring.authorise(key_a) is None and ring.authorise(key_b) is not None
    assert [r.key_id for r in ring.records()] == [rec_b.key_id]


def test_records_sorted_by_creation():
    recs = [new_key("acme", str(i), NOW + 10 - i)[1] for i in range(3)]
    assert [r.label for r in ring_with(*recs).records()] == ["2", "1", "0"]


def valid_fields(**over: object) -> dict[str, object]:
    base: dict[str, object] = {
        "key_id": "0123456789abcdef", "tenant_id": "acme", "sha256": "a" * 64,
        "label": "", "created_at": datetime(2026, 1, 1, tzinfo=UTC)}
    return {**base, **over}


def test_key_record_accepts_valid():
    rec = KeyRecord(**valid_fields())
    assert rec.schema_version == 1 and rec.revoked_at is None


@pytest.mark.parametrize("field, value", [
    ("tenant_id", "a/b"), ("tenant_id", ""), ("tenant_id", "has space"), ("tenant_id", "-x"),
    ("tenant_id", "x" * 129), ("key_id", "0123456789ABCDEF"), ("key_id", "0123"),
    ("key_id", "admin"), ("sha256", "a" * 63), ("sha256", "G" * 64), ("label", "x" * 201),
    ("label", "bell\x07"), ("schema_version", 2),
])
def test_key_record_rejects(field, value):
    with pytest.raises(ValidationError):
        KeyRecord(**valid_fields(**{field: value}))


def test_new_key_validates_tenant_and_label():
    with pytest.raises(ValidationError):
        new_key("no/slash", "", NOW)
    with pytest.raises(ValidationError):
        new_key("acme", "x" * 201, NOW)


def test_naive_datetimes_become_utc():
    rec = KeyRecord(**valid_fields(created_at=datetime(2026, 1, 1)))
    assert rec.created_at.tzinfo is not None


def test_decode_round_trip_and_tombstone():
    _, rec = new_key("acme", "x", NOW)
    assert decode(rec.key_id.encode(), rec.dumps()) == (rec.key_id, rec)
    assert decode(rec.key_id.encode(), None) == (rec.key_id, None)


@pytest.mark.parametrize("key, value, kind", [
    (None, b"{}", "key"), (b"not-an-id", b"{}", "key"),
    (b"0123456789abcdef", b"not json", "not_json"), (b"0123456789abcdef", b"", "not_json"),
    (b"0123456789abcdef", b"[1]", "schema"), (b"0123456789abcdef", b"{}", "schema"),
])
def test_decode_rejects(key, value, kind):
    with pytest.raises(InvalidRecord) as info:
        decode(key, value)
    assert info.value.kind == kind


def test_decode_rejects_key_mismatch_and_never_echoes_the_hash():
    _, rec = new_key("acme", "", NOW)
    with pytest.raises(InvalidRecord) as info:
        decode(b"fedcba9876543210", rec.dumps())
    assert info.value.kind == "key"
    body = json.loads(rec.dumps())
    body["sha256"] = body["sha256"][:-1]  # invalid: 63 hex digits, still hash material
    with pytest.raises(InvalidRecord) as info:
        decode(rec.key_id.encode(), json.dumps(body).encode())
    assert info.value.kind == "schema" and "sha256" in str(info.value)
    assert body["sha256"] not in str(info.value)
    assert info.value.__cause__ is None and info.value.__suppress_context__


def test_keys_topic_spec():
    spec = keys_topic_spec(Settings(topic_prefix="p"))
    assert spec.name == "p.api-keys" and spec.schema is KeyRecord
    assert (spec.partitions, spec.retention_ms, spec.cleanup_policy, spec.co_partitioned) == (
        1, -1, "compact", False)
    assert spec.config()["cleanup.policy"] == "compact"
