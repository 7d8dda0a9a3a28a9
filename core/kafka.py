"""The one Kafka client factory: every producer, consumer and admin client memstream
builds (the stages' loops, the API, the CLI, the demo, tests and benchmarks) gets the
connection settings from here (Faust connects to no broker: streams/faust_setup.py).

A production cluster wants ``SASL_PLAINTEXT`` or ``SASL_SSL`` (PLAIN or SCRAM) and maybe
mutual TLS: one place applies ``kafka_security_protocol``, ``kafka_sasl_*`` and
``kafka_ssl_*`` so no command can connect without them. The password is a ``SecretStr``
until the client is built and is never logged.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.helpers import create_ssl_context

from memstream.core import record_auth, record_keys
from memstream.core.settings import Settings


class _InTheClearOnce(logging.Filter):
    """aiokafka warns "Sending username and password in the clear" on every connection of a
    SASL_PLAINTEXT client: said once per process, it is still said."""

    said = False

    def filter(self, record: logging.LogRecord) -> bool:
        if record.getMessage() != "Sending username and password in the clear":
            return True
        said, self.said = self.said, True
        return not said


logging.getLogger("aiokafka.conn").addFilter(_InTheClearOnce())


def _ssl_context(settings: Settings) -> ssl.SSLContext | None:
    if settings.kafka_security_protocol not in ("SSL", "SASL_SSL"):
        return None
    return create_ssl_context(cafile=settings.kafka_ssl_cafile,
                              certfile=settings.kafka_ssl_certfile,
                              keyfile=settings.kafka_ssl_keyfile)


def connection(settings: Settings) -> dict[str, Any]:
    """aiokafka's connection keywords: bootstrap servers, security protocol, SASL, SSL."""
    args: dict[str, Any] = {"bootstrap_servers": settings.bootstrap_servers,
                            "security_protocol": settings.kafka_security_protocol}
    context = _ssl_context(settings)
    if context is not None:
        args["ssl_context"] = context
    if settings.kafka_security_protocol.startswith("SASL"):
        assert settings.kafka_sasl_password is not None  # Settings checks it
        args.update(sasl_mechanism=settings.kafka_sasl_mechanism,
                    sasl_plain_username=settings.kafka_sasl_username,
                    sasl_plain_password=settings.kafka_sasl_password.get_secret_value())
    return args


class SigningProducer(AIOKafkaProducer):
    """A producer that signs every record it sends to a topic whose records carry authority
    (tool requests, jobs, decisions, job results: :mod:`core.record_auth`) with the keys of
    its settings (:mod:`core.record_keys`), so no producer memstream builds can forget to.
    Without a secret it signs nothing (and the worker refuses those records)."""

    def __init__(self, settings: Settings, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._signing_settings = settings

    async def send(self, topic: str, value: Any = None, key: Any = None, partition: Any = None,
                   timestamp_ms: Any = None, headers: Any = None) -> Any:
        role = record_auth.role_of(topic, self._signing_settings.topic_prefix)
        if role is not None:
            keys = record_keys.keys_for(self._signing_settings)
            if keys.signing is not None:
                if not all(x is None or isinstance(x, bytes) for x in (key, value)):
                    raise TypeError("a signed record's key and value are bytes")
                headers = [h for h in (headers or ()) if h[0] != record_auth.HEADER]
                headers.append(record_auth.header(keys, role, key, value))
        return await super().send(topic, value, key, partition, timestamp_ms, headers)


def producer(settings: Settings, *, sign: bool = True, **kwargs: Any) -> AIOKafkaProducer:
    """A producer (not started) on the configured connection. ``acks="all"`` unless told
    otherwise: a write is acknowledged once ``min.insync.replicas`` replicas have it, so the
    loss of the partition's leader does not lose it (aiokafka's default is 1). Records of the
    topics that carry authority are signed (:class:`SigningProducer`), unless ``sign`` is
    False: a copy of records (``memstream topics grow``) keeps the MACs they were written
    with, so a forged record stays refused in its new topic."""
    kwargs.setdefault("acks", "all")
    if not sign:
        return AIOKafkaProducer(**connection(settings), **kwargs)
    return SigningProducer(settings, **connection(settings), **kwargs)


def consumer(settings: Settings, *topics: str, **kwargs: Any) -> AIOKafkaConsumer:
    """A consumer (not started) on the configured connection."""
    return AIOKafkaConsumer(*topics, **connection(settings), **kwargs)


async def started(client: AIOKafkaConsumer) -> AIOKafkaConsumer:
    """``client`` started; stopped again if it cannot start (a refused login, no broker),
    so no half-open client is left behind."""
    try:
        await client.start()
    except BaseException:
        await stopped(client)
        raise
    return client


async def stopped(client: AIOKafkaConsumer) -> None:
    """Stop a consumer, also one stopped right after its start: aiokafka (0.14) raises
    CancelledError from ``stop()`` when the consumer's own task has not run once yet, which
    would cancel the caller (a timer of the Faust app stops for good on it). A caller
    cancelled meanwhile (a task group's sibling failed) waits for the stop to end before
    it is cancelled: the consumer is never left to be collected unclosed."""
    async def stop() -> None:
        await asyncio.sleep(0)
        await client.stop()

    stopping = asyncio.ensure_future(stop())
    try:
        await asyncio.shield(stopping)
    except asyncio.CancelledError:
        if not stopping.done():  # this task was cancelled: the stop goes on to its end
            await asyncio.wait([stopping])
        raise


def leave_on_stop(client: AIOKafkaConsumer) -> bool:
    """Make a static member leave its group when ``client`` stops. aiokafka never sends a
    static member's LeaveGroup (KIP-345: a restart keeps its partitions without a
    rebalance), so a worker stopped for good held them until its session timed out. Its
    own leave (by member id, after its heartbeat and coordination tasks stopped) is sent
    once the instance id is no longer known to it. False when this client has no group."""
    coordinator = getattr(client, "_coordinator", None)
    if coordinator is None or not hasattr(coordinator, "_group_instance_id"):
        return False
    coordinator._group_instance_id = None
    return True


def admin(settings: Settings, **kwargs: Any) -> AIOKafkaAdminClient:
    """An admin client (not started) on the configured connection."""
    return AIOKafkaAdminClient(**connection(settings), **kwargs)
