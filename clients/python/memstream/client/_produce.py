"""The client's Kafka side: chat messages and session events as records, and the producer.

Writes are Kafka records because that is memstream's ingest contract
(:mod:`memstream.contract.records`): keyed ``tenant/user``, produced idempotently with
``acks=all``, each message carrying a ``message_id`` so a retried ``add`` is deduplicated.
The sync client keeps aiokafka on a private event loop in a daemon thread
(:class:`LoopThread`), so its caller needs no loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import uuid
from collections.abc import Awaitable, Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol, TypeVar, cast

from memstream.client._connection import KafkaConnection, aiokafka
from memstream.client._errors import MemstreamConnectionError
from memstream.client._version import __version__
from memstream.contract.records import ChatMessage, Event

T = TypeVar("T")
Messages = str | Sequence[Mapping[str, Any] | ChatMessage]

_MESSAGE_KEYS = ("role", "content", "message_id", "ts", "metadata")  # the rest of a chat dict


class KafkaProducerLike(Protocol):
    """The part of :class:`aiokafka.AIOKafkaProducer` the client uses (a seam for tests)."""

    async def start(self) -> None: ...

    async def send(self, topic: str, value: bytes, key: bytes) -> Awaitable[Any]: ...

    async def stop(self) -> None: ...


ProducerFactory = Callable[[KafkaConnection], KafkaProducerLike]  # connection -> unstarted producer


def aiokafka_producer(connection: KafkaConnection) -> KafkaProducerLike:
    """The default producer (the ``kafka`` extra): idempotent, every in-sync replica
    acknowledges. The chat topics' records carry no MAC: nothing to sign."""
    return cast(KafkaProducerLike, aiokafka().AIOKafkaProducer(
        **connection.aiokafka_options(),
enable_idempotence=True, acks="all",
        client_id=f"memstream-client/{__version__}"))


def _kafka_errors() -> tuple[type[Exception], ...]:
    """aiokafka's errors, when it is installed (a test's fake producer needs none)."""
    try:
        from aiokafka.errors import KafkaError
    except ImportError:
        return ()
    return (KafkaError,)


@dataclass(frozen=True)
class Record:
    topic: str
    key: bytes
    value: bytes


def to_records(topic: str, events: Sequence[Event]) -> list[Record]:
    return [Record(topic, e.key().encode(), e.dumps()) for e in events]


def chat_messages(messages: Messages, *, tenant_id: str, user_id: str, session_id: str,
                  role: str, now: datetime) -> list[ChatMessage]:
    """Validate what ``add`` was given into ChatMessages, each with a ``message_id`` and a
    ``ts``. Raises ValueError (pydantic's ValidationError is one) on anything invalid."""
    items = [{"role": role, "content": messages}] if isinstance(messages, str) else messages
    out = [_chat_message(m, tenant_id, user_id, session_id, role, now) for m in items]
    if not out:
        raise ValueError("add() needs at least one message")
    ids = [m.message_id for m in out]
    if len(set(ids)) != len(ids):
        raise ValueError("two messages of one add() share a message_id")
    return out


def _chat_message(item: Mapping[str, Any] | ChatMessage, tenant_id: str, user_id: str,
                  session_id: str, role: str, now: datetime) -> ChatMessage:
    if isinstance(item, ChatMessage):
        if (item.tenant_id, item.user_id, item.session_id) != (tenant_id, user_id, session_id):
            raise ValueError("a ChatMessage's tenant_id, user_id and session_id must be the "
                             "client's tenant and the user and session of the add() call")
        message = item
    elif isinstance(item, Mapping):
        fields = {"role": role, "message_id": uuid.uuid4().hex, "ts": now}
        fields |= {k: item[k] for k in _MESSAGE_KEYS if item.get(k) is not None}
        message = ChatMessage.model_validate(
            {**fields, "tenant_id": tenant_id, "user_id": user_id, "session_id": session_id})
    else:
        raise ValueError(f"a message must be a mapping or a ChatMessage, not "
                         f"{type(item).__name__}")
    if not message.content.strip():
        raise ValueError("a message's content must not be blank")
    return message


class Producer:
    """One lazily started producer, reused; sends a batch in order and waits for delivery."""

    def __init__(self, connection: KafkaConnection, factory: ProducerFactory) -> None:
        self._connection = connection
        self._factory = factory
        self._producer: KafkaProducerLike | None = None
        self._lock: asyncio.Lock | None = None

    async def send(self, records: Sequence[Record]) -> None:
        try:
            producer = await self._started()
            pending = [await producer.send(r.topic, value=r.value, key=r.key) for r in records]
            await asyncio.gather(*pending)
        except _kafka_errors() as exc:
            raise MemstreamConnectionError(
                f"records not confirmed by the broker: {type(exc).__name__}: {exc}") from exc

    async def _started(self) -> KafkaProducerLike:
        self._lock = self._lock or asyncio.Lock()
        async with self._lock:
            if self._producer is None:
                producer = self._factory(self._connection)  # aiokafka needs the running loop
                try:
                    await producer.start()
                except BaseException:
                    with contextlib.suppress(Exception):
                        await producer.stop()
                    raise
                self._producer = producer
            return self._producer

    async def stop(self) -> None:
        producer, self._producer = self._producer, None
        if producer is not None:
            await producer.stop()


class LoopThread:
    """A private event loop on a daemon thread, so the sync client can drive aiokafka."""

    def __init__(self) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever,
                                        name="memstream-client-kafka", daemon=True)
        self._thread.start()

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    def stop(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()
        self._loop.close()
