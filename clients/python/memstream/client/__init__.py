"""The Python client of memstream: write conversations to Kafka (or over HTTP), read memories
over HTTP.

Writes (``add``, ``end_session``) are Kafka records, because that is memstream's ingest
contract (:mod:`memstream.contract.records`): keyed ``tenant/user``, produced idempotently with
``acks=all``, each message carrying a ``message_id`` so a retried ``add`` is deduplicated.
A client without Kafka settings (no ``bootstrap_servers``, no ``kafka``) sends them to the
worker's HTTP way in instead (``POST .../messages``, ``.../sessions/{s}/end``), which
produces the same records. Reads and agent tools are the HTTP contract of
:mod:`memstream.contract.http_api.api`, answered as its pydantic models.

The request building and response parsing are written once, sans-I/O (``_ops``), so the
sync (``_sync``) and the async client (``_async``) only differ in the few lines that
actually do I/O; records and the producer are ``_produce``, what both clients share
``_base``; HTTP goes through a transport (``_http``: urllib3, or a test's callable), Kafka
through aiokafka (the ``kafka`` extra, imported only when a record is produced). Import from
here: the underscored modules are not an API.
"""

from memstream.client._async import AsyncMemoryClient
from memstream.client._connection import KafkaConnection
from memstream.client._errors import MemstreamAPIError, MemstreamConnectionError
from memstream.client._http import ConnectError, Request, Response, Transport, TransportError
from memstream.client._ops import api_error
from memstream.client._produce import (
    KafkaProducerLike,
    Messages,
    ProducerFactory,
    aiokafka_producer,
    chat_messages,
)
from memstream.client._sync import MemoryClient
from memstream.client._version import __version__

__all__ = [
    "AsyncMemoryClient",
    "ConnectError",
    "KafkaConnection",
    "KafkaProducerLike",
    "MemoryClient",
    "MemstreamAPIError",
    "MemstreamConnectionError",
    "Messages",
    "ProducerFactory",
    "Request",
    "Response",
    "Transport",
    "TransportError",
    "__version__",
    "aiokafka_producer",
    "api_error",
    "chat_messages",
]
