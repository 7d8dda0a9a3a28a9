"""What every part of the worker's HTTP API shares: the :class:`Backend` and
:class:`Authoriser` it is built on, the :class:`ApiError` it answers with, the :class:`Route`
of its table, the limits it checks and the :class:`LoginGuard` of failed key checks.
Imports nothing of its own package but the contract models, so the route modules
(:mod:`.http_core`, :mod:`.http_governance`, :mod:`.http_inspector`, :mod:`.http_metrics`),
the OpenAPI document (:mod:`.openapi`) and the server (:mod:`.http`) all import it and it
imports none of them.
"""

from __future__ import annotations

import re
import time
from collections import OrderedDict, deque
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from aiohttp import web
from pydantic import BaseModel

from memstream.contract.http_api.api import (
    Accepted,
    ContextRequest,
    ContextResponse,
    ErrorCode,
    FeedbackRequest,
    Health,
    MemoryPage,
    Principal,
    SearchRequest,
    SearchResponse,
    ToolCallRequest,
    ToolResult,
)
from memstream.contract.http_api.history import (
    AuditPage,
    ChangePage,
    CorrectionRequest,
    CorrectionResult,
    HistoryResponse,
    Residue,
    SourceResponse,
)
from memstream.core.errors import MemstreamError
from memstream.memory.model import MemoryType, Status
from memstream.topics.schemas import ToolWrite

DEFAULT_PAGE = 100
MAX_CURSOR_CHARS = 200
MAX_KEY_CHARS = 1024  # longer "keys" are refused without asking the authoriser
MAX_MESSAGE_CHARS = 300  # error messages stay short and never carry the caller's input back
LIST_STATUSES = (*(s.value for s in Status), "all")
LIST_TYPES = tuple(t.value for t in MemoryType)
LIMIT_RE = re.compile(r"[0-9]{1,6}")

# The stable code of each error status (the OpenAPI document names them the same way).
HTTP_CODES = {400: ErrorCode.BAD_REQUEST, 401: ErrorCode.UNAUTHORIZED,
               403: ErrorCode.FORBIDDEN, 404: ErrorCode.NOT_FOUND,
               405: ErrorCode.METHOD_NOT_ALLOWED, 413: ErrorCode.PAYLOAD_TOO_LARGE,
               429: ErrorCode.RATE_LIMITED, 503: ErrorCode.UNAVAILABLE}
IDEMPOTENCY_KEY = "Idempotency-Key"  # the header of a write's key (see Route.write)


