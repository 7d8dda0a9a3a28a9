"""Sealing the public memory event (sealing.envelope.seal_event / open_event): the content
travels sealed with the user's data key, bound to its tenant, user, change id and topic."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from memstream.contract.events import EventLineage, MemoryEvent, MemoryState
from memstream.core.errors import InvalidRecord
from memstream.core.settings import Settings
from memstream.memory.crypto import change_sealing
from memstream.memory.crypto.user_keys import UserKeys
from memstream.sealing import envelope as crypto
from tests.unit.builders import CANARY, change

pytestmark = pytest.mark.unit
T0 = datetime(2026, 1, 1, tzinfo=UTC)


def state(content: str, version: int = 1, status: str = "active") -> MemoryState:
    return MemoryState(version=version, content=content, type="episodic", importance=6,
                       status=status, slot="residence", created_at=T0, updated_at=T0,
                       valid_from=T0)


def event(user: str = "u1", cid: str = "c1") -> MemoryEvent:
    return MemoryEvent(
        change_id=cid, op="update", tenant_id="t1", user_id=user, memory_id="m1", version=2,
        before=state("Lives in Oslo"), after=state(CANARY, 2), reason=f"moved: {CANARY}",
        lineage=EventLineage(kind="extraction", session_id="s1", from_seq=0, to_seq=1,
                             job_id="j1"),
        model="rules", prompt_version="v1", decided_at=T0)


def test_a_sealed_event_keeps_its_ids_and_opens_back():
    key = crypto.new_data_key()
    sealed = crypto.seal_event(event(), "k1", key)
    assert (sealed.before, sealed.after, sealed.reason) == (None, None, "")
    assert sealed.sealed is not None and sealed.sealed.startswith("v1:k1:")
    assert (sealed.change_id, sealed.memory_id, sealed.version, sealed.op) == (
        "c1", "m1", 2, "update")
    assert crypto.sealed_key_id(sealed) == "k1"
    wire = MemoryEvent.model_validate_json(sealed.dumps())
    opened = crypto.open_event(wire, {"k1": key})
    assert opened == event() and opened.sealed is None


def test_the_sealed_wire_form_holds_no_content():
    wire = crypto.seal_event(event(), "k1", crypto.new_data_key()).dumps()
    for text in (CANARY, "Lives in Oslo", "moved", "residence", "episodic"):
        assert text.encode() not in wire, text


def test_two_seals_of_one_event_differ_but_open_alike():
    key = crypto.new_data_key()
    a, b = crypto.seal_event(event(), "k1", key), crypto.seal_event(event(), "k1", key)
    assert a.sealed != b.sealed  # a random nonce each time
    assert crypto.open_event(a, {"k1": key}) == crypto.open_event(b, {"k1": key}) == event()


def test_a_plain_event_opens_as_it_is_and_a_missing_key_gives_none():
    assert crypto.open_event(event(), {}) == event()
    sealed = crypto.seal_event(event(), "k1", crypto.new_data_key())
    assert crypto.open_event(sealed, {}) is None
    assert crypto.open_event(sealed, {"k2": crypto.new_data_key()}) is None


def test_the_wrong_key_under_the_right_id_is_an_invalid_record():
    sealed = crypto.seal_event(event(), "k1", crypto.new_data_key())
    with pytest.raises(InvalidRecord):
        crypto.open_event(sealed, {"k1": crypto.new_data_key()})


@pytest.mark.parametrize("moved", [{"user_id": "u2"}, {"tenant_id": "t2"},
                                   {"change_id": "c2"}], ids=["user", "tenant", "change"])
def test_a_blob_moved_into_another_event_does_not_open(moved):
    key = crypto.new_data_key()
    sealed = crypto.seal_event(event(), "k1", key)
    with pytest.raises(InvalidRecord):
        crypto.open_event(sealed.model_copy(update=moved), {"k1": key})


def test_a_changelog_blob_never_opens_as_an_event_nor_the_reverse():
    key = crypto.new_data_key()
    sealed_change = change_sealing.seal_change(change("u1", "c1"), "k1", key)
    as_event = event().model_copy(update={"before": None, "after": None, "reason": "",
                                          "sealed": sealed_change.sealed})
    with pytest.raises(InvalidRecord):
        crypto.open_event(as_event, {"k1": key})
    sealed_event = crypto.seal_event(event(), "k1", key)
    as_change = sealed_change.model_copy(update={"sealed": sealed_event.sealed})
    with pytest.raises(InvalidRecord):
        change_sealing.open_change(as_change, {"k1": key})


@pytest.mark.parametrize("blob", ["garbage", "v1:k1", "v9:k1:AAAA", "v1:k1:not base64!",
                                  "v1:k1:", "v1:k1:QUJD"])
def test_a_malformed_sealed_field_is_an_invalid_record(blob):
    bad = event().model_copy(update={"sealed": blob})
    with pytest.raises(InvalidRecord):  # not a bare ValueError: a reader skips or dead-letters
        crypto.open_event(bad, {"k1": crypto.new_data_key()})


def test_the_user_keys_opener_opens_events_and_changes_alike(monkeypatch):
    keys = UserKeys(Settings(master_key="a master key of some length"), "keys")
    key = crypto.new_data_key()
    monkeypatch.setattr(keys, "keys_of", lambda tenant, user: {"k1": key})
    open_one = keys.opener()
    assert open_one(crypto.seal_event(event(), "k1", key)) == event()
    assert open_one(change_sealing.seal_change(change(), "k1", key)) == change()


def test_content_that_opens_yet_is_not_an_events_is_an_invalid_record():
    key = crypto.new_data_key()
    e = event()
    token = crypto._enc(key, b'{"after": {"version": "x"}}', crypto._event_aad(e))
    forged = e.model_copy(update={"before": None, "after": None, "sealed": f"v1:k1:{token}"})
    with pytest.raises(InvalidRecord):
        crypto.open_event(forged, {"k1": key})
