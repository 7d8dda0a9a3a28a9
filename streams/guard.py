"""No exception escapes an agent: one guard around the handling of each record.

Under Faust an exception that leaves an agent's loop is worse than a crash: the record in
progress counts as processed, the supervisor restarts the agent on the next record, and the
next commit moves the offset past it (see :mod:`memstream.streams.dead_letters`). So every
agent handles each record inside :func:`guarded`:

- a transient failure (broker, store or LLM outage, by :func:`memstream.retry.is_transient`)
  is retried in place with capped backoff: the partition waits, so a user's records keep
  their order, and every handler is safe to run again (the ingest machine drops duplicate
  messages and re-sends an unanswered job after its timeout; extraction and apply are fenced
  by :mod:`memstream.memory.fencing`);
- anything else is a bug or a record we cannot handle: it is logged with its traceback and
  the record goes to the dead-letter topic (kind ``internal``) with its bytes and position,
  so nothing is lost and the partition moves on.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from memstream.errors import InvalidRecord
from memstream.retry import RetryPolicy, is_transient, next_delay
from memstream.streams.app import Pipeline
from memstream.streams.commit_order import gate_for
from memstream.streams.dead_letters import send_dead_letter

log = logging.getLogger(__name__)
RETRY = RetryPolicy(first_delay_s=0.5, max_delay_s=30.0)


async def guarded(p: Pipeline, message: Any, handle: Callable[[], Awaitable[None]], *,
                  sleep: Callable[[float], Awaitable[Any]] = asyncio.sleep,
                  classify: Callable[[BaseException], bool] | None = None,
                  atomic: bool = True) -> None:
    """Run ``handle()`` for ``message`` until it succeeds, or dead-letter the record.
    ``atomic``: no commit falls inside the handling (:class:`CommitGate`), so everything
    the record writes (table, topics) is in one transaction."""
    if not atomic:
        await _guarded(p, message, handle, sleep, classify)
        return
    async with gate_for(p.app).event():
        await _guarded(p, message, handle, sleep, classify)


async def _guarded(p: Pipeline, message: Any, handle: Callable[[], Awaitable[None]],
                   sleep: Callable[[float], Awaitable[Any]],
                   classify: Callable[[BaseException], bool] | None) -> None:
    transient = classify or is_transient
    attempt = 0
    while True:
        try:
            await handle()
            return
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            attempt += 1
            where = f"{message.topic}[{message.partition}]@{message.offset}"
            if transient(exc):
                delay = next_delay(RETRY, attempt)
                p.counters.handler_retries += 1
                log.warning("%s: %s (transient, attempt %d); retrying in %.1fs",
                            where, type(exc).__name__, attempt, delay)
                await sleep(delay)
                continue
            log.exception("%s: cannot be handled; set aside on the dead-letter topic", where)
            p.counters.handler_failures += 1
            reason = InvalidRecord("internal", f"{type(exc).__name__}: {exc}"[:1000])
            await send_dead_letter(p, reason, message)
            return
