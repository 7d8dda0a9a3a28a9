"""A change event's vector on the wire (topics.schemas.Vector): written packed (base64 of
little-endian float32) by ``dumps``, read packed or as the JSON list of floats the events
written before 2026-12-02 carry, the same float32 values either way; ``MemoryChange.vector``
stays a ``list[float]``; one change, one payload: the same bytes however it was read."""

from __future__ import annotations

import base64
import json
import math
import random
import struct
from array import array

import pytest

from memstream.core.errors import InvalidRecord
from memstream.memory.crypto import change_sealing
from memstream.sealing import envelope as crypto
from memstream.topics.codec import decode, decode_own
from memstream.topics.schemas import (
    JobDecision,
    JobStatus,
    MemoryChange,
    pack_vector,
    unpack_vector,
)
from tests.unit.builders import change

pytestmark = pytest.mark.unit
KEY = b"t1/u1"


def float32(values: list[float]) -> list[float]:
    return array("f", values).tolist()


def embedding(dim: int = 64, seed: int = 3) -> list[float]:
    """What an embedder gives: float64 values, none of them a float32."""
    rng = random.Random(seed)
    raw = [rng.gauss(0, 1) for _ in range(dim)]
    norm = math.sqrt(sum(x * x for x in raw))
    return [x / norm for x in raw]


def with_vector(vector: list[float] | None) -> MemoryChange:
    return MemoryChange.model_validate({**change().model_dump(), "vector": vector})


def old_wire(c: MemoryChange, vector: list[float] | None) -> bytes:
    """The event as written before packing: the vector a JSON list of (float64) floats."""
    return json.dumps({**json.loads(c.model_dump_json()), "vector": vector}).encode()


def test_an_event_with_the_old_float_list_still_decodes():
    vec = embedding()
    raw = old_wire(change(), vec)
    assert isinstance(json.loads(raw)["vector"], list)
    for read in (decode_own(MemoryChange, raw), decode(MemoryChange, raw, KEY),
                 MemoryChange.model_validate_json(raw),
                 MemoryChange.model_validate(json.loads(raw))):
        assert isinstance(read.vector, list) and all(type(x) is float for x in read.vector)
        assert read.vector == float32(vec)  # what Edge kept of it then, and keeps now
    assert decode_own(MemoryChange, old_wire(change(), None)).vector is None


def test_the_new_form_is_packed_little_endian_float32_and_round_trips():
    vec = embedding()
    c = with_vector(vec)
    assert c.vector == float32(vec)  # float32 from the start: what the topic carries
    wire = c.dumps()
    packed = json.loads(wire)["vector"]
    assert isinstance(packed, str) and len(wire) < len(old_wire(c, vec)) / 2
    raw = base64.b64decode(packed, validate=True)
    assert list(struct.unpack(f"<{len(vec)}f", raw)) == c.vector
    for read in (decode_own(MemoryChange, wire), decode(MemoryChange, wire, KEY)):
        assert read == c and read.vector == c.vector
        assert read.dumps() == wire
    assert pack_vector([1.0, -0.5]) == "AACAPwAAAL8="  # the format, pinned
    assert unpack_vector("AACAPwAAAL8=") == [1.0, -0.5]
    assert pack_vector([]) == "" and unpack_vector("") == []


def test_serialization_is_deterministic_whichever_form_was_read():
    vec = embedding(seed=11)
    built = with_vector(vec)
    from_old = decode_own(MemoryChange, old_wire(built, vec))
    from_new = decode_own(MemoryChange, built.dumps())
    assert built.dumps() == built.dumps() == from_old.dumps() == from_new.dumps()
    # plain model_dump_json (no wire context) still writes the floats, the same ones
    assert json.loads(built.model_dump_json())["vector"] == built.vector
    # a store keeps the published events as text; parsed back, they dump to the same bytes
    kept = built.dumps().decode()
    assert MemoryChange.model_validate_json(kept).dumps() == built.dumps()


def test_a_decision_carries_its_changes_packed():
    c = with_vector(embedding())
    d = JobDecision(job_id="j1", seq=1, tenant_id="t1", user_id="u1", session_id="s1",
                    from_seq=0, to_seq=1, status=JobStatus.DONE, changes=[c, c])
    wire = d.dumps()
    assert all(isinstance(x["vector"], str) for x in json.loads(wire)["changes"])
    read = decode(JobDecision, wire, KEY)
    assert read.changes == [c, c] and read.dumps() == wire


def _packed_floats(*values: float) -> str:
    return base64.b64encode(struct.pack(f"<{len(values)}f", *values)).decode()


@pytest.mark.parametrize("vector", [
    "not base64 at all!",
    "AAA",  # not padded base64
    "AAAAAAA=",  # 5 bytes: not float32 values
    _packed_floats(1.0, float("nan")),
    _packed_floats(float("inf"), 0.0),
    [1.0, 1e39],  # beyond float32
    [1.0, "x"],
    {"a": 1.0},
    5,
])
def test_a_bad_vector_is_refused_with_a_reason(vector):
    raw = json.dumps({**json.loads(change().model_dump_json()), "vector": vector}).encode()
    for read in (lambda: decode_own(MemoryChange, raw), lambda: decode(MemoryChange, raw, KEY)):
        with pytest.raises(InvalidRecord) as err:
            read()
        assert err.value.kind == "schema" and "vector" in str(err.value)


def test_decode_own_refuses_what_is_not_a_change_event():
    for raw, kind in ((None, "empty"), (b"", "empty"), (b"{", "schema"), (b"[1]", "schema"),
                      (json.dumps({**json.loads(change().dumps()), "schema_version": 2})
                       .encode(), "schema")):
        with pytest.raises(InvalidRecord) as err:
            decode_own(MemoryChange, raw)
        assert err.value.kind == kind


def test_a_sealed_change_still_opens_to_the_same_vector():
    c = with_vector(embedding())
    key = crypto.new_data_key()
    sealed = decode_own(MemoryChange, change_sealing.seal_change(c, "k1", key).dumps())
    assert sealed.vector is None and sealed.sealed
    opened = change_sealing.open_change(sealed, {"k1": key})
    assert opened is not None and opened.vector == c.vector
    assert opened.dumps() == c.dumps()
