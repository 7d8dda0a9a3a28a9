"""What the sync and the async client share: configuration, validation and the records to
produce, no I/O; each client adds its own HTTP client and, for the sync one, a loop thread."""

from __future__ import annotations

import ssl
from collections.abc import Callable, Iterator, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
from pydantic import SecretStr

from memstream import __version__
from memstream.client import _ops as ops
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
from memstream.core.settings import Settings
from memstream.topics.schemas import ChatMessage, SessionEvent

Verify = bool | str | Path | ssl.SSLContext  # True: the system's CAs; a path: a CA file


def _utc_now() -> datetime:
    return datetime.now(UTC)


def ssl_verify(verify: Verify) -> bool | ssl.SSLContext:
    """httpx's ``verify=``: a CA file (PEM) becomes a context trusting it alone."""
    if isinstance(verify, (str, Path)):
        return ssl.create_default_context(cafile=str(verify))
    return verify


class ClientBase:
    """What both clients share: configuration, validation and the records to produce."""

    def __init__(self, base_url: str | Sequence[str], api_key: str, tenant_id: str,
                 bootstrap_servers: str | None, topic_prefix: str, timeout: float,
                 producer_factory: ProducerFactory | None,
                 clock: Callable[[], datetime] | None, kafka: Settings | None = None) -> None:
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
        self.per_tenant = kafka is not None and kafka.input_topics == "per-tenant"
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

    def _http_options(self, verify: Verify = True) -> dict[str, Any]:
        headers = {"Authorization": f"Bearer {self._api_key.get_secret_value()}",
                   "User-Agent": f"memstream-client/{__version__}"}
        return {"headers": headers, "timeout": self._timeout, "verify": ssl_verify(verify)}

    def _attempts(self, step: ops.Call) -> Iterator[tuple[int, dict[str, Any]]]:
        """Each worker to try for one call (the one that answered last first), with the
        request's keyword arguments."""
        kwargs = step.request_kwargs(self._timeout)
        path = kwargs.pop("url")
        n = len(self.base_urls)
        for i in range(n):
            at = (self._current + i) % n
            yield at, {**kwargs, "url": self.base_urls[at] + path}

    def _settle(self, at: int, response: httpx.Response | None, error: Exception | None,
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
