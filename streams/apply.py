"""The apply stage: decisions -> store, memory changes, job results (and the windowed jobs'
triggers), a thin shell around :mod:`memory.applying`.

It runs in its own loop (:class:`streams.owned_loop.OwnedLoop`, group ``{app_id}-apply``).
Each decision of a partition's batch is applied to the store in order (idempotent and
fenced: :mod:`memory.fencing`), and its change events, as the store keeps them for the job,
then the job result, go out in the batch's transaction with the input offsets. The result
lets the ingest stage emit the user's next job, so that job is only decided once the
changes are in the store and their events committed. A transaction that fails is read
again: the store answers the decisions it holds with their kept events (DONE /
REPUBLISH), so every change has its event on the topic exactly when its decision counts
as read.

One decision per user per transaction: the store keeps the events of the user's last job
only, so a second decision of the user applied before the first's events are committed
could leave them unpublished if that transaction aborted; the batch is cut before it.

With the windowed jobs here (``jobs_enabled``), the loop also owns the ``maintenance``
table: each change applied is folded into it (:class:`streams.jobs_fold.MaintenanceFold`)
in the same transaction, and its timer round (``punctuate``) ticks the users whose jobs
are due. A process that runs only
the windowed jobs (``memstream jobs run``) reads the memory-change topic instead of the
decisions (group ``{app_id}-jobs``).
"""

from __future__ import annotations

import asyncio
import logging
from datetime import UTC, datetime
from typing import Any, Protocol

from memstream.core import tracing
from memstream.core.errors import InvalidRecord, describe
from memstream.core.retry import is_transient, retry_async
from memstream.memory import archive, fencing, governance_metrics
from memstream.memory.applying import Applied, apply_decision
from memstream.memory.model import GLOBAL_USER
from memstream.memory.store.partitioned import ShardNotHere
from memstream.streams import privacy, record_checks
from memstream.streams.counters import Counters, add
from memstream.streams.dead_letters import INTERNAL_MAX_BYTES, set_aside
from memstream.streams.extract import store_policy
from memstream.streams.ingest_tables import LoopTable, TableSlice
from memstream.streams.pipeline import Pipeline
from memstream.streams.stage import (
    NotHere,
    ProcessorBase,
    Record,
    StageBase,
    TaskContext,
    Work,
    here,
    until_handled,
)
from memstream.streams.waiters import Outcome
from memstream.topics.codec import decode
from memstream.topics.schemas import JobDecision, JobResult, JobStatus, MemoryChange

log = logging.getLogger(__name__)


class TaskFold(Protocol):
    """One task's fold of the windowed jobs' triggers (:class:`streams.jobs_fold.TaskFold`)."""

    def fold(self, change: MemoryChange) -> list[Record]: ...

    def punctuate(self, now: float) -> list[Record]: ...


class Fold(Protocol):
    """The windowed jobs' triggers (:class:`streams.jobs_fold.MaintenanceFold`)."""

    table: LoopTable

    def open(self, table: TableSlice) -> TaskFold: ...


async def apply_with_retries(p: Pipeline, decision: JobDecision) -> Applied:
    """The store must take the decision before the job is reported done: a transient store
    error is retried with capped backoff and no deadline (the partition waits, so one
    user's changes stay in order); a permanent one is raised at once."""

    def logged(n: int, exc: BaseException, delay: float) -> None:
        log.error("applying decision of job %s failed (attempt %d, %s: %s); retrying in %.1fs",
                  decision.job_id, n, type(exc).__name__, describe(exc)[:200], delay)

    return await retry_async(
        lambda: asyncio.to_thread(apply_decision, p.services.store, decision),
        policy=store_policy(p.settings), deadline=None, clock=p.clock, on_retry=logged)


async def apply_or_set_aside(p: Pipeline, work: Work, decision: JobDecision,
                             record: Any) -> Applied:
    """A decision the store refuses for good is dead-lettered (``apply_failed``) and its job
    reported failed, so the ingest stage retries it later instead of the partition
    looping on it forever."""
    try:
        return await apply_with_retries(p, decision)
    except ShardNotHere:
        raise  # not this worker's shard (now): the loop reads the decision again
    except Exception as exc:  # permanent (is_transient said no)
        reason = describe(exc)
        log.error("decision of job %s cannot be applied: %s", decision.job_id, reason)
        set_aside(p, work, InvalidRecord("apply_failed", reason), record)
        return Applied(fencing.Verdict.APPLY, JobStatus.FAILED, error=reason)


class Unpublished(Exception):
    """The store took a decision, and its events or result could not be made: the worker
    must stop (the restart reads the decision again and the store answers it from its kept
    events), never set the decision aside as a dead letter."""


