"""The asyncio client: the same methods as the sync one, on the caller's event loop; each
HTTP request waits in a thread of the client's own pool (as ``asyncio.to_thread`` would, the
caller's context variables with it), so the loop goes on and up to :data:`CONCURRENCY`
requests are under way at once, whatever else uses the loop's default executor."""

from __future__ import annotations

import asyncio
import contextvars
import functools
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from types import TracebackType
from typing import Any, Self, TypeVar

from memstream.client import _gov_ops as gops
from memstream.client import _ops as ops
from memstream.client._base import ClientBase, Verify
from memstream.client._connection import KafkaConnection
from memstream.client._errors import MemstreamConnectionError
from memstream.client._http import CONCURRENCY, Request, Response, Transport
from memstream.client._produce import Messages, ProducerFactory
from memstream.contract.http_api import api
from memstream.contract.http_api import history as gov

T = TypeVar("T")


class AsyncMemoryClient(ClientBase):
    """memstream for one tenant, asyncio: the same methods as :class:`MemoryClient`."""

    def __init__(self, base_url: str | Sequence[str], api_key: str, *, tenant_id: str,
                 bootstrap_servers: str | None = None, topic_prefix: str = "memstream",
                 timeout: float = 10.0, transport: Transport | None = None,
                 producer_factory: ProducerFactory | None = None,
                 clock: Callable[[], datetime] | None = None,
                 kafka: KafkaConnection | object | None = None,
                 verify: Verify = True) -> None:
        super().__init__(base_url, api_key, tenant_id, bootstrap_servers, topic_prefix,
                         timeout, producer_factory, clock, kafka, transport, verify)
        self._threads = ThreadPoolExecutor(CONCURRENCY, thread_name_prefix="memstream-http")

    async def _run(self, op: ops.Op[T]) -> T:
        step = ops.advance(op, None, self._secret)
        while isinstance(step, ops.Call):
            step = ops.advance(op, await self._send(step), self._secret)
        return step.value

    async def _send(self, step: ops.Call) -> Response:
        """See :meth:`MemoryClient._send`."""
        attempts = list(self._attempts(step))
        for n, (at, request) in enumerate(attempts):
            response, error = None, None
            try:
                with ops.reaching_api():
                    response = await self._in_thread(request)
            except MemstreamConnectionError as exc:
                error = exc
            if self._settle(at, response, error, n == len(attempts) - 1):
                assert response is not None
                return response
        raise AssertionError("unreachable: the last attempt settles")

    async def _in_thread(self, request: Request) -> Response:
        call = functools.partial(contextvars.copy_context().run, self._transport, request)
        return await asyncio.get_running_loop().run_in_executor(self._threads, call)

    async def add(self, messages: Messages, *, user_id: str, session_id: str,
                  role: str = "user") -> list[str]:
        """See :meth:`MemoryClient.add`."""
        events = self._chat(messages, user_id, session_id, role)
        if self._over_http:
            return await self._run(ops.add_messages_op(self.tenant_id, user_id, session_id,
                                                       events))
        await self._producer.send(self._message_records(events))
        return [e.message_id for e in events]

    async def end_session(self, *, user_id: str, session_id: str) -> None:
        """See :meth:`MemoryClient.end_session`."""
        if self._over_http:
            await self._run(ops.end_session_op(self.tenant_id, user_id, session_id))
            return
        await self._producer.send(self._session_end_records(user_id, session_id))

    async def search(self, query: str, *, user_id: str, limit: int | None = None,
                     sources: ops.Sources | None = None,
                     turn_match: ops.TurnMatch | None = None, recency: bool | None = None,
                     **options: Any) -> api.SearchResponse:
        """See :meth:`MemoryClient.search`."""
        options = ops.fusion_options(options, sources, turn_match, recency)
        return await self._run(ops.search_op(self.tenant_id, user_id, query, limit, options))

    async def get_all(self, *, user_id: str, status: str | None = None,
                      type: str | None = None, page_size: int = 100) -> list[api.MemoryOut]:
        """See :meth:`MemoryClient.get_all`."""
        return await self._run(ops.get_all_op(self.tenant_id, user_id, status, type, page_size))

    async def context(self, query: str, *, user_id: str, session_id: str | None = None,
                      limit: int | None = None, budget_chars: int | None = None,
                      budget_tokens: int | None = None,
                      record_hits: bool = True) -> api.ContextResponse:
        """See :meth:`MemoryClient.context`."""
        request = ops.context_request(query, session_id, limit, budget_chars, budget_tokens,
                                  record_hits)
        return await self._run(ops.context_op(self.tenant_id, user_id, request))

    async def tools(self) -> list[dict[str, Any]]:
        """See :meth:`MemoryClient.tools`."""
        return await self._run(ops.tools_op())

    async def execute_tool(self, name: str, arguments: Mapping[str, Any] | str, *,
                           user_id: str, session_id: str | None = None,
                           tool_call_id: str | None = None,
                           wait_s: float = 5.0) -> api.ToolResult:
        """See :meth:`MemoryClient.execute_tool`."""
        request = ops.tool_call(name, arguments, session_id, tool_call_id, wait_s)
        return await self._run(ops.execute_tool_op(self.tenant_id, user_id, request))

    async def feedback(self, query_id: str, memory_id: str, *, user_id: str,
                       useful: bool) -> None:
        """See :meth:`MemoryClient.feedback`."""
        request = api.FeedbackRequest(query_id=query_id, memory_id=memory_id, useful=useful)
        await self._run(ops.feedback_op(self.tenant_id, user_id, request))

    # --- history and corrections -----------------------------------------------------

    async def history(self, memory_id: str, *, user_id: str) -> gov.HistoryResponse:
        """See :meth:`MemoryClient.history`."""
        return await self._run(gops.history_op(self.tenant_id, user_id, memory_id))

    async def source(self, memory_id: str, *, user_id: str,
                     version: int | None = None) -> gov.SourceResponse:
        """See :meth:`MemoryClient.source`."""
        return await self._run(gops.source_op(self.tenant_id, user_id, memory_id, version))

    async def changes(self, *, user_id: str, limit: int | None = None) -> list[gov.VersionOut]:
        """See :meth:`MemoryClient.changes`."""
        return await self._run(gops.changes_op(self.tenant_id, user_id, limit))

    async def delete(self, memory_id: str | None = None, *, user_id: str, reason: str = "",
                     wait_s: float = 10.0) -> gov.CorrectionResult:
        """See :meth:`MemoryClient.delete`."""
        return await self._run(gops.delete_op(self.tenant_id, user_id, memory_id, reason,
                                              wait_s))

    async def rollback(self, memory_id: str, version: int, *, user_id: str, reason: str = "",
                       wait_s: float = 10.0) -> gov.CorrectionResult:
        """See :meth:`MemoryClient.rollback`."""
        return await self._run(gops.rollback_op(self.tenant_id, user_id, memory_id, version,
                                                reason, wait_s))

    async def undo_job(self, job_id: str, *, user_id: str, reason: str = "",
                       wait_s: float = 10.0) -> gov.CorrectionResult:
        """See :meth:`MemoryClient.undo_job`."""
        return await self._run(gops.undo_job_op(self.tenant_id, user_id, job_id, reason,
                                                wait_s))

    async def forget(self, *, user_id: str, reason: str = "",
                     wait_s: float = 10.0) -> gov.CorrectionResult:
        """See :meth:`MemoryClient.forget`."""
        return await self._run(gops.forget_op(self.tenant_id, user_id, reason, wait_s))

    async def audit(self, *, user_id: str | None = None, kind: str | None = None,
                    limit: int = 100) -> list[gov.AuditEntry]:
        """See :meth:`MemoryClient.audit`."""
        return await self._run(gops.audit_op(self.tenant_id, user_id, kind, limit))

    async def aclose(self) -> None:
        """Stop the producer, close the HTTP connections. Idempotent."""
        try:
            await self._producer.stop()
        finally:
            self._threads.shutdown(wait=False)
            self._close_transport()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.aclose()
