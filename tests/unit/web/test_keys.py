"""API keys without a broker: minting, signing, the ring's answers, record validation,
decoding."""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import logging
import re
from datetime import UTC, datetime, timedelta, timezone
from types import SimpleNamespace

import pytest
from click.testing import CliRunner
from pydantic import ValidationError

from memstream.cli import main
from memstream.core.errors import ConfigError, InvalidRecord
from memstream.core.settings import Settings
from memstream.web.keys import KeyRecord, KeyRing, decode, new_key, revoke, sign, verify
from memstream.web.keys_topic import KeyFollower, create_key, keys_topic_spec, revoke_key

pytestmark = pytest.mark.unit

NOW = 1_780_000_000.0
ADMIN = "admin-secret-of-the-operator-0123456"
OTHER_ADMIN = "admin-secret-of-another-deployment"


def ring_with(*records: KeyRecord, admin: str | None = ADMIN) -> KeyRing:
    ring = KeyRing(admin_key=admin)
    for r in records:
        ring.apply(r)
    return ring


def test_new_key_format_and_record():
    plaintext, record = new_key("acme", "billing bot", NOW, ADMIN)
    m = re.fullmatch(r"msk_([0-9a-f]{16})_([A-Za-z0-9_-]+)", plaintext)
    assert m is not None, plaintext
    assert m.group(1) == record.key_id
    assert len(m.group(2)) >= 43  # token_urlsafe(32): 32 random bytes
    assert record.sha256 == hashlib.sha256(plaintext.encode()).hexdigest()
    assert plaintext not in record.dumps().decode()
    assert (record.tenant_id, record.label, record.revoked_at) == ("acme", "billing bot", None)
    assert record.created_at == datetime.fromtimestamp(NOW, UTC)


def test_new_keys_differ():
    a, ra = new_key("acme", "", NOW, ADMIN)
    b, rb = new_key("acme", "", NOW, ADMIN)
    assert a != b and ra.key_id != rb.key_id and ra.sha256 != rb.sha256


def test_sha256_is_not_in_repr():
    _, record = new_key("acme", "", NOW, ADMIN)
    assert record.sha256 not in repr(record) and record.sha256 not in str(record)


def test_authorise_ok_binds_tenant():
    key_a, rec_a = new_key("acme", "", NOW, ADMIN)
    key_b, rec_b = new_key("globex", "", NOW, ADMIN)
    ring = ring_with(rec_a, rec_b)
    pa, pb = ring.authorise(key_a), ring.authorise(key_b)
    assert pa is not None and pb is not None
    assert (pa.key_id, pa.tenant_id, pa.admin) == (rec_a.key_id, "acme", False)
    assert (pb.key_id, pb.tenant_id) == (rec_b.key_id, "globex")
    assert pa.may_open("acme") and not pa.may_open("globex")


def test_authorise_wrong_secret():
    key, rec = new_key("acme", "", NOW, ADMIN)
    other, _ = new_key("acme", "", NOW, ADMIN)
    forged = key.rsplit("_", 1)[0] + "_" + other.rsplit("_", 1)[1]
    assert forged != key
    assert ring_with(rec).authorise(forged) is None
    assert ring_with(rec).authorise(key[:-1] + ("A" if key[-1] != "A" else "B")) is None


def test_authorise_unknown_id():
    key, _ = new_key("acme", "", NOW, ADMIN)
    _, other = new_key("acme", "", NOW, ADMIN)
    assert ring_with(other).authorise(key) is None
    assert ring_with().authorise(key) is None


@pytest.mark.parametrize("presented", [
    "", "msk_", "msk__", "Bearer x", "msk_0123456789abcdef", "msk_0123456789ABCDEF_" + "a" * 43,
    "msk_0123456789abcdef_" + "a" * 43 + " ", "msk_0123456789abcdef_" + "é" * 43,
    "\ud800", "x" * 100_000, None, 42, b"msk_0123456789abcdef_" + b"a" * 43,
])
def test_authorise_malformed_is_none_never_raises(presented):
    _, rec = new_key("acme", "", NOW, ADMIN)
    assert ring_with(rec).authorise(presented) is None


