"""Records that carry authority: the MAC header (core.record_auth) and where its keys come
from (core.record_keys)."""

from __future__ import annotations

import logging
import stat
from typing import Any

import pytest

from memstream.core import record_auth, record_keys
from memstream.core.cluster_auth import key_for, sign
from memstream.core.record_auth import HEADER, RecordKeys, header, key_id, refusal, role_of
from memstream.core.settings import Settings

pytestmark = pytest.mark.unit
SECRET = "a-cluster-secret-of-at-least-32-characters"
OTHER = "another-cluster-secret-of-32-characters!!"
ROLE, KEY, VALUE = "tool-requests", b"acme/u1", b'{"request_id": "r1"}'


def test_a_signed_record_verifies_and_the_layout_is_the_documented_one():
    keys = RecordKeys.of(SECRET)
    name, value = header(keys, ROLE, KEY, VALUE)
    assert name == HEADER
    k = key_for(SECRET, "record")
    expected = f"v1.{key_id(k)}.{sign(k, ROLE, '1', KEY, '1', VALUE)}"
    assert value.decode() == expected
    assert refusal(keys, ROLE, KEY, VALUE, [("other", b"x"), (name, value)]) is None


@pytest.mark.parametrize("change", ["role", "key", "value", "no key", "no value", "secret"])
def test_a_mac_binds_the_role_the_key_the_value_and_the_secret(change):
    keys = RecordKeys.of(SECRET)
    headers = [header(keys, ROLE, KEY, VALUE)]
    role, key, value, reader = ROLE, KEY, VALUE, keys
    if change == "role":  # moved to another topic that carries authority
        role = "job-results"
    elif change == "key":  # another user
        key = b"acme/u2"
    elif change == "value":
        value = VALUE.replace(b"r1", b"r2")
    elif change == "no key":
        key = None
    elif change == "no value":
        value = None
    else:
        reader = RecordKeys.of(OTHER)
    why = refusal(reader, role, key, value, headers)
    assert why is not None and why.startswith("unauthenticated record")


def test_none_and_empty_are_told_apart():
    keys = RecordKeys.of(SECRET)
    signed = [header(keys, ROLE, None, b"")]
    assert refusal(keys, ROLE, b"", b"", signed) is not None
    assert refusal(keys, ROLE, None, b"", signed) is None


@pytest.mark.parametrize("headers, reason", [
    (None, "no MAC"),
    ([], "no MAC"),
    ([(HEADER, b"v2.abc.def")], "malformed MAC"),
    ([(HEADER, b"\xff\xfe")], "malformed MAC"),
    ([(HEADER, b"v1..")], "malformed MAC"),
    ([(HEADER, b"v1.deadbeef.00")], "does not hold"),
])
def test_a_missing_or_malformed_mac_is_refused_with_a_reason(headers, reason):
    why = refusal(RecordKeys.of(SECRET), ROLE, KEY, VALUE, headers)
    assert why is not None and reason in why


def test_two_mac_headers_are_refused():
    keys = RecordKeys.of(SECRET)
    good = header(keys, ROLE, KEY, VALUE)
    assert "more than one" in (refusal(keys, ROLE, KEY, VALUE, [good, good]) or "")


def test_a_reader_without_keys_refuses_everything():
    signed = [header(RecordKeys.of(SECRET), ROLE, KEY, VALUE)]
    assert refusal(RecordKeys(), ROLE, KEY, VALUE, signed) is not None
    with pytest.raises(ValueError):
        header(RecordKeys(), ROLE, KEY, VALUE)


def test_rotation_signs_with_the_new_secret_and_still_verifies_the_previous():
    before = RecordKeys.of(OTHER)
    during = RecordKeys.of(SECRET, OTHER)
    old = [header(before, ROLE, KEY, VALUE)]
    new = [header(during, ROLE, KEY, VALUE)]
    assert refusal(during, ROLE, KEY, VALUE, old) is None
    assert refusal(during, ROLE, KEY, VALUE, new) is None
    assert new == [header(RecordKeys.of(SECRET), ROLE, KEY, VALUE)]
    assert refusal(RecordKeys.of(SECRET), ROLE, KEY, VALUE, old) is not None  # after it


def test_keys_never_show_in_their_repr():
    keys = RecordKeys.of(SECRET)
    assert keys.signing is not None
    assert keys.signing[1].hex() not in repr(keys) and SECRET not in repr(keys)


