"""Per-user envelope encryption of change events (sealing.envelope)."""

from __future__ import annotations

import json

import pytest

from memstream.core.errors import ConfigError, InvalidRecord
from memstream.memory.crypto import change_sealing
from memstream.sealing import envelope as crypto
from memstream.topics.schemas import MemoryChange
from tests.unit.builders import CANARY, change

pytestmark = pytest.mark.unit
def test_a_sealed_change_keeps_no_content_and_opens_back():
    key = crypto.new_data_key()
    sealed = change_sealing.seal_change(change(), "k1", key)
    wire = sealed.dumps()
    assert CANARY.encode() not in wire and b"0.25" not in wire  # embeddings are content
    assert (sealed.memory_id, sealed.version, sealed.lineage.job_id) == ("m1", 1, "j1")
    opened = change_sealing.open_change(MemoryChange.model_validate_json(wire), {"k1": key})
    assert opened is not None and opened.model_dump() == change().model_dump()


def test_a_shredded_key_makes_every_sealed_record_unreadable():
    key = crypto.new_data_key()
    sealed = [change_sealing.seal_change(change(cid=f"c{i}"), "k1", key) for i in range(3)]
    assert [change_sealing.open_change(c, {}) for c in sealed] == [None, None, None]
    assert change_sealing.open_change(change(), {}) == change()  # plain ones stay as they are


def test_a_sealed_blob_does_not_open_in_another_users_record():
    key = crypto.new_data_key()
    sealed = change_sealing.seal_change(change("u1"), "k1", key)
    moved = sealed.model_copy(update={"user_id": "u2"})
    with pytest.raises(InvalidRecord):
        change_sealing.open_change(moved, {"k1": key})


def test_data_keys_are_wrapped_by_the_master_key_and_bound_to_their_user():
    kek = crypto.kek_from("a master key of some length")
    key = crypto.new_data_key()
    wrapped = crypto.wrap(kek, key, "t1", "u1", "k1")
    assert crypto.unwrap(kek, wrapped, "t1", "u1", "k1") == key
    with pytest.raises(InvalidRecord):
        crypto.unwrap(kek, wrapped, "t1", "u2", "k1")
    with pytest.raises(InvalidRecord):
        crypto.unwrap(crypto.kek_from("another master key, longer"), wrapped, "t1", "u1", "k1")
    with pytest.raises(ConfigError):
        crypto.kek_from("short")
    assert key.hex() not in json.dumps(wrapped)
