"""The ingest agent: a thin shell around :mod:`memory.coalescing`.

One agent consumes the co-partitioned messages, session-event, job-result and tick topics
as one stream, so every event of a user is handled in order on one partition. Per event it
decodes (bad records go to the dead-letter topic), loads the user's snapshot from the
changelog-backed table, calls the pure machine, writes the snapshot back and sends the
emitted jobs / trivial results. A timer sends a tick for every user whose next deadline
(idle flush, retry, job timeout) has passed; the tick travels through Kafka so the state
is only ever changed inside the agent.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from aiokafka import AIOKafkaProducer
from pydantic import BaseModel

from memstream.errors import InvalidRecord
from memstream.memory import coalescing as machine
from memstream.memory import metrics
from memstream.memory.ingest_state import restore, snapshot
from memstream.streams import privacy, window
from memstream.streams.app import Pipeline
from memstream.streams.counters import add
from memstream.streams.dead_letters import decode_input, send_dead_letter
from memstream.streams.guard import guarded
from memstream.topics.schemas import (
    ChatMessage,
    JobResult,
    JobStatus,
    SessionEvent,
    Tick,
    ToolRequest,
)

log = logging.getLogger(__name__)


def step_for(p: Pipeline, state: machine.UserState, event: BaseModel, now: float) -> machine.Step:
    """Route one decoded event to the machine (pure)."""
    c, policy = p.counters, p.policy
    if isinstance(event, ChatMessage):
        c.messages += 1
        return machine.on_message(state, event, now, policy)
    if isinstance(event, ToolRequest):
        c.tool_requests += 1
        step = machine.on_tool(state, event, now, policy)
        if step.duplicate:  # taken before (a retry), or the user's queue is full
            c.tool_requests_refused += 1
        return step
    if isinstance(event, SessionEvent):
        c.session_events += 1
        return machine.on_session_end(state, event.session_id, now, policy,
                                      event.ts.timestamp())
    if isinstance(event, JobResult):
        lag = metrics.extraction_lag(state, event)  # None unless the user's job in flight
        step = machine.on_result(state, event, now, policy)
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
    c.ticks += 1
    return machine.on_tick(state, now, policy)


async def handle(p: Pipeline, event: Any) -> None:
    message = event.message
    try:
        decoded = decode_input(p, message.topic, message.key, message.value)
    except InvalidRecord as exc:
        await send_dead_letter(p, exc, message)
        return
    if isinstance(decoded, Tick) and privacy.is_roll(decoded.tenant_id):
        privacy.roll_tables(p)  # segments roll: compaction can drop erased records
        return
    kbytes: bytes = decoded.key().encode()  # type: ignore[attr-defined]
    raw = p.state.get(kbytes)
    state = p.restored.get(kbytes, raw)
    if state is None:
        state = restore(raw) if raw else machine.UserState(
            decoded.tenant_id, decoded.user_id  # type: ignore[attr-defined]
        )
    step = step_for(p, state, decoded, p.clock())
    if step.duplicate and isinstance(decoded, ChatMessage):
        p.counters.duplicates += 1
    elif isinstance(decoded, ChatMessage):
        seq = step.state.sessions[decoded.session_id].count - 1
        window.record(p.window, p.settings, decoded, seq)
    for sid in set(state.sessions) - set(step.state.sessions):
        window.forget(p.window, p.settings, state.tenant_id, state.user_id, sid)
    if step.state.idle:
        if raw is not None:
            del p.state[kbytes]  # nothing left to remember for this user
            p.restored.forget(kbytes)
    elif step.state != state or raw is None:
        snap = snapshot(step.state)
        snap["deadline"] = machine.next_deadline(step.state, p.policy)
        p.state[kbytes] = snap
        p.restored.put(kbytes, snap, step.state)
    for job in step.jobs:
        if job.attempt > 1:
            p.counters.jobs_resent += 1
        else:  # jobs by trigger reason: first attempts (re-sends are counted above)
            add(p.counters.jobs_by_trigger, metrics.bounded(job.reason.value, metrics.TRIGGERS))
        p.counters.jobs_emitted += 1
        await p.jobs.send(key=kbytes, value=job.dumps())
    for res in step.resolved:
        p.counters.trivial_resolved += 1
        await p.job_results.send(key=kbytes, value=res.dumps())


class TickSender:
    """Sends ticks with a plain (non-transactional) producer.

    Under exactly-once, Faust wraps sends in the partition's open transaction, which is
    only committed together with consumed offsets; a timer that fires while no input
    arrives would leave its ticks invisible. Ticks are idempotent hints, so a plain
    producer is right for them. ``due(now)`` names the users to tick.
    """

    def __init__(self, p: Pipeline, topic: str,
                 due: Callable[[float], list[tuple[str, str]]]) -> None:
        self.p = p
        self.topic = topic
        self.due = due
        self.producer: AIOKafkaProducer | None = None

    async def send_due(self) -> int:
        """Send a tick for each user ``due`` names now."""
        p = self.p
        now = p.clock()
        users = self.due(now)
        if not users:
            return 0
        if self.producer is None:
            self.producer = AIOKafkaProducer(bootstrap_servers=p.settings.bootstrap_servers)
            await self.producer.start()
        stamp = datetime.fromtimestamp(now, UTC)
        for tenant, user in users:
            tick = Tick(tenant_id=tenant, user_id=user, now=stamp)
            await self.producer.send(self.topic, key=tick.key().encode(), value=tick.dumps())
        await self.producer.flush()
        return len(users)

    async def close(self) -> None:
        if self.producer is not None:
            await self.producer.stop()
            self.producer = None


def due_users(p: Pipeline, now: float) -> list[tuple[str, str]]:
    """Locally owned users whose ingest deadline (idle flush, retry, timeout) has passed."""
    return [(snap["tenant_id"], snap["user_id"]) for _key, snap in list(p.state.items())
            if snap and snap.get("deadline") is not None and snap["deadline"] <= now]


def register(p: Pipeline) -> None:
    """Attach the agent and the timer to the app."""

    @p.app.agent(p.inputs, name="ingest")
    async def ingest(stream: Any) -> None:
        async for event in stream.events():
            await guarded(p, event.message, lambda: handle(p, event))  # noqa: B023

    rolls = privacy.RollSchedule(p)
    ticks = TickSender(p, p.topics.ticks.name,
                       lambda now: due_users(p, now) + rolls.due(now))

    @p.app.timer(p.settings.tick_interval_s, name="ingest-ticker")
    async def ticker() -> None:
        await ticks.send_due()

    @p.app.on_before_shutdown.connect  # type: ignore[arg-type]
    async def on_shutdown(app: Any, **_: Any) -> None:
        await ticks.close()
        log.info("ingest counters: %s", p.counters.as_dict())
