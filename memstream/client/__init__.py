"""The Python client of memstream: write conversations to Kafka (or over HTTP), read memories
over HTTP.

Writes (``add``, ``end_session``) are Kafka records, because that is memstream's ingest
contract (:mod:`memstream.topics.schemas`): keyed ``tenant/user``, produced idempotently with
``acks=all``, each message carrying a ``message_id`` so a retried ``add`` is deduplicated.
A client without Kafka settings (no ``bootstrap_servers``, no ``kafka``) sends them to the
worker's HTTP way in instead (``POST .../messages``, ``.../sessions/{s}/end``), which
produces the same records. Reads and agent tools are the HTTP contract of
:mod:`memstream.web.models.api`, answered as its pydantic models.

The request building and response parsing are written once, sans-I/O (``_ops``), so the
sync (``_sync``) and the async client (``_async``) only differ in the few lines that
actually do I/O; records and the producer are ``_produce``, what both clients share
``_base``. Import from here: the underscored modules are not an API.
"""

from memstream.client._async import AsyncMemoryClient
from memstream.client._errors import MemstreamAPIError, MemstreamConnectionError
from memstream.client._ops import api_error
from memstream.client._produce import (
    KafkaProducerLike,
    Messages,
    ProducerFactory,
    aiokafka_producer,
    chat_messages,
)
from memstream.client._sync import MemoryClient

__all__ = [
    "AsyncMemoryClient",
    "KafkaProducerLike",
    "MemoryClient",
    "MemstreamAPIError",
    "MemstreamConnectionError",
    "Messages",
    "ProducerFactory",
    "aiokafka_producer",
    "api_error",
    "chat_messages",
]
