"""The windowed jobs' Faust shell: a thin agent around :mod:`jobs.triggers`.

The apply agent folds each change it publishes (``fold``), the jobs agent each tick of
the maintenance-ticks topic (keyed ``tenant/user``, co-partitioned); both keep one
:class:`~jobs.triggers.UserJobs` per user in the changelog-backed ``maintenance`` table and
send the commands the machine emits to the
tool-requests topic, in the same transaction as the table write (exactly-once: a crash
neither loses a due reflection nor sends it twice; the ingest stage also takes a request
id once).

Ticks: the cost of a timer round must not grow with all users. A :class:`DueIndex` (a heap
of next-due times, built once from the table when the worker starts, then kept up to date
by the agent) names the due users; only they get a tick. Faust's windowed tables are not
used: their expiry is unreliable after rebalances and restarts (faust-streaming #385,
#250), and a plain table plus due times recovers exactly.
"""

from __future__ import annotations

import heapq
from datetime import UTC, datetime
from typing import Any

from memstream.jobs import triggers
from memstream.settings import Settings
from memstream.streams import privacy
from memstream.streams.app import Pipeline
from memstream.streams.dead_letters import decode_or_dead_letter
from memstream.streams.guard import guarded
from memstream.streams.ingest import TickSender
from memstream.topics.schemas import MemoryChange, Tick, ToolRequest, ToolWrite


def policy_from(settings: Settings) -> triggers.JobsPolicy:
    return triggers.JobsPolicy(
        reflection_threshold=settings.reflection_threshold,
        consolidation_interval_s=settings.consolidation_interval_s,
        decay_interval_s=settings.decay_interval_s, enabled=tuple(settings.jobs))


class DueIndex:
    """Next-due time per user key, cheapest first; stale entries are skipped on pop."""

    def __init__(self) -> None:
        self._heap: list[tuple[float, bytes]] = []
        self._due: dict[bytes, float] = {}
        self.built = False

    def push(self, key: bytes, due: float | None) -> None:
        if due is None:
            self._due.pop(key, None)
            return
        if self._due.get(key) == due:
            return
        self._due[key] = due
        heapq.heappush(self._heap, (due, key))

    def pop_due(self, now: float) -> list[bytes]:
        out: list[bytes] = []
        while self._heap and self._heap[0][0] <= now:
            due, key = heapq.heappop(self._heap)
            if self._due.get(key) == due:
                del self._due[key]
                out.append(key)
        return out

    def __len__(self) -> int:
        return len(self._due)


def _state(p: Pipeline, key: bytes, tenant: str, user: str) -> triggers.UserJobs:
    raw = p.maintenance.get(key)
    return triggers.UserJobs.restore(raw) if raw else triggers.UserJobs(tenant, user)


async def fold(p: Pipeline, index: DueIndex, policy: triggers.JobsPolicy,
               event: Tick | MemoryChange) -> None:
    """One change or tick of a user into the table; commands out (in the caller's
    transaction: the apply agent's, or the jobs agent's)."""
    key = event.key().encode()
    state = _state(p, key, event.tenant_id, event.user_id)
    now = p.clock()
    if isinstance(event, Tick):
        new, commands = triggers.on_tick(state, now, policy)
    else:
        new, commands = triggers.on_change(state, event, now, policy)
    if new != state:
        p.maintenance[key] = new.snapshot()
    index.push(key, triggers.next_due(new))
    for command in commands:
        p.counters.jobs_commands += 1
        request = ToolRequest(
            request_id=command.request_id, tenant_id=event.tenant_id, user_id=event.user_id,
            write=ToolWrite(name=command.kind), principal=f"job:{command.kind}",
            ts=datetime.fromtimestamp(now, UTC))
        await p.tool_requests.send(key=key, value=request.dumps())


async def handle(p: Pipeline, index: DueIndex, policy: triggers.JobsPolicy,
                 message: Any) -> None:
    is_tick = message.topic == p.topics.maintenance_ticks.name
    model: type[Tick] | type[MemoryChange] = Tick if is_tick else MemoryChange
    event = await decode_or_dead_letter(p, model, message)
    if isinstance(event, Tick) and privacy.is_roll(event.tenant_id):
        privacy.roll_tables(p.maintenance)  # segments roll: compaction drops erased data
    elif event is not None:
        await fold(p, index, policy, event)


def due_users(p: Pipeline, index: DueIndex, now: float) -> list[tuple[str, str]]:
    if not index.built:  # once per start: the table was restored, the heap was not
        for key, raw in list(p.maintenance.items()):
            if raw:
                index.push(key, triggers.next_due(triggers.UserJobs.restore(raw)))
        index.built = True
    out = []
    for key in index.pop_due(now):
        tenant, _, user = key.decode().partition("/")
        out.append((tenant, user))
    return out


def register(p: Pipeline) -> None:
    """With the apply agent in this process, changes are folded right where they are
    published (``p.on_changes``) and the jobs agent reads only its ticks: an agent of the
    worker subscribing to the memory-change topic made Faust publish that topic inside
    its exactly-once transactions, and the chaos benchmark then found change events
    missing. A triggers-only process (``memstream jobs run``) reads the topic itself."""
    index = DueIndex()
    policy = policy_from(p.settings)
    names = [p.topics.maintenance_ticks.name]
    if p.settings.extract_enabled:
        async def on_changes(changes: list[MemoryChange]) -> None:
            for change in changes:
                await fold(p, index, policy, change)

        p.on_changes = on_changes
    else:
        names.append(p.topics.memory_changes.name)

    @p.app.agent(p.app.topic(*names, key_serializer="raw", value_serializer="raw"),
                 name="jobs")
    async def jobs(stream: Any) -> None:
        async for event in stream.events():
            message = event.message
            await guarded(p, message, lambda: handle(p, index, policy, message))  # noqa: B023

    rolls = privacy.RollSchedule(p)
    ticks = TickSender(p, p.topics.maintenance_ticks.name,
                       lambda now: due_users(p, index, now) + rolls.due(now))

    @p.app.timer(p.settings.tick_interval_s, name="jobs-ticker")
    async def ticker() -> None:
        await ticks.send_due()

    @p.app.on_before_shutdown.connect  # type: ignore[arg-type]
    async def on_shutdown(app: Any, **_: Any) -> None:
        await ticks.close()
