"""The stages' check of records that carry authority (:mod:`core.record_auth`).

Each stage asks :func:`authentic` for a record of its input before it decodes it: a tool
request or job result (ingest), a job (extract), a decision (apply). A record of such a
topic without a valid ``memstream-mac`` changes nothing: it is set aside on the dead-letter
topic **without its value** (its length and sha256 are kept; the original stays where the
dead letter says until retention), counted in
``memstream_records_unauthenticated_total{topic}`` and the stage goes on with the next
record. Records of the other topics (chat messages, session events) pass unchecked.
"""

from __future__ import annotations

import hashlib
from typing import Any

from memstream.core import record_auth, record_keys
from memstream.core.errors import InvalidRecord
from memstream.streams.counters import add
from memstream.streams.dead_letters import count_dead_letter, dead_letter_record
from memstream.streams.pipeline import Pipeline
from memstream.topics.schemas import DeadLetter

KIND = "unauthenticated"


def refusal(p: Pipeline, record: Any) -> InvalidRecord | None:
    """Why ``record`` is refused (None: its topic carries no MAC, or its MAC verifies)."""
    role = record_auth.role_of(record.topic, p.settings.topic_prefix)
    if role is None:
        return None
    why = record_auth.refusal(record_keys.keys_for(p.settings), role, record.key,
                              record.value, getattr(record, "headers", None))
    return None if why is None else InvalidRecord(KIND, why)


def set_aside(p: Pipeline, work: Any, exc: InvalidRecord, record: Any) -> None:
    """The dead letter of an unauthenticated record, without its value, into ``work.out``
    (its batch's transaction); counted by the topic's role."""
    key, raw = dead_letter_record(p, exc, _Bare(record))
    letter = DeadLetter.model_validate_json(raw).model_copy(update={
        "value_length": len(record.value or b""),
        "value_sha256": hashlib.sha256(record.value or b"").hexdigest()})
    work.out.append((p.topics.dead_letters.name, key, letter.dumps()))
    count_dead_letter(p, exc, record)
    role = record_auth.role_of(record.topic, p.settings.topic_prefix) or "other"
    add(p.counters.records_unauthenticated, role)


def authentic(p: Pipeline, work: Any, record: Any) -> bool:
    """True when ``record`` may be handled; else it is set aside (see :func:`set_aside`)."""
    exc = refusal(p, record)
    if exc is None:
        return True
    set_aside(p, work, exc, record)
    return False


class _Bare:
    """A record's place and key, without its value."""

    def __init__(self, record: Any) -> None:
        self.topic, self.partition = record.topic, record.partition
        self.offset, self.key, self.value = record.offset, record.key, None