def test_authorise_malformed_key_with_known_id():
    key, rec = new_key("acme", "", NOW, ADMIN)
    assert ring_with(rec).authorise(f"msk_{rec.key_id}_short") is None
    assert ring_with(rec).authorise(key.upper()) is None


def test_authorise_revoked():
    key, rec = new_key("acme", "", NOW, ADMIN)
    ring = ring_with(rec)
    assert ring.authorise(key) is not None
    ring.apply(revoke(rec, NOW + 60, ADMIN))
    assert ring.authorise(key) is None
    assert len(ring) == 1  # kept, for audit


def test_revoke_is_idempotent():
    _, rec = new_key("acme", "", NOW, ADMIN)
    first = revoke(rec, NOW + 1, ADMIN)
    assert first.revoked_at == datetime.fromtimestamp(NOW + 1, UTC)
    assert revoke(first, NOW + 99, ADMIN) is first
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
    key, rec = new_key("acme", "first", NOW, ADMIN)
    ring = ring_with(rec)
    revoked = revoke(rec, NOW + 1, ADMIN)
    ring.apply(revoked)
    assert ring.authorise(key) is None
    relabelled = sign(rec.model_copy(update={"label": "again"}), ADMIN)
    ring.apply(relabelled)  # what compaction would keep: the last (signed) record
    assert ring.authorise(key) is not None
    assert [r.label for r in ring.records()] == ["again"]


def test_update_applies_tombstones_and_records():
    key_a, rec_a = new_key("acme", "", NOW, ADMIN)
    key_b, rec_b = new_key("acme", "", NOW + 1, ADMIN)
    ring = ring_with(rec_a)
    ring.update({rec_a.key_id: None, rec_b.key_id: rec_b})
    assert ring.authorise(key_a) is None and ring.authorise(key_b) is not None
    assert [r.key_id for r in ring.records()] == [rec_b.key_id]


def test_records_sorted_by_creation():
    recs = [new_key("acme", str(i), NOW + 10 - i, ADMIN)[1] for i in range(3)]
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
        new_key("no/slash", "", NOW, ADMIN)
    with pytest.raises(ValidationError):
        new_key("acme", "x" * 201, NOW, ADMIN)


def test_naive_datetimes_become_utc():
    rec = KeyRecord(**valid_fields(created_at=datetime(2026, 1, 1)))
    assert rec.created_at.tzinfo is not None


def test_decode_round_trip_and_tombstone():
    _, rec = new_key("acme", "x", NOW, ADMIN)
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
    _, rec = new_key("acme", "", NOW, ADMIN)
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


# --- signatures ----------------------------------------------------------------------


def test_signature_follows_the_documented_layout():
    # Recomputed by hand from the module docstring, as another implementation would.
    tz = timezone(timedelta(hours=2))
    rec = KeyRecord(**valid_fields(label="bot é", revoked_at=datetime(2026, 3, 1, 12, tzinfo=tz)))
    mac_key = hashlib.sha256(b"memstream api-keys v1\x1f" + ADMIN.encode()).digest()
    message = "\x1f".join(["0123456789abcdef", "acme", "a" * 64, "2026-01-01T00:00:00.000000Z",
                           "2026-03-01T10:00:00.000000Z", "bot é"]).encode()
    expected = hmac.new(mac_key, message, hashlib.sha256).hexdigest()
    assert sign(rec, ADMIN).signature == expected
    unrevoked = KeyRecord(**valid_fields())
    message = "\x1f".join(["0123456789abcdef", "acme", "a" * 64, "2026-01-01T00:00:00.000000Z",
                           "", ""]).encode()
    assert sign(unrevoked, ADMIN).signature == hmac.new(mac_key, message,
                                                        hashlib.sha256).hexdigest()