class ApiError(MemstreamError):
    """An answer given on purpose: HTTP status, stable code, short message for the caller.
    A :class:`Backend` raises it too (e.g. 404 for an unknown memory); it passes through."""

    def __init__(self, status: int, code: ErrorCode, message: str,
                 headers: Mapping[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.code = ErrorCode(code)
        self.message = message
        self.headers = dict(headers or {})


class Authoriser(Protocol):
    def authorise(self, presented: str) -> Principal | None: ...


class Backend(Protocol):
    def ready(self) -> bool: ...
    def serving(self, tenant: str, user: str) -> bool: ...
    def health(self) -> Health: ...
    def tools(self) -> list[dict[str, Any]]: ...
    async def list_memories(self, tenant: str, user: str, *, limit: int, cursor: str | None,
                            status: str | None, type: str | None) -> MemoryPage: ...
    async def search(self, tenant: str, user: str, req: SearchRequest) -> SearchResponse: ...
    async def context(self, tenant: str, user: str, req: ContextRequest) -> ContextResponse: ...
    async def feedback(self, tenant: str, user: str, req: FeedbackRequest) -> Accepted: ...
    async def execute_tool(self, tenant: str, user: str, req: ToolCallRequest,
                           principal: Principal,
                           idempotency_key: str | None = None) -> ToolResult: ...
    async def history(self, tenant: str, user: str, memory_id: str) -> HistoryResponse: ...
    async def source(self, tenant: str, user: str, memory_id: str,
                     version: int | None) -> SourceResponse: ...
    async def changes(self, tenant: str, user: str, *, limit: int,
                      cursor: str | None) -> ChangePage: ...
    async def correct(self, tenant: str, user: str, write: ToolWrite, req: CorrectionRequest,
                      principal: Principal,
                      idempotency_key: str | None = None) -> CorrectionResult: ...
    async def forget(self, tenant: str, user: str, req: CorrectionRequest,
                     principal: Principal,
                     idempotency_key: str | None = None) -> CorrectionResult: ...
    async def residue(self, tenant: str, user: str) -> Residue: ...
    async def audit(self, tenant: str, *, limit: int, cursor: str | None, user: str | None,
                    kind: str | None) -> AuditPage: ...


class LoginGuard:
    """Failed key checks per key prefix and per client address: at most ``per_minute`` of
    either in the last minute; past that, a failing key from that address or under that
    prefix is answered 429 instead of 401. Only failures are limited: every key is checked
    first and a valid key always opens (a NAT's address, or a key id, is no secret anyone
    could lock out). Bounded: ``most`` prefixes and addresses (the least recently failed
    forgotten first), each with at most ``per_minute`` times. ``counts``: the refusals by
    reason (``unknown_key``, ``rate_limited``: a failure past the limit,
    ``request_rate``: a valid key over its request rate, :meth:`limit_requests`), for
    ``memstream_auth_failures_total``."""

    WINDOW_S = 60.0

    def __init__(self, per_minute: int = 20, clock: Callable[[], float] = time.monotonic,
                 most: int = 10_000) -> None:
        self.per_minute, self._clock, self._most = per_minute, clock, most
        self._failed: OrderedDict[str, deque[float]] = OrderedDict()
        self.counts = {"unknown_key": 0, "rate_limited": 0, "request_rate": 0}
        self.requests: KeyRate | None = None  # per key: None, not limited

    def limit_requests(self, per_s: float, burst: int) -> None:
        """Limit each key's requests to ``per_s`` a second (``burst`` at once); 0: none."""
        self.requests = KeyRate(per_s, burst, self._clock, self._most) if per_s > 0 else None

    def request_wait(self, key_id: str) -> float | None:
        """Seconds until the key ``key_id`` may make its next request; None: now (taken)."""
        wait = self.requests.take(key_id) if self.requests is not None else None
        if wait is not None:
            self.counts["request_rate"] += 1
        return wait

    def retry_after(self, *who: str) -> float | None:
        """Seconds until ``who`` (prefixes, addresses) may fail again; None: now."""
        now, waits = self._clock(), []
        for name in who:
            times = self._recent(name, now)
            if len(times) >= self.per_minute:
                waits.append(times[0] + self.WINDOW_S - now)
        if not waits:
            return None
        self.counts["rate_limited"] += 1
        return max(max(waits), 1.0)

    def failed(self, *who: str) -> None:
        now = self._clock()
        self.counts["unknown_key"] += 1
        for name in who:
            times = self._recent(name, now)
            times.append(now)
            while len(times) > self.per_minute:
                times.popleft()
            self._failed[name] = times
            self._failed.move_to_end(name)
        while len(self._failed) > self._most:
            self._failed.popitem(last=False)

    def _recent(self, name: str, now: float) -> deque[float]:
        times = self._failed.get(name, deque())
        while times and times[0] <= now - self.WINDOW_S:
            times.popleft()
        return times


class KeyRate:
    """A token bucket per key id: ``per_s`` tokens a second, at most ``burst`` held; a
    request takes one. Bounded: ``most`` keys (the least recently used forgotten first: it
    starts again full, which only a valid key can cause)."""

    def __init__(self, per_s: float, burst: int, clock: Callable[[], float],
                 most: int = 10_000) -> None:
        self.per_s, self.burst, self._clock, self._most = per_s, max(1, burst), clock, most
        self._buckets: OrderedDict[str, tuple[float, float]] = OrderedDict()  # tokens, when

    def take(self, key_id: str) -> float | None:
        """None: taken; else seconds until a token is there (nothing taken)."""
        now = self._clock()
        tokens, when = self._buckets.get(key_id, (float(self.burst), now))
        tokens = min(float(self.burst), tokens + (now - when) * self.per_s)
        wait = None if tokens >= 1.0 else (1.0 - tokens) / self.per_s
        self._buckets[key_id] = (tokens - 1.0 if wait is None else tokens, now)
        self._buckets.move_to_end(key_id)
        while len(self._buckets) > self._most:
            self._buckets.popitem(last=False)
        return wait


def key_prefix(key: str) -> str:
    """What a presented key is limited by: the key id of ``msk_<id>_...``, else its first
    12 characters (never the whole secret)."""
    if key.startswith("msk_") and key.count("_") >= 2:
        return key[: key.index("_", 4)][:24]
    return key[:12]


@dataclass(frozen=True)
class Deps:
    """What the handlers read from the app (``request.app[DEPS]``)."""

    backend: Backend
    authoriser: Authoriser
    max_body_bytes: int
    openapi: dict[str, Any]
    guard: LoginGuard = field(default_factory=LoginGuard)


DEPS = web.AppKey("memstream_http", Deps)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@dataclass(frozen=True)
class Route:
    method: str
    path: str  # a constant of memstream.contract.http_api.paths
    name: str
    summary: str
    handler: Handler
    out: type[BaseModel] | None  # None: a free-form object
    body: type[BaseModel] | None = None
    keyed: bool = True
    body_required: bool = True
    write: bool = False  # changes something: takes an Idempotency-Key


@dataclass(frozen=True)
class PageRoute(Route):
    """A route answering text rather than JSON (a page, a script, Prometheus text): the
    OpenAPI document names its media type."""

    media_type: str = "text/html"
