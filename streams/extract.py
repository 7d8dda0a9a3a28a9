"""The extract stage: jobs -> decisions, a thin shell around :mod:`memory.extraction`.

It runs in its own loop (:class:`streams.owned_loop.OwnedLoop`, group ``{app_id}-extract``):
a batch of a partition's jobs is decoded (bad records become dead letters), each user's
jobs are decided one after another in a worker thread, users at once (at most
``extract_concurrency`` jobs in flight over all partitions), transient failures retried
with backoff within the job's deadline. The batch's decisions — ``failed`` after the last
retry, with the job set aside on the dead-letter topic so its messages stay recoverable —
and its input offsets go in one transaction: a job is decided into exactly one committed
decision per read, and none is lost between the topics, whatever kills the worker.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from memstream.core import tracing
from memstream.core.errors import InvalidRecord, describe
from memstream.core.retry import RetryPolicy, retry_async
from memstream.core.settings import Settings
from memstream.memory import fencing
from memstream.memory.applying import build_decision
from memstream.memory.archive import archive_changes
from memstream.memory.store import Scope
from memstream.memory.store.partitioned import ShardNotHere
from memstream.streams import record_checks
from memstream.streams.counters import Counters
from memstream.streams.dead_letters import INTERNAL_MAX_BYTES, set_aside
from memstream.streams.ingest_tables import LoopTable
from memstream.streams.pipeline import Pipeline
from memstream.streams.stage import StageBase, Work, until_handled
from memstream.topics.codec import decode
from memstream.topics.schemas import ExtractionJob, JobDecision, JobRange, JobStatus

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

    def decided(now: float) -> JobDecision:  # (in a worker thread: not the loops' time)
        out = p.services.extractor.decide(job, now, deadline)
        embedder = p.services.embedder
        turns = archive_changes(job, embedder.embed, embedder.name, now) if s.archive else []
        return build_decision(job, out, p.services.model, now, turns)

    async def attempt() -> JobDecision:
        return await asyncio.to_thread(decided, p.clock())

    def logged(n: int, exc: BaseException, delay: float) -> None:
        log.warning("job %s attempt %d failed (%s: %s); retrying in %.1fs",
                    job.job_id, n, type(exc).__name__, describe(exc)[:200], delay)

    try:
        return await retry_async(attempt, policy=job_policy(s), deadline=deadline,
                                 clock=p.clock, on_retry=logged,
                                 max_attempts=s.extract_retries + 1)
    except ShardNotHere:
        raise  # not decided here: the loop reads the job again
    except Exception as exc:  # permanent, or no time left: reported, never raised
        reason = describe(exc)
        log.warning("job %s failed: %s", job.job_id, reason)
        return failed_decision(job, reason)


def count_spend(c: Counters, decision: JobDecision) -> None:
    """The LLM calls and tokens a decision made here spent (applied or not later)."""
    c.llm_calls += decision.llm_calls
    c.prompt_tokens += decision.prompt_tokens
    c.completion_tokens += decision.completion_tokens


class ExtractStage(StageBase):
    """The extract stage as its loop runs it (see the module docstring)."""

    name = "extract"

    def __init__(self, p: Pipeline) -> None:
        self.p = p
        self.inputs = [p.topics.jobs.name]
        self.tables: tuple[LoopTable, ...] = ()
        # a batch waits for its slowest job: a few rounds of the concurrency at most
        self.max_records = max(16, 4 * p.settings.extract_concurrency)
        self._slots: asyncio.Semaphore | None = None

    async def handle(self, records: list[Any]) -> Work:
        work = Work()
        users: dict[str, list[tuple[Any, ExtractionJob]]] = {}
        for record in records:
            if not record_checks.authentic(self.p, work, record):  # no valid MAC
                continue
            try:
                job = decode(ExtractionJob, record.value, record.key,
                             max_bytes=INTERNAL_MAX_BYTES)
            except InvalidRecord as exc:
                set_aside(self.p, work, exc, record)
                continue
            users.setdefault(job.key(), []).append((record, job))
        for out in await asyncio.gather(*(self._user(jobs) for jobs in users.values())):
            work.out.extend(out.out)
            work.spans.extend(out.spans)
        return work

    async def _user(self, jobs: list[tuple[Any, ExtractionJob]]) -> Work:
        """One user's jobs of the batch, in order."""
        p, work = self.p, Work()
        if self._slots is None:
            self._slots = asyncio.Semaphore(p.settings.extract_concurrency)
        for record, job in jobs:
            span = tracing.consume("extract", record, work.spans, p.settings.app_id,
                                   memstream__job__id=job.job_id)
            async with self._slots:
                with tracing.active(span):  # the LLM calls' parent (in their thread too)
                    got = await until_handled(record, self._decider(job), counters=p.counters)
            if isinstance(got, InvalidRecord):
                set_aside(p, work, got, record)
                continue
            decision: JobDecision = got
            count_spend(p.counters, decision)
            if decision.status == JobStatus.FAILED:
                failure = InvalidRecord("extraction_failed", decision.error or "failed")
                set_aside(p, work, failure, record)
            tracing.note(span, memstream__job__status=decision.status.value,
                         memstream__llm__calls=decision.llm_calls)
            work.out.append(tracing.traced(
                (p.topics.decisions.name, job.key().encode(), decision.dumps()), span))
        return work

    def _decider(self, job: ExtractionJob) -> Callable[[], Awaitable[JobDecision]]:
        async def decide() -> JobDecision:
            return await skip_decided(self.p, job) or await decide_with_retries(self.p, job)

        return decide
