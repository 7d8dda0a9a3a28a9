"""Poison input: every hostile record becomes an InvalidRecord of the right kind, and its
dead letter always fits the dead-letter topic; set aside, it goes out in its record's batch
and is counted."""

from __future__ import annotations

import base64
import hashlib
import json
from datetime import UTC, datetime
from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import AwareDatetime, BaseModel
from typing_extensions import TypedDict

from memstream.core.errors import InvalidRecord
from memstream.streams.counters import Counters
from memstream.streams.dead_letters import dead_letter_record, set_aside
from memstream.streams.stage import Work
from memstream.topics.codec import MAX_DEPTH, check_datetimes, dead_letter, decode
from memstream.topics.registry import KAFKA_MAX_MESSAGE_BYTES
from memstream.topics.schemas import (
    ChatMessage,
    DeadLetter,
    ExtractionJob,
    JobDecision,
    JobResult,
    SessionEvent,
)

pytestmark = pytest.mark.unit

GOOD = {
    "tenant_id": "acme", "user_id": "u-42", "session_id": "s1", "message_id": "m1",
    "role": "user", "content": "I moved to Hamburg", "ts": "2026-03-01T10:00:00Z",
    "metadata": {"channel": "web"},
}
KEY = b"acme/u-42"
LIMIT = 256_000
NOW = datetime(2026, 3, 1, tzinfo=UTC)


def enc(obj: object) -> bytes:
    return json.dumps(obj).encode()


def with_field(raw_value: str, name: str = "extra") -> bytes:
    """GOOD plus one field whose JSON text is given verbatim (NaN, huge literals...)."""
    return enc(GOOD)[:-1] + f', "{name}": {raw_value}}}'.encode()


def nested(depth: int) -> object:
    value: object = 1
    for _ in range(depth):
        value = [value]
    return value


JOB = {
    "job_id": "j1", "tenant_id": "acme", "user_id": "u-42", "session_id": "s1",
    "from_seq": 0, "to_seq": 1, "reason": "threshold", "created_at": "2026-03-01T10:00:00Z",
    "messages": [{"seq": 0, "message_id": "m1", "role": "user", "content": "hi",
                  "ts": "2026-03-01T10:00:00Z"}],
}
RESULT = {"job_id": "j1", "tenant_id": "acme", "user_id": "u-42", "session_id": "s1",
          "from_seq": 0, "to_seq": 1, "status": "done", "finished_at": "2026-03-01T10:00:00Z"}

