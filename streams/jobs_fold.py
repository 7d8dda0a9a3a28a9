"""The windowed jobs' shell: a thin fold around :mod:`jobs.triggers`.

The apply loop (:mod:`streams.apply`) folds each change it publishes and each tick of the
maintenance-ticks topic (keyed ``tenant/user``, co-partitioned) with
:class:`MaintenanceFold`: one :class:`~jobs.triggers.UserJobs` per user in the
changelog-backed ``maintenance`` table, and the commands the machine emits sent to the
tool-requests topic, in the same transaction as the table write (exactly-once: a crash
neither loses a due reflection nor sends it twice; the ingest stage also takes a request
id once).

Ticks: the cost of a timer round must not grow with all users. A :class:`DueIndex` (a heap
of next-due times, built once from the table when the worker starts, then kept up to date
by the fold) names the due users; only they get a tick. Faust's windowed tables are not
used: their expiry is unreliable after rebalances and restarts (faust-streaming #385,
#250), and a plain table plus due times recovers exactly.
"""

from __future__ import annotations

import heapq
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from memstream.core.settings import Settings
from memstream.jobs import triggers
from memstream.streams import privacy
from memstream.streams.ingest import TickSender
from memstream.streams.ingest_tables import LoopTable
from memstream.streams.pipeline import Pipeline
from memstream.streams.stage import Record
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


class MaintenanceFold:
    """Changes and ticks of the owned users folded into the ``maintenance`` table (a
    :class:`~streams.ingest_tables.LoopTable` the apply loop owns: written inside its
    batches, committed with them), and the commands that emits."""

    def __init__(self, p: Pipeline) -> None:
        self.p = p
        self.table: LoopTable = p.maintenance
        self.index = DueIndex()
        self.policy = policy_from(p.settings)

    def assigned(self) -> None:
        self.index = DueIndex()  # built again from the restored table at the next tick

    def _state(self, key: bytes, tenant: str, user: str) -> triggers.UserJobs:
        raw = self.table.get(key)
        return triggers.UserJobs.restore(raw) if raw else triggers.UserJobs(tenant, user)

    def fold(self, event: Tick | MemoryChange) -> list[Record]:
        """One change or tick of a user into the table (inside ``table.writing``); the
        tool requests of the commands it emits, to send in the same transaction."""
        p = self.p
        key = event.key().encode()
        state = self._state(key, event.tenant_id, event.user_id)
        now = p.clock()
        if isinstance(event, Tick):
            new, commands = triggers.on_tick(state, now, self.policy)
        else:
            new, commands = triggers.on_change(state, event, now, self.policy)
        if new != state:
            self.table[key] = new.snapshot()
        self.index.push(key, triggers.next_due(new))
        out: list[Record] = []
        for command in commands:
            p.counters.jobs_commands += 1
            request = ToolRequest(
                request_id=command.request_id, tenant_id=event.tenant_id,
                user_id=event.user_id, write=ToolWrite(name=command.kind),
                principal=f"job:{command.kind}", ts=datetime.fromtimestamp(now, UTC))
            out.append((p.topics.tool_requests.name, key, request.dumps()))
        return out

    def due_users(self, now: float) -> list[tuple[str, str]]:
        return due_users(self.table, self.index, now)


def due_users(table: LoopTable | Mapping[bytes, Any], index: DueIndex,
              now: float) -> list[tuple[str, str]]:
    """The users whose next job is due by ``now`` (the heap built from the table once per
    assignment: the table was restored, the heap was not)."""
    if not index.built:
        for key, raw in list(table.items()):
            if raw:
                index.push(key, triggers.next_due(triggers.UserJobs.restore(raw)))
        index.built = True
    out = []
    for key in index.pop_due(now):
        tenant, _, user = key.decode().partition("/")
        out.append((tenant, user))
    return out


def register(p: Pipeline) -> MaintenanceFold:
    """The windowed jobs' fold (run by the apply loop, :mod:`streams.apply`) and the timer
    that sends the due users' ticks."""
    fold = MaintenanceFold(p)
    rolls = privacy.RollSchedule(p)

    def not_sent() -> None:  # the due users are taken from the table again
        fold.assigned()
        rolls.again()

    ticks = TickSender(p, p.topics.maintenance_ticks.name,
                       lambda now: fold.due_users(now) + rolls.due(now), on_failed=not_sent)

    @p.app.timer(p.settings.tick_interval_s, name="jobs-ticker")
    async def ticker() -> None:
        await ticks.send_due()

    @p.app.on_before_shutdown.connect  # type: ignore[arg-type]
    async def on_shutdown(app: Any, **_: Any) -> None:
        await ticks.close()

    return fold
