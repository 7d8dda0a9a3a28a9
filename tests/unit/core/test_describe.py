"""``describe``: an error as text for a log line or an unsealed record, never a value."""

from __future__ import annotations

import json

import pytest
from pydantic import BaseModel, Field, ValidationError

from memstream.core.errors import InvalidRecord, describe
from memstream.core.retry import RetriesExhausted

pytestmark = pytest.mark.unit
SECRET = "Alice has HIV"


class Fact(BaseModel):
    text: str = Field(max_length=5)
    importance: int


def _validation_error() -> ValidationError:
    with pytest.raises(ValidationError) as caught:
        Fact.model_validate({"text": SECRET, "importance": SECRET})
    return caught.value


def test_a_validation_error_names_fields_and_kinds_not_values():
    exc = _validation_error()
    assert SECRET in str(exc)  # what pydantic's own text would have leaked
    text = describe(exc)
    assert SECRET not in text
    assert "text: string_too_long" in text and "importance: int_parsing" in text


def test_invalid_json_is_described_without_the_document():
    with pytest.raises(ValidationError) as caught:
        Fact.model_validate_json('{"text": "' + SECRET)
    assert SECRET not in describe(caught.value) and "json_invalid" in describe(caught.value)


@pytest.mark.parametrize("exc", [ValueError(SECRET), KeyError(SECRET), TypeError(SECRET),
                                 UnicodeDecodeError("utf-8", SECRET.encode(), 0, 1, "bad")])
def test_foreign_errors_that_quote_values_give_their_type_only(exc):
    assert describe(exc) == type(exc).__name__


def test_own_and_transport_errors_keep_their_message():
    assert describe(InvalidRecord("schema", "not a ChatMessage: content")) == \
        "InvalidRecord: not a ChatMessage: content"
    assert describe(TimeoutError("no answer in 30s")) == "TimeoutError: no answer in 30s"
    assert describe(RuntimeError("restore failed")) == "RuntimeError: restore failed"


def test_an_http_error_gives_its_status():
    class APIStatusError(Exception):
        status_code = 422

    assert describe(APIStatusError(json.dumps({"echo": SECRET}))) == "APIStatusError: HTTP 422"


def test_retries_exhausted_describes_its_last_error():
    exc = RetriesExhausted(3, _validation_error(), "the attempt limit is 3")
    assert SECRET not in str(exc) and "int_parsing" in str(exc)


def test_keys_a_caller_chose_are_left_out_of_the_path():
    class Strict(BaseModel):
        model_config = {"extra": "forbid"}
        tags: dict[str, int] = {}

    with pytest.raises(ValidationError) as caught:
        Strict.model_validate({"zqcanary": 1, "tags": {"I live in Berlin": "x"}})
    text = describe(caught.value)
    assert "zqcanary" not in text and "Berlin" not in text
    assert "*: extra_forbidden" in text and "tags.*: int_parsing" in text


def test_a_trace_names_the_frames_not_the_message():
    from memstream.core.errors import trace

    def deep() -> None:
        Fact.model_validate({"text": SECRET, "importance": 1})

    with pytest.raises(ValidationError) as caught:
        deep()
    text = trace(caught.value)
    assert SECRET not in text and "in deep" in text and "text: string_too_long" in text