POISON = [
    # (id, model, value, key, kind)
    ("tombstone", ChatMessage, None, KEY, "empty"),
    ("empty-bytes", ChatMessage, b"", KEY, "empty"),
    ("too-large", ChatMessage, enc({**GOOD, "content": "x" * LIMIT}), KEY, "too_large"),
    ("huge-metadata", ChatMessage,
     enc({**GOOD, "metadata": {f"k{i}": i for i in range(200_000)}}), KEY, "too_large"),
    ("not-utf8", ChatMessage, b"\xff\xfe{}", KEY, "not_json"),
    ("utf16-json", ChatMessage, json.dumps(GOOD).encode("utf-16"), KEY, "not_json"),
    ("encoded-surrogate", ChatMessage, enc(GOOD).replace(b"Hamburg", b"\xed\xa0\x80"), KEY,
     "not_json"),
    ("truncated-json", ChatMessage, enc(GOOD)[:-1], KEY, "not_json"),
    ("array-100k-deep", ChatMessage, b"[" * 100_000 + b"]" * 100_000, KEY, "depth"),
    ("object-30k-deep", ChatMessage, b'{"a":' * 30_000 + b"1" + b"}" * 30_000, KEY,
     "depth"),
    ("extra-field-too-deep", ChatMessage, enc({**GOOD, "extra": nested(MAX_DEPTH)}), KEY,
     "depth"),
    ("int-5000-digits", ChatMessage, with_field("9" * 5000), KEY, "number"),
    ("int-5000-digits-negative", ChatMessage, with_field("-" + "9" * 5000), KEY, "number"),
    ("int-above-int64", ChatMessage, with_field(str(2**63)), KEY, "number"),
    ("int-in-metadata", ChatMessage, enc({**GOOD, "metadata": {"n": -(2**63) - 1}}), KEY,
     "number"),
    ("nan", ChatMessage, with_field("NaN"), KEY, "number"),
    ("infinity", ChatMessage, with_field("Infinity"), KEY, "number"),
    ("minus-infinity", ChatMessage, with_field("[1, -Infinity]"), KEY, "number"),
    ("float-overflow", ChatMessage, with_field("1e999"), KEY, "number"),
    ("surrogate-content", ChatMessage, enc({**GOOD, "content": "hi \ud800"}), KEY, "unicode"),
    ("surrogate-metadata-key", ChatMessage, enc({**GOOD, "metadata": {"\udfff": "x"}}), KEY,
     "unicode"),
    ("surrogate-ignored-field", ChatMessage, enc({**GOOD, "x": [{"y": "\udc80"}]}), KEY,
     "unicode"),
    ("version-true", ChatMessage, enc({**GOOD, "schema_version": True}), KEY, "version"),
    ("version-float", ChatMessage, enc({**GOOD, "schema_version": 1.0}), KEY, "version"),
    ("version-string", ChatMessage, enc({**GOOD, "schema_version": "1"}), KEY, "version"),
    ("version-2", ChatMessage, enc({**GOOD, "schema_version": 2}), KEY, "version"),
    ("version-null", ChatMessage, enc({**GOOD, "schema_version": None}), KEY, "version"),
    ("not-an-object", ChatMessage, b"[1, 2]", KEY, "schema"),
    ("scalar", ChatMessage, b"42", KEY, "schema"),
    ("missing-field", ChatMessage, enc({k: v for k, v in GOOD.items() if k != "role"}), KEY,
     "schema"),
    ("ts-year-1-east", ChatMessage, enc({**GOOD, "ts": "0001-01-01T00:00:00+01:00"}), KEY,
     "date"),
    ("ts-year-9999-west", ChatMessage, enc({**GOOD, "ts": "9999-12-31T23:00:00-05:00"}), KEY,
     "date"),
    ("ts-before-1970", ChatMessage, enc({**GOOD, "ts": "1969-12-31T23:59:59Z"}), KEY, "date"),
    ("ts-epoch-seconds-year-1", ChatMessage, enc({**GOOD, "ts": -62135596800}), KEY, "date"),
    ("session-end-year-1", SessionEvent,
     enc({"tenant_id": "acme", "user_id": "u-42", "session_id": "s1",
          "ts": "0001-01-01T00:30:00+02:00"}), KEY, "date"),
    ("result-finished-year-1", JobResult,
     enc({**RESULT, "finished_at": "0001-01-01T00:00:00+01:00"}), KEY, "date"),
    ("job-message-ts-year-1", ExtractionJob,
     enc({**JOB, "messages": [{**JOB["messages"][0], "ts": "0001-01-01T00:00:00+01:00"}]}),
     KEY, "date"),
    ("null-key", ChatMessage, enc(GOOD), None, "key"),
    ("null-key-session-end", SessionEvent,
     enc({"tenant_id": "acme", "user_id": "u-42", "session_id": "s1", "ts": GOOD["ts"]}),
     None, "key"),
    ("null-key-result", JobResult, enc(RESULT), None, "key"),
    ("null-key-job", ExtractionJob, enc(JOB), None, "key"),
    ("other-user-key", ChatMessage, enc(GOOD), b"acme/u-43", "key"),
    ("huge-key", ChatMessage, enc(GOOD), b"k" * 1_000_000, "key"),
]


@pytest.mark.parametrize(("model", "value", "key", "kind"), [p[1:] for p in POISON],
                         ids=[p[0] for p in POISON])
def test_poison_becomes_invalid_record_of_its_kind(model, value, key, kind):
    with pytest.raises(InvalidRecord) as err:
        decode(model, value, key, max_bytes=LIMIT)
    assert err.value.kind == kind
    reason = str(err.value)
    assert reason and len(reason) < 300  # readable and bounded, never the record itself


