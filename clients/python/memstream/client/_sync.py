"""The synchronous client: urllib3 for HTTP, aiokafka driven from a private loop thread."""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from types import TracebackType
from typing import Any, Self, TypeVar

from memstream.client import _gov_ops as gops
from memstream.client import _ops as ops
from memstream.client._base import ClientBase, Verify
from memstream.client._connection import KafkaConnection
from memstream.client._errors import MemstreamConnectionError
from memstream.client._http import Response, Transport
from memstream.client._produce import LoopThread, Messages, ProducerFactory, Record
from memstream.contract.http_api import api
from memstream.contract.http_api import history as gov

T = TypeVar("T")


class MemoryClient(ClientBase):
    """memstream for one tenant, synchronous. Thread-safe; close it (or use ``with``).

    ``verify``: how the API's certificate is checked over HTTPS (True: the system's CAs;
    a path: a CA file; an ``ssl.SSLContext``). Every write is sent with an
    ``Idempotency-Key`` of its own, the same on each worker it is tried on (failover), so it
    is taken once. ``kafka``: a :class:`KafkaConnection`, or any object with its fields
    (memstream's ``Settings``). ``producer_factory``, ``clock`` and ``transport`` (a
    callable ``Request -> Response``, :mod:`memstream.client._http`) are seams for tests.
    """

    def __init__(self, base_url: str | Sequence[str], api_key: str, *, tenant_id: str,
                 bootstrap_servers: str | None = None, topic_prefix: str = "memstream",
                 timeout: float = 10.0, transport: Transport | None = None,
                 producer_factory: ProducerFactory | None = None,
                 clock: Callable[[], datetime] | None = None,
                 kafka: KafkaConnection | object | None = None,
                 verify: Verify = True) -> None:
        super().__init__(base_url, api_key, tenant_id, bootstrap_servers, topic_prefix,
                         timeout, producer_factory, clock, kafka, transport, verify)
        self._loop_thread: LoopThread | None = None
        self._loop_lock = threading.Lock()

    def _run(self, op: ops.Op[T]) -> T:
        step = ops.advance(op, None, self._secret)
        while isinstance(step, ops.Call):
            step = ops.advance(op, self._send(step), self._secret)
        return step.value

    def _send(self, step: ops.Call) -> Response:
        """The call to the first worker that can answer (several base URLs: failover)."""
        attempts = list(self._attempts(step))
        for n, (at, request) in enumerate(attempts):
            response, error = None, None
            try:
                with ops.reaching_api():
                    response = self._transport(request)
            except MemstreamConnectionError as exc:
                error = exc
            if self._settle(at, response, error, n == len(attempts) - 1):
                assert response is not None
                return response
        raise AssertionError("unreachable: the last attempt settles")

    def _produce(self, records: Sequence[Record]) -> None:
        with self._loop_lock:
            self._loop_thread = self._loop_thread or LoopThread()
        self._loop_thread.run(self._producer.send(records))

    def add(self, messages: Messages, *, user_id: str, session_id: str,
            role: str = "user") -> list[str]:
        """Send messages to memstream, in order; returns their message ids.

        With Kafka settings (``bootstrap_servers`` or ``kafka``) they are produced to the
        messages topic; without, they go through the HTTP way in (``POST .../messages``,
        202 once the broker has them). Everything is validated before anything is sent.
        Retrying with the same ids (pass ``message_id``) is safe: memstream drops duplicates.
        """
        events = self._chat(messages, user_id, session_id, role)
        if self._over_http:
            return self._run(ops.add_messages_op(self.tenant_id, user_id, session_id, events))
        self._produce(self._message_records(events))
        return [e.message_id for e in events]

    def end_session(self, *, user_id: str, session_id: str) -> None:
        """Tell memstream the session ended: what is below the extraction threshold runs
        (over HTTP without Kafka settings, as :meth:`add`)."""
        if self._over_http:
            self._run(ops.end_session_op(self.tenant_id, user_id, session_id))
            return
        self._produce(self._session_end_records(user_id, session_id))

    def search(self, query: str, *, user_id: str, limit: int | None = None,
               sources: ops.Sources | None = None, turn_match: ops.TurnMatch | None = None,
               recency: bool | None = None, **options: Any) -> api.SearchResponse:
        """Ranked memories (``memories``) and, fused with the user's archived turns, the
        ``items`` (:class:`~memstream.contract.http_api.api.RecallItem`). ``sources`` ("fused",
        "memories", "turns"), ``turn_match`` ("hybrid", "dense", "sparse") and ``recency``
        narrow the fusion (unset: the server's defaults); ``options`` are the other
        :class:`SearchRequest` fields."""
        options = ops.fusion_options(options, sources, turn_match, recency)
        return self._run(ops.search_op(self.tenant_id, user_id, query, limit, options))

    def get_all(self, *, user_id: str, status: str | None = None, type: str | None = None,
                page_size: int = 100) -> list[api.MemoryOut]:
        """Every memory of the user (following the cursor through all pages)."""
        return self._run(ops.get_all_op(self.tenant_id, user_id, status, type, page_size))

    def context(self, query: str, *, user_id: str, session_id: str | None = None,
                limit: int | None = None, budget_chars: int | None = None,
                budget_tokens: int | None = None, record_hits: bool = True) -> api.ContextResponse:
        """Memories, core blocks, the session's recent turns and a ready prompt block."""
        request = ops.context_request(query, session_id, limit, budget_chars, budget_tokens,
                                  record_hits)
        return self._run(ops.context_op(self.tenant_id, user_id, request))

    def tools(self) -> list[dict[str, Any]]:
        """The memory tools as OpenAI tool definitions, ready for ``tools=``."""
        return self._run(ops.tools_op())

    def execute_tool(self, name: str, arguments: Mapping[str, Any] | str, *, user_id: str,
                     session_id: str | None = None, tool_call_id: str | None = None,
                     wait_s: float = 5.0) -> api.ToolResult:
        """Run a tool call a model made; ``arguments`` may be the model's JSON string.
        A write waits up to ``wait_s`` for its job to be applied (else status "queued")."""
        request = ops.tool_call(name, arguments, session_id, tool_call_id, wait_s)
        return self._run(ops.execute_tool_op(self.tenant_id, user_id, request))

    def feedback(self, query_id: str, memory_id: str, *, user_id: str, useful: bool) -> None:
        """Whether a memory a search returned (``query_id``) helped."""
        request = api.FeedbackRequest(query_id=query_id, memory_id=memory_id, useful=useful)
        self._run(ops.feedback_op(self.tenant_id, user_id, request))

    # --- history and corrections -----------------------------------------------------

    def history(self, memory_id: str, *, user_id: str) -> gov.HistoryResponse:
        """Every version of a memory, oldest first, each with its lineage (job, session,
        messages, reason, kind, who closed it)."""
        return self._run(gops.history_op(self.tenant_id, user_id, memory_id))

    def source(self, memory_id: str, *, user_id: str,
               version: int | None = None) -> gov.SourceResponse:
        """The messages a version (default: the latest) was extracted from, while the
        session window still keeps them."""
        return self._run(gops.source_op(self.tenant_id, user_id, memory_id, version))

    def changes(self, *, user_id: str, limit: int | None = None) -> list[gov.VersionOut]:
        """The user's change log, newest first."""
        return self._run(gops.changes_op(self.tenant_id, user_id, limit))

    def delete(self, memory_id: str | None = None, *, user_id: str, reason: str = "",
               wait_s: float = 10.0) -> gov.CorrectionResult:
        """Delete one memory, or every memory of the user (``memory_id`` None): soft (kept
        in the history, never retrieved), audited, a job of the user like any write."""
        return self._run(gops.delete_op(self.tenant_id, user_id, memory_id, reason, wait_s))

    def rollback(self, memory_id: str, version: int, *, user_id: str, reason: str = "",
                 wait_s: float = 10.0) -> gov.CorrectionResult:
        """A new version equal to ``version`` (restores a deleted memory)."""
        return self._run(gops.rollback_op(self.tenant_id, user_id, memory_id, version,
                                          reason, wait_s))

    def undo_job(self, job_id: str, *, user_id: str, reason: str = "",
                 wait_s: float = 10.0) -> gov.CorrectionResult:
        """Undo every change of one job (memories changed since are left alone)."""
        return self._run(gops.undo_job_op(self.tenant_id, user_id, job_id, reason, wait_s))

    def forget(self, *, user_id: str, reason: str = "",
               wait_s: float = 10.0) -> gov.CorrectionResult:
        """Forget-me: every memory of the user stops being retrievable at once, then the
        user's content is erased everywhere memstream keeps it (README: the bound)."""
        return self._run(gops.forget_op(self.tenant_id, user_id, reason, wait_s))

    def audit(self, *, user_id: str | None = None, kind: str | None = None,
              limit: int = 100) -> list[gov.AuditEntry]:
        """The tenant's audit log, newest first: who did what, when (no content)."""
        return self._run(gops.audit_op(self.tenant_id, user_id, kind, limit))

    def close(self) -> None:
        """Stop the producer and its thread, close the HTTP connections. Idempotent."""
        with self._loop_lock:
            loop_thread, self._loop_thread = self._loop_thread, None
        try:
            if loop_thread is not None:
                try:
                    loop_thread.run(self._producer.stop())
                finally:
                    loop_thread.stop()
        finally:
            self._close_transport()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()
