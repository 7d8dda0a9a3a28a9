"""What the sync and the async client share: configuration, validation and the records to
produce, no I/O; each client adds its own HTTP client and, for the sync one, a loop thread."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from pydantic import SecretStr

from memstream import __version__
from memstream.client._ops import check_id
from memstream.client._produce import (
    Messages,
    Producer,
    ProducerFactory,
    Record,
    aiokafka_producer,
    chat_messages,
    to_records,
)
from memstream.core.errors import MemstreamError
from memstream.core.settings import Settings
from memstream.topics.schemas import SessionEvent


def _utc_now() -> datetime:
    return datetime.now(UTC)


class ClientBase:
    """What both clients share: configuration, validation and the records to produce."""

    def __init__(self, base_url: str, api_key: str, tenant_id: str,
                 bootstrap_servers: str | None, topic_prefix: str, timeout: float,
                 producer_factory: ProducerFactory | None,
                 clock: Callable[[], datetime] | None, kafka: Settings | None = None) -> None:
        if not api_key:
            raise ValueError("api_key must not be empty")
        self.base_url = base_url
        self.tenant_id = check_id("tenant_id", tenant_id)
        self.topic_prefix = topic_prefix
        if kafka is not None:  # the whole connection: bootstrap servers, SASL, SSL
            bootstrap_servers = bootstrap_servers or kafka.bootstrap_servers
            kafka = kafka.model_copy(update={"bootstrap_servers": bootstrap_servers})
        elif bootstrap_servers is not None:  # plaintext; no environment is read
            kafka = Settings.model_construct(bootstrap_servers=bootstrap_servers)
        self.bootstrap_servers = bootstrap_servers
        self._api_key = SecretStr(api_key)  # never printed, redacted from error messages
        self._timeout = timeout
        self._clock = clock or _utc_now
        self._producer = Producer(kafka or Settings.model_construct(),
                                  producer_factory or aiokafka_producer)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(base_url={self.base_url!r}, tenant_id={self.tenant_id!r})"

    def _http_options(self) -> dict[str, Any]:
        headers = {"Authorization": f"Bearer {self._api_key.get_secret_value()}",
                   "User-Agent": f"memstream-client/{__version__}"}
        return {"base_url": self.base_url, "headers": headers, "timeout": self._timeout}

    @property
    def _secret(self) -> str:
        return self._api_key.get_secret_value()

    def _need_broker(self) -> None:
        if self.bootstrap_servers is None:
            raise MemstreamError("this client needs bootstrap_servers to produce messages "
                                 "and session events to Kafka")

    def _message_records(self, messages: Messages, user_id: str, session_id: str,
                         role: str) -> tuple[list[str], list[Record]]:
        self._need_broker()
        events = chat_messages(messages, tenant_id=self.tenant_id, user_id=user_id,
                               session_id=session_id, role=role, now=self._clock())
        ids = [e.message_id for e in events]
        return ids, to_records(f"{self.topic_prefix}.messages", events)

    def _session_end_records(self, user_id: str, session_id: str) -> list[Record]:
        self._need_broker()
        event = SessionEvent(tenant_id=self.tenant_id, user_id=user_id, session_id=session_id,
                             ts=self._clock())
        return to_records(f"{self.topic_prefix}.session-events", [event])
