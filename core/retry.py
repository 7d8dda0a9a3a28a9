"""The one retry policy: what is worth retrying, how long to wait, and when to give up.

- :func:`is_transient` is THE classification of failures (openai, Qdrant, aiokafka, httpx,
  grpc, builtins and our own errors). Adapters that wrap an exception (``raise StoreError(...)
  from exc``) are seen through by following ``__cause__``.
- :class:`RetryPolicy` + :func:`next_delay`: capped exponential backoff with jitter (pure).
- :func:`retry_async` / :func:`retry_sync`: one loop each, bounded by an absolute
  ``deadline`` on an injected ``clock``: no attempt starts, and no sleep ends, past it.
  A permanent error is raised as it is, after one attempt; running out of time or attempts
  raises :class:`RetriesExhausted` (the last error as ``__cause__``), so callers can tell
  "gave up" from "permanent".
- :func:`set_within`: a wait for an event bounded by a time (a sleep a stop ends early).
- :func:`deadline_scope` / :func:`current_deadline`: the deadline of the job being worked
  on, carried by a context variable (like a gRPC deadline) so that a nested layer, e.g. the
  LLM adapter's per-call retries, fits inside it without every interface growing a
  parameter. ``asyncio.to_thread`` copies the context, so it also reaches worker threads.

Third-party modules are never imported here: an exception of a library can only exist once
that library is imported, so the classification looks them up in ``sys.modules``.
"""

from __future__ import annotations

import asyncio
import random
import sys
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, TypeVar

from memstream.core.errors import ConfigError, InvalidRecord, MemstreamError, describe

R = TypeVar("R")
OnRetry = Callable[[int, BaseException, float], None]

TRANSIENT_STATUS = frozenset({408, 425, 429})  # plus every 5xx
GRPC_TRANSIENT = frozenset({"UNAVAILABLE", "DEADLINE_EXCEEDED", "RESOURCE_EXHAUSTED", "ABORTED"})
_MAX_CHAIN = 16  # __cause__ links followed at most


class RetriesExhausted(MemstreamError):
    """A transient failure outlasted the deadline or the attempts; ``__cause__`` is the last
    error. Not itself transient: whoever gets it must not retry the same work again (that
    is how retries used to nest)."""

    def __init__(self, attempts: int, last: BaseException | None, why: str) -> None:
        detail = f": {describe(last)}" if last is not None else ""
        plural = "" if attempts == 1 else "s"
        super().__init__(f"gave up after {attempts} attempt{plural} ({why}){detail}")
        self.attempts = attempts
        self.last = last
        self.why = why


# --- classification -------------------------------------------------------------------
def _mod(name: str) -> Any:
    """A module if it is already imported (an exception of it can only exist then)."""
    return sys.modules.get(name)


def _status_transient(status: int | None, *, conflict: bool) -> bool:
    if status is None:
        return False
    return status in TRANSIENT_STATUS or status >= 500 or (conflict and status == 409)


def _openai(exc: BaseException) -> bool | None:
    openai = _mod("openai")
    if openai is None or not isinstance(exc, openai.OpenAIError):
        return None
    if isinstance(exc, openai.APIStatusError):  # 409: a lock/conflict the SDK also retries
        return _status_transient(exc.status_code, conflict=True)
    return isinstance(exc, openai.APIConnectionError)  # includes APITimeoutError


def _http(exc: BaseException) -> bool | None:
    """httpx (qdrant-client) and httpx2 (openai>=3): transport failures are transient,
    except the ones that are our own mistake (a bad URL scheme, a malformed request)."""
    for name in ("httpx", "httpx2"):
        h = _mod(name)
        if h is not None and isinstance(exc, h.TransportError):
            return not isinstance(exc, (h.UnsupportedProtocol, h.LocalProtocolError))
        if h is not None and isinstance(exc, h.HTTPStatusError):
            return _status_transient(exc.response.status_code, conflict=False)
    return None


def _qdrant(exc: BaseException) -> bool | None:
    http = _mod("qdrant_client.http.exceptions")
    if http is not None:
        if isinstance(exc, http.UnexpectedResponse):  # 409 there: "already exists"
            return _status_transient(exc.status_code, conflict=False)
        if isinstance(exc, http.ResponseHandlingException):
            source = getattr(exc, "source", None)
            pydantic = _mod("pydantic")
            if pydantic is not None and isinstance(source, pydantic.ValidationError):
                return False  # a reply we cannot parse will not parse next time either
            known = _classify(source) if isinstance(source, BaseException) else None
            return True if known is None else known
    common = _mod("qdrant_client.common.client_exceptions")
    if common is not None and isinstance(exc, common.ResourceExhaustedResponse):
        return True
    return None