async def publish(p: Pipeline, work: Work, key: bytes, decision: JobDecision,
                  applied: Applied, span: Any = None) -> None:
    """The change events first, then the result that lets the user's next job go, into the
    batch's transaction; a forget-me's keys shredded before it (idempotent: a decision read
    again shreds again); callers woken and counts taken once it is committed."""
    wire = await privacy.seal_all(p, applied.publish)
    await privacy.after_erase(p, applied.publish)
    t = p.topics
    spans = [tracing.produce("change", span, t.memory_changes.name, work.spans,
                             memstream__change__op=change.op,
                             memstream__change__memory_id=change.memory_id,
                             memstream__change__version=change.version) if span else None
             for change, _ in wire]  # (each change event continues the decision's trace)
    for (change, event), sent in zip(wire, spans, strict=True):
        # the changelog and downstream's event, one transaction
        work.out.append(tracing.traced((t.memory_changes.name, key, change.dumps()), sent))
        if event is not None:
            work.out.append(tracing.traced((t.memory_events.name, key, event.dumps()), sent))
    if decision.user_id == GLOBAL_USER:  # every worker's copy (streams.standby.GlobalCopy)
        work.out += [tracing.traced((t.global_changes.name, key, change.dumps()), sent)
                     for (change, _), sent in zip(wire, spans, strict=True)]
    result = JobResult.for_job(
        decision, applied.status, datetime.fromtimestamp(p.clock(), UTC),
        llm_calls=decision.llm_calls, error=applied.error, applied_seq=applied.applied_seq)
    work.out.append(tracing.traced((p.topics.job_results.name, key, result.dumps()), span))

    async def committed() -> None:
        count_outcome(p.counters, decision, applied)
        if applied.status != JobStatus.FENCED:  # a fenced job goes again under the same id
            p.waiters.resolve(decision.job_id, Outcome(
                applied.status.value, [_summary(c) for c in applied.publish],
                applied.error or decision.error))

    work.after.append(committed)


def count_outcome(c: Counters, decision: JobDecision, applied: Applied) -> None:
    if applied.verdict == fencing.Verdict.REPUBLISH:
        c.decisions_republished += 1
    elif applied.verdict == fencing.Verdict.DONE:
        c.decisions_duplicate += 1
    elif applied.status == JobStatus.FENCED:
        c.decisions_fenced += 1
    if applied.publish and applied.verdict == fencing.Verdict.APPLY:
        count_applied(c, decision, applied.publish)


def count_applied(c: Counters, decision: JobDecision, changes: list[MemoryChange]) -> None:
    """Write volume and the merges of SPEC §8: once per change applied now (a re-published
    or duplicate decision is not counted again)."""
    c.consolidation_merges += decision.decisions.get("merged", 0)
    for change in changes:
        bounded = governance_metrics.bounded
        add(c.changes, (bounded(change.op, governance_metrics.CHANGE_OPS),
                        bounded(change.lineage.kind, governance_metrics.LINEAGE_KINDS)))


def _summary(change: MemoryChange) -> dict[str, object]:
    return {"op": change.op, "memory_id": change.memory_id, "version": change.version,
            "content": change.after.get("content", "")}


class ApplyStage(StageBase):
    """The apply stage as its loop runs it (see the module docstring). ``fold``: the
    windowed jobs' triggers, when they run in this process; ``decisions`` False: only
    those (the memory-change topic folded instead of decisions applied)."""

    def __init__(self, p: Pipeline, fold: Fold | None, *, decisions: bool = True) -> None:
        self.p = p
        self.fold = fold
        t = p.topics
        self.decisions = t.decisions.name if decisions else None
        self.name = "apply" if decisions else "jobs"
        self.inputs = [t.decisions.name if decisions else t.memory_changes.name]
        self.tables: tuple[LoopTable, ...] = (fold.table,) if fold is not None else ()
        self.max_records = p.settings.ingest_batch_records
        self.next_sweep = 0.0  # archived turns past archive_days: swept at the first round

    def open(self, context: TaskContext) -> ApplyProcessor:
        return ApplyProcessor(self, context)

    def take_order(self, partitions: set[int]) -> list[int]:
        keeper = self.p.shards
        if keeper is not None and self.decisions:
            return list(keeper.order(partitions))
        return sorted(partitions)

    async def prepare(self, new: set[int], gone: set[int]) -> None:
        """Before any record of ``new`` is handled (after the fence): the store shards of
        the partitions (store_partitioned: streams.shards) restored, those of ``gone``
        closed."""
        keeper = self.p.shards
        if keeper is not None and self.decisions:
            await keeper.release(gone)
            await keeper.take(new)

    async def sweep(self, now: float) -> None:
        """Every ``archive_sweep_s``, the archived turns older than ``archive_days`` swept
        from the store (the whole store's: once per loop, not per partition)."""
        s = self.p.settings
        oldest = archive.cutoff(now, s.archive_days)
        if oldest is None or not self.decisions or now < self.next_sweep:
            return
        self.next_sweep = now + s.archive_sweep_s
        try:
            swept = await asyncio.to_thread(self.p.services.store.sweep_turns, oldest)
        except Exception as exc:  # the store's trouble: tried again next period
            log.warning("archive sweep failed: %s", describe(exc)[:200])
            return
        self.p.counters.turns_swept += swept


