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
from memstream.memory import fencing, metrics
from memstream.memory.apply import Applied, apply_decision, build_decision
from memstream.memory.store import Scope
from memstream.retry import RetryPolicy, retry_async
from memstream.settings import Settings
from memstream.streams import privacy
from memstream.streams.app import Pipeline
from memstream.streams.counters import Counters, add
from memstream.streams.dead_letters import decode_or_dead_letter, send_dead_letter
from memstream.streams.guard import guarded
from memstream.streams.waiters import Outcome
from memstream.topics.schemas import (
    ExtractionJob,
    JobDecision,
    JobRange,
    JobResult,
    JobStatus,
    MemoryChange,
)

log = logging.getLogger(__name__)


def failed_decision(job: ExtractionJob, error: str) -> JobDecision:
    return JobDecision(**JobRange.fields_of(job), status=JobStatus.FAILED,
                       error=error)


async def skip_decided(p: Pipeline, job: ExtractionJob) -> JobDecision | None:
    """A job at or below the user's cursor is never decided again (no LLM call): the apply
    agent answers it from the cursor: fenced (the ingest stage re-issues it), or, for the
    cursor's own job, done, after publishing again the change events the store kept for it
    (they may have died with an aborted transaction). The status sent here (fenced) only
    keeps a decision without changes from ever being applied."""
    cursor = await asyncio.to_thread(p.services.store.cursor, Scope(job.tenant_id, job.user_id))
    if fencing.decide_or_skip(cursor, job.seq, job.job_id) == fencing.Verdict.APPLY:
        return None
    p.counters.jobs_skipped += 1
    held = cursor.seq if cursor else 0
    return JobDecision(**JobRange.fields_of(job), status=JobStatus.FENCED, applied_seq=held,
                       error=f"job {job.seq} at or below the store's job {held}")


def job_policy(s: Settings) -> RetryPolicy:
    return RetryPolicy(first_delay_s=s.extract_backoff_s,
                       max_delay_s=max(s.extract_backoff_s, s.extract_backoff_max_s))


def store_policy(s: Settings) -> RetryPolicy:
    return RetryPolicy(first_delay_s=s.apply_backoff_s,
                       max_delay_s=max(s.apply_backoff_s, s.apply_backoff_max_s))


async def decide_with_retries(p: Pipeline, job: ExtractionJob) -> JobDecision:
    """Decide the job within its deadline, a share of ``job_timeout_s`` (so the ingest stage
    never re-sends a job that still runs here). The LLM layer retries its own calls inside
    that deadline; what is left transient here (a store search, the embedder, an invented
    target) is tried again while the deadline leaves room. A permanent error, or giving up,
    makes the decision ``failed`` at once."""
    s = p.settings
    deadline = p.clock() + s.job_timeout_s * s.job_deadline_fraction

    async def attempt() -> JobDecision:
        now = p.clock()
        out = await asyncio.to_thread(p.services.extractor.decide, job, now, deadline)
        return build_decision(job, out, p.services.model, now)

    def logged(n: int, exc: BaseException, delay: float) -> None:
        log.warning("job %s attempt %d failed (%s: %s); retrying in %.1fs",
                    job.job_id, n, type(exc).__name__, str(exc)[:200], delay)

    try:
        return await retry_async(attempt, policy=job_policy(s), deadline=deadline,
                                 clock=p.clock, on_retry=logged,
                                 max_attempts=s.extract_retries + 1)
    except Exception as exc:  # permanent, or no time left: reported, never raised
        reason = f"{type(exc).__name__}: {exc}"[:500]
        log.warning("job %s failed: %s", job.job_id, reason)
        return failed_decision(job, reason)


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


async def apply_with_retries(p: Pipeline, decision: JobDecision) -> Applied:
    """The store must take the decision before the job is reported done: a transient store
    error is retried with capped backoff and no deadline (the partition waits, so one
    user's changes stay in order); a permanent one is raised at once."""

    def logged(n: int, exc: BaseException, delay: float) -> None:
        log.error("applying decision of job %s failed (attempt %d, %s: %s); retrying in %.1fs",
                  decision.job_id, n, type(exc).__name__, str(exc)[:200], delay)

    return await retry_async(
        lambda: asyncio.to_thread(apply_decision, p.services.store, decision),
        policy=store_policy(p.settings), deadline=None, clock=p.clock, on_retry=logged)


