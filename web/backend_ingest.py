"""The worker's side of the HTTP way in: the records of :mod:`.ingest_records` produced to
the messages and session-events topics by one idempotent producer of the worker's web
layer, each answered with the offset every in-sync replica acknowledged.

Any worker produces any user's records: the producer's partitioner (murmur2 of the key
``tenant/user``, the Java client's and aiokafka's default) puts them on the user's
partition, where the ingest stage that owns it reads them, so the request is not forwarded
to the user's owner (a write does not wait on the owner being up, only on the broker).
A broker that does not acknowledge within :data:`PRODUCE_TIMEOUT_S` is 503, never a hang:
the caller retries with the same ``Idempotency-Key`` (or message ids), and a copy the broker
took meanwhile is dropped by message id (the ingest stage dedupes per session).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import Any

from aiokafka import AIOKafkaProducer
from aiokafka.errors import KafkaError

from memstream.contract.http_api.api import ErrorCode
from memstream.contract.http_api.intake import (
    MessageAccepted,
    MessagesAccepted,
    MessagesRequest,
    Placement,
    SessionEndAccepted,
    SessionEndRequest,
)
from memstream.core import kafka, tracing
from memstream.core.errors import describe
from memstream.core.settings import Settings
from memstream.topics.schemas import Event
from memstream.web import ingest_records
from memstream.web.http_base import ApiError

log = logging.getLogger(__name__)
PRODUCE_TIMEOUT_S = 10.0  # start + send + every in-sync replica's acknowledgement


class IngestProducer:
    """The API's one idempotent producer (``acks=all``), started on the first request and
    reused: the HTTP way in's records and the tool requests (:meth:`started`) go through
    it; ``factory`` is a seam for tests."""

    def __init__(self, settings: Settings, timeout_s: float = PRODUCE_TIMEOUT_S,
                 factory: Callable[[Settings], Any] | None = None) -> None:
        self._settings = settings
        self._timeout_s = timeout_s
        self._factory = factory or _idempotent
        self._producer: Any = None
        self._lock = asyncio.Lock()

    async def send(self, topic: str, events: Sequence[Event]) -> list[Placement]:
        """Send in order, wait for every acknowledgement; 503 when the broker does not
        take them in time."""
        spans: list[Any] = []  # tracing on: a produce span per record (docs/tracing.md)
        parent = tracing.current()
        try:
            async with asyncio.timeout(self._timeout_s):
                producer = await self.started()
                pending = []
                for e in events:
                    span = tracing.produce("produce", parent, topic, spans)
                    traced = {"headers": list(tracing.headers(span))} if span else {}
                    pending.append(await producer.send(topic, key=e.key().encode(),
                                                       value=e.dumps(), **traced))
                done = await asyncio.gather(*pending)
            tracing.settle(spans, "acknowledged")
        except (TimeoutError, KafkaError, OSError) as exc:
            tracing.settle(spans, "failed")
            log.warning("http ingest: %d record(s) to %s not acknowledged: %s", len(events),
                        topic, describe(exc))
            raise ApiError(503, ErrorCode.UNAVAILABLE, "the broker did not acknowledge the "
                           "records; retry with the same Idempotency-Key") from None
        return [Placement(topic=m.topic, partition=m.partition, offset=m.offset) for m in done]

    async def started(self) -> Any:
        async with self._lock:
            if self._producer is None:
                producer = self._factory(self._settings)
                try:
                    await producer.start()
                except BaseException:
                    with contextlib.suppress(Exception):
                        await producer.stop()
                    raise
                self._producer = producer
            return self._producer

    async def close(self) -> None:
        producer, self._producer = self._producer, None
        if producer is not None:
            await producer.stop()


def _idempotent(settings: Settings) -> AIOKafkaProducer:
    return kafka.producer(settings, enable_idempotence=True, acks="all",
                          client_id="memstream-api")


def messages_topic(p: Any, tenant: str) -> str:
    """Where a tenant's chat messages go (one topic for every tenant today)."""
    return str(p.topics.messages.name)


def session_events_topic(p: Any, tenant: str) -> str:
    return str(p.topics.session_events.name)


def _now(p: Any) -> datetime:
    return datetime.fromtimestamp(p.clock(), UTC)


async def add_messages(p: Any, producer: IngestProducer, tenant: str, user: str,
                       req: MessagesRequest, idempotency_key: str | None) -> MessagesAccepted:
    """Validate every message (nothing is sent when one is bad), then produce them."""
    s = p.settings
    messages = ingest_records.chat_messages(
        tenant, user, req, idempotency_key or "", _now(p),
        max_bytes=s.max_message_bytes, max_chars=s.max_content_chars, most=s.dedup_window)
    placed = await producer.send(messages_topic(p, tenant), messages)
    return MessagesAccepted(messages=[
        MessageAccepted(message_id=m.message_id, session_id=m.session_id, **at.model_dump())
        for m, at in zip(messages, placed, strict=True)])


async def end_session(p: Any, producer: IngestProducer, tenant: str, user: str, session: str,
                      req: SessionEndRequest) -> SessionEndAccepted:
    event = ingest_records.session_end(tenant, user, session, req.ts, _now(p),
                                       max_bytes=p.settings.max_message_bytes)
    [at] = await producer.send(session_events_topic(p, tenant), [event])
    return SessionEndAccepted(session_id=session, **at.model_dump())