def test_new_key_and_revoke_are_signed_and_survive_the_topic():
    _, rec = new_key("acme", "bot", NOW + 0.123456, ADMIN)
    revoked = revoke(rec, NOW + 60.5, ADMIN)
    for r in (rec, revoked):
        assert re.fullmatch(r"[0-9a-f]{64}", r.signature)
        assert verify(r, ADMIN) and not verify(r, OTHER_ADMIN) and not verify(r, None)
        _, decoded = decode(r.key_id.encode(), r.dumps())
        assert decoded is not None and verify(decoded, ADMIN)
    assert revoked.signature != rec.signature
    assert rec.signature not in repr(rec) and ADMIN not in rec.dumps().decode()


def test_minting_and_revoking_need_the_admin_key():
    _, rec = new_key("acme", "", NOW, ADMIN)
    with pytest.raises(ConfigError, match="MEMSTREAM_ADMIN_KEY"):
        new_key("acme", "", NOW, "")
    with pytest.raises(ConfigError, match="MEMSTREAM_ADMIN_KEY"):
        revoke(rec, NOW, "")


def own_key_for(tenant_id: str, signature: str) -> tuple[str, KeyRecord]:
    """What an attacker with produce rights writes: their own key, the victim tenant."""
    plaintext = "msk_00000000000000aa_" + "s" * 43
    return plaintext, KeyRecord(key_id="00000000000000aa", tenant_id=tenant_id,
                                sha256=hashlib.sha256(plaintext.encode()).hexdigest(),
                                created_at=datetime.fromtimestamp(NOW, UTC),
                                signature=signature)


@pytest.mark.parametrize("how", ["missing", "garbage", "other_admin", "copied"])
def test_forged_record_is_rejected_and_never_authorises(how):
    _, genuine = new_key("acme", "", NOW, ADMIN)
    plaintext, forged = own_key_for("globex", "")
    forged = {
        "missing": forged,
        "garbage": forged.model_copy(update={"signature": "0" * 64}),
        "other_admin": sign(forged, OTHER_ADMIN),
        "copied": forged.model_copy(update={"signature": genuine.signature}),
    }[how]
    _, forged = decode(forged.key_id.encode(), forged.dumps())  # as it comes off the topic
    assert forged is not None and not verify(forged, ADMIN)
    ring = ring_with(genuine)
    ring.apply(forged)
    assert ring.authorise(plaintext) is None
    assert ring.get(forged.key_id) is None and len(ring) == 1 and ring.rejected == 1


def test_tampered_fields_are_rejected():
    key, rec = new_key("acme", "", NOW, ADMIN)
    ring = ring_with()
    ring.apply(rec.model_copy(update={"tenant_id": "globex"}))
    ring.apply(rec.model_copy(update={"label": "renamed"}))
    assert ring.authorise(key) is None and len(ring) == 0 and ring.rejected == 2
    # Un-revoking by dropping revoked_at from a signed revocation does not verify either.
    ring.apply(rec)
    revoked = revoke(rec, NOW + 1, ADMIN)
    ring.apply(revoked)
    ring.apply(revoked.model_copy(update={"revoked_at": None}))
    assert ring.authorise(key) is None and ring.get(rec.key_id) == revoked


def test_forged_record_does_not_displace_the_real_one():
    key, rec = new_key("acme", "", NOW, ADMIN)
    ring = ring_with(rec)
    mine = "msk_" + rec.key_id + "_" + "m" * 43
    forged = rec.model_copy(update={"sha256": hashlib.sha256(mine.encode()).hexdigest()})
    ring.update({rec.key_id: forged})
    assert ring.authorise(mine) is None
    principal = ring.authorise(key)
    assert principal is not None and principal.tenant_id == "acme"


@pytest.mark.parametrize("admin", [None, ""])
def test_ring_without_admin_key_authorises_no_tenant_key(admin, caplog):
    made = [new_key("acme", "", NOW, ADMIN) for _ in range(3)]
    with caplog.at_level(logging.WARNING, logger="memstream.web.keys"):
        ring = ring_with(*(rec for _, rec in made), admin=admin)
    assert all(ring.authorise(key) is None for key, _ in made)
    assert len(ring) == 0 and ring.rejected == 3
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 1 and "MEMSTREAM_ADMIN_KEY" in warnings[0], warnings