async def apply_or_set_aside(p: Pipeline, decision: JobDecision, message: Any) -> Applied:
    """A decision the store refuses for good is dead-lettered (``apply_failed``) and its job
    reported failed, so the ingest stage retries it later instead of the partition
    looping on it forever."""
    try:
        return await apply_with_retries(p, decision)
    except Exception as exc:  # permanent (is_transient said no)
        reason = f"{type(exc).__name__}: {exc}"[:500]
        log.error("decision of job %s cannot be applied: %s", decision.job_id, reason)
        await send_dead_letter(p, InvalidRecord("apply_failed", reason), message)
        return Applied(fencing.Verdict.APPLY, JobStatus.FAILED, error=reason)


async def publish(p: Pipeline, key: bytes, decision: JobDecision, applied: Applied) -> None:
    """Change events first, delivered, then the result that lets the user's next job go:
    a later job is never applied while an earlier one's events could still be lost."""
    c = p.counters
    if applied.verdict == fencing.Verdict.REPUBLISH:
        c.decisions_republished += 1
    elif applied.verdict == fencing.Verdict.DONE:
        c.decisions_duplicate += 1
    elif applied.status == JobStatus.FENCED:
        c.decisions_fenced += 1
    wire = await privacy.seal_all(p, applied.publish)
    sent = [await p.memory_changes.send(key=key, value=change.dumps()) for change in wire]
    for delivery in sent:
        await delivery
    result = JobResult.for_job(
        decision, applied.status, datetime.fromtimestamp(p.clock(), UTC),
        llm_calls=decision.llm_calls, error=applied.error, applied_seq=applied.applied_seq)
    await p.job_results.send(key=key, value=result.dumps())
    await privacy.after_erase(p, applied.publish)
    if applied.publish and p.on_changes is not None:  # the windowed jobs' triggers
        await p.on_changes(applied.publish)
    if applied.publish and applied.verdict == fencing.Verdict.APPLY:
        count_applied(c, decision, applied.publish)
    if applied.status != JobStatus.FENCED:  # a fenced job goes again under the same id
        p.waiters.resolve(decision.job_id, Outcome(
            applied.status.value, [_summary(c) for c in applied.publish],
            applied.error or decision.error))


def count_applied(c: Counters, decision: JobDecision, changes: list[MemoryChange]) -> None:
    """Write volume and the merges of SPEC §8: once per change applied now (a re-published
    or duplicate decision is not counted again)."""
    c.consolidation_merges += decision.decisions.get("merged", 0)
    for change in changes:
        add(c.changes, (metrics.bounded(change.op, metrics.CHANGE_OPS),
                        metrics.bounded(change.lineage.kind, metrics.LINEAGE_KINDS)))


def count_spend(c: Counters, decision: JobDecision) -> None:
    """The LLM calls and tokens a decision made here spent (applied or not later)."""
    c.llm_calls += decision.llm_calls
    c.prompt_tokens += decision.prompt_tokens
    c.completion_tokens += decision.completion_tokens


def _summary(change: MemoryChange) -> dict[str, object]:
    return {"op": change.op, "memory_id": change.memory_id, "version": change.version,
            "content": change.after.get("content", "")}


async def extract_one(p: Pipeline, locks: UserLocks, message: Any) -> None:
    """jobs -> decisions, for one record."""
    job = await decode_or_dead_letter(p, ExtractionJob, message)
    if job is None:
        return
    key = job.key()
    async with locks.hold(key):
        decision = await skip_decided(p, job) or await decide_with_retries(p, job)
    count_spend(p.counters, decision)
    if decision.status == JobStatus.FAILED:
        failure = InvalidRecord("extraction_failed", decision.error or "failed")
        await send_dead_letter(p, failure, message)
    await p.decisions.send(key=key.encode(), value=decision.dumps())


async def apply_one(p: Pipeline, message: Any) -> None:
    """decisions -> store, memory-changes, job-results, for one record."""
    decision = await decode_or_dead_letter(p, JobDecision, message)
    if decision is None:
        return
    applied = await apply_or_set_aside(p, decision, message)
    await publish(p, message.key, decision, applied)


def register(p: Pipeline) -> None:
    locks = UserLocks()

    @p.app.agent(p.jobs, name="extract", concurrency=p.settings.extract_concurrency)
    async def extract(stream: Any) -> None:
        async for event in stream.events():
            message = event.message
            await guarded(p, message, lambda: extract_one(p, locks, message),  # noqa: B023
                          atomic=False)  # one output per record; LLM calls would hold commits

    @p.app.agent(p.decisions, name="apply")
    async def apply(stream: Any) -> None:
        async for event in stream.events():
            message = event.message
            await guarded(p, message, lambda: apply_one(p, message))  # noqa: B023