def _kafka_wrapper(exc: BaseException) -> bool:
    """aiokafka's bare ``KafkaError(repr(err)) from err`` (its producer's coordinator
    lookup, say): the cause decides."""
    errors = _mod("aiokafka.errors")
    return (errors is not None and type(exc) is errors.KafkaError
            and exc.__cause__ is not None)


def _kafka(exc: BaseException) -> bool | None:
    errors = _mod("aiokafka.errors")
    if errors is None or not isinstance(exc, errors.KafkaError) or _kafka_wrapper(exc):
        return None
    if isinstance(exc, (errors.KafkaTimeoutError, errors.KafkaConnectionError)):
        return True
    return bool(getattr(exc, "retriable", False))


def _grpc(exc: BaseException) -> bool | None:
    grpc = _mod("grpc")
    if grpc is None or not isinstance(exc, grpc.RpcError):
        return None
    code = getattr(exc, "code", None)
    status = code() if callable(code) else None
    return getattr(status, "name", None) in GRPC_TRANSIENT


def _ours(exc: BaseException) -> bool | None:
    llm = _mod("memstream.memory.llm.openai_model")
    if llm is not None and isinstance(exc, llm.InvalidReply):
        return True  # the model may answer validly next time
    decisions = _mod("memstream.memory.decisions")
    if decisions is not None and isinstance(exc, decisions.InvalidDecision):
        return True
    if isinstance(exc, (InvalidRecord, ConfigError, RetriesExhausted)):
        return False
    return None


def _classify(exc: BaseException) -> bool | None:
    """True/False where the exception's own type decides; None where it does not."""
    for family in (_ours, _openai, _qdrant, _http, _kafka, _grpc):
        verdict = family(exc)
        if verdict is not None:
            return verdict
    if isinstance(exc, (ConnectionError, TimeoutError)):  # asyncio.TimeoutError included
        return True
    return None


def is_transient(exc: BaseException) -> bool:
    """Is ``exc`` worth trying again (the same call, later)?

    Our adapter errors (``StoreError``, ``LLMError``, ``EmbeddingError``, any other
    :class:`MemstreamError` not classified itself) and aiokafka's bare ``KafkaError``
    wrapping another are as transient as their ``__cause__``;
    without a cause, and for everything unknown (ValueError, TypeError, KeyError, ...),
    the answer is no.
    """
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen and len(seen) < _MAX_CHAIN:
        seen.add(id(current))
        verdict = _classify(current)
        if verdict is not None:
            return verdict
        if not isinstance(current, MemstreamError) and not _kafka_wrapper(current):
            return False
        current = current.__cause__
    return False


# --- backoff --------------------------------------------------------------------------
@dataclass(frozen=True)
class RetryPolicy:
    """Delay before attempt n+1 = ``first_delay_s * multiplier**(n-1)``, capped at
    ``max_delay_s``, times a random factor in ``[1 - jitter, 1 + jitter]`` (still capped).
    An attempt starts only with at least ``min_attempt_s`` left before the deadline."""

    first_delay_s: float
    max_delay_s: float
    multiplier: float = 2.0
    jitter: float = 0.1
    min_attempt_s: float = 0.0

    def __post_init__(self) -> None:
        if not (0 <= self.first_delay_s <= self.max_delay_s and self.multiplier >= 1
                and 0 <= self.jitter < 1 and self.min_attempt_s >= 0):
            raise ConfigError(f"unusable retry policy: {self}")


def next_delay(policy: RetryPolicy, attempt: int, rng: Callable[[], float] = random.random,
               ) -> float:
    """Seconds to wait after failed attempt number ``attempt`` (1-based); ``rng`` returns
    a float in [0, 1) (0.5 means no jitter)."""
    exponent = min(max(attempt - 1, 0), 64)  # no float overflow on very long outages
    base = min(policy.max_delay_s, policy.first_delay_s * policy.multiplier ** exponent)
    factor = 1 + policy.jitter * (2 * rng() - 1)
    return min(policy.max_delay_s, max(0.0, base * factor))


def _check_room(attempt: int, last: Exception | None, now: float, deadline: float | None,
                policy: RetryPolicy) -> None:
    if deadline is not None and deadline - now < max(policy.min_attempt_s, 1e-9):
        error = RetriesExhausted(attempt, last, "no time left before the deadline")
        raise error from last