def test_rejections_are_logged_once_per_key_id_without_values(caplog):
    _, rec = new_key("acme", "label-x", NOW, ADMIN)
    forged = sign(rec.model_copy(update={"tenant_id": "globex"}), OTHER_ADMIN)
    ring = ring_with()
    with caplog.at_level(logging.WARNING, logger="memstream.web.keys"):
        for _ in range(3):
            ring.apply(forged)
        ring.apply(rec.model_copy(update={"key_id": "fedcba9876543210", "signature": ""}))
    messages = [r.getMessage() for r in caplog.records]
    assert len(messages) == 2 and ring.rejected == 4
    assert rec.key_id in messages[0] and "fedcba9876543210" in messages[1]
    for value in (rec.sha256, forged.signature, "globex", "label-x", ADMIN):
        assert not any(value in m for m in messages)


def test_a_forged_tombstone_only_denies():
    key, rec = new_key("acme", "", NOW, ADMIN)
    ring = ring_with(rec)
    ring.update({rec.key_id: None})  # unsigned by nature: removing can only deny
    assert ring.authorise(key) is None and len(ring) == 0 and ring.rejected == 0


def test_revoke_re_signs_a_forged_revocation():
    # A record someone else wrote as "already revoked" must not make the operator's revoke
    # a no-op: it is revoked afresh, signed, at the operator's time.
    _, rec = new_key("acme", "", NOW, ADMIN)
    fake = rec.model_copy(update={"revoked_at": datetime.fromtimestamp(NOW, UTC),
                                  "signature": ""})
    done = revoke(fake, NOW + 5, ADMIN)
    assert done is not fake and verify(done, ADMIN)
    assert done.revoked_at == datetime.fromtimestamp(NOW + 5, UTC)


def test_follower_keeps_a_revocation_that_a_forgery_follows_in_one_batch():
    # Without the check before batching, a forged record right after the revocation would
    # replace it in the batch, be skipped by the ring, and leave the key live.
    key, rec = new_key("acme", "", NOW, ADMIN)
    ring = ring_with(rec)
    follower = KeyFollower(ring, Settings(bootstrap_servers="127.0.0.1:1"), "p.api-keys")
    revoked = revoke(rec, NOW + 1, ADMIN)
    forged = rec.model_copy(update={"label": "forged"})  # unrevoked, old signature
    changes: dict[str, KeyRecord | None] = {}
    for offset, r in enumerate((revoked, forged)):
        follower._take(SimpleNamespace(topic="p.api-keys", partition=0, offset=offset,
                                       key=r.key_id.encode(), value=r.dumps()), changes)
    ring.update(changes)
    assert ring.authorise(key) is None and ring.get(rec.key_id) == revoked
    assert ring.rejected == 1


@pytest.mark.parametrize("admin", [None, ""])
def test_admin_helpers_need_the_admin_key_before_the_broker(admin):
    s = Settings(bootstrap_servers="127.0.0.1:1", admin_key=admin)
    with pytest.raises(ConfigError, match="MEMSTREAM_ADMIN_KEY"):
        asyncio.run(create_key(s, "acme", ""))
    with pytest.raises(ConfigError, match="MEMSTREAM_ADMIN_KEY"):
        asyncio.run(revoke_key(s, "0123456789abcdef"))


@pytest.mark.parametrize("args", [["keys", "create", "--tenant", "acme"],
                                  ["keys", "revoke", "0123456789abcdef"]])
def test_cli_without_admin_key_is_a_clean_error(args, monkeypatch):
    monkeypatch.delenv("MEMSTREAM_ADMIN_KEY", raising=False)
    monkeypatch.setenv("MEMSTREAM_BOOTSTRAP_SERVERS", "127.0.0.1:1")
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 1 and "MEMSTREAM_ADMIN_KEY" in result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)
