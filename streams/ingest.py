"""The ingest stage: a thin shell around :mod:`memory.coalescing`.

The co-partitioned messages, session-event, job-result and tool-request topics are read
as one stream per partition by :mod:`streams.owned_loop`, so every event of a user is
handled in order. Records come in batches; per record this module decodes (bad records
become dead letters), calls the pure machine with the user's state (loaded once per batch
from the changelog-backed table) and collects the emitted jobs / trivial results; at the
end of the batch each changed user's snapshot is written once. The loop sends all of it
with the batch's input offsets in one transaction. Its timer round (``punctuate``) ticks
every user of the partition whose next deadline (idle flush, retry, job timeout) has
passed, in a transaction of that partition too: the state only ever changes inside the
loop.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import Any

from pydantic import BaseModel

from memstream.core import tracing
from memstream.core.errors import InvalidRecord, describe, trace
from memstream.memory import coalescing, governance_metrics
from memstream.memory.ingest_state import UserState, overdue, restore, snapshot
from memstream.streams import placement, privacy, record_checks, window
from memstream.streams.counters import add
from memstream.streams.dead_letters import decode_input, set_aside
from memstream.streams.ingest_tables import LoopTable
from memstream.streams.owned_loop import OwnedLoop
from memstream.streams.pipeline import Pipeline
from memstream.streams.stage import NotHere, ProcessorBase, StageBase, TaskContext, Work
from memstream.topics.schemas import (
    ChatMessage,
    JobResult,
    JobStatus,
    SessionEvent,
    ToolRequest,
)

log = logging.getLogger(__name__)


def step_for(p: Pipeline, state: coalescing.UserState, event: BaseModel,
             now: float) -> coalescing.Step:
    """Route one decoded event to the machine (pure)."""
    c, policy = p.counters, p.policy
    if isinstance(event, ChatMessage):
        c.messages += 1
        return coalescing.on_message(state, event, now, policy)
    if isinstance(event, ToolRequest):
        c.tool_requests += 1
        step = coalescing.on_tool(state, event, now, policy)
        if step.duplicate:  # taken before (a retry), or the user's queue is full
            c.tool_requests_refused += 1
        return step
    if isinstance(event, SessionEvent):
        c.session_events += 1
        return coalescing.on_session_end(state, event.session_id, now, policy,
                                      event.ts.timestamp())
    if isinstance(event, JobResult):
        # None unless the user's job in flight
        lag = governance_metrics.extraction_lag(state, event)
        step = coalescing.on_result(state, event, now, policy)
        if lag is not None and not step.duplicate:
            c.extraction_lag.observe(lag)
        if step.duplicate:
            if event.status != JobStatus.TRIVIAL:  # not our own inline resolution echoed
                c.stale_results += 1
        elif event.status == JobStatus.FAILED:
            c.results_failed += 1
        elif event.status == JobStatus.FENCED:
            c.results_fenced += 1
        else:
            c.results_done += 1
        return step
    raise TypeError(f"not an ingest input: {type(event).__name__}")


@dataclass
class Batch(Work):
    """What one batch of one partition produced: the records to send in its transaction
    (topic, key, value), and each user's state as the batch found and leaves it (written
    to the table once per batch, not once per record)."""

    users: dict[bytes, tuple[Any, UserState, UserState]] = field(default_factory=dict)
    # the task's slices of the ingest state and the window (streams.ingest_tables)
    state: Any = None
    window: Any = None
    # when this worker took the partition: a job in flight is timed from then at the
    # earliest (see ``_user``)
    since: float = 0.0
    # tracing on (core.tracing): the messages' contexts, the span of the record in hand
    traces: tracing.MessageTraces | None = None
    span: Any = None
    where: tuple[str, int, int] = ("", 0, 0)


def _user(p: Pipeline, batch: Batch, key: bytes, tenant: str, user: str) -> UserState:
    if key in batch.users:
        return batch.users[key][2]
    raw = batch.state.get(key)
    state = p.restored.get(key, raw)
    if state is None:
        state = restore(raw) if raw else UserState(tenant, user)
    first = state
    flight = state.in_flight
    if flight is not None and flight.sent_at < batch.since:
        # The loops lose no record: a job sent before this worker took the partition is
        # still on its way (the time the partition had no owner, or a backlog after a
        # restart), not lost. Timed from the takeover, it is not re-sent for the downtime.
        state = replace(state, in_flight=replace(flight, sent_at=batch.since))
    batch.users[key] = (raw, first, state)
    return state


def handle_event(p: Pipeline, batch: Batch, decoded: Any) -> None:
    """One decoded input of a user: the machine's step; its jobs and trivial results go
    into the batch, the window is written (pending until the batch commits)."""
    kbytes: bytes = decoded.key().encode()
    state = _user(p, batch, kbytes, decoded.tenant_id, decoded.user_id)
    step = step_for(p, state, decoded, p.clock())
    if step.duplicate and isinstance(decoded, ChatMessage):
        p.counters.duplicates += 1
    elif isinstance(decoded, ChatMessage):
        seq = step.state.sessions[decoded.session_id].count - 1
        window.record(batch.window, p.settings, decoded, seq)
        if batch.traces is not None:
            batch.traces.seen(kbytes, batch.where, tracing.context_of(batch.span))
    _took(p, batch, kbytes, state, step, isinstance(decoded, (ChatMessage, SessionEvent,
                                                               ToolRequest)))


def tick(p: Pipeline, batch: Batch, key: bytes, snap: dict[str, Any], now: float) -> None:
    """A user whose deadline passed: the machine's timers (idle flush, retry, re-send)."""
    state = _user(p, batch, key, str(snap["tenant_id"]), str(snap["user_id"]))
    p.counters.ticks += 1
    _took(p, batch, key, state, coalescing.on_tick(state, now, p.policy))