def _after_failure(exc: Exception, attempt: int, *, policy: RetryPolicy, now: float,
                   deadline: float | None, max_attempts: int | None,
                   rng: Callable[[], float], classify: Callable[[BaseException], bool],
                   ) -> float:
    """The delay before the next attempt, or raise: ``exc`` itself when it is permanent,
    :class:`RetriesExhausted` when no further attempt fits (pure but for ``rng``)."""
    if not classify(exc):
        raise exc
    if max_attempts is not None and attempt >= max_attempts:
        raise RetriesExhausted(attempt, exc, f"the attempt limit is {max_attempts}") from exc
    delay = next_delay(policy, attempt, rng)
    if deadline is not None and now + delay + policy.min_attempt_s >= deadline:
        raise RetriesExhausted(attempt, exc, "the next attempt would start past the deadline"
                               ) from exc
    return delay


async def retry_async(fn: Callable[[], Awaitable[R]], *, policy: RetryPolicy,
                      deadline: float | None, clock: Callable[[], float],
                      sleep: Callable[[float], Awaitable[Any]] = asyncio.sleep,
                      on_retry: OnRetry | None = None, max_attempts: int | None = None,
                      rng: Callable[[], float] = random.random,
                      classify: Callable[[BaseException], bool] = is_transient) -> R:
    """``await fn()`` until it succeeds, retrying transient errors after a backoff.

    ``deadline`` is an absolute time on ``clock`` (None: no deadline, e.g. a store write
    the partition must wait for); ``max_attempts`` None: no limit but the deadline.
    ``on_retry(attempt, exc, delay)`` is called before each sleep (for logging).
    """
    attempt = 0
    last: Exception | None = None
    while True:
        _check_room(attempt, last, clock(), deadline, policy)
        attempt += 1
        try:
            return await fn()
        except Exception as exc:
            delay = _after_failure(exc, attempt, policy=policy, now=clock(), deadline=deadline,
                                   max_attempts=max_attempts, rng=rng, classify=classify)
            last = exc
            if on_retry is not None:
                on_retry(attempt, exc, delay)
        await sleep(delay)


def retry_sync(fn: Callable[[], R], *, policy: RetryPolicy, deadline: float | None,
               clock: Callable[[], float], sleep: Callable[[float], Any] = time.sleep,
               on_retry: OnRetry | None = None, max_attempts: int | None = None,
               rng: Callable[[], float] = random.random,
               classify: Callable[[BaseException], bool] = is_transient) -> R:
    """The blocking twin of :func:`retry_async` (for code running in worker threads)."""
    attempt = 0
    last: Exception | None = None
    while True:
        _check_room(attempt, last, clock(), deadline, policy)
        attempt += 1
        try:
            return fn()
        except Exception as exc:
            delay = _after_failure(exc, attempt, policy=policy, now=clock(), deadline=deadline,
                                   max_attempts=max_attempts, rng=rng, classify=classify)
            last = exc
            if on_retry is not None:
                on_retry(attempt, exc, delay)
        sleep(delay)


# --- the deadline of the work in progress --------------------------------------------
_DEADLINE: ContextVar[float | None] = ContextVar("memstream_deadline", default=None)


async def set_within(event: asyncio.Event, seconds: float) -> bool:
    """Wait up to ``seconds`` for ``event``: True once it is set, False if the time ran out
    first (a backoff's sleep that a stop ends early; a wait for a ready flag). One set
    already is True at once, whatever ``seconds``."""
    if event.is_set():
        return True
    try:
        await asyncio.wait_for(event.wait(), seconds)
    except TimeoutError:
        return event.is_set()
    return True


def current_deadline() -> float | None:
    """The deadline of the job this code runs for (None: none set)."""
    return _DEADLINE.get()


@contextmanager
def deadline_scope(deadline: float | None) -> Iterator[float | None]:
    """Run a block under ``deadline``; an outer, earlier deadline stays in force."""
    outer = _DEADLINE.get()
    effective = deadline if outer is None else outer if deadline is None else min(outer, deadline)
    token = _DEADLINE.set(effective)
    try:
        yield effective
    finally:
        _DEADLINE.reset(token)


def remaining(deadline: float | None, clock: Callable[[], float]) -> float | None:
    """Seconds left before ``deadline`` (never negative), or None without a deadline."""
    return None if deadline is None else max(0.0, deadline - clock())
