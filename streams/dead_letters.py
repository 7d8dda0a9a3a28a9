"""The dead-letter path of every agent: decode a record, or set it aside, delivered.

A record that breaks the contract (:class:`~memstream.errors.InvalidRecord`) is data, not a
failure: it goes to the dead-letter topic (``codec.dead_letter``: reason, kind, where the
original is, its length and sha256, a bounded prefix of its bytes, so it always fits the
topic) and the agent moves on to the next record. It may only move on once the dead
letter is *delivered*: the send waits for the broker, and transient failures (broker
unreachable, a leader moving, a timeout) are retried with backoff by the one retry policy
(:mod:`memstream.retry`) for up to :data:`DELIVERY_DEADLINE_S`.

When a dead letter still cannot be delivered (a permanent error such as a misconfigured
dead-letter topic, or retries running out), the worker must not pass the record. Raising
from the agent is not enough under Faust: the stream marks the record in progress as
processed when the agent's loop unwinds, the supervisor restarts the agent on the next
record, and the next commit (at the latest the one Faust makes while shutting down) moves
the input offset past the record — a silent skip. So :func:`halt_worker` ends the process
at once with exit code :data:`EXIT_UNDELIVERABLE` (75, "temporary failure"): nothing is
committed after the record (under exactly-once the open transaction is aborted), the
process supervisor (systemd, Kubernetes, Docker ``restart: on-failure``) restarts the
worker, and the record is read and dead-lettered again once the topic takes it. A crash
loop with a clear log line is loud; a lost record is not.
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any, TypeVar

from pydantic import BaseModel

from memstream.errors import InvalidRecord, MemstreamError
from memstream.memory.metrics import DEAD_LETTER_CLASSES, bounded
from memstream.retry import RetryPolicy, retry_async
from memstream.streams.app import Pipeline
from memstream.streams.counters import add
from memstream.topics.codec import DEAD_LETTER_KEY_BYTES, check_message, dead_letter, decode
from memstream.topics.schemas import ChatMessage

log = logging.getLogger(__name__)
M = TypeVar("M", bound=BaseModel)

# Jobs and decisions are written by the worker itself, so they may be larger than a chat
# message; they are bounded by what the worker's producer may send (16 MiB).
INTERNAL_MAX_BYTES = 16 * 1024 * 1024
DELIVERY_POLICY = RetryPolicy(first_delay_s=0.2, max_delay_s=5.0)
DELIVERY_DEADLINE_S = 60.0
EXIT_UNDELIVERABLE = 75  # EX_TEMPFAIL


class DeadLetterUndeliverable(MemstreamError):
    """A dead letter could not be delivered; the record it stands for must not be passed."""


def halt_worker(error: DeadLetterUndeliverable) -> None:
    """End the process now, before Faust can mark the record processed or commit past it."""
    log.critical("%s; exiting (code %d) so that the record is read again after a restart",
                 error, EXIT_UNDELIVERABLE)
    for handler in logging.getLogger().handlers:
        handler.flush()
    sys.stderr.flush()
    os._exit(EXIT_UNDELIVERABLE)


def decode_input(p: Pipeline, topic: str, key: bytes | None, value: bytes | None) -> BaseModel:
    """One record of the ingest agent's co-partitioned inputs, by the schema of its topic."""
    model = p.input_models[topic]
    event = decode(model, value, key, max_bytes=p.settings.max_message_bytes)
    if isinstance(event, ChatMessage):
        check_message(event, p.settings.max_content_chars)
    return event


async def send_dead_letter(
    p: Pipeline, exc: InvalidRecord, message: Any, *,
    halt: Callable[[DeadLetterUndeliverable], None] = halt_worker,
    sleep: Callable[[float], Awaitable[Any]] = asyncio.sleep,
) -> None:
    """Set the record aside on the dead-letter topic and wait until the broker has it.

    Raises :class:`DeadLetterUndeliverable` only where ``halt`` returns (tests); the
    default ``halt`` ends the process (see the module docstring for why).
    """
    key, value = dead_letter_record(p, exc, message)
    where = f"{message.topic}[{message.partition}]@{message.offset}"

    async def deliver() -> None:
        # Topic.send would hand back the delivery future but also leave Faust's own copy of
        # a failure unretrieved (a traceback in the log per attempt); wait=True returns once
        # the broker has the record and raises this attempt's error otherwise.
        pending = p.dead_letters.as_future_message(key=key, value=value)
        await p.dead_letters.publish_message(pending, wait=True)

    def on_retry(attempt: int, err: BaseException, delay: float) -> None:
        log.warning("dead letter of %s: attempt %d failed (%s); retrying in %.1fs",
                    where, attempt, type(err).__name__, delay)

    try:
        await retry_async(deliver, policy=DELIVERY_POLICY, clock=p.clock, sleep=sleep,
                          deadline=p.clock() + DELIVERY_DEADLINE_S, on_retry=on_retry)
    except Exception as err:
        error = DeadLetterUndeliverable(
            f"dead letter of {where} (kind {exc.kind}) undeliverable: {type(err).__name__}")
        halt(error)
        raise error from err
    count_dead_letter(p, exc, message)


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


async def decode_or_dead_letter(p: Pipeline, model: type[M], message: Any, *,
                                max_bytes: int = INTERNAL_MAX_BYTES) -> M | None:
    """The decoded record of an internal topic, or None once it is dead-lettered."""
    try:
        return decode(model, message.value, message.key, max_bytes=max_bytes)
    except InvalidRecord as exc:
        await send_dead_letter(p, exc, message)
        return None
