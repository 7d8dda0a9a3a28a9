"""The dead-letter path of every stage: decode a record, or set it aside.

A record that breaks the contract (:class:`~memstream.core.errors.InvalidRecord`) is data, not a
failure: it goes to the dead-letter topic (``codec.dead_letter``: reason, kind, where the
original is, its length and sha256, a bounded prefix of its bytes, so it always fits the
topic) and the stage moves on to the next record. :func:`set_aside` puts the dead letter
into the outputs of the record's batch, so it is sent in the transaction that commits the
batch's input offsets (:mod:`memstream.streams.owned_loop`): the dead letter is there
exactly when the record counts as read, and an aborted transaction takes back both.

A transaction the broker refuses for good (``owned_loop.REFUSED``: e.g. a dead-letter topic
misconfigured so that it does not take the dead letter) must not pass the record: the worker
ends with exit code :data:`EXIT_UNDELIVERABLE` (75, "temporary failure"), the process
supervisor (systemd, Kubernetes, Docker ``restart: on-failure``) restarts it, and the record
is read and dead-lettered again from the committed offsets once the topic takes it. A crash
loop with a clear log line is loud; a lost record is not.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime
from typing import Any

from pydantic import BaseModel

from memstream.core.errors import InvalidRecord
from memstream.memory.governance_metrics import DEAD_LETTER_CLASSES, bounded
from memstream.streams.counters import add
from memstream.streams.pipeline import Pipeline
from memstream.topics.codec import DEAD_LETTER_KEY_BYTES, check_message, dead_letter, decode
from memstream.topics.schemas import ChatMessage

log = logging.getLogger(__name__)

# Jobs and decisions are written by the worker itself, so they may be larger than a chat
# message; they are bounded by what the worker's producer may send (16 MiB).
INTERNAL_MAX_BYTES = 16 * 1024 * 1024
EXIT_UNDELIVERABLE = 75  # EX_TEMPFAIL: a transaction the broker refuses for good


def decode_input(p: Pipeline, topic: str, key: bytes | None, value: bytes | None) -> BaseModel:
    """One record of the ingest stage's co-partitioned inputs, by the schema of its topic."""
    model = p.input_models.get(topic)
    if model is None:  # a record on the repartition topic that names no producers' topic
        raise InvalidRecord("schema", f"{topic}: no memstream-source header naming a topic "
                            "producers write")
    event = decode(model, value, key, max_bytes=p.settings.max_message_bytes)
    if isinstance(event, ChatMessage):
        check_message(event, p.settings.max_content_chars)
    return event


def dead_letter_record(p: Pipeline, exc: InvalidRecord, message: Any,
                       ) -> tuple[bytes | None, bytes]:
    """The dead letter of ``message`` as a record to send (key, value)."""
    record = dead_letter(
        exc, topic=message.topic, partition=message.partition, offset=message.offset,
        key=message.key, value=message.value, now=datetime.fromtimestamp(p.clock(), UTC),
    )
    key = message.key[:DEAD_LETTER_KEY_BYTES] if message.key is not None else None
    return key, record.dumps()


def set_aside(p: Pipeline, work: Any, exc: InvalidRecord, record: Any) -> None:
    """The record's dead letter into ``work.out``: sent in its batch's transaction, so it
    is there exactly when the record counts as read (an owned loop's batch)."""
    work.out.append((p.topics.dead_letters.name, *dead_letter_record(p, exc, record)))
    count_dead_letter(p, exc, record)


def count_dead_letter(p: Pipeline, exc: InvalidRecord, message: Any) -> None:
    """Count (by reason class) and log a dead letter of ``message``."""
    add(p.counters.dead_letters_by_class, bounded(exc.kind, DEAD_LETTER_CLASSES))
    log.warning("dead letter: %s[%s]@%s kind=%s (%d bytes)", message.topic,
                message.partition, message.offset, exc.kind, len(message.value or b""))
