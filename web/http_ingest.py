"""The HTTP way in: a tenant key adds chat messages, or ends a session, without Kafka.

- ``POST /v1/tenants/{tenant}/users/{user}/messages``: :class:`MessagesRequest` (one to
  :data:`MAX_BATCH_MESSAGES` messages; the body at most ``http_max_body_bytes``, else 413),
  produced to the messages topic, answered **202** :class:`MessagesAccepted` (each
  message's id, topic, partition and offset) once every in-sync replica has them.
- ``POST /v1/tenants/{tenant}/users/{user}/sessions/{session_id}/end``: an optional
  :class:`SessionEndRequest`, a session-end event, answered 202 :class:`SessionEndAccepted`.
  A sub-resource action, as ``jobs/{job_id}/undo`` and ``memories/{memory_id}/rollback``:
  the session is named by the path, like the user.

The checks are every scoped route's (:func:`memstream.web.http_checks.identified`: the
failed-login limit 429, key 401, path ids 400, tenant 403, then the body 413 / 400) and the
records are checked as the ingest stage reads them (:mod:`.ingest_records`). Both are writes
(``Idempotency-Key``). Neither waits for the user's owner: any worker produces (see
:mod:`.backend_ingest`), so :mod:`.routing` serves them where they arrive (:data:`LOCAL`).
A worker whose backend cannot produce answers 503.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from aiohttp import web
from pydantic import BaseModel, ValidationError

from memstream.contract.http_api import paths
from memstream.contract.http_api.api import ErrorCode
from memstream.contract.http_api.intake import (
    MAX_BATCH_MESSAGES,
    MessagesAccepted,
    MessagesRequest,
    SessionEndAccepted,
    SessionEndRequest,
)
from memstream.core import tracing
from memstream.web.http_base import DEPS, ApiError, Route
from memstream.web.http_checks import (
    IDEMPOTENCY,
    bad,
    identified,
    ok,
    read_object,
    validation_message,
)

__all__ = ["INGEST_ROUTES", "LOCAL", "MAX_BATCH_MESSAGES", "AcceptedRoute", "Producing"]

LOCAL = frozenset({paths.MESSAGES, paths.SESSION_END})  # served where they arrive


@runtime_checkable
class Producing(Protocol):
    """What a backend adds to take the HTTP way in (:class:`~.backend.WorkerBackend`)."""

    async def add_messages(self, tenant: str, user: str, req: MessagesRequest,
                           idempotency_key: str | None = None) -> MessagesAccepted: ...

    async def end_session(self, tenant: str, user: str, session: str,
                          req: SessionEndRequest) -> SessionEndAccepted: ...


@dataclass(frozen=True)
class AcceptedRoute(Route):
    """A route answering 202 Accepted: taken, not yet processed (the OpenAPI document names
    its status)."""

    status: int = 202


def _producing(request: web.Request) -> Producing:
    backend = request.app[DEPS].backend
    if not isinstance(backend, Producing):
        raise ApiError(503, ErrorCode.UNAVAILABLE, "this worker takes no messages over HTTP")
    return backend


async def _body(request: web.Request, model: type[BaseModel], required: bool) -> BaseModel:
    has_body = request.content_length or request.headers.get("Transfer-Encoding")
    obj = await read_object(request, request.app[DEPS].max_body_bytes) \
        if has_body or required else {}
    try:
        return model.model_validate(obj)
    except ValidationError as exc:
        raise bad(validation_message(exc)) from None


async def _messages(request: web.Request) -> web.StreamResponse:
    _, (tenant, user) = identified(request, "tenant", "user")
    backend = _producing(request)
    req = await _body(request, MessagesRequest, required=True)
    assert isinstance(req, MessagesRequest)
    with _traced(request):
        return ok(await backend.add_messages(tenant, user, req, request.get(IDEMPOTENCY)), 202)


async def _session_end(request: web.Request) -> web.StreamResponse:
    _, (tenant, user, session) = identified(request, "tenant", "user", "session_id")
    backend = _producing(request)
    req = await _body(request, SessionEndRequest, required=False)
    assert isinstance(req, SessionEndRequest)
    with _traced(request):
        return ok(await backend.end_session(tenant, user, session, req), 202)


def _traced(request: web.Request) -> AbstractContextManager[Any]:
    """The caller's trace (its W3C ``traceparent`` header), continued by the records."""
    return tracing.continued(request.headers.get("traceparent"),
                             request.headers.get("tracestate"))


INGEST_ROUTES: tuple[Route, ...] = (
    AcceptedRoute("POST", paths.MESSAGES, "add_messages",
                  "Add chat messages of the user (produced to the messages topic; 202 with "
                  "each message's id and offset)", _messages, MessagesAccepted,
                  MessagesRequest, write=True),
    AcceptedRoute("POST", paths.SESSION_END, "end_session",
                  "End a session of the user: what is below the extraction threshold is "
                  "extracted (produced to the session-events topic; 202 with its offset)",
                  _session_end, SessionEndAccepted, SessionEndRequest, body_required=False,
                  write=True),
)
