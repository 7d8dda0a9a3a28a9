"""Confluent schema-registry framing on the producers' topics (issue 47): JSON behind the
5-byte header reads like plain JSON with its schema id kept; Avro or Protobuf behind it,
and a header cut short, are refused with a reason that names them; plain JSON is
unchanged; the dead letter keeps what it always kept."""

from __future__ import annotations

import base64
import json
import struct
from datetime import UTC, datetime

import pytest

from memstream.core.errors import InvalidRecord
from memstream.topics.codec import dead_letter, decode, parse_json
from memstream.topics.framing import frame, unframe
from memstream.topics.schemas import ChatMessage, JobResult, SessionEvent, ToolRequest

pytestmark = pytest.mark.unit

KEY = b"acme/u-42"
MSG = {"tenant_id": "acme", "user_id": "u-42", "session_id": "s1", "message_id": "m1",
       "role": "user", "content": "I moved to Hamburg", "ts": "2026-03-01T10:00:00Z"}
END = {"tenant_id": "acme", "user_id": "u-42", "session_id": "s1", "kind": "ended",
       "ts": "2026-03-01T10:30:00Z"}


def framed(schema_id: int, payload: bytes) -> bytes:
    """By hand, as the integration test and the producer guide build it."""
    return b"\x00" + struct.pack(">I", schema_id) + payload


def refusal(model, value: bytes) -> InvalidRecord:
    with pytest.raises(InvalidRecord) as caught:
        decode(model, value, KEY)
    return caught.value


def test_frame_is_the_wire_format():
    assert frame(42, b"{}") == framed(42, b"{}") == b"\x00\x00\x00\x00\x2a{}"
    assert unframe(framed(2**32 - 1, b' {"a":1}')) == (2**32 - 1, b' {"a":1}')


def test_a_framed_json_message_reads_like_the_plain_one_with_its_id_kept():
    plain = json.dumps(MSG).encode()
    m = decode(ChatMessage, framed(42, plain), KEY)
    assert m.schema_id == 42
    assert m.model_copy(update={"schema_id": None}) == decode(ChatMessage, plain, KEY)
    # kept, never written: the wire form (snapshots, archive, jobs) is what it always was
    assert m.dumps() == decode(ChatMessage, plain, KEY).dumps()
    assert "schema_id" not in json.loads(m.dumps())


def test_a_framed_session_event_reads_with_its_id_kept():
    e = decode(SessionEvent, framed(7, b"\n " + json.dumps(END).encode()), KEY)
    assert e.schema_id == 7 and e.kind == "ended" and e.session_id == "s1"


def test_plain_json_is_unchanged_and_cannot_claim_a_schema_id():
    m = decode(ChatMessage, json.dumps({**MSG, "schema_id": 99}).encode(), KEY)
    assert m.schema_id is None and m.content == MSG["content"]
    e = decode(SessionEvent, b"  " + json.dumps(END).encode(), KEY)
    assert e.schema_id is None


def test_plain_json_never_starts_with_byte_zero():
    """So a leading 0x00 can only be the magic byte: NUL is no JSON whitespace."""
    with pytest.raises(InvalidRecord, match="not JSON") as caught:
        parse_json(b"\x00" + json.dumps(MSG).encode())
    assert caught.value.kind == "not_json"


def test_avro_framing_is_refused_by_name():
    # Avro binary of a record whose first field is a string: zigzag length, then bytes
    avro = framed(42, b"\x08acme\x08u-42\x04s1")
    exc = refusal(ChatMessage, avro)
    assert exc.kind == "not_json"
    assert str(exc) == ("schema-registry framed non-JSON (Avro or Protobuf) (schema id 42): "
                        "memstream reads JSON only (use the JSON Schema serializer)")


def test_protobuf_framing_is_refused_by_name():
    # message-index array [0] (one byte 0x00), then field 1 (tag 0x0a) length-delimited
    proto = framed(1001, b"\x00\x0a\x04acme\x12\x04u-42")
    for model in (ChatMessage, SessionEvent):
        exc = refusal(model, proto)
        assert exc.kind == "not_json" and "Protobuf" in str(exc) and "schema id 1001" in str(exc)


@pytest.mark.parametrize("value", [b"\x00", b"\x00\x00", b"\x00\x00\x00\x2a"])
def test_a_header_cut_short_is_refused(value):
    exc = refusal(ChatMessage, value)
    assert exc.kind == "not_json" and f"cut short: {len(value)} of 5 bytes" in str(exc)


def test_a_framed_record_without_payload_is_refused():
    exc = refusal(SessionEvent, framed(3, b""))
    assert exc.kind == "not_json" and "no payload (schema id 3)" in str(exc)


def test_framed_json_is_validated_like_any_and_its_reason_names_the_id():
    exc = refusal(ChatMessage, framed(42, json.dumps({**MSG, "user_id": "a/b"}).encode()))
    assert exc.kind == "schema" and str(exc).endswith("(schema-registry framed JSON, schema id 42)")
    exc = refusal(ChatMessage, framed(42, b"{not json"))
    assert exc.kind == "not_json" and "schema id 42" in str(exc)
    other_key = json.dumps({**MSG, "user_id": "u-43"}).encode()
    assert refusal(ChatMessage, framed(42, other_key)).kind == "key"


def test_only_the_producers_inputs_take_framing():
    """Internal topics are memstream's own JSON: a framed value there is not JSON."""
    res = JobResult(job_id="j", tenant_id="acme", user_id="u-42", session_id="s1", from_seq=0,
                    to_seq=4, status="done", finished_at="2026-01-01T00:00:00Z")
    assert refusal(JobResult, framed(42, res.dumps())).kind == "not_json"
    assert refusal(ToolRequest, framed(42, b"{}")).kind == "not_json"


def test_the_dead_letter_of_a_framed_record_names_it_and_keeps_only_its_bounded_copy():
    avro = framed(42, b"\x08acme" * 10)
    exc = refusal(ChatMessage, avro)
    dl = dead_letter(exc, topic="memstream.messages", partition=1, offset=5, key=KEY,
                     value=avro, now=datetime(2026, 1, 1, tzinfo=UTC))
    assert dl.kind == "not_json" and "framed non-JSON (Avro or Protobuf) (schema id 42)" \
        in dl.reason
    assert base64.b64decode(dl.value_b64) == avro and dl.value_length == len(avro)
    assert "acme" not in dl.reason  # the reason carries no value bytes