class ApplyProcessor(ProcessorBase):
    """The apply stage's processor of one partition task: its fold of the windowed jobs
    (its slice of the maintenance table, its due index) and its segment rolls."""

    def __init__(self, stage: ApplyStage, context: TaskContext) -> None:
        self.stage = stage
        self.p = stage.p
        self.partition = context.partition
        self.decisions = stage.decisions
        self.fold = None if stage.fold is None else stage.fold.open(context.tables[0])
        self.table = context.tables[0] if context.tables else None
        self.rolls = privacy.RollSchedule(stage.p.settings)

    def committed(self, offsets: dict[str, int]) -> None:
        """A transaction of the partition committed, its records up to ``offsets``."""
        if self.p.shards is not None and self.decisions:
            self.p.shards.wrote(self.partition, offsets)

    async def punctuate(self, now: float) -> Work | None:
        """The windowed jobs due on the partition (their tool requests), and the segment
        roll of the maintenance table's changelog (and the loop's archive sweep)."""
        await self.stage.sweep(now)
        if self.fold is None or self.table is None:
            return None
        work = Work()
        work.out += self.fold.punctuate(now)
        if self.rolls.due(now):  # compaction drops erased data
            privacy.roll_tables(self.table)
        return work

    def shard_here(self) -> NotHere | None:
        """None when the partition's store shard is served here (store_partitioned: the
        take restored it before the task served; it may have been closed since, as the
        worker stops), else why not."""
        keeper = self.p.shards
        if keeper is None or not self.decisions or self.partition in keeper.store.owned:
            return None
        return NotHere(self.partition, f"the store shard of partition {self.partition} is "
                       "not owned here")

    async def process(self, records: list[Any]) -> Work | NotHere:
        """The batch's work; :class:`NotHere` when the shard is not here, before the batch
        or as a store call of it found (a value: nothing of the batch is committed)."""
        return self.shard_here() or await here(self._handle(records))

    async def _handle(self, records: list[Any]) -> Work:
        work, users = Work(), set()
        for n, record in enumerate(records):
            if record.topic == self.decisions:
                if record.key in users:  # the user's second decision: next transaction
                    work.handled = n
                    break
                users.add(record.key)
                step = self._decision
            else:
                step = self._change
            mark = len(work.out), len(work.after), len(work.spans)

            async def attempt(r: Any = record, step: Any = step,
                              mark: tuple[int, int, int] = mark) -> None:
                del work.out[mark[0]:], work.after[mark[1]:]  # a failed attempt's part
                tracing.settle(work.spans[mark[2]:], "retried")
                del work.spans[mark[2]:]
                await step(work, r)

            got = await until_handled(record, attempt, counters=self.p.counters,
                                      fatal=(Unpublished,))
            if isinstance(got, InvalidRecord):
                set_aside(self.p, work, got, record)
        return work

    async def _decision(self, work: Work, record: Any) -> None:
        p = self.p
        if not record_checks.authentic(p, work, record):  # no valid MAC: changes nothing
            return
        try:
            decision = decode(JobDecision, record.value, record.key, max_bytes=INTERNAL_MAX_BYTES)
        except InvalidRecord as exc:
            set_aside(p, work, exc, record)
            return
        span = tracing.consume("apply", record, work.spans, p.settings.app_id,
                               memstream__job__id=decision.job_id)
        applied = await apply_or_set_aside(p, work, decision, record)
        tracing.note(span, memstream__apply__verdict=applied.verdict.value,
                     memstream__job__status=applied.status.value)
        try:
            await publish(p, work, record.key, decision, applied, span)
            # DONE: another decision of the job was applied, and folded in its committed
            # transaction (REPUBLISH: this one's transaction, fold included, was not)
            if self.fold is not None and applied.verdict != fencing.Verdict.DONE:
                for change in applied.publish:
                    work.out += self.fold.fold(change)
        except Exception as exc:
            if is_transient(exc):
                raise  # tried again in place; the store answers with its kept events
            raise Unpublished(f"job {decision.job_id}: {describe(exc)}") from exc

    async def _change(self, work: Work, record: Any) -> None:
        """(The jobs-only process) a published change."""
        try:
            change = decode(MemoryChange, record.value, record.key,
                            max_bytes=INTERNAL_MAX_BYTES)
        except InvalidRecord as exc:
            set_aside(self.p, work, exc, record)
            return
        assert self.fold is not None
        work.out += self.fold.fold(change)
