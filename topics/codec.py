"""The one codec of the contract: bytes in, a validated event out, or a clear reason.

``decode`` never lets a bad record through and never raises anything but
:class:`~memstream.errors.InvalidRecord`, whose ``kind`` and message go to the dead-letter
topic together with the original bytes.
"""

from __future__ import annotations

import base64
import json
from datetime import datetime
from typing import TypeVar

from pydantic import BaseModel, ValidationError

from memstream.errors import InvalidRecord
from memstream.topics.schemas import SCHEMA_VERSION, ChatMessage, DeadLetter

M = TypeVar("M", bound=BaseModel)


def _describe(exc: ValidationError) -> str:
    parts = []
    for err in exc.errors()[:5]:
        where = ".".join(str(p) for p in err["loc"]) or "record"
        parts.append(f"{where}: {err['msg']}")
    return "; ".join(parts)


def decode(
    model: type[M], value: bytes | None, key: bytes | None = None, *, max_bytes: int | None = None
) -> M:
    """Parse and validate one record of ``model``; check the key when the model is keyed."""
    if value is None:
        raise InvalidRecord("empty", "record has no value (tombstone)")
    if max_bytes is not None and len(value) > max_bytes:
        raise InvalidRecord("too_large", f"record is {len(value)} bytes, limit {max_bytes}")
    try:
        data = json.loads(value)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InvalidRecord("not_json", f"not UTF-8 JSON: {exc}") from None
    if not isinstance(data, dict):
        raise InvalidRecord("schema", f"expected a JSON object, got {type(data).__name__}")
    version = data.get("schema_version", SCHEMA_VERSION)
    if version != SCHEMA_VERSION:
        raise InvalidRecord(
            "version", f"unknown schema_version {version!r} (this worker reads {SCHEMA_VERSION})"
        )
    try:
        event = model.model_validate(data)
    except ValidationError as exc:
        raise InvalidRecord("schema", f"{model.__name__} invalid: {_describe(exc)}") from None
    if key is not None and hasattr(event, "tenant_id"):
        expected = event.key().encode()  # type: ignore[attr-defined]
        if key != expected:
            raise InvalidRecord(
                "key", f"record key {key!r} does not match tenant/user {expected.decode()!r}"
            )
    return event


def check_message(message: ChatMessage, max_chars: int) -> None:
    """Content rules that pydantic types alone do not say."""
    if not message.content.strip():
        raise InvalidRecord("empty", "content is empty")
    if len(message.content) > max_chars:
        raise InvalidRecord(
            "too_large", f"content is {len(message.content)} characters, limit {max_chars}"
        )
    if "\x00" in message.content:
        raise InvalidRecord("schema", "content contains NUL characters")


def dead_letter(
    exc: InvalidRecord,
    *,
    topic: str,
    partition: int,
    offset: int,
    key: bytes | None,
    value: bytes | None,
    now: datetime,
) -> DeadLetter:
    return DeadLetter(
        reason=str(exc),
        kind=exc.kind,
        source_topic=topic,
        partition=partition,
        offset=offset,
        key_b64=base64.b64encode(key).decode() if key is not None else None,
        value_b64=base64.b64encode(value or b"").decode(),
        failed_at=now,
    )
