"""The extract and apply agents: thin shells around :mod:`memory.extraction` / :mod:`memory.apply`.

extract (jobs -> decisions): decode the job, decide it against the store in a worker
thread (one job per user at a time; other users concurrently), retry transient failures
with backoff, and send one :class:`JobDecision` — ``failed`` after the last retry, with
the job set aside on the dead-letter topic so its messages stay recoverable.

apply (decisions -> store, memory-changes, job-results): apply each change idempotently
in order, publish it on the memory-change topic, then send the job result that lets the
ingest stage emit the user's next job. Because the result is only sent once the changes
are in the store, the next decision for that user never works from a stale snapshot.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from typing import Any

from memstream.errors import InvalidRecord
from memstream.memory.apply import apply_change, change_for
from memstream.memory.extraction import JobOutcome
from memstream.streams.app import Pipeline
from memstream.streams.ingest import decode_or_dead_letter, send_dead_letter
from memstream.topics.schemas import (
    ExtractionJob,
    JobDecision,
    JobRange,
    JobResult,
    JobStatus,
    MemoryChange,
)

log = logging.getLogger(__name__)


def decision_for(p: Pipeline, job: ExtractionJob, out: JobOutcome, now: float) -> JobDecision:
    model = p.services.model
    return JobDecision(
        **JobRange.fields_of(job),
        status=JobStatus.TRIVIAL if out.trivial else JobStatus.DONE,
        changes=[change_for(op, vec, job, out, model, now) for op, vec in out.ops],
        decisions=dict(out.decisions), llm_calls=out.usage.calls,
        prompt_tokens=out.usage.prompt_tokens, completion_tokens=out.usage.completion_tokens,
        model=model.name, prompt_version=model.prompt_version,
    )


def failed_decision(job: ExtractionJob, error: str) -> JobDecision:
    return JobDecision(**JobRange.fields_of(job), status=JobStatus.FAILED,
                       error=error)


async def decide_with_retries(p: Pipeline, job: ExtractionJob) -> JobDecision:
    s = p.settings
    delay = s.extract_backoff_s
    for attempt in range(s.extract_retries + 1):
        now = p.clock()
        try:
            out = await asyncio.to_thread(p.services.extractor.decide, job, now)
            return decision_for(p, job, out, now)
        except Exception as exc:  # every failure is retried, then reported
            reason = f"{type(exc).__name__}: {exc}"[:500]
            log.warning("job %s attempt %d failed: %s", job.job_id, attempt + 1, reason)
            if attempt == s.extract_retries:
                return failed_decision(job, reason)
            await asyncio.sleep(delay)
            delay *= 2
    raise AssertionError("unreachable")


class UserLocks:
    """One asyncio lock per user with work in progress; dropped when nobody holds it."""

    def __init__(self) -> None:
        self._locks: dict[str, tuple[asyncio.Lock, int]] = {}

    @asynccontextmanager
    async def hold(self, key: str) -> AsyncIterator[None]:
        lock, users = self._locks.get(key, (asyncio.Lock(), 0))
        self._locks[key] = (lock, users + 1)
        try:
            async with lock:
                yield
        finally:
            lock, users = self._locks[key]
            if users == 1:
                del self._locks[key]
            else:
                self._locks[key] = (lock, users - 1)

    def __len__(self) -> int:
        return len(self._locks)


async def apply_with_retries(p: Pipeline, change: MemoryChange) -> None:
    """The store must take the change before the job is reported done: retry until it does
    (the partition waits, so one user's changes stay in order)."""
    delay = p.settings.extract_backoff_s
    while True:
        try:
            await asyncio.to_thread(apply_change, p.services.store, change)
            return
        except Exception as exc:  # a store outage: wait and try again
            log.error("applying change %s failed (%s); retrying in %.1fs",
                      change.change_id, type(exc).__name__, delay)
            await asyncio.sleep(delay)
            delay = min(delay * 2, 60.0)


def register(p: Pipeline) -> None:
    locks = UserLocks()

    @p.app.agent(p.jobs, name="extract", concurrency=p.settings.extract_concurrency)
    async def extract(stream: Any) -> None:
        async for event in stream.events():
            message = event.message
            job = await decode_or_dead_letter(p, ExtractionJob, message)
            if job is None:
                continue
            key = job.key()
            async with locks.hold(key):
                decision = await decide_with_retries(p, job)
            if decision.status == JobStatus.FAILED:
                failure = InvalidRecord("extraction_failed", decision.error or "failed")
                await send_dead_letter(p, failure, message)
            await p.decisions.send(key=key.encode(), value=decision.dumps())

    @p.app.agent(p.decisions, name="apply")
    async def apply(stream: Any) -> None:
        async for event in stream.events():
            message = event.message
            decision = await decode_or_dead_letter(p, JobDecision, message)
            if decision is None:
                continue
            for change in decision.changes:
                await apply_with_retries(p, change)
                await p.memory_changes.send(key=message.key, value=change.dumps())
            result = JobResult.for_job(
                decision, decision.status, datetime.fromtimestamp(p.clock(), UTC),
                llm_calls=decision.llm_calls, error=decision.error)
            await p.job_results.send(key=message.key, value=result.dumps())
