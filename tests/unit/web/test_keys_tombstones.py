"""Tombstones of the api-keys topic are signed (web.keys_topic): one that does not verify
removes no key, is counted and dead-lettered without its value; so is a forged record."""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
from types import SimpleNamespace

import pytest

from memstream.core.settings import Settings
from memstream.web.keys import KeyRecord, KeyRing, new_key, signing_key
from memstream.web.keys_topic import SIG_HEADER, KeyFollower, tombstone_mac

pytestmark = pytest.mark.unit
NOW = 1_780_000_000.0
ADMIN = "admin-secret-of-the-operator-0123456"
OTHER_ADMIN = "admin-secret-of-another-deployment"
TOPIC = "p.api-keys"


def follower(*records: KeyRecord) -> KeyFollower:
    ring = KeyRing(admin_key=ADMIN)
    for r in records:
        ring.apply(r)
    settings = Settings(bootstrap_servers="127.0.0.1:1", admin_key=ADMIN)
    return KeyFollower(ring, settings, TOPIC, dead_letters="p.dead-letters")


def consumed(key_id: str, value: bytes | None, headers=(), offset: int = 7):
    return SimpleNamespace(topic=TOPIC, partition=0, offset=offset, key=key_id.encode(),
                           value=value, headers=tuple(headers))


def feed(f: KeyFollower, *records) -> None:
    changes: dict[str, KeyRecord | None] = {}
    for r in records:
        f._take(r, changes)
    f.ring.update(changes)


def test_the_tombstone_mac_follows_the_documented_layout():
    want = hmac.new(hashlib.sha256(b"memstream api-keys v1\x1f" + ADMIN.encode()).digest(),
                    b"api-keys\x1ftombstone\x1f0123456789abcdef", hashlib.sha256).hexdigest()
    assert tombstone_mac(ADMIN, "0123456789abcdef") == want
    assert signing_key(ADMIN) != signing_key(OTHER_ADMIN)


@pytest.mark.parametrize("headers_of", [
    lambda key_id: [],  # unsigned: what any producer could write
    lambda key_id: [(SIG_HEADER, b"00" * 32)],
    lambda key_id: [(SIG_HEADER, tombstone_mac(OTHER_ADMIN, key_id).encode())],
    lambda key_id: [(SIG_HEADER, tombstone_mac(ADMIN, "fedcba9876543210").encode())],
    lambda key_id: [("other", tombstone_mac(ADMIN, key_id).encode())],
], ids=["unsigned", "garbage", "other-admin", "other-key", "other-header"])
def test_a_tombstone_that_does_not_verify_removes_nothing_and_is_a_dead_letter(headers_of):
    key, record = new_key("acme", "", NOW, ADMIN)
    f = follower(record)
    headers = headers_of(record.key_id)
    feed(f, consumed(record.key_id, None, headers))
    assert f.ring.authorise(key) is not None and len(f.ring) == 1
    assert f.rejected == {"unsigned": 1}
    (dead_key, letter), = f._dead
    got = json.loads(letter)
    assert dead_key == record.key_id.encode() and got["value_b64"] == ""
    assert (got["source_topic"], got["offset"], got["kind"]) == (TOPIC, 7, "unsigned")


def test_a_signed_tombstone_removes_the_key():
    key, record = new_key("acme", "", NOW, ADMIN)
    f = follower(record)
    feed(f, consumed(record.key_id, None,
                     [(SIG_HEADER, tombstone_mac(ADMIN, record.key_id).encode())]))
    assert f.ring.authorise(key) is None and len(f.ring) == 0
    assert f.rejected == {} and f._dead == []


def test_a_forged_record_is_a_dead_letter_without_its_value():
    _, real = new_key("acme", "", NOW, ADMIN)
    forged = real.model_copy(update={"tenant_id": "globex"})  # the old signature
    f = follower(real)
    feed(f, consumed(real.key_id, forged.dumps()))
    assert f.ring.get(real.key_id) == real and f.rejected == {"unsigned": 1}
    (_, letter), = f._dead
    got = json.loads(letter)
    assert got["value_b64"] == "" and real.sha256 not in letter.decode()


def test_dead_letters_are_sent_to_their_topic():
    sent: list = []

    class Producer:
        async def send_and_wait(self, topic, key, value):
            sent.append((topic, key, value))

    _, record = new_key("acme", "", NOW, ADMIN)
    f = follower(record)
    feed(f, consumed(record.key_id, None))
    f._producer = Producer()  # type: ignore[assignment]
    asyncio.run(f._send_dead())
    assert [(t, k) for t, k, _ in sent] == [("p.dead-letters", record.key_id.encode())]
    assert f._dead == []