@pytest.mark.parametrize(("model", "value"), [
    (ChatMessage, enc(GOOD)),
    (ChatMessage, enc({k: v for k, v in GOOD.items() if k != "metadata"})),
    (ChatMessage, enc({**GOOD, "schema_version": 1})),
    (ChatMessage, enc({**GOOD, "extra": nested(MAX_DEPTH - 1)})),  # at the depth limit
    (ChatMessage, enc({**GOOD, "metadata": {"max": 2**63 - 1, "min": -(2**63), "f": 1.5e308}})),
    (ChatMessage, enc({**GOOD, "ts": "1970-01-01T00:00:00Z"})),
    (ChatMessage, enc({**GOOD, "ts": "9999-12-31T23:59:59Z"})),
    (ChatMessage, enc({**GOOD, "ts": "2026-03-01T10:00:00+14:00"})),
    (ChatMessage, enc({**GOOD, "content": "记住：我对花生过敏 🥜 \\ud800 (escaped text)"})),
    (ChatMessage, json.dumps({**GOOD, "content": "😀 pairs are fine"}).encode()),  # \ud83d\ude00
    (ExtractionJob, enc(JOB)),
    (JobResult, enc(RESULT)),
], ids=["good", "no-metadata", "version-1", "depth-limit", "int64-bounds", "year-1970",
        "year-9999", "offset-plus-14", "cjk-emoji", "escaped-pair", "job", "result"])
def test_valid_records_still_decode(model, value):
    event = decode(model, value, KEY, max_bytes=LIMIT)
    assert event.key() == "acme/u-42"
    assert model.model_validate_json(event.dumps()) == event  # state stays serialisable


def test_valid_message_decodes_to_the_same_fields():
    m = decode(ChatMessage, enc(GOOD), KEY, max_bytes=LIMIT)
    assert (m.content, m.metadata, m.ts) == ("I moved to Hamburg", {"channel": "web"},
                                            datetime(2026, 3, 1, 10, tzinfo=UTC))


def test_byte_limit_is_a_parameter():
    big_job = enc({**JOB, "messages": JOB["messages"] * 5000})
    assert len(big_job) > LIMIT
    with pytest.raises(InvalidRecord, match="limit"):
        decode(ExtractionJob, big_job, KEY, max_bytes=LIMIT)
    assert len(decode(ExtractionJob, big_job, KEY, max_bytes=16 * 1024 * 1024).messages) == 5000


def test_dead_letter_of_a_5_mb_value_fits_and_describes_the_original():
    value = bytes(range(256)) * (5 * 1024 * 1024 // 256)
    key = b"k" * 3_000_000
    exc = InvalidRecord("too_large", "why " * 100_000)
    dl = dead_letter(exc, topic="t.messages", partition=3, offset=77, key=key, value=value,
                     now=NOW)
    raw = dl.dumps()
    assert len(raw) < 1_000_000 < KAFKA_MAX_MESSAGE_BYTES
    back = DeadLetter.model_validate_json(raw)
    assert back.value_length == len(value)
    assert back.value_sha256 == hashlib.sha256(value).hexdigest()
    prefix = base64.b64decode(back.value_b64)
    assert back.truncated and 0 < len(prefix) < len(value) and value.startswith(prefix)
    assert back.key_truncated and key.startswith(base64.b64decode(back.key_b64 or ""))
    assert (back.source_topic, back.partition, back.offset, back.kind) == (
        "t.messages", 3, 77, "too_large")
    assert back.reason.startswith("why ") and len(back.reason) <= 2000


def test_dead_letter_of_a_small_record_keeps_it_whole():
    value = enc(JOB)
    dl = DeadLetter.model_validate_json(dead_letter(
        InvalidRecord("extraction_failed", "LLM down \ud800"), topic="t.jobs", partition=0,
        offset=1, key=KEY, value=value, now=NOW).dumps())
    assert base64.b64decode(dl.value_b64) == value and not dl.truncated
    assert base64.b64decode(dl.key_b64 or "") == KEY and not dl.key_truncated
    assert dl.value_length == len(value) and "LLM down" in dl.reason


def test_dead_letter_of_a_tombstone():
    dl = dead_letter(InvalidRecord("empty", "tombstone"), topic="t", partition=0, offset=0,
                     key=None, value=None, now=NOW)
    assert (dl.value_b64, dl.value_length, dl.key_b64) == ("", 0, None)


# --- fuzzing: decode raises InvalidRecord or returns a serialisable event ------------------
def decodes_or_invalid(model, value, key=KEY) -> None:
    try:
        event = decode(model, value, key, max_bytes=LIMIT)
    except InvalidRecord as exc:
        assert exc.kind and str(exc)
        dead_letter(exc, topic="t", partition=0, offset=0, key=key, value=value,
                    now=NOW).dumps()  # and its dead letter is always writable
        return
    event.dumps()  # no surrogate, NaN or out-of-range date got through
    check_datetimes(event)


json_scalars = st.one_of(
    st.none(), st.booleans(), st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=20),
    st.sampled_from(["0001-01-01T00:00:00+01:00", "9999-12-31T23:59:59-01:00",
                     "2026-03-01T10:00:00Z", "\ud800", "1969-12-31T23:59:59Z"]),
)
json_values = st.recursive(
    json_scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner,
                                                                max_size=4),
    max_leaves=25,
)


