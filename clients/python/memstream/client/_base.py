"""What the sync and the async client share: configuration, validation, the requests and
the records to produce, no I/O; each client adds how it waits for the transport and, for the
sync one, a loop thread for the producer."""

from __future__ import annotations

import ssl
from collections.abc import Callable, Iterator, Sequence
from datetime import UTC, datetime
from pathlib import Path

from pydantic import SecretStr

from memstream.client import _ops as ops
from memstream.client._connection import KafkaConnection, aiokafka
from memstream.client._http import Request, Response, Transport, Urllib3Transport
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
from memstream.client._version import __version__
from memstream.contract.records import ChatMessage, SessionEvent

Verify = bool | str | Path | ssl.SSLContext  # True: the system's CAs; a path: a CA file


def _utc_now() -> datetime:
    return datetime.now(UTC)


def ssl_verify(verify: Verify) -> bool | ssl.SSLContext:
    """The transport's ``verify``: a CA file (PEM) becomes a context trusting it alone."""
    if isinstance(verify, (str, Path)):
        return ssl.create_default_context(cafile=str(verify))
    return verify


class ClientBase:
    """What both clients share: configuration, validation and the records to produce."""

    def __init__(self, base_url: str | Sequence[str], api_key: str, tenant_id: str,
                 bootstrap_servers: str | None, topic_prefix: str, timeout: float,
                 producer_factory: ProducerFactory | None,
                 clock: Callable[[], datetime] | None, kafka: object | None = None,
                 transport: Transport | None = None, verify: Verify = True) -> None:
        if not api_key:
            raise ValueError("api_key must not be empty")
        # several workers: any answers any request; one that cannot be reached (or answers
        # 502/503/504) is skipped for the next (see :meth:`_attempts`)
        self.base_urls = [base_url] if isinstance(base_url, str) else list(base_url)
        if not self.base_urls:
            raise ValueError("base_url must name at least one worker")
        self.base_urls = [u.rstrip("/") for u in self.base_urls]
        self.base_url = self.base_urls[0]
        self._current = 0
        self.tenant_id = check_id("tenant_id", tenant_id)
        self.topic_prefix = topic_prefix
        # the per-tenant layout (docs/tenancy.md): the tenant's own input topics
        # ``kafka``: a KafkaConnection, or any object with its fields (the server's Settings)
        connection = None if kafka is None else KafkaConnection.of(kafka)
        self.per_tenant = connection is not None and connection.input_topics == "per-tenant"
        if connection is not None:  # the whole connection: bootstrap servers, SASL, SSL
            bootstrap_servers = bootstrap_servers or connection.bootstrap_servers
            connection = connection.model_copy(update={"bootstrap_servers": bootstrap_servers})
        elif bootstrap_servers is not None:  # plaintext; no environment is read
            connection = KafkaConnection(bootstrap_servers=bootstrap_servers)
        self.bootstrap_servers = bootstrap_servers
        self._api_key = SecretStr(api_key)  # never printed, redacted from error messages
        self._timeout = timeout
        self._clock = clock or _utc_now
        if connection is not None and producer_factory is None:
            aiokafka()  # Kafka writes need the kafka extra: say so now, not at the first add
        self._producer = Producer(connection or KafkaConnection(),
                                  producer_factory or aiokafka_producer)
        # the HTTP transport: urllib3's pools unless a test gives its own (then not closed)
        self._own_transport = transport is None
        self._transport: Transport = transport or Urllib3Transport(ssl_verify(verify))


    def __repr__(self) -> str:
        return f"{type(self).__name__}(base_url={self.base_url!r}, tenant_id={self.tenant_id!r})"

    def _attempts(self, step: ops.Call) -> Iterator[tuple[int, Request]]:
        """Each worker to try for one call (the one that answered last first), with the
        request to send it."""
        headers = {"Authorization": f"Bearer {self._secret}",  # the key: only in requests
                   "User-Agent": f"memstream-client/{__version__}"}
        n = len(self.base_urls)
        for i in range(n):
            at = (self._current + i) % n
            yield at, step.request(self.base_urls[at], headers, self._timeout)

    def _close_transport(self) -> None:
        close = getattr(self._transport, "close", None)
        if self._own_transport and callable(close):
            close()

    def _settle(self, at: int, response: Response | None, error: Exception | None,
                last: bool) -> bool:
        """After one attempt: True when it is the answer (remembered as the worker to ask
        first), False to try the next worker; raises the connection error of the last."""
        if error is not None:
            if last or not ops.failover(error):
                raise error
            return False
        assert response is not None
        if response.status_code in ops.FAILOVER_STATUSES and not last:
            return False
        self._current = at
        return True

    @property
    def _secret(self) -> str:
        return self._api_key.get_secret_value()

    @property
    def _over_http(self) -> bool:
        """No Kafka settings: ``add`` and ``end_session`` go through the HTTP way in."""
        return self.bootstrap_servers is None

    def _chat(self, messages: Messages, user_id: str, session_id: str,
              role: str) -> list[ChatMessage]:
        """Validated messages, each with its id: everything is checked before any send."""
        return chat_messages(messages, tenant_id=self.tenant_id, user_id=user_id,
                             session_id=session_id, role=role, now=self._clock())

    def _message_records(self, events: Sequence[ChatMessage]) -> list[Record]:
        return to_records(self._input_topic("messages"), events)

    def _session_end_records(self, user_id: str, session_id: str) -> list[Record]:
        event = SessionEvent(tenant_id=self.tenant_id, user_id=user_id, session_id=session_id,
                             ts=self._clock())
        return to_records(self._input_topic("session-events"), [event])

    def _input_topic(self, name: str) -> str:
        """Where a chat service writes (``messages``, ``session-events``): the shared topic,
        or with ``kafka`` settings of the per-tenant layout, the client's tenant's own."""
        tenant = f"tenant.{self.tenant_id}." if self.per_tenant else ""
        return f"{self.topic_prefix}.{tenant}{name}"