def _took(p: Pipeline, batch: Batch, kbytes: bytes, state: UserState,
          step: coalescing.Step, trigger: bool = False) -> None:
    """A step's new state, its sessions forgotten, its jobs and trivial results."""
    for sid in set(state.sessions) - set(step.state.sessions):
        window.forget(batch.window, p.settings, state.tenant_id, state.user_id, sid)
    raw, first, _ = batch.users[kbytes]
    batch.users[kbytes] = (raw, first, step.state)
    for job in step.jobs:
        if job.attempt > 1:
            p.counters.jobs_resent += 1
        else:  # jobs by trigger reason: first attempts (re-sends are counted above)
            add(p.counters.jobs_by_trigger,
                governance_metrics.bounded(job.reason.value, governance_metrics.TRIGGERS))
        p.counters.jobs_emitted += 1
        record = (p.topics.jobs.name, kbytes, job.dumps())
        if batch.traces is not None:  # continues the message that made it (core.tracing)
            span = tracing.job(
                batch.traces, kbytes, job.job_id, batch.span if trigger else None, batch.span,
                p.topics.jobs.name, batch.spans, memstream__job__id=job.job_id,
                memstream__job__reason=job.reason.value, memstream__job__attempt=job.attempt,
                memstream__job__messages=len(job.messages))
            batch.out.append(tracing.traced(record, span))
        else:
            batch.out.append(record)
    for res in step.resolved:
        p.counters.trivial_resolved += 1
        batch.out.append(tracing.traced((p.topics.job_results.name, kbytes, res.dumps()),
                                        batch.span))


def check_tenant(p: Pipeline, topic: str, decoded: Any) -> None:
    """A record on a tenant's own input topic (the per-tenant layout) is of that tenant, or
    :class:`InvalidRecord` (dead-lettered): a chat service whose ACLs let it write only its
    tenant's topics cannot write another tenant's memories (docs/tenancy.md)."""
    owner = p.topics.tenant_of(topic)
    if owner is not None and decoded.tenant_id != owner:
        raise InvalidRecord("tenant", f"{topic}: a record of tenant {decoded.tenant_id!r} on "
                            f"tenant {owner!r}'s input topic (a chat service writes only its "
                            "own tenant's topics)")