@settings(max_examples=400, deadline=None)
@given(st.binary(max_size=300))
def test_fuzz_random_bytes(value):
    decodes_or_invalid(ChatMessage, value)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(field=st.sampled_from([*GOOD, "schema_version", "extra"]), replacement=json_values,
       depth=st.integers(min_value=0, max_value=40))
def test_fuzz_one_field_of_a_good_message(field, replacement, depth):
    for _ in range(depth // 4):
        replacement = [replacement]
    value = json.dumps({**GOOD, field: replacement}, allow_nan=True).encode()
    decodes_or_invalid(ChatMessage, value)


@settings(max_examples=300, deadline=None)
@given(model=st.sampled_from([ChatMessage, SessionEvent, JobResult, ExtractionJob]),
       value=json_values, key=st.one_of(st.none(), st.just(KEY), st.binary(max_size=12)))
def test_fuzz_any_json_for_any_model(model, value, key):
    decodes_or_invalid(model, json.dumps(value, allow_nan=True).encode(), key)


@settings(max_examples=200, deadline=None)
@given(st.binary(min_size=1, max_size=40), st.integers(min_value=0, max_value=200))
def test_fuzz_splices_into_a_good_message(chunk, at):
    raw = enc(GOOD)
    at = min(at, len(raw))
    decodes_or_invalid(ChatMessage, raw[:at] + chunk + raw[at:])


# --- setting a record aside: its dead letter goes out in the record's batch ---------------
def pipeline() -> SimpleNamespace:
    return SimpleNamespace(topics=SimpleNamespace(dead_letters=SimpleNamespace(name="t.dlq")),
                           counters=Counters(), clock=lambda: 1_800_000_000.0)


def record(value: bytes, key: bytes | None = KEY) -> SimpleNamespace:
    return SimpleNamespace(topic="t.messages", partition=1, offset=42, key=key, value=value)


def test_a_hostile_record_set_aside_fits_the_topic_and_is_counted():
    p, work = pipeline(), Work()
    set_aside(p, work, InvalidRecord("depth", "deep"), record(b"[" * 5_000_000))
    (topic, key, value), = work.out  # sent in the batch's transaction, with its offsets
    dl = DeadLetter.model_validate_json(value)
    assert topic == "t.dlq" and key == KEY
    assert len(value) < 1_000_000 and dl.truncated and dl.offset == 42
    assert p.counters.dead_letters == 1


def test_the_dead_letter_bounds_the_record_key():
    key, _ = dead_letter_record(pipeline(), InvalidRecord("key", "bad key"),
                                record(b"{}", b"k" * 900_000))
    assert key is not None and 0 < len(key) <= 1024


class _Node(BaseModel):
    at: str = ""
    kids: list[_Node] = []
    when: AwareDatetime | None = None


class _Span(TypedDict):
    start: datetime


class _Odd(BaseModel):
    tree: _Node
    span: _Span | None = None
    meta: dict[str, Any] = {}
    vector: tuple[float, ...] = ()


@pytest.mark.parametrize("value", [
    {"tree": {"kids": [{"kids": [{"when": "0001-01-01T00:00:00+01:00"}]}]}},  # recursive
    {"tree": {}, "span": {"start": "0001-01-01T00:00:00+01:00"}},  # a TypedDict
])
def test_the_date_walk_misses_no_date_whatever_holds_it(value):
    """check_datetimes walks only the fields whose types can hold a datetime: a type it
    does not know (AwareDatetime, a TypedDict) and a recursive model are walked, never
    skipped; Any, plain JSON types and literals are not."""
    with pytest.raises(InvalidRecord) as exc:
        decode(_Odd, enc(value))
    assert exc.value.kind == "date"
    from memstream.topics import codec
    assert set(codec._date_fields(_Odd)) == {"tree", "span"}
    assert set(codec._date_fields(ExtractionJob)) >= {"messages", "created_at"}
    assert "read_versions" not in codec._date_fields(JobDecision)