@pytest.mark.parametrize("topic, role", [
    ("memstream.tool-requests", "tool-requests"),
    ("memstream.extraction-jobs", "extraction-jobs"),
    ("memstream.job-results", "job-results"),
    ("memstream.decisions", "decisions"),
    ("memstream.messages", None),
    ("memstream.ingest-repartition", None),
    ("other.tool-requests", None),
    ("memstream.tool-requests.x", None),
])
def test_roles_are_the_registry_names_of_the_signed_topics(topic, role):
    assert role_of(topic, "memstream") == role


def test_every_signed_role_is_a_registry_topic():
    from memstream.topics.registry import registry

    names = {t.name for t in registry(Settings()).all()}
    assert {f"memstream.{r}" for r in record_auth.SIGNED_ROLES} <= names


# --- where the keys come from -------------------------------------------------------------

def test_a_single_worker_generates_its_secret_once_and_keeps_it_private(tmp_path, caplog):
    s = Settings(data_dir=tmp_path / "d")
    assert record_keys.keys_for(s).signing is None  # nothing yet: a client signs nothing
    with caplog.at_level(logging.INFO, logger="memstream.core.record_keys"):
        first = record_keys.provide(s)
    path = tmp_path / "d" / "record-secret"
    secret = path.read_text().strip()
    assert len(secret) == 64 and stat.S_IMODE(path.stat().st_mode) == 0o600
    assert str(path) in caplog.text and secret not in caplog.text  # the path, never it
    assert record_keys.provide(s) == first == RecordKeys.of(secret)  # kept: same keys
    assert record_keys.keys_for(Settings(data_dir=tmp_path / "d")) == first  # tools too
    assert not list((tmp_path / "d").glob(".record-secret*"))  # no temporary file left


def test_the_cluster_secret_wins_and_no_file_is_made(tmp_path):
    s = Settings(data_dir=tmp_path, cluster_secret=SECRET, cluster_secret_previous=OTHER)
    keys = record_keys.provide(s)
    assert keys == RecordKeys.of(SECRET, OTHER)
    assert not (tmp_path / "record-secret").exists()


def test_a_short_previous_secret_is_refused():
    with pytest.raises(ValueError, match="CLUSTER_SECRET_PREVIOUS"):
        Settings(cluster_secret_previous="short")


# --- every producer memstream builds signs (core.kafka) -------------------------------------

async def test_the_client_factorys_producers_sign_the_topics_that_carry_authority(
        tmp_path, monkeypatch):
    from aiokafka import AIOKafkaProducer

    from memstream.core import kafka

    sent: list[tuple[str, bytes | None, bytes | None, Any]] = []

    async def send(self: Any, topic: str, value: Any = None, key: Any = None,
                   partition: Any = None, timestamp_ms: Any = None, headers: Any = None) -> None:
        sent.append((topic, key, value, headers))

    monkeypatch.setattr(AIOKafkaProducer, "send", send)
    producer = kafka.producer(Settings(data_dir=tmp_path, cluster_secret=SECRET))
    await producer.send("memstream.tool-requests", b"v", key=b"acme/u1")
    await producer.send("memstream.decisions", b"v", key=b"acme/u1",
                        headers=[("h", b"1"), (HEADER, b"v1.forged.00")])
    await producer.send("memstream.messages", b"v", key=b"acme/u1", headers=[("h", b"1")])
    keys = RecordKeys.of(SECRET)
    assert sent[0][3] == [header(keys, "tool-requests", b"acme/u1", b"v")]
    assert sent[1][3] == [("h", b"1"), header(keys, "decisions", b"acme/u1", b"v")]
    assert sent[2][3] == [("h", b"1")]  # a chat message carries no MAC
    with pytest.raises(TypeError):
        await producer.send("memstream.job-results", {"not": "bytes"}, key=b"acme/u1")
    keyless = kafka.producer(Settings(data_dir=tmp_path / "none"))  # another Kafka client
    await keyless.send("memstream.tool-requests", b"v", key=b"acme/u1")
    assert sent[-1][3] is None  # signs nothing: the worker refuses it
    assert not (tmp_path / "none").exists()  # and makes no secret of its own
    copier = kafka.producer(Settings(data_dir=tmp_path, cluster_secret=SECRET), sign=False)
    await copier.send("memstream.tool-requests", b"v", key=b"acme/u1")  # topics grow
    assert sent[-1][3] is None  # a copy keeps what it was written with: never signed anew