def handle_record(p: Pipeline, batch: Batch, record: Any) -> None:
    """One input record: decoded, or set aside as a dead letter (sent in the batch's
    transaction, so it is there exactly when the record counts as read); one that is not
    on its key's partition is re-routed there. A tool request or job result without a valid
    MAC changes nothing (set aside without its value: streams.record_checks)."""
    if not record_checks.authentic(p, batch, record):
        return
    try:
        source = placement.source_topic(p.topics, record)
        decoded = decode_input(p, source, record.key, record.value)
        check_tenant(p, source, decoded)
    except InvalidRecord as exc:
        set_aside(p, batch, exc, record)
        return
    placed = placement.misplaced(p.topics, p.settings.partitions, record)
    if placed is not None:
        batch.placed.append(placed)
        return
    if batch.traces is not None:
        batch.span = tracing.consume("ingest", record, batch.spans, p.settings.app_id,
                                     memstream__tenant_id=getattr(decoded, "tenant_id", None))
        batch.where = (record.topic, record.partition, record.offset)
    try:
        handle_event(p, batch, decoded)
    except Exception as exc:  # a bug or an input the machine cannot take: set aside
        log.error("%s[%s]@%s: cannot be handled; set aside on the dead-letter topic\n%s",
                  record.topic, record.partition, record.offset, trace(exc))
        p.counters.handler_failures += 1
        set_aside(p, batch, InvalidRecord("internal", describe(exc, 1000)),
                   record)
    batch.span = None


def finish(p: Pipeline, batch: Batch) -> None:
    """Write each user's state once: the snapshot with its next deadline, or nothing left
    to remember (deleted)."""
    for key, (raw, first, state) in batch.users.items():
        if state.idle:
            if raw is not None:
                del batch.state[key]
                p.restored.forget(key)
        elif state != first or raw is None:
            snap = snapshot(state)
            snap["deadline"] = coalescing.next_deadline(state, p.policy)
            batch.state[key] = snap
            p.restored.put(key, snap, state)


class IngestStage(StageBase):
    """The ingest stage as its loop (:class:`streams.owned_loop.OwnedLoop`) runs it: a
    :class:`IngestProcessor` per partition task."""

    name = "ingest"

    def __init__(self, p: Pipeline) -> None:
        self.p = p
        self.inputs = [t.name for t in p.topics.ingest_inputs()]
        self.tables: tuple[LoopTable, ...] = (p.state, p.window)
        self.max_records = p.settings.ingest_batch_records
        self.traces = tracing.MessageTraces()

    def open(self, context: TaskContext) -> IngestProcessor:
        return IngestProcessor(self.p, context, self.traces)

    def assigned(self, partitions: set[int]) -> None:
        log.info("ingest: %d users restored", len(self.p.state))


class IngestProcessor(ProcessorBase):
    """One partition task of the ingest stage: its slices of the state and window tables,
    when this worker took it, its overdue messages and its segment rolls."""

    def __init__(self, p: Pipeline, context: TaskContext,
                 traces: tracing.MessageTraces) -> None:
        self.p = p
        self.state, self.window = context.tables
        self.taken_at = p.clock()  # a job in flight is timed from here at the earliest
        self.late = 0  # messages overdue at its last round (in counters.messages_overdue)
        self.rolls = privacy.RollSchedule(p.settings)
        self.traces = traces

    @contextmanager
    def _batch(self) -> Iterator[Batch]:
        """A batch of the partition: each changed user's state written once at the end."""
        batch = Batch(since=self.taken_at, state=self.state, window=self.window,
                      traces=self.traces if tracing.enabled() else None)
        yield batch
        finish(self.p, batch)

    async def process(self, records: list[Any]) -> Work | NotHere:
        with self._batch() as batch:
            for record in records:
                handle_record(self.p, batch, record)
        if batch.placed:
            batch.after.append(self._count_rerouted(len(batch.placed)))
        return batch

    async def punctuate(self, now: float) -> Work | None:
        """Every user of the partition whose deadline (idle flush, retry, job timeout) has
        passed, ticked; the overdue messages counted on the way (the detector of a lost
        message); the tables' changelog segments rolled every half erasure bound."""
        p, late = self.p, 0
        with self._batch() as batch:
            for key, snap in self.state.items():
                if snap.get("deadline") is not None and snap["deadline"] <= now:
                    tick(p, batch, key, snap, now)
                late += overdue(snap, now, p.policy, p.settings.tick_interval_s)
            if self.rolls.due(now):  # compaction drops erased data
                privacy.roll_tables(self.state, self.window)
        p.counters.messages_overdue += late - self.late
        self.late = late
        return batch

    def close(self) -> None:
        self.p.counters.messages_overdue -= self.late
        self.late = 0

    def _count_rerouted(self, n: int) -> Callable[[], Awaitable[None]]:
        async def count() -> None:  # once committed: an aborted batch is read again
            self.p.counters.misplaced_records += n
        return count


def ingest_loop(p: Pipeline, **kwargs: Any) -> OwnedLoop:
    return OwnedLoop(p.settings, IngestStage(p), **kwargs)
